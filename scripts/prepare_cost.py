#!/usr/bin/env python3
"""Where a warm start's prepare() time goes. Each case is a fresh process: it sets up CUDA, cuDNN and the ops
as bench.py's cases do (a tiny convolution, forward and backward), then loads a cache file and times
prepare() on N threads, then drops the plans and times prepare() again: what the second does not pay is paid
once per process (loading kernels, first uses inside cuDNN), what it pays again is the builds' own. The debug
log gives each plan's build time in both, summed per engine, and the part of it a config stored by its position
in heuristics' list spends asking cuDNN's heuristics for that list. Another fresh process times creating cuDNN
handles one after another, which a pool thread's first plan build pays for its handle. The cache file comes
from a cold bench case (bench.py --case WORKLOAD:cache_cold --cache-file FILE).

    python3 scripts/prepare_cost.py --cache-file /tmp/c.bin --threads 1 2 4 8 --handles 8 --json out.json
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

PREPARE = r"""
import json, sys, time, torch, torch.nn.functional as F
import cudnn_cache
path, threads = sys.argv[1], int(sys.argv[2])
x = torch.rand(1, 1, 5, 5, device="cuda", requires_grad=True)
w = torch.rand(1, 1, 2, 2, device="cuda")
F.conv2d(x, w).sum().backward()
cudnn_cache.set_miss_policy("heuristic")
cudnn_cache.functional.conv2d(x, w).sum().backward()
torch.cuda.synchronize()
started = time.perf_counter()
entries = cudnn_cache.load(path)
loaded = time.perf_counter()
cudnn_cache.set_log_level("debug")  # each plan's build time, on stderr
print("== prepare", file=sys.stderr, flush=True)
plans = cudnn_cache.prepare(threads=threads)
prepared = time.perf_counter()
limit = cudnn_cache.plan_cache_limit()
cudnn_cache.set_plan_cache_limit(1)  # drops the plans (a sweep keeps 90% of the limit), not the entries
cudnn_cache.set_plan_cache_limit(limit)
print("== again", file=sys.stderr, flush=True)
started_again = time.perf_counter()
again = cudnn_cache.prepare(threads=threads)
prepared_again = time.perf_counter()
cudnn_cache.set_log_level("off")
print(json.dumps({"threads": threads, "entries": entries, "plans": plans, "load_s": loaded - started,
                  "prepare_s": prepared - loaded, "plans_again": again,
                  "prepare_again_s": prepared_again - started_again}))
"""

PLAN_BUILT = re.compile(r"plan built in ([0-9.]+) ms(?: \(([0-9.]+) ms of it heuristics' list\))?: engine (-?[0-9]+)")

HANDLES = r"""
import ctypes, glob, json, os, sys, time, torch
import nvidia.cudnn
count = int(sys.argv[1])
torch.zeros(1, device="cuda")
library = ctypes.CDLL(glob.glob(os.path.join(list(nvidia.cudnn.__path__)[0], "lib", "libcudnn.so.*"))[0])
times = []
for _ in range(count):
    handle = ctypes.c_void_p()
    started = time.perf_counter()
    status = library.cudnnCreate(ctypes.byref(handle))
    times.append(time.perf_counter() - started)
    assert status == 0, f"cudnnCreate returned {status}"
print(json.dumps({"handles": count, "create_s": times}))
"""


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan_times(log: str) -> dict:
    """From a PREPARE child's stderr: per phase ('prepare', 'again'), each engine's plans built, their build time
    summed and the part of it spent asking heuristics for their list (configs stored by their position in it),
    {engine: [count, ms, heuristics_ms]}, the slowest engine first."""
    phases, phase = {}, None
    for line in log.splitlines():
        if line.startswith("== "):
            phase = phases.setdefault(line[3:].strip(), {})
            continue
        found = PLAN_BUILT.search(line)
        if found and phase is not None:
            totals = phase.setdefault(found[3], [0, 0.0, 0.0])
            totals[0] += 1
            totals[1] += float(found[1])
            totals[2] += float(found[2] or 0.0)
    return {name: dict(sorted(engines.items(), key=lambda item: -item[1][1])) for name, engines in phases.items()}


def child(script: str, *args: str) -> dict:
    # `import cudnn_cache` from the source checkout (ops in build/), as bench.py's cases do.
    path = os.pathsep.join(filter(None, [os.path.join(ROOT, "torch_ops"), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=path))
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if script is PREPARE:
        result["plan_ms_by_engine"] = plan_times(done.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-file", required=True, help="a cache file from a cold case")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8], help="prepare()'s thread counts")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per thread count")
    parser.add_argument("--handles", type=int, default=8, help="cuDNN handles to create, one after another")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    result = {"prepare": {}, "handles": child(HANDLES, str(args.handles))}
    for _ in range(args.repeats):  # interleaved: each round runs every thread count once
        for threads in args.threads:
            result["prepare"].setdefault(str(threads), []).append(child(PREPARE, args.cache_file, str(threads)))
    print(f"cudnnCreate, one after another: {', '.join(f'{1e3 * s:.1f}' for s in result['handles']['create_s'])} ms")
    print("threads | entries | plans | prepare (median, min-max) | again, the plans dropped (median, min-max)")
    for threads, runs in result["prepare"].items():
        times = [1e3 * run["prepare_s"] for run in runs]
        again = [1e3 * run["prepare_again_s"] for run in runs]
        print(f"{threads:>7} | {runs[0]['entries']:>7} | {runs[0]['plans']:>5} | {statistics.median(times):.0f} ms "
              f"({min(times):.0f}-{max(times):.0f}) | {statistics.median(again):.0f} ms "
              f"({min(again):.0f}-{max(again):.0f})")
    first = next(iter(result["prepare"].values()))[0]["plan_ms_by_engine"]
    for phase, engines in first.items():  # the first process's: which engines' builds take the time
        print(f"{phase}: plan builds per engine (count, ms, of it heuristics' list ms): "
              + ", ".join(f"{engine}: {count}, {ms:.1f}, {listing:.1f}"
                          for engine, (count, ms, listing) in list(engines.items())[:8]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
