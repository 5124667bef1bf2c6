"""Host time per cuDNN call, per convolution of a bench workload and per direction: natively (with cuDNN's
heuristics, and with benchmark mode's timed picks) and through the cache (the op a converted model calls, and
PyTorch's own call under intercept).

When a host-bound step is slower through cudnn_cache than natively (the models benchmark's interleaved cases say
how much), this tells which convolution and which direction pays: it records every convolution of the workload's
model (shapes, strides, dtype, layout, parameters), tunes each into the cache, then times each direction's call
in a TorchScript loop (no Python argument parsing on either side), the four ways in turn, over interleaved
rounds. Per key and direction it prints native's host time per call and each other way's difference, each a median
with its 95% interval (the differences paired per round), with the config the cache stored; at the end, their
sum over one training step of the model.

    python3 -m benchmarks host-cost --workload seed
    python3 -m benchmarks host-cost --workload resnet50_bf16_cl --rounds 30 --json /tmp/host_cost.json

Writes bench-results/host_cost.json (--json to move it; --update: benchmarks/results/host_cost.json too).

Needs a CUDA GPU for figures that mean anything; --device cpu runs the same code on ATen's CPU kernels (a smoke
test: there is no cuDNN, so nothing is tuned and intercept has nothing to take).
"""

import argparse
import pathlib
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch

from benchmarks import output_paths, write_result
from benchmarks.cases import OVERHEAD, TRAIN_INPUT, TRAIN_WEIGHT, WORKLOADS, in_turn, model_and_input, synchronize
from benchmarks.stats import median_interval

# The three cuDNN directions one at a time, and "backward": both gradients in one call, as a training step's
# backward asks for them (aten::convolution_backward with both in its mask; the cache's _convolution_backward).
DIRECTIONS = ("forward", "backward_data", "backward_filter", "backward")
STEP = ("forward", "backward")  # what one training step calls per layer
# How a call is made: natively with cuDNN's heuristics (benchmark=False), natively with benchmark mode's
# timed picks (benchmark=True), through the cache's op, and PyTorch's own call under intercept.
WAYS = ("native", "native_benchmark", "op", "intercept")
CACHE_WAYS = ("native_benchmark", "op", "intercept")  # each reported against "native"


# One call of each direction, natively (ATen's convolution ops, as nn.Conv*d and its backward make them) and
# through the cache's op, `calls` times in a TorchScript loop. The results are kept: TorchScript removes calls
# whose results nobody uses.
def native_forward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                   dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    zeros = [0] * len(stride)
    for _ in range(calls):
        out.append(torch.ops.aten.convolution(x, w, None, stride, padding, dilation, False, zeros, groups))
    return out


