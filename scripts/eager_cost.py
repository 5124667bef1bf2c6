#!/usr/bin/env python3
"""Where the eager training path's host time goes: the bench's overhead micro case (forward + backward of a
16 -> 16 3x3 convolution, as scripts/bench.py times it) split into its parts, natively, through the cache's op
(as a converted module calls it) and under intercept, with a choice of which thread's cuDNN handle built the
execution plans the cache runs.

scripts/host_cost.py times each direction's call in a TorchScript loop on one thread; a training step also
runs its backward on autograd's device thread. On an H200 (2026-12-03) the parts summed to about +4 us per
iteration under intercept (forward +1.1, the backward called directly +3.9), while the training iteration
itself was +13 us, on both cache paths: the rest appears only when autograd runs the backward. Every part is
timed per round in an order drawn anew each round (bench_cases.in_turn), --calls calls per round with no
synchronize between them, and is reported as host time per call before the round's final synchronize, median
[95%], with each cache way's paired difference from native's:

    forward           the forward alone, no grad
    forward_grad      the forward with input and weight requiring grad (autograd records its node)
    backward          aten::convolution_backward called directly on this thread (both gradients), no autograd
    train             torch.autograd.grad of the forward: its backward on autograd's device thread

--plans says which handle built the plans the cache ways run (each choice in a process of its own: plans are
process-wide): 'search' as the tuning left them (the forward and the direct backward tune on this thread, so
the backward keys' plans are this thread's, as in a process whose first backward ran on it); 'main' dropped
after tuning and built again by a forward and a direct backward on this thread; 'autograd' dropped and built
again by one training iteration (the backward keys' on autograd's device thread, where training runs them);
'pool' dropped and built again by cudnn_cache.prepare() on its pool's handles, as in a warm process. PyTorch
builds each plan on the handle of the thread that runs it (its plan caches are thread-local).

--tuning NAME=VALUE sets cudnn_cache.set_tuning_options before the keys are tuned, as bench.py's does. With
`--tuning max_candidates=1 mode_b_candidates=0 knob_variants=0 finalists=0` each key stores heuristics' first
config, the plan native runs, so the cache ways run native's kernels: what is left of their difference from
native is the cache's path, not the kernels' launch cost.

--api adds, per part and way, what torch.profiler records per call in one profiled round after the timed ones:
each operator's and each CUDA runtime or driver call's count and self CPU time, shown where a cache way's count
differs from native's or among the largest times (a host cost inside cuDNN shows as calls native does not
make, or as the same calls taking longer).

    python3 scripts/eager_cost.py --plans autograd --json /tmp/eager_cost.json
    python3 scripts/eager_cost.py --api
    python3 scripts/eager_cost.py --tuning max_candidates=1 mode_b_candidates=0 knob_variants=0 finalists=0

Needs a CUDA GPU for figures that mean anything; --device cpu runs the same code as a smoke test (intercept
takes nothing there, and there are no plans).
"""

import argparse
import json
import pathlib
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "torch_ops"))  # `import cudnn_cache` from the source checkout (ops in build/)

from bench_cases import (TRAIN_INPUT, TRAIN_WEIGHT, device_of, drop_plans, in_turn,  # noqa: E402
                         initialise_libraries, profile_each_step, synchronize, tuning_arguments)
from bench_stats import median_interval  # noqa: E402

PARTS = ("forward", "forward_grad", "backward", "train")
WAYS = ("native", "op", "intercept")
CACHE_WAYS = ("op", "intercept")  # each reported against native
PLANS = ("search", "main", "autograd", "pool")
SHOWN = 16  # rows per part of the --api table


