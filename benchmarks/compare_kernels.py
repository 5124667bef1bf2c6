"""One convolution, natively and through the cache: which kernels each runs, and for how long.

When a network is slower through cudnn_cache than natively, this tells which layer and which direction: it runs
one convolution (forward, then forward + backward) with native benchmark=False, native benchmark=True and
cudnn_cache (tuned first, then intercepting PyTorch's call), each warmed up, and prints the CUDA kernels
torch.profiler records per call with their mean times, plus cudnn_cache.audit() of the cache's entries. The
tunings and the audit run before anything is profiled (Note [Profiling last] in measure.py).

    python3 -m benchmarks compare-kernels --input 32,3,224,224 --weight 64,3,7,7 --stride 2 --padding 3
    python3 -m benchmarks compare-kernels --input 64,256,56,56 --weight 64,256,1,1 --dtype bfloat16 --channels-last

Writes JSON to --output (default: stdout only). Needs a CUDA GPU.
"""

import argparse
import json
import sys

import torch

from benchmarks import no_gpu

CALLS = 20
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def sizes(text: str) -> tuple:
    """'64,208,14,14' -> (64, 208, 14, 14), for argparse."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers (e.g. 64,208,14,14)")
    if any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes are not negative")
    return values


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--input", type=sizes, required=True, help="input shape N,C,spatial... (e.g. 64,208,14,14)")
    add("--weight", type=sizes, required=True, help="weight shape K,C/groups,kernel... (e.g. 208,8,3,3)")
    for name, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
        add(f"--{name}", type=sizes, default=(default,), help=f"one value per spatial dimension, or one for all "
                                                            f"(default {default})")
    add("--groups", type=int, default=1)
    add("--dtype", choices=sorted(DTYPES), default="float32")
    add("--channels-last", action="store_true", help="input and weight in channels_last")
    add("--output", help="write the JSON report here too")
    args = parser.parse_args(argv)
    spatial = len(args.input) - 2
    if spatial < 1 or len(args.weight) != len(args.input):
        parser.error(f"--input {args.input} and --weight {args.weight}: both N,C and at least one spatial size, "
                     "of the same length")
    if args.groups < 1 or args.input[1] % args.groups or args.weight[0] % args.groups or \
            args.weight[1] * args.groups != args.input[1]:
        parser.error(f"--groups {args.groups}: the input's {args.input[1]} channels must be groups x the weight's "
                     f"{args.weight[1]}, and its {args.weight[0]} outputs a multiple of groups")
    for name in ("stride", "padding", "dilation"):
        value = getattr(args, name)
        if len(value) not in (1, spatial):
            parser.error(f"--{name} {value}: one value per spatial dimension ({spatial}), or one for all")
        setattr(args, name, value * spatial if len(value) == 1 else value)
    if args.channels_last and len(args.input) not in (4, 5):
        parser.error(f"--channels-last: a 2-D or 3-D convolution's layout, not one of --input {args.input}")
    return args


def kernels(call) -> list:
    """The CUDA kernels of CALLS calls, per call: name, launches and microseconds."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    events = sorted((e for e in profiler.key_averages() if e.self_device_time_total > 0),
                    key=lambda e: e.self_device_time_total, reverse=True)
    return [{"kernel": e.key[:140], "launches": e.count / CALLS, "us": e.self_device_time_total / CALLS} for e in events]


def main(argv=None) -> int:
    args = parse_args(argv)
    if no_gpu("cuda", "compare_kernels"):
        return 2
    import cudnn_cache

    memory_format = {4: torch.channels_last, 5: torch.channels_last_3d}[len(args.input)] if args.channels_last \
        else torch.contiguous_format
    x, w = (torch.randn(shape, device="cuda", dtype=DTYPES[args.dtype]).contiguous(memory_format=memory_format)
            .requires_grad_() for shape in (args.input, args.weight))
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[x.dim()]
    options = dict(stride=args.stride, padding=args.padding, dilation=args.dilation, groups=args.groups)

    def forward():
        with torch.no_grad():
            conv(x, w, **options)

    def training():
        conv(x, w, **options).sum().backward()

    report = {"problem": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "modes": {}}
    cudnn_cache.intercept(True)  # everything that times runs before the first profiler session
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
            print(f"\n{mode} {run}: {sum(row['us'] for row in rows):.1f} us per call")
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