def native_backward_data(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                         dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    zeros = [0] * len(stride)
    for _ in range(calls):
        out.append(torch.ops.aten.convolution_backward(g, x, w, None, stride, padding, dilation, False, zeros, groups,
                                                       [True, False, False])[0])
    return out


def native_backward_filter(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int],
                           padding: List[int], dilation: List[int], groups: int,
                           calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    zeros = [0] * len(stride)
    for _ in range(calls):
        out.append(torch.ops.aten.convolution_backward(g, x, w, None, stride, padding, dilation, False, zeros, groups,
                                                       [False, True, False])[1])
    return out


def native_backward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                    dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    zeros = [0] * len(stride)
    for _ in range(calls):
        grads = torch.ops.aten.convolution_backward(g, x, w, None, stride, padding, dilation, False, zeros, groups,
                                                    [True, True, False])
        out += [grads[0], grads[1]]
    return out


def op_forward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
               dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    for _ in range(calls):
        out.append(torch.ops.cudnn_cache._convolution_forward(x, w, stride, padding, dilation, groups))
    return out


def op_backward_data(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                     dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    for _ in range(calls):
        out.append(torch.ops.cudnn_cache._convolution_backward_input(g, w, x.size(), stride, padding, dilation,
                                                                     groups))
    return out


def op_backward_filter(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                       dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    for _ in range(calls):
        out.append(torch.ops.cudnn_cache._convolution_backward_weight(g, x, w.size(), stride, padding, dilation,
                                                                      groups))
    return out


def op_backward(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                dilation: List[int], groups: int, calls: int) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    for _ in range(calls):
        grads = torch.ops.cudnn_cache._convolution_backward(g, x, w, stride, padding, dilation, groups)
        out += [grads[0], grads[1]]
    return out


LOOPS = {  # (way, direction) -> the scripted loop; intercept runs native's loops with interception on
    ("native", "forward"): native_forward, ("native", "backward_data"): native_backward_data,
    ("native", "backward_filter"): native_backward_filter, ("op", "forward"): op_forward,
    ("op", "backward_data"): op_backward_data, ("op", "backward_filter"): op_backward_filter,
    ("native", "backward"): native_backward, ("op", "backward"): op_backward,
}


class Convolution:
    """One distinct convolution of the model: its operands (x, w, and g shaped like its output), parameters and
    how many of the model's layers have it."""

    def __init__(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        from cudnn_cache.functional import same_padding

        self.x, self.w = x.detach().clone(), module.weight.detach().clone()
        self.g = torch.rand_like(y)
        self.stride, self.dilation, self.groups = list(module.stride), list(module.dilation), module.groups
        padding = module.padding
        if padding == "same":
            padding, extra = same_padding(module.kernel_size, module.dilation)
            if any(extra):
                raise ValueError("padding='same' with an even kernel pads its input first: not measured")
        self.padding = [0] * len(self.stride) if padding == "valid" else list(padding)
        self.layers = 1

    def signature(self) -> Tuple:
        return (tuple(self.x.shape), tuple(self.x.stride()), tuple(self.w.shape), tuple(self.w.stride()),
                self.x.dtype, tuple(self.stride), tuple(self.padding), tuple(self.dilation), self.groups)

    def label(self) -> str:
        x, w = "x".join(map(str, self.x.shape)), "x".join(map(str, self.w.shape))
        layout = "channels_last" if self.x.dim() == 4 and self.x.is_contiguous(memory_format=torch.channels_last) \
            and not self.x.is_contiguous() else "contiguous"
        return (f"{x} * {w} {str(self.x.dtype).replace('torch.', '')} {layout} stride {self.stride} padding "
                f"{self.padding} groups {self.groups}")

    def arguments(self, calls: int) -> tuple:
        return self.x, self.w, self.g, self.stride, self.padding, self.dilation, self.groups, calls


def convolutions_of(workload: str, device: torch.device) -> List[Convolution]:
    """The model's distinct (non-transposed) convolutions, recorded by forward hooks on one forward pass; for
    'overhead', the convolution of the models benchmark's eager training micro case."""
    if workload == OVERHEAD:
        module = torch.nn.Conv2d(TRAIN_WEIGHT[1], TRAIN_WEIGHT[0], TRAIN_WEIGHT[2:], padding=1, bias=False).to(device)
        x = torch.rand(TRAIN_INPUT, device=device)
        with torch.no_grad():
            return [Convolution(module, x, module(x))]
    model, x, _ = model_and_input(WORKLOADS[workload], device, None)
    found: Dict[Tuple, Convolution] = {}

    def record(module, inputs, output):
        convolution = Convolution(module, inputs[0], output)
        if convolution.signature() in found:
            found[convolution.signature()].layers += 1
        else:
            found[convolution.signature()] = convolution

    hooks = [m.register_forward_hook(record) for m in model.modules()
             if isinstance(m, torch.nn.modules.conv._ConvNd) and not m.transposed]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()
    return list(found.values())


def stored_config(convolution: Convolution, direction: str) -> dict:
    """What the cache holds for the convolution's key in `direction`: its best candidate, briefly ({} off a GPU,
    where there are no entries)."""
    import cudnn_cache

    if not convolution.x.is_cuda or direction not in ("forward", "backward_data", "backward_filter"):
        return {}

    key = cudnn_cache.conv_key(direction, convolution.x, convolution.w, convolution.stride, convolution.padding,
                               convolution.dilation, convolution.groups)
    ranking = cudnn_cache.query(direction, key)
    if not ranking:
        return {}
    best = ranking[0]
    return {name: best[name] for name in ("engine", "algorithm", "workspace_bytes", "runtime_compiled", "time_ms")
            if name in best}


def device_of(parser, args, tool: str) -> Optional[torch.device]:
    """The --device of a measuring tool with --rounds: refuses fewer than 6
    rounds through the parser; None, having said why, where CUDA is asked for and there is none."""
    if args.rounds < 6:
        parser.error("--rounds must be >= 6: a 95% interval of a median needs 6 values")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{tool}: no CUDA GPU is visible; --device cpu runs the smoke test", file=sys.stderr)
        return None
    return device


def measure(convolutions: List[Convolution], device: torch.device, rounds: int, calls: int) -> List[dict]:
    import cudnn_cache

    loops = {key: torch.jit.script(loop) for key, loop in LOOPS.items()}

    def timed(way: str, direction: str, convolution: Convolution) -> float:
        """Host microseconds per call of `calls` calls (the loop's time before the final synchronize)."""
        loop = loops[("op" if way == "op" else "native", direction)]
        cudnn_cache.intercept(way == "intercept")
        torch.backends.cudnn.benchmark = way == "native_benchmark"
        try:
            synchronize(device)
            started = time.perf_counter()
            loop(*convolution.arguments(calls))
            queued = time.perf_counter()
            synchronize(device)
        finally:
            cudnn_cache.intercept(False)
            torch.backends.cudnn.benchmark = False
        return 1e6 * (queued - started) / calls

    cudnn_cache.set_miss_policy("tune")
    for convolution in convolutions:  # tunes the cache's entries and native's plans, outside the timing
        if device.type == "cuda":
            cudnn_cache.fill(convolution.x, convolution.w, convolution.stride, convolution.padding,
                             convolution.dilation, convolution.groups)
        for direction in DIRECTIONS:
            for way in WAYS:
                timed(way, direction, convolution)
    cudnn_cache.set_miss_policy("error")

    times: Dict[Tuple[int, str, str], List[float]] = {(i, d, w): [] for i in range(len(convolutions))
                                                       for d in DIRECTIONS for w in WAYS}
    for round_index in range(rounds):
        ways = in_turn(list(WAYS), round_index)
        for index, convolution in enumerate(convolutions):
            for direction in DIRECTIONS:
                for way in ways:
                    times[(index, direction, way)].append(timed(way, direction, convolution))

    rows = []
    for index, convolution in enumerate(convolutions):
        for direction in DIRECTIONS:
            native = times[(index, direction, "native")]
            row = {"convolution": convolution.label(), "layers": convolution.layers, "direction": direction,
                   "native_us": median_interval(native), "stored": stored_config(convolution, direction)}
            for way in CACHE_WAYS:
                row[f"{way}_minus_native_us"] = median_interval(
                    [a - b for a, b in zip(times[(index, direction, way)], native)])
            rows.append(row)
    return rows


def table(rows: List[dict]) -> str:
    def cell(figure: dict) -> str:
        return f"{figure['median']:+.1f} [{figure['lo']:+.1f}, {figure['hi']:+.1f}]"

    lines = ["| convolution | layers | direction | native host per call | native benchmark − native | op − native | "
             "intercept − native | stored |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        native = row["native_us"]
        stored = ", ".join(f"{k} {v}" for k, v in row["stored"].items()) or "-"
        differences = " | ".join(f"{cell(row[f'{way}_minus_native_us'])} us" for way in CACHE_WAYS)
        lines.append(f"| {row['convolution']} | {row['layers']} | {row['direction']} | "
                     f"{native['median']:.1f} [{native['lo']:.1f}, {native['hi']:.1f}] us | {differences} | "
                     f"{stored} |")
    per_step = {way: sum(row["layers"] * row[f"{way}_minus_native_us"]["median"] for row in rows
                         if row["direction"] in STEP) for way in CACHE_WAYS}
    lines += ["", "Per training step (every layer's forward and backward, medians summed), against native "
                  "heuristics (benchmark=False): " + ", ".join(f"{way} {per_step[way]:+.1f} us" for way in CACHE_WAYS)
              + "."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, OVERHEAD], default="seed",
                        help="a workload of the models benchmark (default seed), or 'overhead': the convolution of its "
                             "eager training micro case")
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds (default 60; at least 6)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed loop (default 200)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", choices=("graph", "legacy"), default="graph")
    parser.add_argument("--json", type=pathlib.Path, help="the result file (default bench-results/host_cost.json)")
    parser.add_argument("--update", action="store_true", help="also write benchmarks/results/host_cost.json")
    args = parser.parse_args(argv)
    device = device_of(parser, args, "host_cost")
    if device is None:
        return 2
    import cudnn_cache

    cudnn_cache.set_backend(args.backend)
    convolutions = convolutions_of(args.workload, device)
    rows = measure(convolutions, device, args.rounds, args.calls)
    print(f"{args.workload}: {len(convolutions)} distinct convolutions, {args.rounds} rounds of {args.calls} calls, "
          f"{device}, backend {args.backend}\n")
    print(table(rows))
    write_result({"workload": args.workload, "device": str(device), "rounds": args.rounds, "calls": args.calls,
                  "backend": args.backend, "rows": rows}, output_paths("host_cost.json", args.json, args.update))
    return 0


if __name__ == "__main__":
    sys.exit(main())
