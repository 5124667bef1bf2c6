"""Remote store benchmark (issue 18): cudnn_cache's Redis layer against a redis-server of its own on loopback.

CPU cases (no GPU needed), on a file of 10,000 synthetic entries:

    push_new        the file's entries pushed to an empty server (each merged on the server: WATCH/MULTI)
    push_again      the same push again: no news, nothing written
    pull            the 10,000 entries pulled and checked, median of 7 (target: <= 100 ms)
    writers         16 processes push 1,000 entries each at once, half disjoint, half the same keys with other
                    measurements; then the pull is compared with `cudnn_cache merge` of the 16 files (target: 0
                    lost, every entry the fastest written)

GPU case (--gpu, needs a CUDA GPU): the warm start of a fresh process (import, then its entries, prepare(),
the first training step) of ResNet-50 fp32 batch 32, from a local file (cudnn_cache.load) and from the remote
alone (an empty local file; cudnn_cache.pull_remote), 7 rounds of each, interleaved, each in its own process
(target: from the remote within 50 ms of from the local file, the median of the rounds' paired differences).

    python3 -m benchmarks remote                  # CPU cases: about a minute
    python3 -m benchmarks remote --gpu            # and the warm start (about four minutes more, on a GPU)

Writes bench-results/remote.json (with --gpu remote_gpu.json; --json to move it, --update to write
benchmarks/results/ too) and the table beside it (.md). Exit codes: 0 every case ran and
every target was met; 1 a case failed or a target was missed; 2 bad arguments, no redis-server, or --gpu without a GPU.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

from benchmarks import ROOT, output_paths, write_result
from benchmarks.stats import median_interval

sys.path.insert(0, str(ROOT / "scripts"))
from redis_server import REDIS_SERVER, RedisServer  # noqa: E402  (the tests' server too)

ENTRIES, WRITERS, WRITER_ENTRIES, PULLS, ROUNDS = 10000, 16, 1000, 7, 7
TARGETS = {"pull_ms": 100.0, "writers_lost": 0, "warm_start_gap_ms": 50.0}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cudnn_cache", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=child_env())
    if check and done.returncode != 0:
        raise RuntimeError(f"cudnn_cache {' '.join(map(str, args))}: {done.stderr.strip()}")
    return done


def child_env() -> dict:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = ":".join(filter(None, [str(ROOT / "torch_ops"), env.get("PYTHONPATH")]))
    return env


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


def writer_scale(writer: int) -> Callable[[int], float]:
    """Writer `writer`'s measurements of the shared keys: 0.5x to 2.0x the first's, by entry and writer."""
    return lambda index: 0.5 + ((index * 7 + writer * 3) % 16) / 10


def concurrent_writers(folder: pathlib.Path, url: str) -> dict:
    """WRITERS processes push WRITER_ENTRIES entries each to the store at `url` at once: the odd ones entries of
    their own, the even ones the same keys with other measurements. Then the store's content is compared with
    `cudnn_cache merge` of their files: entries lost, extra, and not the fastest written."""
    shared = folder / "shared.cache"
    cli("synth", shared, "--entries", WRITER_ENTRIES, "--seed", 7)
    files = []
    for writer in range(WRITERS):
        path = folder / f"writer{writer}.cache"
        if writer % 2:
            cli("synth", path, "--entries", WRITER_ENTRIES, "--seed", 100 + writer)
        else:
            scaled_copy(shared, path, writer_scale(writer))
        files.append(path)
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-m", "cudnn_cache", "remote", "push", str(path), url, "--json",
                                   "--timeout", "30"], env=child_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for path in files]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"a writer failed: {err.strip()}")
        reports.append(json.loads(out))
    seconds = time.perf_counter() - started
    cli("merge", *files, "-o", folder / "merged.cache")
    cli("remote", "pull", url, "-o", folder / "pulled.cache")
    diff = cli("diff", folder / "merged.cache", folder / "pulled.cache", check=False)
    lost, extra, not_fastest = (sum(line.startswith(marker) for line in diff.stdout.splitlines())
                                for marker in ("< ", "> ", "! "))
    return {"writers": WRITERS, "entries_each": WRITER_ENTRIES, "seconds": seconds,
            "retries": sum(r["retries"] for r in reports), "stored": sum(r["stored"] for r in reports),
            "lost": lost, "extra": extra, "not_fastest": not_fastest,
            "pulled_summary": cli("validate", folder / "pulled.cache").stdout.strip()}


def cpu_cases(folder: pathlib.Path) -> Dict[str, dict]:
    import cudnn_cache  # noqa: F401  (the ops)
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
        results["pull"] = {"ms": median_interval(pulls) if len(pulls) >= 6 else None, "samples_ms": pulls,
                           "entries": report.entries, "refused": len(report.refused)}

    with RedisServer(folder / "writers") as server:
        results["writers"] = concurrent_writers(folder, server.url)
    return results


# The GPU case: one process per warm start.
WARM_START = r"""
import json, sys, time
started = time.perf_counter()
import torch, torchvision, cudnn_cache
mode, cache_file, url = sys.argv[1:4]
device = torch.device("cuda")
model = torchvision.models.resnet50().to(device).train()
x = torch.randn(32, 3, 224, 224, device=device)
torch.cuda.synchronize()
setup = time.perf_counter() - started
cudnn_cache.set_miss_policy("tune")
cudnn_cache.intercept(True)
if mode == "tune":
    model(x).sum().backward()
    cudnn_cache.set_remote(url)
    cudnn_cache.save(cache_file)
    print(json.dumps({"entries": cudnn_cache.size()}))
    sys.exit(0)
