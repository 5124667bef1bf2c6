"""python3 -m benchmarks SUBCOMMAND [options]: every benchmark of cudnn_cache against native PyTorch.

Each subcommand is a module of this package with its own options (`python3 -m benchmarks SUBCOMMAND --help`); it
writes bench-results/NAME.json, and benchmarks/results/NAME.json too with --update (benchmarks/__init__.py).
"""

import importlib
import sys

SUBCOMMANDS = {  # name -> (module, what it measures)
    "models": ("models", "whole models, cold / warm / steady / host cost, each mode in a fresh process"),
    "dynamic": ("dynamic", "training whose input shapes keep changing; --memory: memory over 1,000 shapes"),
    "distributed": ("distributed", "tuning split over N GPUs with cudnn_cache.distributed.sync()"),
    "remote": ("remote", "the Redis store: push, pull, concurrent writers; --gpu: warm start from it"),
    "core": ("core", "the C++ core's micro-benchmarks (Google Benchmark) against their targets"),
    "real-workloads": ("real_workloads", "real training workloads, native and cudnn_cache side by side"),
    "host-cost": ("host_cost", "host time per call against native, per convolution and direction"),
    "compare-kernels": ("compare_kernels", "the kernels one convolution runs natively and through the cache"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = "usage: python3 -m benchmarks SUBCOMMAND [options]\n\nsubcommands:\n" + "".join(
        f"  {name:<16} {what}\n" for name, (_, what) in SUBCOMMANDS.items())
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + usage, end="")
        return 0 if argv else 2
    if argv[0] not in SUBCOMMANDS:
        sys.stderr.write(usage + f"\nbenchmarks: unknown subcommand {argv[0]!r}\n")
        return 2
    sys.argv[0] = f"python3 -m benchmarks {argv[0]}"  # argparse's prog in usage and errors
    return importlib.import_module(f"benchmarks.{SUBCOMMANDS[argv[0]][0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
