"""Host time per call against native PyTorch: the models benchmark's 'overhead' case (a tiny convolution's
forward in a TorchScript loop, and a 16 -> 16 3x3 convolution's forward + backward from Python and in a TorchScript
loop, natively, through the op and under intercept), and `python3 -m benchmarks host-cost`: per convolution of a models workload and
per direction, its call natively (cuDNN's heuristics, and benchmark mode's picks), through the cache's op and
under intercept, each in a TorchScript loop (no Python argument parsing on either side), with the differences to
native's paired per round, the config the cache stored, and their sum over one training step.

Both time rounds of calls with no synchronize between them, then one: the host time before that synchronize, and
the wall time after it, per call. The ways are taken in an order drawn anew each round (measure.in_turn), so that
drift, place and predecessor hit every way alike; every figure is a median with its 95% interval.

    python3 -m benchmarks host-cost --workload seed
    python3 -m benchmarks host-cost --workload resnet50_bf16_cl --rounds 30 --output /tmp/host_cost.json

Writes bench-results/host_cost.json. --device cpu runs the same code on ATen's CPU kernels (a smoke test: no
cuDNN, so nothing is tuned and intercept has nothing to take).
"""

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from benchmarks import add_arguments, no_gpu, output_paths, parse, write_result
from benchmarks.measure import in_turn, initialise_libraries, synchronize
from benchmarks.workloads import WORKLOADS, model_and_input
from benchmarks.report import table
from benchmarks.stats import median_interval

Way = Tuple[bool, bool, int, Callable[[], object]]  # cudnn.benchmark, intercept, calls per round, a round of calls


def time_rounds(ways: Dict[object, Way], rounds: int, device: torch.device) -> Dict[object, List[tuple]]:
    """(wall, host) microseconds per call of each way in each of `rounds` rounds, the ways in turn; the cache's
    entries and native benchmark mode's picks are made first, by one untimed round under miss policy 'tune'."""
    import cudnn_cache

    def time_round(benchmark: bool, intercept: bool, calls: int, round_of_calls) -> tuple:
        torch.backends.cudnn.benchmark = benchmark
        cudnn_cache.intercept(intercept)
        try:
            synchronize(device)
            started = time.perf_counter()
            round_of_calls()
            queued = time.perf_counter()
            synchronize(device)
            return 1e6 * (time.perf_counter() - started) / calls, 1e6 * (queued - started) / calls
        finally:
            cudnn_cache.intercept(False)
            torch.backends.cudnn.benchmark = False

    cudnn_cache.set_miss_policy("tune")
    for way in ways.values():
        time_round(*way)
    cudnn_cache.set_miss_policy("error")
    cudnn_cache.reset_stats()
    times = {name: [] for name in ways}
    for round_index in range(rounds):
        for name in in_turn(list(ways), round_index):
            times[name].append(time_round(*ways[name]))
    return times


# --- The models benchmark's overhead case -------------------------------------------------------------------------

OVERHEAD_INPUT, OVERHEAD_WEIGHT, OVERHEAD_CALLS = (1, 8, 8, 8), (8, 8, 3, 3), 1000  # forward, no grad
TRAIN_INPUT, TRAIN_WEIGHT, TRAIN_CALLS = (8, 16, 8, 8), (16, 16, 3, 3), 50  # forward + both gradients
# The op's own host overhead is the TorchScript pair's difference (there both calls are one interpreter call);
# the eager training rows add what a Python caller pays: converted modules call the op through cudnn_cache._eager,
# which parses its arguments as F.conv2d's generated binding does (Note [Eager calls]).
TARGETS = {  # the overhead case's figure -> (its row, the native rows it is measured above, its target's words)
    "op_overhead_above_native_us": ("op_scripted", ["native_scripted"], "op host time per call in TorchScript"),
    "train_op_overhead_above_native_us": ("train_op", ["train_native_heuristic", "train_native_benchmark"],
                                          "eager training path (forward + backward) through the op"),
    "train_intercept_overhead_above_native_us": ("train_intercept", ["train_native_heuristic", "train_native_benchmark"],
                                                 "eager training path (forward + backward) through intercept"),
    "scripted_train_op_overhead_above_native_us": ("train_op_scripted", ["train_native_scripted"],
                                                   "TorchScript training loop (forward + backward) through the op"),
    "scripted_train_intercept_overhead_above_native_us": (
        "train_intercept_scripted", ["train_native_scripted"],
        "TorchScript training loop (forward + backward) through intercept"),
}