started = time.perf_counter()
if mode == "local":
    cudnn_cache.load(cache_file)
else:
    cudnn_cache.set_remote(url)
    cudnn_cache.pull_remote()
entries = time.perf_counter() - started
cudnn_cache.prepare()
prepared = time.perf_counter() - started
model(x).sum().backward()
torch.cuda.synchronize()
first = time.perf_counter() - started
stats = cudnn_cache.stats()
print(json.dumps({"setup_s": setup, "entries_s": entries, "prepare_s": prepared - entries,
                  "warm_start_s": first, "entries": cudnn_cache.size(), "tunes": stats["tunes"]}))
"""


def gpu_case(folder: pathlib.Path) -> dict:
    def run(mode: str, cache_file: pathlib.Path, url: str) -> dict:
        done = subprocess.run([sys.executable, "-c", WARM_START, mode, str(cache_file), url], capture_output=True,
                              text=True, timeout=600, env=child_env())
        if done.returncode != 0:
            raise RuntimeError(f"warm start ({mode}): {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    with RedisServer(folder / "gpu") as server:
        cache_file = folder / "resnet50.cache"
        tuned = run("tune", cache_file, server.url)
        rounds: Dict[str, List[dict]] = {"local": [], "remote": []}
        for _ in range(ROUNDS):
            for mode in rounds:
                rounds[mode].append(run(mode, cache_file, server.url))
    result = {"workload": "ResNet-50 fp32 bs32", "entries": tuned["entries"], "rounds": rounds}
    for mode, runs in rounds.items():
        result[mode] = {"warm_start_ms": statistics.median(1e3 * r["warm_start_s"] for r in runs),
                        "entries_ms": statistics.median(1e3 * r["entries_s"] for r in runs),
                        "tunes": max(r["tunes"] for r in runs)}
    # The gap is judged on the rounds' paired differences (each round runs both modes, one after the other).
    gaps = [1e3 * (remote["warm_start_s"] - local["warm_start_s"]) for local, remote in zip(rounds["local"],
                                                                                          rounds["remote"])]
    result["gap_ms"] = statistics.median(gaps)
    result["gap_interval_ms"] = median_interval(gaps) if len(gaps) >= 6 else None
    return result


def gap_interval(gpu: dict) -> str:
    interval = gpu.get("gap_interval_ms")
    return f" [{interval['lo']:+.0f}, {interval['hi']:+.0f}]" if interval else ""


def report(results: dict) -> str:
    lines = [f"Remote store bench, {results['environment']['date']}, {results['environment']['machine']}, "
             f"redis-server {results['environment']['redis']}.", "",
             "| case | figure | target | verdict |", "|---|---|---|---|"]
    cpu = results.get("cpu", {})
    verdicts = []

    def row(case: str, figure: str, target: str = "", met=None) -> None:
        verdict = "" if met is None else ("met" if met else "MISSED")
        if met is not None:
            verdicts.append(met)
        lines.append(f"| {case} | {figure} | {target} | {verdict} |")

    if "push_new" in cpu:
        for case in ("push_new", "push_again"):
            r = cpu[case]
            row(f"{case} ({r['entries']} entries)", f"{r['seconds']:.2f} s: {r['stored']} stored, "
                                                     f"{r['unchanged']} unchanged")
        pull = cpu["pull"]
        median = pull["ms"]["median"] if pull["ms"] else statistics.median(pull["samples_ms"])
        interval = f" [{pull['ms']['lo']:.0f}, {pull['ms']['hi']:.0f}]" if pull["ms"] else ""
        row(f"pull ({pull['entries']} entries, {pull['refused']} refused)", f"{median:.0f} ms{interval}",
            f"<= {TARGETS['pull_ms']:.0f} ms", median <= TARGETS["pull_ms"])
        w = cpu["writers"]
        row(f"{w['writers']} writers x {w['entries_each']} entries at once",
            f"{w['seconds']:.1f} s, {w['retries']} merges retried; lost {w['lost']}, not the fastest "
            f"{w['not_fastest']}, extra {w['extra']}", "0 lost, all fastest",
            w["lost"] == w["not_fastest"] == w["extra"] == TARGETS["writers_lost"])
    gpu = results.get("gpu")
    if gpu:
        row(f"warm start, {gpu['workload']}, {gpu['entries']} entries, from the local file",
            f"{gpu['local']['warm_start_ms']:.0f} ms (entries {gpu['local']['entries_ms']:.0f} ms, "
            f"tunes {gpu['local']['tunes']})")
        row("the same from the remote store alone (empty local file)",
            f"{gpu['remote']['warm_start_ms']:.0f} ms (entries {gpu['remote']['entries_ms']:.0f} ms, tunes "
            f"{gpu['remote']['tunes']}); gap {gpu['gap_ms']:+.0f} ms{gap_interval(gpu)} (median of the rounds' paired "
            f"differences)", f"gap <= {TARGETS['warm_start_gap_ms']:.0f} ms",
            gpu["gap_ms"] <= TARGETS["warm_start_gap_ms"] and gpu["remote"]["tunes"] == 0)
    results["all_met"] = all(verdicts)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="also the warm start from the remote store (CUDA GPU)")
    parser.add_argument("--no-cpu", action="store_true", help="leave out the CPU cases")
    parser.add_argument("--json", help="the result file (default bench-results/remote.json, --gpu remote_gpu.json)")
    parser.add_argument("--update", action="store_true", help="also write the committed one in benchmarks/results/")
    args = parser.parse_args(argv)
    if REDIS_SERVER is None:
        print("remote: redis-server is not installed (scripts/install_deps.sh installs it)", file=sys.stderr)
        return 2
    import platform

    import torch

    if args.gpu and not torch.cuda.is_available():
        print("remote: --gpu needs a CUDA GPU, and none is visible", file=sys.stderr)
        return 2
    redis_version = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True).stdout.split()
    results = {"environment": {"date": time.strftime("%Y-%m-%d"), "redis": redis_version[2].removeprefix("v=") if len(redis_version) > 2
                               else "?", "machine": torch.cuda.get_device_name() if args.gpu else
                               f"{platform.machine()} CPU, {__import__('os').cpu_count()} cores"},
               "targets": TARGETS}
    with tempfile.TemporaryDirectory(prefix="bench_remote_") as folder:
        if not args.no_cpu:
            results["cpu"] = cpu_cases(pathlib.Path(folder))
        if args.gpu:
            results["gpu"] = gpu_case(pathlib.Path(folder))
    table = report(results)
    write_result(results, output_paths("remote_gpu.json" if args.gpu else "remote.json", args.json, args.update),
                 table)
    print(table)
    return 0 if results["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
