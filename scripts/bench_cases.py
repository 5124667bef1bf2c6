"""scripts/bench.py's cases, each run in its own process (bench.py --case WORKLOAD:MODE or --case overhead):
the training case of a workload in one mode, the host-overhead micro case, and the per-key audit after
cache_cold. Each prints its result as one JSON line; scripts/bench_report.py turns them into the reports."""

import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "torch_ops"))  # `import cudnn_cache` from the source checkout (ops in build/)

@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and its input: `model` is a torchvision name, or 'conv3d_stack' or 'seed' (defined below)."""
    label: str
    model: str
    batch: int
    shape: tuple  # input shape without the batch
    dtype: str
    channels_last: bool = False


WORKLOADS: Dict[str, Workload] = {
    "resnet50_fp32": Workload("ResNet-50 fp32 bs32", "resnet50", 32, (3, 224, 224), "float32"),
    "resnet50_bf16_cl": Workload("ResNet-50 bf16 channels_last bs64", "resnet50", 64, (3, 224, 224), "bfloat16",
                                 channels_last=True),
    "resnet18_fp16_cl": Workload("ResNet-18 fp16 channels_last bs64", "resnet18", 64, (3, 224, 224), "float16",
                                 channels_last=True),
    "mobilenet_v2_bf16_cl": Workload("MobileNetV2 bf16 channels_last bs64", "mobilenet_v2", 64, (3, 224, 224),
                                     "bfloat16", channels_last=True),
    "conv3d_fp32": Workload("3-D conv stack fp32 (6x Conv3d + 1x1 head, 64^3, bs2)", "conv3d_stack", 2,
                            (1, 64, 64, 64), "float32"),
    "seed": Workload("two-conv model of the seed (bs7, 32x32)", "seed", 7, (3, 32, 32), "float32"),
}
OVERHEAD = "overhead"  # the host-overhead micro case, selected with --workloads like a workload


@dataclasses.dataclass(frozen=True)
class Mode:
    benchmark: bool              # torch.backends.cudnn.benchmark
    miss_policy: Optional[str]   # None: native convolutions; else convert() and run through the cache
    tunes: bool                  # the first step autotunes (so first - steady estimates the tuning time)
    intercept: bool = False      # the model is not converted: cudnn_cache.intercept() routes its convolutions


MODES: Dict[str, Mode] = {
    "native_benchmark": Mode(benchmark=True, miss_policy=None, tunes=True),
    "native_heuristic": Mode(benchmark=False, miss_policy=None, tunes=False),
    "cache_cold": Mode(benchmark=False, miss_policy="tune", tunes=True),
    "cache_warm": Mode(benchmark=False, miss_policy="error", tunes=False),
    "cache_intercept": Mode(benchmark=False, miss_policy="error", tunes=False, intercept=True),
}
LOADS_COLD_FILE = ("cache_warm", "cache_intercept")  # modes that load the file cache_cold saved

# The micro case: a tiny convolution, forward only, called OVERHEAD_CALLS times without synchronizing.
OVERHEAD_INPUT = (1, 8, 8, 8)
OVERHEAD_WEIGHT = (8, 8, 3, 3)
OVERHEAD_CALLS = 1000
OVERHEAD_REPEATS = 5
GPU_TIME_STEPS = 5  # steps profiled for gpu_ms, after the timed ones

OVERHEAD_LABELS = {  # its rows: result name -> the call timed
    "native_heuristic": "F.conv2d (benchmark=False)",
    "native_benchmark": "F.conv2d (benchmark=True)",
    "op": "torch.ops.cudnn_cache.convolution",
    "functional": "cudnn_cache.functional.conv2d",
    "native_scripted": "torch.conv2d in a TorchScript loop (benchmark=False)",
    "op_scripted": "cudnn_cache::convolution in a TorchScript loop",
}
NATIVE_OVERHEADS = ("native_heuristic", "native_benchmark")
# From Python, torch.ops.<library>.<op> parses its arguments against the schema on every call, which F.conv2d's
# generated binding does not; in TorchScript both are one interpreter call. So the op's own host overhead is
# the scripted pair's difference, and the eager rows show what a Python caller pays on top.


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(function: Callable[[], object], device: torch.device) -> Tuple[object, float]:
    """(function(), its wall seconds), with the device synchronized before and after."""
    synchronize(device)
    started = time.perf_counter()
    value = function()
    synchronize(device)
    return value, time.perf_counter() - started


def timed(function: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of function(), with the device synchronized before and after."""
    return timed_call(function, device)[1]