# The overhead case's TorchScript loops, natively (torch.conv2d) or through the op (both ways pay the one test of
# `op` a call); the outputs are kept: TorchScript removes calls whose results nobody uses.
def scripted_forward(x: torch.Tensor, w: torch.Tensor, calls: int, op: bool) -> List[torch.Tensor]:
    outputs: List[torch.Tensor] = []
    for _ in range(calls):
        outputs.append(torch.ops.cudnn_cache.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1) if op
                       else torch.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1))
    return outputs


def scripted_training(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, calls: int,
                      op: bool) -> List[Optional[torch.Tensor]]:
    grads: List[Optional[torch.Tensor]] = []
    for _ in range(calls):
        y = (torch.ops.cudnn_cache.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1) if op
             else torch.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1))
        outputs: List[Optional[torch.Tensor]] = [grad]
        grads += torch.autograd.grad([y], [x, w], outputs)
    return grads


def overhead_case(args, result: dict) -> None:
    """The models benchmark's overhead case (models --case overhead:host_time): --overhead-rounds rounds of each
    row (a difference of 1 us per call needs a few hundred for the medians' 95% intervals to tell it from drift),
    the cache warm; each figure of TARGETS is its row's host time per call above the better of its native rows'."""
    import cudnn_cache

    device = torch.device(args.device)
    cudnn_cache.set_backend(args.backend)
    initialise_libraries(device, cudnn_cache)
    x, w = torch.rand(*OVERHEAD_INPUT, device=device), torch.rand(*OVERHEAD_WEIGHT, device=device)
    tx = torch.rand(*TRAIN_INPUT, device=device, requires_grad=True)
    tw = torch.rand(*TRAIN_WEIGHT, device=device, requires_grad=True)
    grad = torch.ones(TRAIN_INPUT[0], TRAIN_WEIGHT[0], *TRAIN_INPUT[2:], device=device)
    forward_loop, training_loop = torch.jit.script(scripted_forward), torch.jit.script(scripted_training)

    def native(x, w):
        return torch.nn.functional.conv2d(x, w, padding=1)

    def through_op(x, w):  # as converted modules call it (Note [Eager calls])
        return cudnn_cache.functional.convolution_call(x, w, None, [1, 1], [1, 1], [1, 1], 1)

    def training(convolution) -> Callable[[], None]:
        def calls():
            for _ in range(TRAIN_CALLS):
                torch.autograd.grad(convolution(tx, tw), (tx, tw), grad)
        return calls

    def scripted(op: bool) -> Callable[[], None]:
        def calls():
            with torch.no_grad():
                forward_loop(x, w, OVERHEAD_CALLS, op)
        return calls

    rows: Dict[str, Way] = {
        "native_scripted": (False, False, OVERHEAD_CALLS, scripted(False)),
        "op_scripted": (False, False, OVERHEAD_CALLS, scripted(True)),
        "train_native_heuristic": (False, False, TRAIN_CALLS, training(native)),
        "train_native_benchmark": (True, False, TRAIN_CALLS, training(native)),
        "train_op": (False, False, TRAIN_CALLS, training(through_op)),
        "train_intercept": (False, True, TRAIN_CALLS, training(native)),
        "train_native_scripted": (False, False, TRAIN_CALLS, lambda: training_loop(tx, tw, grad, TRAIN_CALLS, False)),
        "train_op_scripted": (False, False, TRAIN_CALLS, lambda: training_loop(tx, tw, grad, TRAIN_CALLS, True)),
        "train_intercept_scripted": (False, True, TRAIN_CALLS, lambda: training_loop(tx, tw, grad, TRAIN_CALLS, False)),
    }
    rounds = args.overhead_rounds
    results = {}
    for name, measured in time_rounds(rows, rounds, device).items():
        wall, host = [r[0] for r in measured], [r[1] for r in measured]
        results[name] = {"wall_us": statistics.median(wall), "host_us": statistics.median(host),
                         "wall_us_interval": median_interval(wall), "host_us_interval": median_interval(host),
                         "wall_us_rounds": wall, "host_us_rounds": host}
    result.update(backend=cudnn_cache.backend(), input=list(OVERHEAD_INPUT), weight=list(OVERHEAD_WEIGHT), padding=1,
                  calls=OVERHEAD_CALLS, repeats=rounds, train_input=list(TRAIN_INPUT), train_weight=list(TRAIN_WEIGHT),
                  train_calls=TRAIN_CALLS, results=results, stats=cudnn_cache.stats())
    for figure, (row, natives, _) in TARGETS.items():
        result[figure] = results[row]["host_us"] - min(results[native]["host_us"] for native in natives)


