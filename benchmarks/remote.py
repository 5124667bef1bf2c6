"""The remote store (issue 18): cudnn_cache's Redis layer against a redis-server of its own on loopback.

CPU cases, on a file of 10,000 synthetic entries: the entries pushed to an empty server (each merged on the
server: WATCH/MULTI); the same push again (nothing new, nothing written); the pull, median of 7 (target <= 100
ms); 16 processes pushing 1,000 entries each at once, half their own keys, half the same keys with other
measurements, the pull then compared with `cudnn_cache merge` of the 16 files (target: none lost, every entry the
fastest written). --gpu: the warm start of a fresh process (import, its entries, prepare(), the first training
step) of ResNet-50 fp32 batch 32 from the local file and from the remote store alone (an empty local file), 7
rounds of each in turn, each in its own process (target: from the remote within 50 ms of from the file, the
median of the rounds' paired differences).

    python3 -m benchmarks remote          # the CPU cases: about a minute
    python3 -m benchmarks remote --gpu    # the warm start (about four minutes, on a GPU)

Writes bench-results/remote.json (--gpu: remote_gpu.json) and its table. Exit codes: 0 every target met; 1 one
missed; 2 no redis-server, or --gpu without a GPU.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

from benchmarks import (ROOT, add_arguments, case_command, no_gpu, output_paths, parse, run_case, run_subprocess,
                        write_result)
from benchmarks.performance_doc import remote_rows
from benchmarks.report import table
from benchmarks.stats import median_interval

sys.path.insert(0, str(ROOT / "scripts"))
from redis_server import REDIS_SERVER, RedisServer  # noqa: E402  (the tests' server too)

ENTRIES, WRITERS, WRITER_ENTRIES, PULLS, ROUNDS = 10000, 16, 1000, 7, 7
TARGETS = {"pull_ms": 100.0, "writers_lost": 0, "warm_start_gap_ms": 50.0}


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=":".join(filter(None, [str(ROOT / "torch_ops"), os.environ.get("PYTHONPATH")])))


def cli(*args, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cudnn_cache", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=child_env())
    if check and done.returncode != 0:
        raise RuntimeError(f"cudnn_cache {' '.join(map(str, args))}: {done.stderr.strip()}")
    return done


def scaled_copy(source: pathlib.Path, target: pathlib.Path, scale: Callable[[int], float]) -> pathlib.Path:
    """`source` with the times of its i-th entry's ranking multiplied by scale(i), written to `target` (through
    a JSON export and import): the same keys, other measurements."""
    exported = target.with_suffix(".json")
    cli("export", source, "--json", "-o", exported)
    data = json.loads(exported.read_text())
    index = 0
    for section in data["sections"]:
        for name, entries in section.items():
            if not isinstance(entries, list) or name.startswith(("plans", "pending")):
                continue
            for entry in entries:
                for candidate in entry["ranking"]["candidates"]:
                    candidate["time_ms"] *= scale(index)
                index += 1
    exported.write_text(json.dumps(data))
    cli("import", exported, "-o", target)
    return target


def concurrent_writers(folder: pathlib.Path, url: str) -> dict:
    """WRITERS processes push WRITER_ENTRIES entries each to the store at `url` at once: the odd ones entries of
    their own, the even ones the same keys with other measurements (0.5x to 2x, by entry and writer). Then the
    store's content is compared with `cudnn_cache merge` of their files: entries lost, extra, and not the fastest."""
    shared, files = folder / "shared.cache", []
    cli("synth", shared, "--entries", WRITER_ENTRIES, "--seed", 7)
    for writer in range(WRITERS):
        path = folder / f"writer{writer}.cache"
        if writer % 2:
            cli("synth", path, "--entries", WRITER_ENTRIES, "--seed", 100 + writer)
        else:
            scaled_copy(shared, path, lambda index, writer=writer: 0.5 + ((index * 7 + writer * 3) % 16) / 10)
        files.append(path)
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-m", "cudnn_cache", "remote", "push", str(path), url, "--json",
                                   "--timeout", "30"], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for path in files]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"a writer failed: {err.strip()}")
        reports.append(json.loads(out))
    seconds = time.perf_counter() - started
    cli("merge", *files, "-o", folder / "merged.cache")
    cli("remote", "pull", url, "-o", folder / "pulled.cache")
    diff = cli("diff", folder / "merged.cache", folder / "pulled.cache", check=False).stdout.splitlines()
    lost, extra, not_fastest = (sum(line.startswith(marker) for line in diff) for marker in ("< ", "> ", "! "))
    return {"writers": WRITERS, "entries_each": WRITER_ENTRIES, "seconds": seconds,
            "retries": sum(r["retries"] for r in reports), "stored": sum(r["stored"] for r in reports),
            "lost": lost, "extra": extra, "not_fastest": not_fastest,
            "pulled_summary": cli("validate", folder / "pulled.cache").stdout.strip()}


