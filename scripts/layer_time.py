#!/usr/bin/env python3
"""Host time per layer of a training step's forward: natively, through the cache with its tuned choices, through
the cache with native's own choices, and under intercept, interleaved in one process.

scripts/bench.py's interleaved cases say how much slower a host-bound step is through the cache, and
scripts/host_cost.py that the calls themselves, timed in a loop, are not. This places the difference inside the
running network: forward hooks time every convolution, batch norm and ReLU module of the workload's model, each
step taken in one of these modes in turn (in an order drawn anew each round):

    native          the model natively (cuDNN's heuristics, or benchmark mode with --native-mode benchmark)
    tuned           the converted model on the entries a full search stored (the default tuning options)
    native_pick     the converted model on entries that hold only heuristics' first engine config, which native
                    benchmark=False runs (tuned with max_candidates=1 and no mode-B, knob or finalist timing):
                    what is left of a gap here is the cache's own code, the rest of tuned's is its choices
    intercept       the unmodified model under cudnn_cache.intercept(), on the tuned entries

Both sets of entries are saved to files and loaded before each step of their mode (outside the timed part); the
execution plans of both stay in the plan cache. With --drain every layer starts on an idle GPU (a synchronize in
the layer's pre-hook, outside its time), so a layer's time is the host's own work and not a wait for the GPU.
Per mode it reports the forward's host time (median and 95% interval, and its ratio to native's of the same round),
each layer kind's summed median, the layers whose time differs most from native's, and the CUDA caching
allocator's device allocations, frees and retries over the timed steps.

    python3 scripts/layer_time.py --workload resnet50_fp32
    python3 scripts/layer_time.py --workload resnet50_fp32 --drain --json /tmp/layers.json

Needs a CUDA GPU for figures that mean anything; --device cpu runs the same code on ATen's CPU kernels (a smoke
test: nothing is tuned there).
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "torch_ops"))  # `import cudnn_cache` from the source checkout (ops in build/)

from bench_cases import (WORKLOADS, device_of, in_turn, initialise_libraries, model_and_input,  # noqa: E402
                         synchronize)
from bench_stats import median_interval  # noqa: E402

MODES = ("native", "tuned", "native_pick", "intercept")
TIMED_LAYERS = (torch.nn.modules.conv._ConvNd, torch.nn.modules.batchnorm._BatchNorm, torch.nn.ReLU,
                torch.nn.ReLU6)
# The tuning options under which a search stores heuristics' first config alone (native benchmark=False's pick).
NATIVE_PICK = {"max_candidates": 1, "mode_b_candidates": 0, "knob_variants": 0, "finalists": 0}
ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


class LayerTimer:
    """Forward hooks on every timed layer of a model: each layer's host time in the current step, in seconds (a
    module called twice in one forward, as torchvision's ReLUs are, counts both)."""

    def __init__(self, model: torch.nn.Module, drain: Callable[[], None]):
        self.current: Dict[str, float] = {}
        self.kinds: Dict[str, str] = {}
        for name, module in model.named_modules():
            if isinstance(module, TIMED_LAYERS):
                self.kinds[name] = type(module).__name__
                module.register_forward_pre_hook(self._starter(drain))
                module.register_forward_hook(self._stopper(name))

    def _starter(self, drain: Callable[[], None]):
        def start(module, inputs):
            drain()
            module._layer_time_started = time.perf_counter()
        return start

    def _stopper(self, name: str):
        def stop(module, inputs, output):
            self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - module._layer_time_started
        return stop


def tune_into(path: pathlib.Path, cudnn_cache, model, x, options: dict, device: torch.device) -> int:
    """Tunes the converted model's every key under `options` into an empty cache and saves it to `path`;
    returns the entries saved."""
    saved = cudnn_cache.tuning_options()
    cudnn_cache.clear()
    cudnn_cache.set_tuning_options(**options)
    cudnn_cache.set_miss_policy("tune")
    try:
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
        synchronize(device)
    finally:
        cudnn_cache.set_tuning_options(**saved)
    return cudnn_cache.save(path, merge=False)