# --- host-cost: each convolution of a workload, each direction ------------------------------------------------------

# The three cuDNN directions one at a time, and "backward": both gradients in one call, as a training step's
# backward asks for them (aten::convolution_backward with both in its mask; the cache's _convolution_backward).
DIRECTIONS = ("forward", "backward_data", "backward_filter", "backward")
STEP = ("forward", "backward")  # what one training step calls per layer
WAYS = ("native", "native_benchmark", "op", "intercept")  # intercept runs native's loop with interception on


def scripted_calls(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: List[int], padding: List[int],
                   dilation: List[int], groups: int, calls: int, direction: str, op: bool) -> List[torch.Tensor]:
    """`calls` calls of one direction, natively (ATen's ops, as nn.Conv*d and its backward make them) or through
    the cache's op, each way's loop apart so that a call pays no test; the results are kept (see above)."""
    out: List[torch.Tensor] = []
    zeros = [0] * len(stride)
    if direction == "forward" and not op:
        for _ in range(calls):
            out.append(torch.ops.aten.convolution(x, w, None, stride, padding, dilation, False, zeros, groups))
    elif direction == "forward":
        for _ in range(calls):
            out.append(torch.ops.cudnn_cache._convolution_forward(x, w, stride, padding, dilation, groups))
    elif not op and direction == "backward":
        for _ in range(calls):
            grads = torch.ops.aten.convolution_backward(g, x, w, None, stride, padding, dilation, False, zeros,
                                                        groups, [True, True, False])
            out += [grads[0], grads[1]]
    elif not op:
        mask, first = [direction == "backward_data", direction == "backward_filter", False], int(direction != "backward_data")
        for _ in range(calls):
            out.append(torch.ops.aten.convolution_backward(g, x, w, None, stride, padding, dilation, False, zeros,
                                                           groups, mask)[first])
    elif direction == "backward_data":
        for _ in range(calls):
            out.append(torch.ops.cudnn_cache._convolution_backward_input(g, w, x.size(), stride, padding, dilation,
                                                                         groups))
    elif direction == "backward_filter":
        for _ in range(calls):
            out.append(torch.ops.cudnn_cache._convolution_backward_weight(g, x, w.size(), stride, padding, dilation,
                                                                          groups))
    else:
        for _ in range(calls):
            grads = torch.ops.cudnn_cache._convolution_backward(g, x, w, stride, padding, dilation, groups)
            out += [grads[0], grads[1]]
    return out