def cpu_cases(folder: pathlib.Path) -> Dict[str, dict]:
    from cudnn_cache import remote

    results: Dict[str, dict] = {}
    source = folder / "entries.cache"
    cli("synth", source, "--entries", ENTRIES)
    data = source.read_bytes()
    with RedisServer(folder / "server") as server:
        store = remote.Remote(server.url, timeout=30)
        for case in ("push_new", "push_again"):
            report = store.push(data, str(source))
            results[case] = {"seconds": report.seconds, "entries": report.entries, "stored": report.stored,
                             "unchanged": report.unchanged}
        pulls = []
        for _ in range(PULLS):
            started = time.perf_counter()
            _, report = store.pull()
            pulls.append(1e3 * (time.perf_counter() - started))
        results["pull"] = {"ms": median_interval(pulls), "samples_ms": pulls, "entries": report.entries,
                           "refused": len(report.refused)}
    with RedisServer(folder / "writers") as server:
        results["writers"] = concurrent_writers(folder, server.url)
    return results


def warm_start(mode: str, cache_file: str, url: str, result: dict) -> None:
    """One process's warm start (--case tune|local|remote): 'tune' fills the file and the store."""
    started = time.perf_counter()
    import torch
    import torchvision

    import cudnn_cache

    device = torch.device("cuda")
    model = torchvision.models.resnet50().to(device).train()
    x = torch.randn(32, 3, 224, 224, device=device)
    torch.cuda.synchronize()
    result["setup_s"] = time.perf_counter() - started
    cudnn_cache.set_miss_policy("tune")
    cudnn_cache.intercept(True)
    if mode == "tune":
        model(x).sum().backward()
        cudnn_cache.set_remote(url)
        cudnn_cache.save(cache_file)
        result["entries"] = cudnn_cache.size()
        return
    started = time.perf_counter()
    if mode == "local":
        cudnn_cache.load(cache_file)
    else:
        cudnn_cache.set_remote(url)
        cudnn_cache.pull_remote()
    result["entries_s"] = time.perf_counter() - started
    cudnn_cache.prepare()
    result["prepare_s"] = time.perf_counter() - started - result["entries_s"]
    model(x).sum().backward()
    torch.cuda.synchronize()
    result.update(warm_start_s=time.perf_counter() - started, entries=cudnn_cache.size(),
                  tunes=cudnn_cache.stats()["tunes"])


def gpu_case(folder: pathlib.Path) -> dict:
    def run(mode: str, url: str) -> dict:
        result = run_subprocess(case_command("remote", "--case", f"{mode}:{url}", "--cache-file",
                                             folder / "resnet50.cache"), 600, child_env())
        if "error" in result:
            raise RuntimeError(f"warm start ({mode}): {result['error']}")
        return result

    with RedisServer(folder / "gpu") as server:
        tuned = run("tune", server.url)
        rounds: Dict[str, List[dict]] = {"local": [], "remote": []}
        for _ in range(ROUNDS):
            for mode in rounds:
                rounds[mode].append(run(mode, server.url))
    result = {"workload": "ResNet-50 fp32 bs32", "entries": tuned["entries"], "rounds": rounds}
    for mode, runs in rounds.items():
        result[mode] = {"warm_start_ms": statistics.median(1e3 * r["warm_start_s"] for r in runs),
                        "entries_ms": statistics.median(1e3 * r["entries_s"] for r in runs),
                        "tunes": max(r["tunes"] for r in runs)}
    # The gap is judged on the rounds' paired differences (each round runs both modes, one after the other).
    gaps = [1e3 * (remote["warm_start_s"] - local["warm_start_s"])
            for local, remote in zip(rounds["local"], rounds["remote"])]
    result.update(gap_ms=statistics.median(gaps), gap_interval_ms=median_interval(gaps))
    return result


def report(results: dict) -> str:
    """The table of the cases that ran; sets results['all_met'] (also missed: a writer's extra entries, a warm
    start from the store that tuned)."""
    rows = remote_rows(results)
    results["all_met"] = (all(row[-1] != "missed" for row in rows) and results.get("cpu", {}).get("writers", {}).get(
        "extra", 0) == 0 and results.get("gpu", {}).get("remote", {}).get("tunes", 0) == 0)
    return "\n".join([f"Remote store bench, {results['environment']['date']}, {results['environment']['machine']}, "
                      f"redis-server {results['environment']['redis']}.", ""] +
                     table(["case", "measured", "target", "verdict"], rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "remote.json")
    parser.add_argument("--gpu", action="store_true", help="the warm start from the remote store instead (CUDA GPU)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--cache-file", help=argparse.SUPPRESS)
    args = parse(parser, argv)
    if args.case:
        mode, _, url = args.case.partition(":")
        return run_case(lambda result: warm_start(mode, args.cache_file, url, result), {"mode": mode})
    if REDIS_SERVER is None:
        print("remote: redis-server is not installed (scripts/install_deps.sh installs it)", file=sys.stderr)
        return 2
    if args.gpu and no_gpu("cuda", "remote --gpu"):
        return 2
    import torch

    version = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True).stdout.split()
    results = {"environment": {"date": time.strftime("%Y-%m-%d"),
                               "redis": version[2].removeprefix("v=") if len(version) > 2 else "?",
                               "machine": torch.cuda.get_device_name() if args.gpu else
                               f"{platform.machine()} CPU, {os.cpu_count()} cores"}, "targets": TARGETS}
    with tempfile.TemporaryDirectory(prefix="bench_remote_") as folder:
        results["gpu" if args.gpu else "cpu"] = (gpu_case if args.gpu else cpu_cases)(pathlib.Path(folder))
    text = report(results)
    write_result(results, output_paths("remote_gpu.json" if args.gpu else "remote.json", args.output, args.update), text)
    print(text)
    return 0 if results["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