def build_model(workload: Workload) -> torch.nn.Module:
    from torch import nn

    if workload.model == "seed":
        return nn.Sequential(nn.Conv2d(3, 64, 3, padding="same"), nn.ReLU(), nn.Conv2d(64, 32, 3), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1))
    if workload.model == "conv3d_stack":
        # As baseline_autotune.py defines it: six 3x3x3 convolutions with ReLU, then a 1x1x1 head to 1 channel.
        layers, channels = [], workload.shape[0]
        for out in (16, 32, 64, 64, 32, 16):
            layers += [nn.Conv3d(channels, out, 3, padding=1), nn.ReLU()]
            channels = out
        return nn.Sequential(*layers, nn.Conv3d(channels, 1, 1))
    import torchvision

    return torchvision.models.get_model(workload.model, weights=None)


def model_and_input(workload: Workload, device: torch.device, cache, convert: bool = True) -> tuple:
    """The model (converted when `cache` is the cudnn_cache module and `convert`), its input, and its
    convolution count."""
    torch.manual_seed(0)
    model = build_model(workload)
    convolutions = sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    if cache is not None and convert:
        cache.convert(model)
    dtype = getattr(torch, workload.dtype)
    model = model.to(device=device, dtype=dtype).train()
    x = torch.rand(workload.batch, *workload.shape).to(device=device, dtype=dtype)
    if workload.channels_last:
        memory_format = torch.channels_last_3d if x.dim() == 5 else torch.channels_last
        model = model.to(memory_format=memory_format)
        x = x.contiguous(memory_format=memory_format)
    return model, x.requires_grad_(True), convolutions


def initialise_libraries(device: torch.device, cache) -> None:
    """Runs a tiny convolution forward and backward, natively and (in cache modes) through the cache under the
    'heuristic' policy, which stores nothing: CUDA, cuBLAS, cuDNN and the ops are set up before the first step."""
    import torch.nn.functional as F

    x = torch.rand(1, 1, 5, 5, device=device, requires_grad=True)
    w = torch.rand(1, 1, 2, 2, device=device)
    F.conv2d(x, w).sum().backward()
    if cache is not None:
        cache.set_miss_policy("heuristic")
        cache.functional.conv2d(x, w).sum().backward()
    synchronize(device)


def microseconds_as_seconds(stats: dict, key: str) -> Optional[float]:
    """stats[key], a time in microseconds, in seconds; None when this build of the ops does not count it."""
    value = stats.get(key)
    return None if value is None else value / 1e6


def run_training_case(workload_name: str, mode_name: str, args) -> dict:
    workload, mode, device = WORKLOADS[workload_name], MODES[mode_name], torch.device(args.device)
    torch.backends.cudnn.benchmark = mode.benchmark
    cache = None
    if mode.miss_policy is not None:
        import cudnn_cache as cache
        cache.set_backend(args.backend)
        cache.set_tuning_options(**args.tuning)
    initialise_libraries(device, cache)

    result = {"workload": workload_name, "mode": mode_name}
    if cache is not None:
        result["backend"] = cache.backend()
        cache.clear()
        cache.reset_stats()  # here, so that what load() counts (plans_deserialized) stays in the stats
        if mode_name in LOADS_COLD_FILE:
            result["loaded_entries"], result["load_s"] = timed_call(lambda: cache.load(args.cache_file), device)
    model, x, result["convolutions"] = model_and_input(workload, device, cache, convert=not mode.intercept)
    if cache is not None:
        cache.set_miss_policy(mode.miss_policy)
        if mode.intercept:
            cache.intercept(True)
        if mode_name in LOADS_COLD_FILE:
            # On the CPU there is no cuDNN and so no plan to build: prepare is not called, and counts as 0 s.
            result["prepared_plans"], result["prepare_s"] = (
                timed_call(cache.prepare, device) if device.type == "cuda" else (None, None))

    def step():
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()

    result["first_s"] = timed(step, device)
    for _ in range(args.warmup):
        step()
    steps = [timed(step, device) for _ in range(args.steps)]
    result["steps_ms"] = [1e3 * s for s in steps]
    result["steady_ms"] = 1e3 * statistics.median(steps)
    result["gpu_ms"], result["top_kernels"] = gpu_time_per_step(step, device)
    if mode.tunes:
        result["tuning_estimate_s"] = result["first_s"] - result["steady_ms"] / 1e3
    if cache is not None:
        result["stats"] = stats = cache.stats()
        result["tune_s"] = microseconds_as_seconds(stats, "tune_us")
        result["plan_build_s"] = microseconds_as_seconds(stats, "plan_build_us")
        if mode_name == "cache_cold":
            started = time.perf_counter()
            cache.save(args.cache_file)
            result["save_s"] = time.perf_counter() - started
            if args.audit and device.type == "cuda":
                started = time.perf_counter()
                result["audit"] = summarize_audit(cache.audit())
                result["audit"]["seconds"] = time.perf_counter() - started
        if mode_name in LOADS_COLD_FILE:
            result["plans_deserialized"] = stats.get("plans_deserialized")
            result["warm_start_s"] = result["load_s"] + (result["prepare_s"] or 0.0) + result["first_s"]
    return result