def parts_of(device: torch.device, calls: int) -> Dict[str, Dict[str, Callable[[], None]]]:
    """Per part and way, a round of `calls` calls."""
    import cudnn_cache

    x = torch.rand(*TRAIN_INPUT, device=device, requires_grad=True)
    w = torch.rand(*TRAIN_WEIGHT, device=device, requires_grad=True)
    grad = torch.ones(TRAIN_INPUT[0], TRAIN_WEIGHT[0], *TRAIN_INPUT[2:], device=device)
    x0, w0 = x.detach(), w.detach()
    op = cudnn_cache.functional.convolution_call  # as converted modules call it (Note [Eager calls])
    backward_op = torch.ops.aten.convolution_backward.default

    def native(a, b):
        return F.conv2d(a, b, padding=1)

    def through_op(a, b):
        return op(a, b, None, [1, 1], [1, 1], [1, 1], 1)

    def forward(convolution):
        def calls_():
            with torch.no_grad():
                for _ in range(calls):
                    convolution(x0, w0)
        return calls_

    def forward_grad(convolution):
        def calls_():
            for _ in range(calls):
                convolution(x, w)
        return calls_

    def backward_native():  # what ConvolutionBackward0 calls; under intercept, the cache's kernel
        for _ in range(calls):
            backward_op(grad, x0, w0, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])

    def backward_op_():  # what the op's backward node calls
        for _ in range(calls):
            torch.ops.cudnn_cache._convolution_backward(grad, x0, w0, [1, 1], [1, 1], [1, 1], 1)

    def train(convolution):
        def calls_():
            for _ in range(calls):
                torch.autograd.grad(convolution(x, w), (x, w), grad)
        return calls_

    return {"forward": {"native": forward(native), "op": forward(through_op), "intercept": forward(native)},
            "forward_grad": {"native": forward_grad(native), "op": forward_grad(through_op),
                             "intercept": forward_grad(native)},
            "backward": {"native": backward_native, "op": backward_op_, "intercept": backward_native},
            "train": {"native": train(native), "op": train(through_op), "intercept": train(native)}}


def rebuild_plans(cache, plans: str, parts) -> int:
    """Drops the plans kept after tuning and builds them again as --plans says; returns the plans prepare() made
    ready ('pool'), else 0."""
    if plans == "search":
        return 0
    drop_plans(cache)
    if plans == "pool":
        return cache.prepare()
    first = ("forward", "backward") if plans == "main" else ("train",)
    for part in first:
        for way in CACHE_WAYS:
            cache.intercept(way == "intercept")
            parts[part][way]()
            cache.intercept(False)
    return 0


