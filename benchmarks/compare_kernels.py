#!/usr/bin/env python3
"""One convolution, natively and through the cache: which kernels each runs, and for how long.

When a network is slower through cudnn_cache than natively, this tells which layer and which direction: it
runs one convolution (forward, then forward + backward) with native benchmark=False, native benchmark=True
and cudnn_cache (tuned first, then intercepting PyTorch's call), each warmed up, and prints the CUDA kernels
torch.profiler records per call with their mean times, plus cudnn_cache.audit() for the cache's entries. The
tunings and the audit run before anything is profiled.

    python3 scripts/compare_kernels.py --input 32,3,224,224 --weight 64,3,7,7 --stride 2 --padding 3
    python3 scripts/compare_kernels.py --input 64,256,56,56 --weight 64,256,1,1 --dtype bfloat16 --channels-last

Writes JSON to --output (default: stdout only). Needs a CUDA GPU.
"""

import argparse
import json
import sys
from typing import Dict, List

import torch
import torch.nn.functional as F

from bench_cases import add_convolution_arguments, check_convolution, convolution_operands

CALLS = 20


def kernels(call, calls: int = CALLS) -> List[Dict]:
    """The CUDA kernels of `calls` calls, per call: name, launches and microseconds."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = [e for e in profiler.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [{"kernel": e.key[:140], "launches": e.count / calls, "us": e.self_device_time_total / calls}
            for e in events]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_convolution_arguments(parser)
    parser.add_argument("--output", help="write the JSON report here too")
    args = parser.parse_args(argv)
    check_convolution(args, parser.error)
    if not torch.cuda.is_available():
        print("compare_kernels: no CUDA GPU is visible; this compares cuDNN kernels and needs one", file=sys.stderr)
        return 2
    import cudnn_cache

    x, w = convolution_operands(args)
    x.requires_grad_()
    w.requires_grad_()
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    options = dict(stride=args.stride, padding=args.padding, dilation=args.dilation, groups=args.groups)

    def forward():
        with torch.no_grad():
            conv(x, w, **options)

    def training():
        conv(x, w, **options).sum().backward()

    report = {"problem": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "modes": {}}
    # Everything that times (cudnn_cache's search and audit, native benchmark mode's first calls) before the
    # first profiler session, which may leave CUPTI attached (Note [Profiling last] in bench_cases.py).
    cudnn_cache.intercept(True)
    training()  # tunes the three directions
    report["audit"] = cudnn_cache.audit()
    cudnn_cache.intercept(False)
    torch.backends.cudnn.benchmark = True
    forward()  # native benchmark mode times its candidates for each direction at its first call
    training()
    for mode, benchmark, intercept in (("native_heuristic", False, False), ("native_benchmark", True, False),
                                       ("cudnn_cache", False, True)):
        torch.backends.cudnn.benchmark = benchmark
        cudnn_cache.intercept(intercept)
        report["modes"][mode] = {"forward": kernels(forward), "forward_backward": kernels(training)}
    torch.backends.cudnn.benchmark = False
    cudnn_cache.intercept(False)

    for mode, runs in report["modes"].items():
        for run, rows in runs.items():
            total = sum(row["us"] for row in rows)
            print(f"\n{mode} {run}: {total:.1f} us per call")
            for row in rows:
                print(f"  {row['us']:9.1f} us  x{row['launches']:.0f}  {row['kernel']}")
    for row in report["audit"]:
        print(f"\naudit {row['direction']}: stored {row['stored_ms']:.4f} ms ({row['stored_engine']}); heuristic "
              f"{row['heuristic_ms']:.4f} ms ({row['heuristic_engine']}); benchmark {row['benchmark_ms']:.4f} ms "
              f"({row['benchmark_engine']})")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