TOP_KERNELS = 25  # kept per case in the JSON, with calls and time per step
AUDIT_NOISE = 1.02  # an audited time within 2% of another counts as a tie


def summarize_audit(rows: List[dict]) -> dict:
    """cudnn_cache.audit()'s rows, summarised: per key, the stored choice's time over the faster of the two
    native choices (all measured the same way) and the key's resolution; how many keys are slower than native
    by more than AUDIT_NOISE and by more than their own resolution; the geometric means against each native
    mode; and the worst key. Each row gains resolution_us and slower_than_native.

    A key's resolution is the gap between its stored config's two timings (stored_ms and stored_again_ms, taken
    in the same rounds): a kernel of 10 us times within about 1 us of itself, 10%, so a smaller gap says nothing
    about which of two configs is faster. Each key is judged by its own, not by the noisiest key of the
    workload. A row without stored_again_ms (an older build) has resolution 0."""
    summary = {"keys": len(rows), "rows": rows}
    if not rows:
        return summary
    native = [min(row["heuristic_ms"], row["benchmark_ms"]) for row in rows]
    ratios = [row["stored_ms"] / best for row, best in zip(rows, native)]
    worst = max(range(len(rows)), key=ratios.__getitem__)
    for row, best, key_ratio in zip(rows, native, ratios):
        resolution_ms = abs(row["stored_ms"] - row.get("stored_again_ms", row["stored_ms"]))
        row["resolution_us"] = 1e3 * resolution_ms
        row["slower_than_native"] = key_ratio > AUDIT_NOISE and row["stored_ms"] - best > resolution_ms
    resolutions = [row["resolution_us"] for row in rows]

    def geomean(values):
        return math.exp(statistics.fmean(math.log(v) for v in values))

    summary.update(
        resolution_us_median=statistics.median(resolutions), resolution_us_max=max(resolutions),
        slower_than_native=sum(row["slower_than_native"] for row in rows),
        faster_than_native=sum(r < 1 / AUDIT_NOISE for r in ratios),
        geomean_vs_heuristic=geomean([r["stored_ms"] / r["heuristic_ms"] for r in rows]),
        geomean_vs_benchmark=geomean([r["stored_ms"] / r["benchmark_ms"] for r in rows]),
        worst_ratio=ratios[worst], worst_key=f"{rows[worst]['direction']} {rows[worst]['key']}",
        stored_total_ms=sum(r["stored_ms"] for r in rows),
        heuristic_total_ms=sum(r["heuristic_ms"] for r in rows),
        benchmark_total_ms=sum(r["benchmark_ms"] for r in rows))
    return summary