def api_calls(device: torch.device, calls: int, round_of_calls: Callable[[], None]) -> Dict[str, dict]:
    """Per event torch.profiler records in one profiled round (operators, CUDA runtime and driver calls): its
    count and self CPU time, each per call of the round."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    [events] = profile_each_step(round_of_calls, device, 1, activities, lambda profiler: {
        event.key: {"calls": event.count / calls, "self_us": event.self_cpu_time_total / calls}
        for event in profiler.key_averages()})
    return events


def measure(device: torch.device, rounds: int, calls: int, plans: str, api: bool = False,
            tuning: Optional[Dict[str, object]] = None) -> dict:
    import cudnn_cache

    torch.backends.cudnn.benchmark = False
    initialise_libraries(device, cudnn_cache)
    cudnn_cache.set_tuning_options(**(tuning or {}))
    parts = parts_of(device, calls)

    def timed(part: str, way: str) -> float:
        cudnn_cache.intercept(way == "intercept")
        synchronize(device)
        started = time.perf_counter()
        parts[part][way]()
        queued = time.perf_counter()
        synchronize(device)
        cudnn_cache.intercept(False)
        return 1e6 * (queued - started) / calls

    cudnn_cache.set_miss_policy("tune")
    for part in PARTS:  # tunes every key, in this order (see --plans 'search'), and warms native up
        for way in WAYS:
            timed(part, way)
    cudnn_cache.set_miss_policy("error")
    prepared = rebuild_plans(cudnn_cache, plans, parts)
    cudnn_cache.reset_stats()
    times: Dict[str, List[float]] = {f"{part} {way}": [] for part in PARTS for way in WAYS}
    for round_index in range(rounds):
        for row in in_turn(list(times), round_index):
            times[row].append(timed(*row.split()))
    result = {"device": str(device), "rounds": rounds, "calls": calls, "plans": plans, "plans_prepared": prepared,
              "tuning": cudnn_cache.tuning_options(),
              "input": list(TRAIN_INPUT), "weight": list(TRAIN_WEIGHT), "parts": {}, "stats": cudnn_cache.stats()}
    for part in PARTS:
        native = times[f"{part} native"]
        entry = {"native_us": median_interval(native)}
        for way in CACHE_WAYS:
            mine = times[f"{part} {way}"]
            entry[f"{way}_us"] = median_interval(mine)
            entry[f"{way}_minus_native_us"] = median_interval([a - b for a, b in zip(mine, native)])
        result["parts"][part] = entry
    if api:
        result["api"] = {part: {way: api_calls(device, calls, lambda: timed(part, way)) for way in WAYS}
                         for part in PARTS}
    return result


def table(result: dict) -> str:
    def cell(figure: dict, sign: str = "") -> str:
        return f"{figure['median']:{sign}.1f} [{figure['lo']:{sign}.1f}, {figure['hi']:{sign}.1f}] us"

    lines = ["| part | native | op | op − native | intercept | intercept − native |", "|---|---|---|---|---|---|"]
    for part, entry in result["parts"].items():
        lines.append(f"| {part} | {cell(entry['native_us'])} | {cell(entry['op_us'])} | "
                     f"{cell(entry['op_minus_native_us'], '+')} | {cell(entry['intercept_us'])} | "
                     f"{cell(entry['intercept_minus_native_us'], '+')} |")
    return "\n".join(lines)


def api_table(api: Dict[str, Dict[str, Dict[str, dict]]]) -> str:
    """Per part, the events whose count per call differs between native and a cache way (CUDA calls first), then
    the largest self times, up to SHOWN rows: calls and self CPU time per call, each way."""
    lines = []
    for part, ways in api.items():
        names = set().union(*(ways[way] for way in WAYS))

        def figure(way: str, name: str, what: str) -> float:
            return ways[way].get(name, {}).get(what, 0.0)

        # CUDA runtime and driver calls first: the operators' names differ between the ways by design.
        differing = sorted((name for name in names if any(
            abs(figure(way, name, "calls") - figure("native", name, "calls")) >= 0.5 for way in CACHE_WAYS)),
            key=lambda name: (not name.startswith("cu"), -max(figure(way, name, "self_us") for way in WAYS)))
        largest = sorted(names - set(differing), key=lambda name: -max(figure(way, name, "self_us") for way in WAYS))
        lines += ["", f"{part}: per call, calls and self CPU time", "",
                  "| event | " + " | ".join(WAYS) + " |", "|---|" + "---|" * len(WAYS)]
        for name in (differing + largest)[:SHOWN]:
            cells = " | ".join(f"{figure(way, name, 'calls'):.1f}, {figure(way, name, 'self_us'):.1f} us"
                               for way in WAYS)
            lines.append(f"| {name[:60]}{' (count differs)' if name in differing else ''} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="interleaved rounds (default 200; at least 6)")
    parser.add_argument("--calls", type=int, default=50, help="calls per round (default 50)")
    parser.add_argument("--plans", choices=PLANS, default="search",
                        help="which handle built the plans the cache ways run (default: as the tuning left them)")
    parser.add_argument("--api", action="store_true",
                        help="also each part's operators and CUDA calls per call, from one profiled round per way")
    parser.add_argument("--tuning", nargs="*", default=[], metavar="NAME=VALUE",
                        help="cudnn_cache.set_tuning_options before tuning, e.g. max_candidates=1 (see the docstring)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    device = device_of(parser, args, "eager_cost")
    if device is None:
        return 2
    if args.plans != "search" and device.type != "cuda":
        parser.error(f"--plans {args.plans} needs a CUDA device: execution plans are the GPU path's")
    tuning = tuning_arguments(args.tuning, parser.error)
    result = measure(device, args.rounds, args.calls, args.plans, args.api, tuning)
    print(f"eager training path, {args.rounds} rounds of {args.calls} calls, {device}, plans: {args.plans} "
          f"({result['plans_prepared']} prepared)\n")
    print(table(result))
    if args.api:
        print(api_table(result["api"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
