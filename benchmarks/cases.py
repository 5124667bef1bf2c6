"""The models benchmark's cases, each run in its own process (python3 -m benchmarks.models --case WORKLOAD:MODE
or --case overhead): the training case of a workload in one mode, the host-overhead micro case, and the per-key
audit after cache_cold. Each prints its result as one JSON line; report.py turns them into the reports."""

import dataclasses
import json
import math
import os
import random
import statistics
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch

from benchmarks.stats import median_interval

# cudnn_cache.set_tuning_options' options that are flags, and the one that is a ratio; the rest are counts.
TUNING_FLAGS = ("flush_l2", "exhaustive", "prefetch_backward", "rank_deterministic")
TUNING_RATIOS = ("give_up_ratio",)


def tuning_arguments(items: List[str], error: Callable[[str], None]) -> Dict[str, object]:
    """The --tuning NAME=VALUE arguments of the measuring scripts, typed for cudnn_cache.set_tuning_options
    (flags as 0 or 1); `error` (argparse's parser.error) is called with what is wrong. Unknown names are left to
    set_tuning_options, which lists the options."""
    tuning: Dict[str, object] = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value:
            error(f"--tuning takes NAME=VALUE, got {item!r} (e.g. flush_l2=0)")
            continue
        try:
            number = float(value) if name in TUNING_RATIOS else int(value)
        except ValueError:
            error(f"--tuning {name}: {value!r} is not a number")
            continue
        tuning[name] = bool(number) if name in TUNING_FLAGS else number
    return tuning


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and its input: `model` is a torchvision name, or 'conv3d_stack' or 'seed' (defined below)."""
    label: str
    model: str
    batch: int
    shape: tuple  # input shape without the batch
    dtype: str
    channels_last: bool = False
    depthwise: bool = False  # depthwise convolutions, where native heuristics itself compiles engines at run time


WORKLOADS: Dict[str, Workload] = {
    "resnet50_fp32": Workload("ResNet-50 fp32 bs32", "resnet50", 32, (3, 224, 224), "float32"),
    "resnet50_bf16_cl": Workload("ResNet-50 bf16 channels_last bs64", "resnet50", 64, (3, 224, 224), "bfloat16",
                                 channels_last=True),
    "resnet18_fp16_cl": Workload("ResNet-18 fp16 channels_last bs64", "resnet18", 64, (3, 224, 224), "float16",
                                 channels_last=True),
    "mobilenet_v2_bf16_cl": Workload("MobileNetV2 bf16 channels_last bs64", "mobilenet_v2", 64, (3, 224, 224),
                                     "bfloat16", channels_last=True, depthwise=True),
    "conv3d_fp32": Workload("3-D conv stack fp32 (6x Conv3d + 1x1 head, 64^3, bs2)", "conv3d_stack", 2,
                            (1, 64, 64, 64), "float32"),
    "seed": Workload("two-conv model of the seed (bs7, 32x32)", "seed", 7, (3, 32, 32), "float32"),
    # Grouped 3x3 convolutions of group width 8 in fp32, where cuDNN's FFMA and TF32 wgrad engines are close
    # and a stored choice was once slower than native's (issue 16).
    "regnet_y_400mf_fp32": Workload("RegNetY-400MF fp32 bs64 (grouped, group width 8)", "regnet_y_400mf", 64,
                                    (3, 224, 224), "float32"),
}
OVERHEAD = "overhead"  # the host-overhead micro case, selected with --workloads like a workload


@dataclasses.dataclass(frozen=True)
class Mode:
    benchmark: bool              # torch.backends.cudnn.benchmark
    miss_policy: Optional[str]   # None: native convolutions; else convert() and run through the cache
    tunes: bool                  # the first step autotunes (so first - steady estimates the tuning time)
    intercept: bool = False      # the model is not converted: cudnn_cache.intercept() routes its convolutions
    zero_code: bool = False      # CUDNN_CACHE_PATH names the file: the import loads it, the first call prepares


MODES: Dict[str, Mode] = {
    "native_benchmark": Mode(benchmark=True, miss_policy=None, tunes=True),
    "native_heuristic": Mode(benchmark=False, miss_policy=None, tunes=False),
    "cache_cold": Mode(benchmark=False, miss_policy="tune", tunes=True),
    "cache_warm": Mode(benchmark=False, miss_policy="error", tunes=False),
    "cache_intercept": Mode(benchmark=False, miss_policy="error", tunes=False, intercept=True),
    "cache_env": Mode(benchmark=False, miss_policy="error", tunes=False, intercept=True, zero_code=True),
}
LOADS_COLD_FILE = ("cache_warm", "cache_intercept", "cache_env")  # modes that load the file cache_cold saved
# The interleaved cases (--case WORKLOAD:interleaved:NATIVE_MODE): the steady step of native (one of these
# modes), cache_warm and cache_intercept, one step of each in turn, in one process. PyTorch keeps one cuDNN plan
# cache for both of its modes (keyed without the benchmark flag), so each native mode gets its own process.
INTERLEAVED = "interleaved"
INTERLEAVED_NATIVE = ("native_heuristic", "native_benchmark")
INTERLEAVED_MODES = ("native", "cache_warm", "cache_intercept")

# The micro case: a tiny convolution, forward only, called OVERHEAD_CALLS times without synchronizing; and the
# eager training path, forward + backward of a 16 -> 16 3x3 convolution, TRAIN_CALLS times. --steps rounds each.
OVERHEAD_INPUT = (1, 8, 8, 8)
OVERHEAD_WEIGHT = (8, 8, 3, 3)
OVERHEAD_CALLS = 1000
TRAIN_INPUT = (8, 16, 8, 8)
TRAIN_WEIGHT = (16, 16, 3, 3)
TRAIN_CALLS = 50
# Rounds of the micro case, at least: a round takes about 0.1 s, and a host-time difference of 1 us per call
# needs a few hundred interleaved rounds for the medians' 95% intervals to tell it from drift. --quick runs
# --steps rounds.
OVERHEAD_ROUNDS = 300

OVERHEAD_LABELS = {  # its rows: result name -> the call timed
    "native_heuristic": "F.conv2d (benchmark=False)",
    "native_benchmark": "F.conv2d (benchmark=True)",
    "op": "cudnn_cache.functional.convolution_call (a converted module's call)",
    "functional": "cudnn_cache.functional.conv2d",
    "native_scripted": "torch.conv2d in a TorchScript loop (benchmark=False)",
    "op_scripted": "cudnn_cache::convolution in a TorchScript loop",
    "train_native_heuristic": "training: F.conv2d forward + backward (benchmark=False)",
    "train_native_benchmark": "training: F.conv2d forward + backward (benchmark=True)",
    "train_op": "training: cudnn_cache.functional.convolution_call (a converted module's call) forward + backward",
    "train_intercept": "training: F.conv2d forward + backward under cudnn_cache.intercept(True)",
    "train_native_scripted": "training in a TorchScript loop: torch.conv2d + torch.autograd.grad (benchmark=False)",
    "train_op_scripted": "training in a TorchScript loop: cudnn_cache::convolution + torch.autograd.grad",
    "train_intercept_scripted": "training in a TorchScript loop: torch.conv2d + torch.autograd.grad under "
                                "cudnn_cache.intercept(True)",
}
NATIVE_OVERHEADS = ("native_heuristic", "native_benchmark")
NATIVE_TRAIN_OVERHEADS = ("train_native_heuristic", "train_native_benchmark")
# From Python, torch.ops.<library>.<op> parses its arguments against the schema on every call (a boxed call), which
# F.conv2d's generated binding does not; converted modules call the op through cudnn_cache._eager, which parses as
# that binding does, where the build made it (Note [Eager calls]). In TorchScript both are one interpreter call. So
# the op's own host overhead is the scripted pair's difference, and the eager rows show what a Python caller pays
# on top.


def in_turn(items: List[str], round_index: int) -> List[str]:
    """`items` in the order of round `round_index`: a permutation drawn from a generator seeded with the round
    index (so every run orders its rounds alike), so that no item always comes first and none always follows the
    same other. Rotation was not enough: it keeps the cyclic order, so an item always came after the same one.
    2026-12-03 on an H200, the overhead case's two native training rows, which run the same cuDNN plans (PyTorch's
    plan cache does not key by the benchmark flag), differed by 20 us per iteration with the benchmark row always
    right after the heuristics one, warm from it, and the heuristics row after a forward-only TorchScript loop."""
    order = list(items)
    random.Random(round_index).shuffle(order)
    return order


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


def drop_plans(cache) -> None:
    """Drops every execution plan the cache keeps in memory (its entries stay), so that the next calls, or
    prepare(), build them again: on the handle of the thread that calls first, or on prepare()'s pool."""
    limit = cache.plan_cache_limit()
    cache.set_plan_cache_limit(1)  # a sweep keeps 90% of the limit: none
    cache.set_plan_cache_limit(limit)


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
    result = {"workload": workload_name, "mode": mode_name}
    if mode.miss_policy is not None:
        if mode.zero_code:  # as a user's process started with the variables set: the import loads the file
            os.environ.update(CUDNN_CACHE_PATH=str(args.cache_file), CUDNN_CACHE_MISS_POLICY="heuristic")
        started = time.perf_counter()
        import cudnn_cache as cache
        result["import_s"] = time.perf_counter() - started  # the first import in this process: part of a warm start
        cache.set_backend(args.backend)
        cache.set_tuning_options(**args.tuning)
    if mode.zero_code:  # in a user's process the first step's convolution is the first: the set-up's starts nothing
        torch.ops.cudnn_cache.prepare_at_first_call(False)
    initialise_libraries(device, cache)
    if mode.zero_code:  # armed again as the import armed it (Note [Prepare at the first call] in runtime.cpp)
        torch.ops.cudnn_cache.prepare_at_first_call(cache.size() > 0)

    if cache is not None:
        result["backend"] = cache.backend()
        if mode.zero_code:  # loaded at import (timed there); the stats count from the process's start
            result["loaded_entries"], result["load_s"] = cache.size(), None
        else:
            cache.clear()
            cache.reset_stats()  # here, so that what load() counts (plans_deserialized) stays in the stats
            if mode_name in LOADS_COLD_FILE:
                result["loaded_entries"], result["load_s"] = timed_call(lambda: cache.load(args.cache_file), device)
    model, x, result["convolutions"] = model_and_input(workload, device, cache, convert=not mode.intercept)
    if cache is not None:
        cache.set_miss_policy(mode.miss_policy)
        if mode.intercept:
            cache.intercept(True)
    if cache is not None and mode_name in LOADS_COLD_FILE:
        # On the CPU there is no cuDNN and so no plan to build: prepare is not called, and counts as 0 s. Nor
        # does a process that CUDNN_CACHE_PATH set up: its first call starts a prepare in the background.
        if device.type != "cuda" or mode.zero_code:
            result["prepared_plans"], result["prepare_s"] = None, None
        else:
            result["prepared_plans"], result["prepare_s"] = timed_call(cache.prepare, device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()

    result["first_s"] = timed(step, device)
    if mode_name == "cache_cold" and device.type == "cuda" and args.settle:
        result["settle"] = settle_cache(cache)  # as scripts/warm_start.py does after its steps
    if args.warmup > 0:  # the first warm-up step, timed alone: what only the first step pays is first_s - second_s
        result["second_s"] = timed(step, device)
    for _ in range(args.warmup - 1):
        step()
    audited = cache if mode_name == "cache_cold" and args.audit and device.type == "cuda" else None
    try:
        result.update(steady_figures(step, device, args, audited))
    finally:  # the warm cases load this file: it is written even where the audit or the profiler fails
        if mode_name == "cache_cold":
            started = time.perf_counter()
            cache.save(args.cache_file)
            result["save_s"] = time.perf_counter() - started
    if mode.tunes:
        result["tuning_estimate_s"] = result["first_s"] - result["steady_ms"] / 1e3
    if cache is not None:
        result["stats"] = stats = cache.stats()
        result["tune_s"] = microseconds_as_seconds(stats, "tune_us")
        result["plan_build_s"] = microseconds_as_seconds(stats, "plan_build_us")
        if mode_name in LOADS_COLD_FILE:
            result["plans_deserialized"] = stats.get("plans_deserialized")
            result["warm_start_s"] = (result["import_s"] + (result["load_s"] or 0.0) + (result["prepare_s"] or 0.0)
                                      + result["first_s"])
    return result


# Note [Profiling last]
# ~~~~~~~~~~~~~~~~~~~~~
# torch.profiler's CUDA activity attaches CUPTI to the process, and Kineto may leave it attached when the session
# ends: it calls cuptiFinalize only where TEARDOWN_CUPTI=1 (pytorch/pytorch#144455: a program stays 10-20%
# slower after profiling; kineto#1539 proposes tearing down by default). While CUPTI is attached every kernel
# launch pays its callbacks on the host, so whatever a process measures after a profiled step it measures in a
# process unlike a user's, and not alike for every engine config: one that launches a kernel per group and a
# memset pays many times what one that launches a single kernel pays. So a training case times its wall steps,
# then audits (cache_cold, --audit), and profiles its GPU time per step last: an audit run after profiled steps
# found engine configs slower that were faster or tied when their key was timed alone.


def steady_figures(step: Callable[[], None], device: torch.device, args, audited=None) -> dict:
    """A training case's steady figures, taken in the order of Note [Profiling last]: args.steps synchronized
    steps (steps_ms, wall_ms and steady_ms, its median), then, where `audited` is the cudnn_cache module, its
    audit (audit_cache, with the seconds it took), then the GPU time of args.steps replays of the step captured in
    a CUDA graph (graph_steps_ms, graph_ms; graph_error where it cannot be captured), then the GPU time of
    args.steps more steps under torch.profiler (gpu_steps_ms, gpu_ms, top_kernels)."""
    figures: Dict[str, object] = {}
    figures["steps_ms"] = [1e3 * timed(step, device) for _ in range(args.steps)]
    figures["wall_ms"] = median_interval(figures["steps_ms"])
    figures["steady_ms"] = figures["wall_ms"]["median"]  # the name earlier reports gave it
    if audited is not None:
        started = time.perf_counter()
        figures["audit"] = audit_cache(audited, args.audit_repeats, args.audit_rounds)
        figures["audit"]["seconds"] = time.perf_counter() - started
    figures["graph_steps_ms"], error = graph_time_per_step(step, device, args.steps)
    figures["graph_ms"] = None if figures["graph_steps_ms"] is None else median_interval(figures["graph_steps_ms"])
    if error is not None:
        figures["graph_error"] = error
    figures["gpu_steps_ms"], figures["top_kernels"] = gpu_time_per_step(step, device, args.steps)
    figures["gpu_ms"] = None if figures["gpu_steps_ms"] is None else median_interval(figures["gpu_steps_ms"])
    return figures


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
    workload. A row without stored_again_ms (an older build) has resolution 0.

    The stored config's time is the mean of its two timings (stored_mean_ms). Each round times the configs in a
    fresh order (Note [Paired rounds in a fresh order]), so the two are measurements of one config alike in
    all but their noise; judging by the first alone called a key slower whenever that one drew the noise and
    the other matched native's."""
    summary = {"keys": len(rows), "rows": rows}
    if not rows:
        return summary
    for row in rows:
        again = row.get("stored_again_ms", row["stored_ms"])
        row["stored_mean_ms"] = (row["stored_ms"] + again) / 2
        row["resolution_us"] = 1e3 * abs(row["stored_ms"] - again)
    native = [min(row["heuristic_ms"], row["benchmark_ms"]) for row in rows]
    ratios = [row["stored_mean_ms"] / best for row, best in zip(rows, native)]
    worst = max(range(len(rows)), key=ratios.__getitem__)
    for row, best, key_ratio in zip(rows, native, ratios):
        row["slower_than_native"] = (key_ratio > AUDIT_NOISE
                                     and row["stored_mean_ms"] - best > row["resolution_us"] / 1e3)
    resolutions = [row["resolution_us"] for row in rows]

    def geomean(values):
        return math.exp(statistics.fmean(math.log(v) for v in values))

    summary.update(
        resolution_us_median=statistics.median(resolutions), resolution_us_max=max(resolutions),
        slower_than_native=sum(row["slower_than_native"] for row in rows),
        faster_than_native=sum(r < 1 / AUDIT_NOISE for r in ratios),
        geomean_vs_heuristic=geomean([r["stored_mean_ms"] / r["heuristic_ms"] for r in rows]),
        geomean_vs_benchmark=geomean([r["stored_mean_ms"] / r["benchmark_ms"] for r in rows]),
        worst_ratio=ratios[worst], worst_key=f"{rows[worst]['direction']} {rows[worst]['key']}",
        stored_total_ms=sum(r["stored_mean_ms"] for r in rows),
        heuristic_total_ms=sum(r["heuristic_ms"] for r in rows),
        benchmark_total_ms=sum(r["benchmark_ms"] for r in rows))
    return summary


def audit_repeatedly(audit: Callable[[], List[dict]], repeats: int) -> dict:
    """The first of `repeats` audits run one after another in this process, summarised (summarize_audit), and
    with more than one, what the others add: the keys each found slower (slower_per_audit, a count per audit)
    and those every one found slower (slower_in_every_audit, with their names in slower_in_every_audit_keys).

    A key's resolution is the gap between two timings of its stored config in the same rounds. From one audit to
    the next the same config's time moves further: on the H100 a 16 us config of RegNetY timed 15.5 to 17.4 us
    in four audits whose resolutions for it were 0.2 to 0.8 us, and of the keys one audit found slower, the next
    found one in seven again. A verdict that does not repeat is noise."""
    summaries = [summarize_audit(audit()) for _ in range(max(repeats, 1))]
    first = summaries[0]
    if len(summaries) > 1:
        flagged = [{f"{row['direction']} {row['key']}" for row in s["rows"] if row["slower_than_native"]}
                   for s in summaries]
        in_every = set.intersection(*flagged)
        first.update(audit_repeats=len(summaries), slower_per_audit=[len(keys) for keys in flagged],
                     slower_in_every_audit=len(in_every), slower_in_every_audit_keys=sorted(in_every))
    return first


def settle_cache(cache) -> dict:
    """cudnn_cache.settle() (Note [Settling in steady state]) after the tuning step: the seconds it
    took, the keys it decided again, and those whose first config it changed, each with its direction, key and
    the engine configs before and after."""
    started = time.perf_counter()
    rows = cache.settle()
    changes = [{"direction": row["direction"], "key": row["key"], "from": row["stored_engine"],
                "to": row["settled_engine"]} for row in rows if row["changed"]]
    return {"seconds": time.perf_counter() - started, "keys": len(rows), "changed": len(changes), "changes": changes}


def audit_cache(cache, repeats: int, rounds: Optional[int]) -> dict:
    """audit_repeatedly of cudnn_cache.audit, in `rounds` interleaved rounds per key where given (the tuning
    option `repetitions`, which the audit's rounds follow, is set for the audits alone and put back after), else
    in the tuning's; the summary records how many (rounds)."""
    before = cache.tuning_options()["repetitions"]
    rounds = before if rounds is None else rounds
    cache.set_tuning_options(repetitions=rounds)
    try:
        summary = audit_repeatedly(cache.audit, repeats)
    finally:
        cache.set_tuning_options(repetitions=before)
    summary["rounds"] = rounds
    return summary


def profile_each_step(step: Callable[[], None], device: torch.device, steps: int, activities: list,
                      measure: Callable[[object], object]) -> list:
    """measure(profiler) of each of `steps` steps, each profiled on its own: torch.profiler's schedule cycles
    through one untraced warm-up step and one traced step, and hands each traced step to measure (its
    on_trace_ready), so 2 x steps steps run. The step is synchronized before its trace closes."""
    from torch.profiler import profile, schedule

    measured = []
    with warnings.catch_warnings():
        # It warns that each cycle starts with no events: what makes each measurement one step's.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=steps),
                     on_trace_ready=lambda profiler: measured.append(measure(profiler))) as profiler:
            for _ in range(2 * steps):
                step()
                synchronize(device)
                profiler.step()
    return measured