class Convolution:
    """One distinct convolution of the model: its operands (x, w, and g shaped like its output), parameters and
    how many of the model's layers have it."""

    def __init__(self, module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        from cudnn_cache.functional import same_padding

        self.x, self.w, self.g = x.detach().clone(), module.weight.detach().clone(), torch.rand_like(y)
        self.stride, self.dilation, self.groups = list(module.stride), list(module.dilation), module.groups
        padding = module.padding
        if padding == "same":
            padding, extra = same_padding(module.kernel_size, module.dilation)
            if any(extra):
                raise ValueError("padding='same' with an even kernel pads its input first: not measured")
        self.padding = [0] * len(self.stride) if padding == "valid" else list(padding)
        self.layers = 1

    def signature(self) -> tuple:
        return (tuple(self.x.shape), tuple(self.x.stride()), tuple(self.w.shape), tuple(self.w.stride()),
                self.x.dtype, tuple(self.stride), tuple(self.padding), tuple(self.dilation), self.groups)

    def label(self) -> str:
        x, w = "x".join(map(str, self.x.shape)), "x".join(map(str, self.w.shape))
        layout = "channels_last" if self.x.dim() == 4 and self.x.is_contiguous(memory_format=torch.channels_last) \
            and not self.x.is_contiguous() else "contiguous"
        return (f"{x} * {w} {str(self.x.dtype).replace('torch.', '')} {layout} stride {self.stride} padding "
                f"{self.padding} groups {self.groups}")

    def arguments(self) -> tuple:
        return self.x, self.w, self.g, self.stride, self.padding, self.dilation, self.groups


def convolutions_of(workload: str, device: torch.device) -> List[Convolution]:
    """The model's distinct (non-transposed) convolutions, recorded by forward hooks on one forward pass; for
    'overhead', the convolution of the overhead case's training rows."""
    if workload == "overhead":
        module = torch.nn.Conv2d(TRAIN_WEIGHT[1], TRAIN_WEIGHT[0], TRAIN_WEIGHT[2:], padding=1, bias=False).to(device)
        x = torch.rand(TRAIN_INPUT, device=device)
        with torch.no_grad():
            return [Convolution(module, x, module(x))]
    model, x, _ = model_and_input(WORKLOADS[workload], device, None)
    found: Dict[tuple, Convolution] = {}

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
    """The best candidate the cache holds for the convolution's key in `direction`, briefly ({} off a GPU)."""
    import cudnn_cache

    if not convolution.x.is_cuda or direction == "backward":
        return {}
    key = cudnn_cache.conv_key(direction, convolution.x, convolution.w, convolution.stride, convolution.padding,
                               convolution.dilation, convolution.groups)
    best = (cudnn_cache.query(direction, key) or [{}])[0]
    return {name: best[name] for name in ("engine", "algorithm", "workspace_bytes", "runtime_compiled", "time_ms")
            if name in best}


def measure(convolutions: List[Convolution], device: torch.device, rounds: int, calls: int) -> List[dict]:
    """A row per convolution and direction: native's host time per call and each other way's difference to it,
    paired per round, and the config the cache stored."""
    import cudnn_cache

    loop = torch.jit.script(scripted_calls)
    ways: Dict[tuple, Way] = {}
    for index, convolution in enumerate(convolutions):
        if device.type == "cuda":  # its entries, tuned outside the timing
            cudnn_cache.fill(convolution.x, convolution.w, convolution.stride, convolution.padding,
                             convolution.dilation, convolution.groups)
        for direction in DIRECTIONS:
            for way in WAYS:
                ways[(index, direction, way)] = (way == "native_benchmark", way == "intercept", calls,
                                                 lambda c=convolution, d=direction, op=way == "op":
                                                 loop(*c.arguments(), calls, d, op))
    times = {key: [host for _, host in values] for key, values in time_rounds(ways, rounds, device).items()}
    rows = []
    for index, convolution in enumerate(convolutions):
        for direction in DIRECTIONS:
            native = times[(index, direction, "native")]
            row = {"convolution": convolution.label(), "layers": convolution.layers, "direction": direction,
                   "native_us": median_interval(native), "stored": stored_config(convolution, direction)}
            for way in WAYS[1:]:
                row[f"{way}_minus_native_us"] = median_interval(
                    [a - b for a, b in zip(times[(index, direction, way)], native)])
            rows.append(row)
    return rows


def markdown(rows: List[dict]) -> str:
    def cell(figure: dict, sign: str = "+") -> str:
        return f"{figure['median']:{sign}.1f} [{figure['lo']:{sign}.1f}, {figure['hi']:{sign}.1f}] us"

    lines = table(["convolution", "layers", "direction", "native host per call", "native benchmark − native",
                   "op − native", "intercept − native", "stored"],
                  [[row["convolution"], row["layers"], row["direction"], cell(row["native_us"], ""),
                    *(cell(row[f"{way}_minus_native_us"]) for way in WAYS[1:]),
                    ", ".join(f"{k} {v}" for k, v in row["stored"].items()) or "-"] for row in rows])
    per_step = {way: sum(row["layers"] * row[f"{way}_minus_native_us"]["median"] for row in rows
                         if row["direction"] in STEP) for way in WAYS[1:]}
    return "\n".join(lines + ["", "Per training step (every layer's forward and backward, medians summed), against "
                              "native heuristics (benchmark=False): " +
                              ", ".join(f"{way} {us:+.1f} us" for way, us in per_step.items()) + "."])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, "host_cost.json")
    parser.add_argument("--workload", choices=[*WORKLOADS, "overhead"], default="seed",
                        help="a models workload (default seed), or 'overhead': the overhead case's training convolution")
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds (default 60; at least 6)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed loop (default 200)")
    parser.add_argument("--backend", choices=("graph", "legacy"), default="graph")
    args = parse(parser, argv)
    if args.rounds < 6:
        parser.error("--rounds must be >= 6: a 95% interval of a median needs 6 values")
    if no_gpu(args.device, "host_cost"):
        return 2
    import cudnn_cache

    device = torch.device(args.device)
    cudnn_cache.set_backend(args.backend)
    convolutions = convolutions_of(args.workload, device)
    rows = measure(convolutions, device, args.rounds, args.calls)
    text = markdown(rows)
    print(f"{args.workload}: {len(convolutions)} distinct convolutions, {args.rounds} rounds of {args.calls} calls, "
          f"{device}, backend {args.backend}\n\n{text}")
    write_result({"workload": args.workload, "device": str(device), "rounds": args.rounds, "calls": args.calls,
                  "backend": args.backend, "rows": rows}, output_paths("host_cost.json", args.output, args.update), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