def measure(workload: str, device: torch.device, native_mode: str, rounds: int, warmup: int, drain: bool,
            directory: pathlib.Path) -> dict:
    import cudnn_cache

    torch.backends.cudnn.benchmark = native_mode == "benchmark"
    initialise_libraries(device, cudnn_cache)
    native, x, _ = model_and_input(WORKLOADS[workload], device, None)
    converted, _, _ = model_and_input(WORKLOADS[workload], device, cudnn_cache)
    files = {"tuned": directory / "tuned.cache", "native_pick": directory / "native_pick.cache"}
    entries = {"native_pick": tune_into(files["native_pick"], cudnn_cache, converted, x, NATIVE_PICK, device),
               "tuned": tune_into(files["tuned"], cudnn_cache, converted, x, {}, device)}
    cudnn_cache.set_miss_policy("error")  # every key is tuned: a miss would time candidates inside a step

    drain_gpu = (lambda: synchronize(device)) if drain else (lambda: None)
    timers = {"native": LayerTimer(native, drain_gpu), "converted": LayerTimer(converted, drain_gpu)}
    models = {"native": native, "tuned": converted, "native_pick": converted, "intercept": native}
    loaded = {"file": None}

    def step(mode: str):
        file = files.get(mode, files["tuned"]) if mode != "native" else None
        if file is not None and loaded["file"] != file:
            cudnn_cache.clear()
            cudnn_cache.load(file)
            loaded["file"] = file
        model = models[mode]
        timer = timers["native" if model is native else "converted"]
        timer.current = {}
        cudnn_cache.intercept(mode == "intercept")
        try:
            synchronize(device)
            started = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss = model(x).float().sum()
            forward = time.perf_counter() - started
            loss.backward()
            synchronize(device)
        finally:
            cudnn_cache.intercept(False)
        return forward, timer.current

    for mode in MODES:
        for _ in range(warmup):
            step(mode)
    allocator = {mode: {counter: 0 for counter in ALLOCATOR_COUNTERS} for mode in MODES}
    forward_ms: Dict[str, List[float]] = {mode: [] for mode in MODES}
    layers_us: Dict[str, Dict[str, List[float]]] = {mode: {} for mode in MODES}
    for round_index in range(rounds):
        for mode in in_turn(list(MODES), round_index):
            before = allocator_counters(device)
            forward, layers = step(mode)
            after = allocator_counters(device)
            for counter in ALLOCATOR_COUNTERS:
                allocator[mode][counter] += after[counter] - before[counter]
            forward_ms[mode].append(1e3 * forward)
            for name, seconds in layers.items():
                layers_us[mode].setdefault(name, []).append(1e6 * seconds)
    kinds = timers["native"].kinds
    return {
        "workload": workload, "device": str(device), "native_mode": native_mode, "rounds": rounds, "drain": drain,
        "entries": entries,
        "forward_ms": {mode: median_interval(values) for mode, values in forward_ms.items()},
        "forward_ratio_to_native": {mode: median_interval([a / b for a, b in zip(forward_ms[mode],
                                                                                 forward_ms["native"])])
                                    for mode in MODES if mode != "native"},
        "layers_us": {mode: {name: statistics.median(values) for name, values in per_layer.items()}
                      for mode, per_layer in layers_us.items()},
        "layer_kinds": kinds,
        "allocator_per_step": {mode: {counter: count / rounds for counter, count in counts.items()}
                               for mode, counts in allocator.items()},
    }


def allocator_counters(device: torch.device) -> Dict[str, int]:
    if device.type != "cuda":
        return {counter: 0 for counter in ALLOCATOR_COUNTERS}
    stats = torch.cuda.memory_stats(device)
    return {counter: int(stats.get(counter, 0)) for counter in ALLOCATOR_COUNTERS}


def report(result: dict, top: int = 12) -> str:
    def figure(value: dict, unit: str = "", digits: int = 2) -> str:
        return f"{value['median']:.{digits}f} [{value['lo']:.{digits}f}, {value['hi']:.{digits}f}]{unit}"

    lines = [f"{result['workload']}: forward host time per step, {result['rounds']} interleaved rounds, native "
             f"{result['native_mode']}{', every layer drained' if result['drain'] else ''} ({result['device']})", "",
             "| mode | forward | ÷ native | " + " | ".join(sorted(set(result["layer_kinds"].values()))) +
             " | device allocs / frees / retries per step |",
             "|---|---|---|" + "---|" * len(set(result["layer_kinds"].values())) + "---|"]
    kinds = sorted(set(result["layer_kinds"].values()))
    for mode in MODES:
        ratio = result["forward_ratio_to_native"].get(mode)
        sums = {kind: sum(us for name, us in result["layers_us"][mode].items()
                          if result["layer_kinds"].get(name) == kind) for kind in kinds}
        allocator = result["allocator_per_step"][mode]
        lines.append(f"| {mode} | {figure(result['forward_ms'][mode], ' ms')} | "
                     f"{figure(ratio, digits=3) if ratio else '-'} | " +
                     " | ".join(f"{sums[kind]:.0f} us" for kind in kinds) +
                     f" | {allocator['num_device_alloc']:.1f} / {allocator['num_device_free']:.1f} / "
                     f"{allocator['num_alloc_retries']:.1f} |")
    native = result["layers_us"]["native"]
    differences = sorted(((result["layers_us"]["tuned"].get(name, 0.0) - us, name) for name, us in native.items()),
                         reverse=True)
    lines += ["", "Layers whose host time differs most from native's (median µs): native, then each mode", "",
              "| layer | kind | " + " | ".join(MODES) + " |", "|---|---|" + "---|" * len(MODES)]
    for _, name in differences[:top]:
        lines.append(f"| {name} | {result['layer_kinds'][name]} | " +
                     " | ".join(f"{result['layers_us'][mode].get(name, 0.0):.1f}" for mode in MODES) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="resnet50_fp32")
    parser.add_argument("--native-mode", choices=("heuristic", "benchmark"), default="heuristic")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20; at least 6)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode first (default 3)")
    parser.add_argument("--drain", action="store_true", help="start every layer on an idle GPU")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=pathlib.Path, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    device = device_of(parser, args, "layer_time")
    if device is None:
        return 2
    with tempfile.TemporaryDirectory(prefix="layer_time-") as directory:
        result = measure(args.workload, device, args.native_mode, args.rounds, args.warmup, args.drain,
                         pathlib.Path(directory))
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