def gpu_time_per_step(step: Callable[[], None], device: torch.device,
                      steps: int) -> Tuple[Optional[List[float]], Optional[List[dict]]]:
    """Milliseconds the GPU spends running kernels and copies in each of `steps` steps, each step profiled on
    its own by torch.profiler, and the kernels that take most of it over all of them (name, calls and
    microseconds per step); (None, None) on the CPU. Against the steady step, it tells slower kernels from host
    time the GPU waits on."""
    if device.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity

    def kernels(profiler):
        return [(e.key, e.count, e.self_device_time_total) for e in profiler.key_averages()
                if e.self_device_time_total > 0]

    per_step = profile_each_step(step, device, steps, [ProfilerActivity.CUDA], kernels)
    totals: Dict[str, List[float]] = {}  # kernel -> [calls, microseconds] over every profiled step
    for events in per_step:
        for name, calls, us in events:
            total = totals.setdefault(name, [0, 0.0])
            total[0] += calls
            total[1] += us
    top = sorted(totals.items(), key=lambda item: item[1][1], reverse=True)[:TOP_KERNELS]
    return ([sum(us for _, _, us in events) / 1e3 for events in per_step],
            [{"name": name[:120], "calls": calls / steps, "us": us / steps} for name, (calls, us) in top])


