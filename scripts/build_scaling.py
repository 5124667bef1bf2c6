#!/usr/bin/env python3
"""Whether cuDNN's runtime compilations run at once: on threads of one process, and in separate processes.

Depthwise and inverted-bottleneck networks in bf16/fp16 are tuned slowly because most of their candidates are
engines cuDNN compiles at run time (NVRTC, 50-250 ms each). A search builds those on worker threads while it
times the ones built (Note [Parallel candidate builds] in extension/src/graph_search.cpp); on MobileNetV2 that
measured no faster than building them one after another (docs/PERFORMANCE.md), as if cuDNN compiled one at a
time per process. This measures where compilations overlap, to decide where candidates should be built. It
tunes --keys distinct depthwise 5x5 convolutions (bf16, channels_last, forward only; each a search of the
default options, most of its candidates compiled at run time) four ways:

    serial     one process, build_threads=1, build_processes=0: every candidate built on the thread that times
    threads    one process, build_threads=0, build_processes=0: compiled candidates also built on worker threads
    processes  --processes processes at once, build_threads=1, build_processes=0, the keys dealt out among them
    builders   one process, build_processes=--processes: compiled candidates built in builder processes (Note
               [Builder processes] in extension/src/plan_builders.h), restored and timed in the one process

Every process imports torch and sets up CUDA, cuDNN and the ops first, then waits for a common start; the
figure is the time from that start until the last process has tuned its keys, with the cache counters' tuning
time summed over the processes beside it. Each way's keys are new to its processes (another batch size per
way), so nothing is shared through the GPU driver's caches. Prints a table; --json writes the figures.

    python3 scripts/build_scaling.py --keys 16 --processes 4

Needs a CUDA GPU; exits 2 without one.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time
from typing import Dict, List, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Channel counts of MobileNetV2's and EfficientNet's depthwise layers and their neighbours: distinct keys.
CHANNELS = (96, 144, 192, 240, 288, 336, 384, 432, 480, 528, 576, 624, 672, 720, 768, 816, 864, 912, 960, 1008)
BATCH_OF_WAY = {"serial": 32, "threads": 48, "processes": 64, "builders": 80}  # each way's own keys


def ways(processes: int) -> List[Tuple[str, int, int, int]]:
    """Each way: its name, how many processes tune, and each one's build_threads and build_processes."""
    return [("serial", 1, 1, 0), ("threads", 1, 0, 0), ("processes", processes, 1, 0), ("builders", 1, 1, processes)]


def child(channels: List[int], batch: int, build_threads: int, build_processes: int) -> None:
    """Sets up, says 'ready', waits for a line on stdin, tunes one forward convolution per channel count and
    prints its figures as JSON."""
    sys.path.insert(0, str(ROOT / "torch_ops"))
    sys.path.insert(0, str(ROOT / "scripts"))
    import torch

    import cudnn_cache
    from bench_cases import initialise_libraries

    device = torch.device("cuda")
    initialise_libraries(device, cudnn_cache)
    cudnn_cache.set_tuning_options(build_threads=build_threads, build_processes=build_processes)
    cudnn_cache.set_miss_policy("tune")
    operands = []
    for c in channels:
        x = torch.randn(batch, c, 14, 14, device=device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.randn(c, 1, 5, 5, device=device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        operands.append((x, w, c))
    torch.cuda.synchronize()
    cudnn_cache.reset_stats()
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.time()
    for x, w, c in operands:
        cudnn_cache.functional.conv2d(x, w, padding=2, groups=c)
    torch.cuda.synchronize()
    ended = time.time()
    stats = cudnn_cache.stats()
    print(json.dumps({"started": started, "ended": ended, "tunes": stats["tunes"], "tune_s": stats["tune_us"] / 1e6}),
          flush=True)


def run_way(name: str, keys: List[int], processes: int, build_threads: int, build_processes: int,
            timeout: float) -> Dict:
    """Runs one way: `processes` children, the keys dealt out round-robin, started together."""
    dealt = [keys[i::processes] for i in range(processes)]
    children = [subprocess.Popen([sys.executable, __file__, "--child", ",".join(map(str, part)),
                                  "--batch", str(BATCH_OF_WAY[name]), "--build-threads", str(build_threads),
                                  "--build-processes", str(build_processes)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for part in dealt]
    for process in children:
        line = process.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"build_scaling.py: a child of way {name!r} failed before tuning (said {line!r})")
    for process in children:
        process.stdin.write("go\n")
        process.stdin.flush()
    results = []
    for process in children:
        out, _ = process.communicate(timeout=timeout)
        if process.returncode != 0:
            raise SystemExit(f"build_scaling.py: a child of way {name!r} exited with {process.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    span = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"way": name, "processes": processes, "build_threads": build_threads, "build_processes": build_processes,
            "keys": len(keys),
            "tunes": sum(r["tunes"] for r in results), "wall_s": span,
            "tune_s_summed": sum(r["tune_s"] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=16, help=f"depthwise keys per way (at most {len(CHANNELS)})")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes of the 'processes' way, builder processes of the 'builders' way (default 4)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a way may take (default 300)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--build-threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--build-processes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child([int(c) for c in args.child.split(",")], args.batch, args.build_threads, args.build_processes)
        return 0
    if not 1 <= args.keys <= len(CHANNELS):
        parser.error(f"--keys must be between 1 and {len(CHANNELS)}")
    if not 1 <= args.processes <= args.keys:
        parser.error("--processes must be between 1 and --keys")
    import torch

    if not torch.cuda.is_available():
        print("build_scaling.py: no CUDA GPU: it times cuDNN's compilations on one", file=sys.stderr)
        return 2
    keys = list(CHANNELS[:args.keys])
    rows = [run_way(name, keys, processes, threads, builders, args.timeout)
            for name, processes, threads, builders in ways(args.processes)]
    serial = rows[0]["wall_s"]
    print(f"{args.keys} depthwise 5x5 bf16 channels_last keys, forward, tuned with the default search options; "
          f"{torch.cuda.get_device_name()}")
    print("| way | processes | build_threads | build_processes | searches | wall | / serial | tuning time summed over "
          "processes |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['way']} | {row['processes']} | {row['build_threads'] or 'cores'} | {row['build_processes']} | "
              f"{row['tunes']} | {row['wall_s']:.2f} s | {row['wall_s'] / serial:.2f} | {row['tune_s_summed']:.2f} s |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                                      indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