def gpu_time_per_step(step: Callable[[], None], device: torch.device,
                      steps: int = GPU_TIME_STEPS) -> Tuple[Optional[float], Optional[List[dict]]]:
    """Milliseconds the GPU spends running kernels and copies per step, from torch.profiler over `steps` steps,
    and the kernels that take most of it (name, calls and microseconds per step); (None, None) on the CPU.
    Against the steady step, it tells slower kernels from host time the GPU waits on."""
    if device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(steps):
            step()
        synchronize(device)
    events = [e for e in profiler.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    kernels = [{"name": e.key[:120], "calls": e.count / steps, "us": e.self_device_time_total / steps}
               for e in events[:TOP_KERNELS]]
    return sum(e.self_device_time_total for e in events) / 1e3 / steps, kernels


def run_overhead_case(args) -> dict:
    """Host overhead per call: OVERHEAD_CALLS forward calls of a tiny convolution with no synchronize between
    them, then one synchronize; the per-call wall time (and the host-only time, before that synchronize), the
    median over OVERHEAD_REPEATS rounds. The cache is warm: tuned before timing, then miss policy 'error'.
    op_overhead_above_native_us: the op's host time per call minus native's, both called in a TorchScript loop
    (see NATIVE_OVERHEADS); eager_op_overhead_above_native_us: the same from Python."""
    import torch.nn.functional as F

    import cudnn_cache

    device = torch.device(args.device)
    cudnn_cache.set_backend(args.backend)
    initialise_libraries(device, cudnn_cache)
    x = torch.rand(*OVERHEAD_INPUT, device=device)
    w = torch.rand(*OVERHEAD_WEIGHT, device=device)
    op = torch.ops.cudnn_cache.convolution

    def repeat(call):
        def calls():
            for _ in range(OVERHEAD_CALLS):
                call()
        return calls

    native_loop, op_loop = torch.jit.script(scripted_native_loop), torch.jit.script(scripted_op_loop)
    calls = {  # name (as in OVERHEAD_LABELS) -> (cudnn.benchmark, OVERHEAD_CALLS calls)
        "native_heuristic": (False, repeat(lambda: F.conv2d(x, w, padding=1))),
        "native_benchmark": (True, repeat(lambda: F.conv2d(x, w, padding=1))),
        "op": (False, repeat(lambda: op(x, w, None, [1, 1], [1, 1], [1, 1], 1))),
        "functional": (False, repeat(lambda: cudnn_cache.functional.conv2d(x, w, padding=1))),
        "native_scripted": (False, lambda: native_loop(x, w, OVERHEAD_CALLS)),
        "op_scripted": (False, lambda: op_loop(x, w, OVERHEAD_CALLS)),
    }

    def time_calls(benchmark: bool, calls) -> tuple:
        torch.backends.cudnn.benchmark = benchmark
        synchronize(device)
        started = time.perf_counter()
        calls()
        queued = time.perf_counter()
        synchronize(device)
        finished = time.perf_counter()
        return 1e6 * (finished - started) / OVERHEAD_CALLS, 1e6 * (queued - started) / OVERHEAD_CALLS

    with torch.no_grad():
        cudnn_cache.set_miss_policy("tune")
        for benchmark, call in calls.values():  # warm-up: tunes the cache entry and native's benchmark cache
            time_calls(benchmark, call)
        cudnn_cache.set_miss_policy("error")
        cudnn_cache.reset_stats()
        rounds = {name: [] for name in calls}
        for _ in range(OVERHEAD_REPEATS):  # interleaved, so drift hits every variant alike
            for name, (benchmark, call) in calls.items():
                rounds[name].append(time_calls(benchmark, call))

    results = {name: {"wall_us": statistics.median(r[0] for r in rounds[name]),
                      "host_us": statistics.median(r[1] for r in rounds[name]),
                      "wall_us_rounds": [r[0] for r in rounds[name]]} for name in calls}
    native_host_us = min(results[name]["host_us"] for name in NATIVE_OVERHEADS)
    return {"workload": OVERHEAD, "backend": cudnn_cache.backend(), "input": list(OVERHEAD_INPUT),
            "weight": list(OVERHEAD_WEIGHT), "padding": 1, "calls": OVERHEAD_CALLS, "repeats": OVERHEAD_REPEATS,
            "results": results,
            "op_overhead_above_native_us": results["op_scripted"]["host_us"] - results["native_scripted"]["host_us"],
            "eager_op_overhead_above_native_us": results["op"]["host_us"] - native_host_us,
            "stats": cudnn_cache.stats()}


# The outputs are kept in a list: TorchScript removes calls whose results nobody uses.
def scripted_native_loop(x: torch.Tensor, w: torch.Tensor, calls: int) -> List[torch.Tensor]:
    outputs: List[torch.Tensor] = []
    for _ in range(calls):
        outputs.append(torch.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1))
    return outputs


def scripted_op_loop(x: torch.Tensor, w: torch.Tensor, calls: int) -> List[torch.Tensor]:
    outputs: List[torch.Tensor] = []
    for _ in range(calls):
        outputs.append(torch.ops.cudnn_cache.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1))
    return outputs


def run_case(args) -> int:
    """The --case entry point: runs one case and prints its result as one JSON line."""
    if args.case == OVERHEAD:
        result = run_overhead_case(args)
    else:
        workload_name, mode_name = args.case.split(":")
        result = run_training_case(workload_name, mode_name, args)
    print(json.dumps(result), flush=True)
    return 0