# Note [GPU time without a profiler]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# gpu_ms is what torch.profiler's CUDA activity records, and CUPTI attached to the process changes what it
# measures: on an H100 one runtime-compiled engine config of RegNetY took 3-4 us more per call
# after a profiler session, which may leave CUPTI attached (12.0 against 15.5 us, timed without the profiler),
# and an engine that launches a kernel per group pays its per-kernel cost many times (Note [Profiling last]).
# Engine configs beyond native's picks are where an exhaustive tuning differs from native, so a GPU time taken
# through the profiler judges them on a clock tilted against them.
# graph_ms attaches nothing: the step is captured once in a CUDA graph (warmed up first on the side stream it is
# captured on, as PyTorch's whole-network capture warms up; captured in thread-local mode, so that another
# thread's CUDA calls do not end it) and each replay is timed by CUDA events around it. A replay runs the step's
# kernels and copies back to back, with the host out of the way, so it is the GPU's time for the step, gaps
# between kernels included; it is measured before the profiler attaches CUPTI. A step that cannot be captured (a host
# synchronization, an operator CUDA graphs do not support) has no graph_ms, and graph_error says why.
# A capture that fails leaves PyTorch's default CUDA generator marked as capturing (torch 2.11 marks it when a
# capture begins and clears the mark only when one ends well), and every random op after it raises "Offset
# increment outside graph capture encountered unexpectedly": seen on the H100 on 2026-12-07, where the test of a
# step that cannot be captured made 40 later tests of its process fail. So a failed capture is followed by one
# that succeeds (end_failed_capture), which clears the mark.
GRAPH_WARMUP = 3  # steps on the side stream before the capture, and replays before the timed ones


def end_failed_capture(stream: torch.cuda.Stream) -> None:
    """Clears what a failed CUDA graph capture on `stream` left set in the default CUDA generator (Note [GPU time
    without a profiler]): captures one fill on `stream` and drops that graph."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        torch.zeros(1, device=stream.device)
    graph.reset()


def graph_time_per_step(step: Callable[[], None], device: torch.device,
                        steps: int) -> Tuple[Optional[List[float]], Optional[str]]:
    """Milliseconds of each of `steps` replays of the step captured in a CUDA graph, each timed by CUDA events
    around it (Note [GPU time without a profiler]), and None; (None, None) on the CPU; (None, why) where the
    step cannot be captured."""
    if device.type != "cuda":
        return None, None
    graph = torch.cuda.CUDAGraph()
    capturing = False  # from the capture's start until it ends well
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                step()
        torch.cuda.current_stream(device).wait_stream(side)
        # Captured on the stream the warm-up ran on: what a library sets up per stream (cuBLAS's workspace, a
        # handle's stream) is set up before the capture.
        capturing = True
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            step()
        capturing = False
        for _ in range(GRAPH_WARMUP):
            graph.replay()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in events], None
    except Exception as error:  # noqa: BLE001 - the case goes on without this clock, and says why
        synchronize(device)
        if capturing:
            end_failed_capture(side)
        return None, f"{type(error).__name__}: {error}".splitlines()[0][:300]
    finally:
        graph.reset()  # its memory pool goes back to the allocator before the profiled steps


def run_overhead_case(args) -> dict:
    """Host overhead per call, the cache warm (tuned before timing, then miss policy 'error'). Each row times a
    round of calls with no synchronize between them, then one synchronize: the per-call wall time, and the
    host-only time before that synchronize; OVERHEAD_ROUNDS rounds (or --steps, if more; with --quick, --steps),
    interleaved in an order drawn anew each round (in_turn) so that drift, place and predecessor hit every row
    alike, give each row's median and its 95% interval (bench_stats). The forward rows make OVERHEAD_CALLS
    no-grad calls of a tiny convolution; the training rows TRAIN_CALLS iterations of forward + backward
    (torch.autograd.grad of input and weight) of a 16 -> 16 3x3 convolution.
    op_overhead_above_native_us: the op's host time per call minus native's, both called in a TorchScript loop
    (see NATIVE_OVERHEADS); eager_op_overhead_above_native_us: the same from Python;
    train_op_overhead_above_native_us and train_intercept_overhead_above_native_us: the training rows' host
    time per iteration through the op (as a converted module calls it) and through intercept, above the
    better native's; scripted_train_op_overhead_above_native_us and scripted_train_intercept_overhead_above_native_us:
    the same iterations made by a TorchScript loop (as a LibTorch or TorchScript training loop makes them), above
    native's in such a loop."""
    import torch.nn.functional as F

    import cudnn_cache

    device = torch.device(args.device)
    cudnn_cache.set_backend(args.backend)
    initialise_libraries(device, cudnn_cache)
    x = torch.rand(*OVERHEAD_INPUT, device=device)
    w = torch.rand(*OVERHEAD_WEIGHT, device=device)
    train_x = torch.rand(*TRAIN_INPUT, device=device, requires_grad=True)
    train_w = torch.rand(*TRAIN_WEIGHT, device=device, requires_grad=True)
    train_grad = torch.ones(TRAIN_INPUT[0], TRAIN_WEIGHT[0], *TRAIN_INPUT[2:], device=device)
    op = cudnn_cache.functional.convolution_call  # as converted modules call it (Note [Eager calls])

    def forward_calls(call):
        def calls():
            with torch.no_grad():
                for _ in range(OVERHEAD_CALLS):
                    call()
        return calls

    def training_calls(convolution):
        def calls():
            for _ in range(TRAIN_CALLS):
                torch.autograd.grad(convolution(train_x, train_w), (train_x, train_w), train_grad)
        return calls

    def native(x, w):
        return F.conv2d(x, w, padding=1)

    def through_op(x, w):
        return op(x, w, None, [1, 1], [1, 1], [1, 1], 1)

    native_loop, op_loop = torch.jit.script(scripted_native_loop), torch.jit.script(scripted_op_loop)
    native_training, op_training = (torch.jit.script(scripted_native_training),
                                    torch.jit.script(scripted_op_training))

    def scripted_training_calls(loop):
        def calls():
            loop(train_x, train_w, train_grad, TRAIN_CALLS)
        return calls
    rows = {  # name (as in OVERHEAD_LABELS) -> (cudnn.benchmark, intercept, calls per round, a round of calls)
        "native_heuristic": (False, False, OVERHEAD_CALLS, forward_calls(lambda: native(x, w))),
        "native_benchmark": (True, False, OVERHEAD_CALLS, forward_calls(lambda: native(x, w))),
        "op": (False, False, OVERHEAD_CALLS, forward_calls(lambda: through_op(x, w))),
        "functional": (False, False, OVERHEAD_CALLS,
                       forward_calls(lambda: cudnn_cache.functional.conv2d(x, w, padding=1))),
        "native_scripted": (False, False, OVERHEAD_CALLS, scripted_round(native_loop, x, w)),
        "op_scripted": (False, False, OVERHEAD_CALLS, scripted_round(op_loop, x, w)),
        "train_native_heuristic": (False, False, TRAIN_CALLS, training_calls(native)),
        "train_native_benchmark": (True, False, TRAIN_CALLS, training_calls(native)),
        "train_op": (False, False, TRAIN_CALLS, training_calls(through_op)),
        "train_intercept": (False, True, TRAIN_CALLS, training_calls(native)),
        "train_native_scripted": (False, False, TRAIN_CALLS, scripted_training_calls(native_training)),
        "train_op_scripted": (False, False, TRAIN_CALLS, scripted_training_calls(op_training)),
        "train_intercept_scripted": (False, True, TRAIN_CALLS, scripted_training_calls(native_training)),
    }

    def time_round(benchmark: bool, intercept: bool, calls: int, round_of_calls) -> tuple:
        torch.backends.cudnn.benchmark = benchmark
        cudnn_cache.intercept(intercept)
        synchronize(device)
        started = time.perf_counter()
        round_of_calls()
        queued = time.perf_counter()
        synchronize(device)
        finished = time.perf_counter()
        cudnn_cache.intercept(False)
        return 1e6 * (finished - started) / calls, 1e6 * (queued - started) / calls

    cudnn_cache.set_miss_policy("tune")
    for row in rows.values():  # warm-up: tunes the cache entries and native's benchmark cache
        time_round(*row)
    cudnn_cache.set_miss_policy("error")
    cudnn_cache.reset_stats()
    rounds = {name: [] for name in rows}
    repeats = args.steps if args.quick else max(args.steps, OVERHEAD_ROUNDS)
    for round_index in range(repeats):
        for name in in_turn(list(rows), round_index):
            rounds[name].append(time_round(*rows[name]))

    results = {}
    for name in rows:
        wall, host = [r[0] for r in rounds[name]], [r[1] for r in rounds[name]]
        results[name] = {"wall_us": statistics.median(wall), "host_us": statistics.median(host),
                         "wall_us_interval": median_interval(wall), "host_us_interval": median_interval(host),
                         "wall_us_rounds": wall, "host_us_rounds": host}

    def above_better_native(name: str, natives) -> float:
        return results[name]["host_us"] - min(results[native]["host_us"] for native in natives)

    return {"workload": OVERHEAD, "backend": cudnn_cache.backend(), "input": list(OVERHEAD_INPUT),
            "weight": list(OVERHEAD_WEIGHT), "padding": 1, "calls": OVERHEAD_CALLS, "repeats": repeats,
            "train_input": list(TRAIN_INPUT), "train_weight": list(TRAIN_WEIGHT), "train_calls": TRAIN_CALLS,
            "results": results,
            "op_overhead_above_native_us": above_better_native("op_scripted", ["native_scripted"]),
            "eager_op_overhead_above_native_us": above_better_native("op", NATIVE_OVERHEADS),
            "train_op_overhead_above_native_us": above_better_native("train_op", NATIVE_TRAIN_OVERHEADS),
            "train_intercept_overhead_above_native_us": above_better_native("train_intercept",
                                                                            NATIVE_TRAIN_OVERHEADS),
            "scripted_train_op_overhead_above_native_us": above_better_native("train_op_scripted",
                                                                              ["train_native_scripted"]),
            "scripted_train_intercept_overhead_above_native_us": above_better_native("train_intercept_scripted",
                                                                                     ["train_native_scripted"]),
            "stats": cudnn_cache.stats()}


def scripted_round(loop, x: torch.Tensor, w: torch.Tensor) -> Callable[[], None]:
    """A round of OVERHEAD_CALLS no-grad calls made by a TorchScript loop."""
    def calls():
        with torch.no_grad():
            loop(x, w, OVERHEAD_CALLS)
    return calls


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


def scripted_native_training(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor,
                             calls: int) -> List[Optional[torch.Tensor]]:
    grads: List[Optional[torch.Tensor]] = []
    for _ in range(calls):
        outputs: List[Optional[torch.Tensor]] = [grad]
        grads += torch.autograd.grad([torch.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)], [x, w], outputs)
    return grads


def scripted_op_training(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor,
                         calls: int) -> List[Optional[torch.Tensor]]:
    grads: List[Optional[torch.Tensor]] = []
    for _ in range(calls):
        outputs: List[Optional[torch.Tensor]] = [grad]
        grads += torch.autograd.grad([torch.ops.cudnn_cache.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1)],
                                     [x, w], outputs)
    return grads


def run_interleaved_case(workload_name: str, native_mode: str, args) -> dict:
    """Steady steps of one workload in three modes taken in turn in one process: native (native_mode), the
    converted model on the file cache_cold saved (cache_warm) and the unmodified model under intercept
    (cache_intercept). Separate processes differ by more than these modes do (host jitter, clocks, where memory
    landed), so the wall-clock comparison that counts is this one: every round times one step of each mode,
    in an order drawn anew each round (in_turn), and each cache mode's ratio to native is taken per round (paired), then
    summarised as a median with its 95% interval (bench_stats). GPU time is the training cases' to report."""
    import cudnn_cache

    workload, device = WORKLOADS[workload_name], torch.device(args.device)
    torch.backends.cudnn.benchmark = MODES[native_mode].benchmark
    cudnn_cache.set_backend(args.backend)
    initialise_libraries(device, cudnn_cache)
    cudnn_cache.clear()
    loaded = cudnn_cache.load(args.cache_file)
    cudnn_cache.set_miss_policy("error")
    native, x, convolutions = model_and_input(workload, device, None)
    converted, _, _ = model_and_input(workload, device, cudnn_cache)
    if device.type == "cuda":
        cudnn_cache.prepare()

    def step_of(model, intercept: bool):
        def step():
            cudnn_cache.intercept(intercept)
            try:
                synchronize(device)
                started = time.perf_counter()
                model.zero_grad(set_to_none=True)
                loss = model(x).float().sum()
                forwarded = time.perf_counter()
                loss.backward()
                queued = time.perf_counter()
                synchronize(device)
                return time.perf_counter() - started, queued - started, forwarded - started
            finally:
                cudnn_cache.intercept(False)
        return step

    steps = {"native": step_of(native, False), "cache_warm": step_of(converted, False),
             "cache_intercept": step_of(native, True)}
    for step in steps.values():  # native benchmark mode tunes on its first step
        for _ in range(args.warmup + 1):
            step()
    cudnn_cache.reset_stats()
    times: Dict[str, List[float]] = {mode: [] for mode in steps}
    host: Dict[str, List[float]] = {mode: [] for mode in steps}
    forward: Dict[str, List[float]] = {mode: [] for mode in steps}
    for round_index in range(args.steps):
        for mode in in_turn(list(steps), round_index):
            wall, queued, forwarded = steps[mode]()
            times[mode].append(1e3 * wall)
            host[mode].append(1e3 * queued)
            forward[mode].append(1e3 * forwarded)

    def paired(values: Dict[str, List[float]]) -> Dict[str, dict]:
        return {mode: median_interval([a / b for a, b in zip(values[mode], values["native"])])
                for mode in ("cache_warm", "cache_intercept")}

    # host: until backward() returns, before the step's final synchronize; a cache mode whose wall ratio is
    # above its host ratio waits on the GPU more than native does, one whose host ratio is as high spends the
    # host time itself. forward: until the loss is computed, so the host's backward is host minus forward.
    return {"workload": workload_name, "native_mode": native_mode, "backend": cudnn_cache.backend(),
            "convolutions": convolutions, "loaded_entries": loaded, "steps_ms": times, "host_steps_ms": host,
            "wall_ms": {mode: median_interval(values) for mode, values in times.items()},
            "host_ms": {mode: median_interval(values) for mode, values in host.items()},
            "forward_steps_ms": forward, "forward_ms": {mode: median_interval(v) for mode, v in forward.items()},
            "ratio_to_native": paired(times), "host_ratio_to_native": paired(host),
            "forward_ratio_to_native": paired(forward),
            "stats": cudnn_cache.stats()}


def run_case(args) -> int:
    """The --case entry point: runs one case and prints its result as one JSON line."""
    if args.case == OVERHEAD:
        result = run_overhead_case(args)
    elif f":{INTERLEAVED}:" in args.case:
        workload_name, _, native_mode = args.case.split(":")
        result = run_interleaved_case(workload_name, native_mode, args)
    else:
        workload_name, mode_name = args.case.split(":")
        result = run_training_case(workload_name, mode_name, args)
    print(json.dumps(result), flush=True)
    return 0
