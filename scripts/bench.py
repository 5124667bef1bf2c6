#!/usr/bin/env python3
"""Whole-model benchmark: cudnn_cache against PyTorch's own cuDNN autotuning, each case in a fresh process.

For every workload, five modes run one after another, each in its own Python process (so no in-process cache
carries over between them):

    native_benchmark   torch.backends.cudnn.benchmark=True: PyTorch times engines on the first step
    native_heuristic   benchmark=False: cuDNN's heuristics, no timing
    cache_cold         cudnn_cache.convert(model), empty cache, miss policy 'tune': the first step tunes every
                       convolution; the cache is then saved to a temporary file
    cache_warm         a fresh process loads that file (timed), converts the model, sets miss policy 'error'
                       (a convolution the file does not cover fails loudly instead of tuning) and builds the
                       execution plans of the loaded entries with cudnn_cache.prepare() (timed) before the
                       first step; warm start = load + prepare + first step
    cache_intercept    as cache_warm, but the model is not converted: cudnn_cache.intercept() routes PyTorch's
                       own convolutions (aten::convolution and its backward) through the cache

The cache modes run through the backend --backend names (cudnn_cache.set_backend): 'graph' (default) runs
cuDNN graph-API engine configs, 'legacy' replays cudnnConvolution*Algo_t.

A training step is model.zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward (no
optimizer step; the same in every mode), with the input requiring grad, as in the baseline measurement
(../shared/context/baseline_autotune.py, results in ../shared/context/MEASURED.md). Before the first step each
process initialises CUDA, cuBLAS and cuDNN on an unrelated tiny convolution, so the first step measures
tuning and per-shape set-up only. Per case it reports the first step (s, synchronized), the median of --steps
steady steps after --warmup steps (ms, synchronized per step), the tuning estimate (first step minus steady
step), the cache load and prepare times, and the cache counters (tuning and plan-build time among them). A
separate micro case measures host overhead per call of a tiny convolution: native F.conv2d against the op
torch.ops.cudnn_cache.convolution called directly and against cudnn_cache.functional.conv2d.

Targets, checked per workload from its cases and once for the op's host overhead (met or missed):
    warm first step <= native_heuristic first step;  warm start <= 1.5 s;
    warm steady <= native_benchmark steady;  warm steady <= the better native steady (stretch: 0.95 of it);
    cold tuning time (cache_cold first step - steady step) <= native_benchmark first step;
    intercepted steady <= 1.02 x the converted model's (cache_warm) steady, with nothing tuned;
    with --audit, no key whose stored choice is > 2% slower than a native choice measured the same way, by
    more than the audit's resolution (the widest gap it measured between a stored config and itself);
    the op's host time per call <= the better native's + 2 us.

Usage (after scripts/build.sh; needs a CUDA GPU, else it says so and exits 2):

    python3 scripts/bench.py                                   # everything: about 3-6 minutes on an H200
    python3 scripts/bench.py --quick                           # 20 steps, seed, ResNet-18, MobileNetV2, overhead
    python3 scripts/bench.py --workloads resnet18_fp16_cl seed --modes native_heuristic cache_cold cache_warm
    python3 scripts/bench.py --backend legacy --steps 50 --timeout 300 --output-dir /tmp/bench

Writes <output-dir>/bench.json (environment, settings, every raw per-case result, the targets; --json to move
it), <output-dir>/bench.md (the tables, also printed) and <output-dir>/bench.png (needs matplotlib; skipped
with a message without it). A case that fails or times out is recorded with its error text and the run goes on.

Exit codes: 0 every case ran; 1 some case failed (the reports are still written); 2 bad arguments or no GPU.
"""

import argparse
import dataclasses
import datetime
import json
import math
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
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
QUICK_WORKLOADS = ("seed", "resnet18_fp16_cl", "mobilenet_v2_bf16_cl", OVERHEAD)  # what --quick runs
BACKENDS = ("graph", "legacy")  # cudnn_cache.set_backend


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

# The targets (see check_targets).
TARGET_WARM_START_S = 1.5          # load + prepare + first step of cache_warm
TARGET_STEADY_STRETCH = 0.95       # of the better native steady step; 'met' is judged at 1.00
TARGET_OP_OVERHEAD_US = 2.0        # the op's host time per call above the better native's
TARGET_INTERCEPT_RATIO = 1.02      # cache_intercept's steady step over cache_warm's (run-to-run noise)


# ---------------------------------------------------------------------------------------------------------------
# One case, in its own process (--case)
# ---------------------------------------------------------------------------------------------------------------

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
    native choices (all measured the same way); how many keys are slower than that by more than AUDIT_NOISE
    and by more than the audit's resolution; the geometric means against each native mode; and the worst key.

    The resolution is the widest gap the audit measured between a stored config and itself (stored_again_ms):
    a kernel of 10 us times within about 1 us of itself, 10%, so a smaller gap says nothing about which of
    two configs is faster."""
    summary = {"keys": len(rows), "rows": rows}
    if not rows:
        return summary
    native = [min(row["heuristic_ms"], row["benchmark_ms"]) for row in rows]
    ratios = [row["stored_ms"] / best for row, best in zip(rows, native)]
    worst = max(range(len(rows)), key=ratios.__getitem__)
    resolution_ms = max((abs(row["stored_ms"] - row["stored_again_ms"]) for row in rows if "stored_again_ms" in row),
                        default=0.0)
    slower = [ratio > AUDIT_NOISE and row["stored_ms"] - best > resolution_ms
              for row, best, ratio in zip(rows, native, ratios)]

    def geomean(values):
        return math.exp(statistics.fmean(math.log(v) for v in values))

    summary.update(
        resolution_us=1e3 * resolution_ms,
        slower_than_native=sum(slower),
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


# ---------------------------------------------------------------------------------------------------------------
# The driver: one subprocess per case
# ---------------------------------------------------------------------------------------------------------------

def run_subprocess(command: List[str], timeout: float) -> dict:
    """Runs one case's command; returns the JSON object of its last '{' stdout line, or {'error': text} when it
    fails, times out or prints none. Adds process_s (the process's wall time) either way."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
        return {"error": f"timed out after {timeout:g} s\n{(stderr or '')[-2000:]}".strip(),
                "process_s": time.perf_counter() - started}
    elapsed = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        text = (done.stderr.strip() or done.stdout.strip() or "no output")[-2000:]
        return {"error": f"exit code {done.returncode}: {text}", "process_s": elapsed}
    result = json.loads(lines[-1])
    result["process_s"] = elapsed
    return result


def case_command(case: str, args, cache_file: Optional[pathlib.Path]) -> List[str]:
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--case", case, "--device", args.device,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--backend", args.backend]
    if cache_file is not None:
        command += ["--cache-file", str(cache_file)]
    if args.audit:
        command.append("--audit")
    command += ["--tuning", *(f"{name}={int(value) if isinstance(value, bool) else value}"
                              for name, value in args.tuning.items())]
    return command


def describe(result: dict) -> str:
    """One progress line for a finished case."""
    if "error" in result:
        return "FAILED: " + result["error"].splitlines()[0]
    if result["workload"] == OVERHEAD:
        return ", ".join(f"{name} {r['host_us']:.1f} us/call (host)" for name, r in result["results"].items())
    line = f"first step {result['first_s']:.2f} s, steady {result['steady_ms']:.2f} ms"
    if "warm_start_s" in result:
        line += f", warm start {result['warm_start_s']:.2f} s"
    return line


def run_all(args) -> dict:
    """Runs every selected case in its own process, in order (cache_warm after cache_cold of its workload)."""
    plan = [(w, m) for w in args.workloads if w != OVERHEAD for m in MODES if m in args.modes]
    if OVERHEAD in args.workloads:
        plan.append((OVERHEAD, None))
    cases, overhead = [], None
    with tempfile.TemporaryDirectory(prefix="cudnn_cache_bench_") as folder:
        for index, (workload, mode) in enumerate(plan, 1):
            name = workload if mode is None else f"{workload}:{mode}"
            cache_file = pathlib.Path(folder) / f"{workload}.cache" if mode else None
            if mode in LOADS_COLD_FILE and not cache_file.exists():
                result = {"error": "skipped: cache_cold of this workload wrote no cache file"}
            else:
                result = run_subprocess(case_command(name, args, cache_file), args.timeout)
            result.setdefault("workload", workload)
            if mode is None:
                overhead = result
            else:
                result.setdefault("mode", mode)
                cases.append(result)
            print(f"[{index}/{len(plan)}] {name}: {describe(result)}", flush=True)
    return {"cases": cases, "overhead": overhead}


def environment(device: str) -> dict:
    cuda = device == "cuda" and torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if cuda else f"none (--device {device})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "python": platform.python_version(),
        "host": platform.node(),
    }


# ---------------------------------------------------------------------------------------------------------------
# Reports: derived columns, targets, JSON, markdown, chart
# ---------------------------------------------------------------------------------------------------------------

def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if numerator is None or not denominator else numerator / denominator


def successful(cases: List[dict]) -> Dict[Tuple[str, str], dict]:
    """The cases that ran, by (workload, mode)."""
    return {(c["workload"], c["mode"]): c for c in cases if "error" not in c}


def best_native_steady(ok: Dict[Tuple[str, str], dict], workload: str) -> Optional[float]:
    """The faster steady step (ms) of native_benchmark and native_heuristic; None when neither ran."""
    steadies = [ok[(workload, m)]["steady_ms"] for m in ("native_benchmark", "native_heuristic")
                if (workload, m) in ok]
    return min(steadies) if steadies else None


def add_derived(cases: List[dict]) -> None:
    """Adds case['derived'] to every successful case: steady ÷ native_benchmark steady, steady ÷ the better of
    the two native steadies, first step ÷ native_heuristic first step, and (cache_warm) warm start ÷
    native_heuristic first step, all within the same workload; None where a case is missing."""
    ok = successful(cases)
    for case in ok.values():
        def native(mode, key):
            return ok.get((case["workload"], mode), {}).get(key)

        case["derived"] = {
            "steady_vs_native_benchmark": ratio(case["steady_ms"], native("native_benchmark", "steady_ms")),
            "steady_vs_best_native": ratio(case["steady_ms"], best_native_steady(ok, case["workload"])),
            "first_vs_native_heuristic_first": ratio(case["first_s"], native("native_heuristic", "first_s")),
            "warm_start_vs_native_heuristic_first": ratio(case.get("warm_start_s"),
                                                          native("native_heuristic", "first_s")),
        }


def check_targets(report: dict) -> List[dict]:
    """The targets, for every workload with a cache_cold or cache_warm case, then once for the op's host
    overhead: dicts {workload, target, value, limit, unit, met}, met = value <= limit, or None (no data) when a
    case it needs is missing or failed. The better-native-steady target also has stretch_limit and stretch_met."""
    ok, targets = successful(report["cases"]), []

    def target(workload, text, value, limit, unit, stretch_limit=None):
        row = {"workload": workload, "target": text, "value": value, "limit": limit, "unit": unit,
               "met": None if value is None or limit is None else value <= limit}
        if stretch_limit is not None:
            row.update(stretch_limit=stretch_limit, stretch_met=None if value is None else value <= stretch_limit)
        targets.append(row)

    workloads = dict.fromkeys(c["workload"] for c in report["cases"] if c["mode"].startswith("cache_"))
    for workload in workloads:
        def get(mode, key):
            return ok.get((workload, mode), {}).get(key)

        warm_steady = get("cache_warm", "steady_ms")
        target(workload, "warm first step ≤ native_heuristic first step", get("cache_warm", "first_s"),
               get("native_heuristic", "first_s"), "s")
        target(workload, f"warm start (load + prepare + first step) ≤ {TARGET_WARM_START_S:g} s",
               get("cache_warm", "warm_start_s"), TARGET_WARM_START_S, "s")
        target(workload, "warm steady ÷ native_benchmark steady ≤ 1.00",
               ratio(warm_steady, get("native_benchmark", "steady_ms")), 1.0, "ratio")
        target(workload, f"warm steady ÷ better native steady ≤ 1.00 (stretch {TARGET_STEADY_STRETCH:.2f})",
               ratio(warm_steady, best_native_steady(ok, workload)), 1.0, "ratio",
               stretch_limit=TARGET_STEADY_STRETCH)
        target(workload, "cold tuning (cache_cold first step − steady step) ≤ native_benchmark first step",
               get("cache_cold", "tuning_estimate_s"), get("native_benchmark", "first_s"), "s")
        if (workload, "cache_intercept") in ok or (workload, "cache_intercept") in failed_cases(report["cases"]):
            target(workload, f"intercepted steady ÷ converted (cache_warm) steady ≤ {TARGET_INTERCEPT_RATIO:.2f}, "
                   "tuning nothing", intercept_ratio(ok, workload), TARGET_INTERCEPT_RATIO, "ratio")
        audit = get("cache_cold", "audit")
        if audit is not None and audit["keys"]:
            target(workload, f"keys whose stored choice is > {AUDIT_NOISE:g}x slower than a native choice, "
                   "measured the same way (cudnn_cache.audit)", audit["slower_than_native"], 0, "count")
    overhead = report.get("overhead")
    if overhead is not None:
        target(OVERHEAD, f"op host time per call ≤ better native's + {TARGET_OP_OVERHEAD_US:g} us",
               overhead.get("op_overhead_above_native_us"), TARGET_OP_OVERHEAD_US, "us")
    return targets


def failed_cases(cases: List[dict]) -> set:
    return {(c["workload"], c["mode"]) for c in cases if "error" in c}


def intercept_ratio(ok: Dict[Tuple[str, str], dict], workload: str) -> Optional[float]:
    """cache_intercept's steady step over cache_warm's, or None when either is missing or it tuned anything."""
    intercepted = ok.get((workload, "cache_intercept"))
    if intercepted is None or intercepted.get("stats", {}).get("tunes"):
        return None
    return ratio(intercepted["steady_ms"], ok.get((workload, "cache_warm"), {}).get("steady_ms"))


def number(value: Optional[float], spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def table(columns: List[str], rows: List[List[str]]) -> List[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def workload_label(workload: str) -> str:
    return WORKLOADS[workload].label if workload in WORKLOADS else workload


START_COLUMNS = ["workload", "mode", "first step", "first ÷ heuristic first", "tuning est. (tunes)", "tune time",
                 "plan build", "load", "prepare (plans)", "warm start", "warm start ÷ heuristic first"]
STEADY_COLUMNS = ["workload", "mode", "steady step", "GPU time per step", "÷ bench steady", "÷ best native steady",
                  "hits / misses / tunes / fallbacks", "plans built / deserialized / rebuilt"]


def failed_row(case: dict, columns: List[str]) -> List[str]:
    error = " ".join(case["error"].splitlines()[:1])[:160].replace("|", "\\|")
    return [workload_label(case["workload"]), case["mode"], f"FAILED: {error}"] + [""] * (len(columns) - 3)


def start_row(case: dict) -> List[str]:
    """The case's row of the first-step and start-up table."""
    if "error" in case:
        return failed_row(case, START_COLUMNS)
    derived, stats = case["derived"], case.get("stats")
    tuning = number(case.get("tuning_estimate_s"), ".2f", " s")
    if stats is not None and case["mode"] == "cache_cold":
        tuning += f" ({stats['tunes']})"
    load = "-"
    if "load_s" in case:
        load = f"{1e3 * case['load_s']:.1f} ms ({case['loaded_entries']} entries)"
    prepare = "-"
    if case.get("prepare_s") is not None:
        prepare = f"{1e3 * case['prepare_s']:.1f} ms ({case['prepared_plans']})"
    return [workload_label(case["workload"]), case["mode"], number(case["first_s"], ".2f", " s"),
            number(derived["first_vs_native_heuristic_first"], ".2f"), tuning, number(case.get("tune_s"), ".2f", " s"),
            number(case.get("plan_build_s"), ".3f", " s"), load, prepare, number(case.get("warm_start_s"), ".2f", " s"),
            number(derived["warm_start_vs_native_heuristic_first"], ".2f")]


def steady_row(case: dict) -> List[str]:
    """The case's row of the steady-state table."""
    if "error" in case:
        return failed_row(case, STEADY_COLUMNS)
    derived, stats = case["derived"], case.get("stats")
    counters = plans = "-"
    if stats is not None:
        counters = " / ".join(str(stats[k]) for k in ("hits", "misses", "tunes", "fallbacks"))
        plans = " / ".join(str(stats.get(k, "-")) for k in ("plans_built", "plans_deserialized", "plan_rebuilds"))
    return [workload_label(case["workload"]), case["mode"], number(case["steady_ms"], ".2f", " ms"),
            number(case.get("gpu_ms"), ".2f", " ms"), number(derived["steady_vs_native_benchmark"], ".2f"),
            number(derived["steady_vs_best_native"], ".2f"),
            counters, plans]


def audit_table(cases: List[dict]) -> List[str]:
    audited = [c for c in cases if c.get("audit", {}).get("keys")]
    if not audited:
        return []
    lines = ["", "## Per-key audit", "", "cudnn_cache.audit() after cache_cold: every tuned key's stored engine "
             "config against the configs native benchmark=False (first that runs, in heuristic order) and "
             "benchmark=True (fastest of 10, one timing each) would run, all three then timed the same way: warmed "
             "up, L2 flushed, interleaved rounds, median; the stored config twice, and the widest gap between its "
             "two times is the audit's resolution. A key counts as slower when its stored choice is more than "
             f"{AUDIT_NOISE:g}x and more than the resolution slower than a native choice. Ratios are stored ÷ "
             "native; below 1 is faster.", ""]
    rows = []
    for case in audited:
        a = case["audit"]
        resolution = f"{a['resolution_us']:.1f} us" if "resolution_us" in a else "-"
        rows.append([workload_label(case["workload"]), str(a["keys"]), resolution, str(a["slower_than_native"]),
                     str(a["faster_than_native"]), f"{a['geomean_vs_heuristic']:.3f}",
                     f"{a['geomean_vs_benchmark']:.3f}",
                     f"{a['stored_total_ms']:.2f} / {a['heuristic_total_ms']:.2f} / {a['benchmark_total_ms']:.2f} ms",
                     f"{a['worst_ratio']:.3f}", f"{a['seconds']:.1f} s"])
    return lines + table(["workload", "keys", "resolution", "slower", f"faster < 1/{AUDIT_NOISE:g}",
                          "geomean ÷ heuristic", "geomean ÷ benchmark", "sum stored / heuristic / benchmark",
                          "worst key ratio", "audit time"], rows)


def overhead_table(overhead: Optional[dict]) -> List[str]:
    if overhead is None:
        return []
    lines = ["", "## Host overhead per call"]
    if "error" in overhead:
        return lines + ["", "FAILED: " + overhead["error"].splitlines()[0]]
    shape = "x".join(map(str, overhead["input"]))
    lines += ["", f"conv2d forward, input {shape}, weight {'x'.join(map(str, overhead['weight']))}, padding 1, "
              f"no grad: {overhead['calls']} calls with no synchronize between them, then one; median of "
              f"{overhead['repeats']} rounds. The cache was tuned first (warm), then ran with miss policy 'error'. "
              f"The op's host time above native's, both in a TorchScript loop: "
              f"{overhead['op_overhead_above_native_us']:.1f} us; called from Python (torch.ops parses its "
              f"arguments per call), above the better native's: "
              f"{overhead.get('eager_op_overhead_above_native_us', math.nan):.1f} us.", ""]
    rows = [[OVERHEAD_LABELS.get(name, name), f"{r['wall_us']:.1f} us", f"{r['host_us']:.1f} us"]
            for name, r in overhead["results"].items()]
    return lines + table(["call", "wall per call (incl. final synchronize)", "host per call (before it)"], rows)


TARGET_FORMATS = {"s": (".2f", " s"), "ratio": (".2f", ""), "us": (".1f", " us"), "count": ("d", "")}


def targets_table(targets: List[dict]) -> List[str]:
    if not targets:
        return []
    verdicts = {True: "met", False: "missed", None: "no data"}
    rows = []
    for t in targets:
        spec, unit = TARGET_FORMATS[t["unit"]]
        verdict = verdicts[t["met"]]
        if "stretch_limit" in t:
            verdict += f"; stretch {t['stretch_limit']:.2f}: {verdicts[t['stretch_met']]}"
        label = "host overhead" if t["workload"] == OVERHEAD else workload_label(t["workload"])
        rows.append([label, t["target"], number(t["value"], spec, unit), number(t["limit"], spec, unit), verdict])
    met = sum(t["met"] is True for t in targets)
    return ["", "## Targets", "", f"{met} of {len(targets)} met (cache_warm and cache_cold against the native "
            "cases of the same workload).", ""] + table(["workload", "target", "value", "limit", "result"], rows)


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# cudnn_cache against native cuDNN autotuning: whole training steps", "",
        f"{env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}), cuDNN {env['cudnn']}; {env['date']}. "
        f"Each case ran in a fresh process (`scripts/bench.py`); cache backend '{report['settings']['backend']}'.",
        "", "## First step and start-up", "",
    ]
    lines += table(START_COLUMNS, [start_row(case) for case in report["cases"]])
    lines += ["", "## Steady state", ""]
    lines += table(STEADY_COLUMNS, [steady_row(case) for case in report["cases"]])
    lines += audit_table(report["cases"])
    lines += overhead_table(report.get("overhead"))
    lines += targets_table(report.get("targets", []))
    lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def notes(settings: dict) -> List[str]:
    lines = [
        "A training step: zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward; no optimizer "
        "step. The input requires grad. The same in every mode.",
        "first step: wall time of the first training step, synchronized, after CUDA, cuBLAS and cuDNN were set up "
        f"on an unrelated tiny convolution. steady step: median of {settings['steps']} steps, synchronized per "
        f"step, after {settings['warmup']} warm-up steps. GPU time per step: kernel and copy time torch.profiler "
        f"records over {GPU_TIME_STEPS} more steps, per step; a steady step well above it is host time the GPU "
        "waits on.",
        f"backend: the cache modes ran with cudnn_cache.set_backend('{settings['backend']}'). 'graph' runs cuDNN "
        "graph-API engine configs, each through an execution plan built from its stored config (by prepare() or "
        "on its first call); 'legacy' replays cudnnConvolution*Algo_t and builds no plans.",
        "tuning est.: first step minus steady step, for the modes that tune (native_benchmark, cache_cold); in "
        "parentheses, the convolutions cudnn_cache tuned (stats()['tunes']).",
        "tune time, plan build: stats()['tune_us'] and stats()['plan_build_us'] over the case, in seconds: time "
        "spent tuning, and building execution plans (on first calls and in prepare()); '-' where this build of "
        "the ops does not count them.",
        "load: cudnn_cache.load() of the file cache_cold saved (cache_warm, which runs with miss policy 'error'). "
        "prepare: cudnn_cache.prepare() after it, before the first step, which builds the execution plan of "
        "every loaded graph-API entry of the GPU (in parentheses, the plans it reports). warm start: load + "
        "prepare + first step.",
        "÷ bench steady: steady step ÷ native_benchmark's; ÷ best native steady: ÷ the faster of native_benchmark "
        "and native_heuristic; first ÷ heuristic first, warm start ÷ heuristic first: ÷ native_heuristic's "
        "first step.",
        "hits / misses / tunes / fallbacks, plans built / deserialized / rebuilt: cudnn_cache.stats() over the "
        "case (from before load, so prepare and the first step count): plans_built, plans_deserialized (restored "
        "from the file instead of built), plan_rebuilds (stored plans that could not be used and were rebuilt).",
    ]
    if settings["device"] == "cpu":
        lines.append("--device cpu: no cuDNN, so prepare() is not called: prepare_s and prepared_plans are null, "
                     "and warm start counts prepare as 0 s.")
    return lines


def plot(report: dict, path: pathlib.Path) -> bool:
    """Grouped bars per workload, on log scales: steady step and first step per mode, and (when cache_warm ran)
    cache_warm's warm start against the native first steps. Returns False, saying why, when matplotlib is
    missing or no training case succeeded."""
    ok = successful(report["cases"])
    if not ok:
        print(f"bench: no successful training case to chart; skipping {path}")
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"bench: matplotlib is not installed; skipping the chart {path} (pip install matplotlib)")
        return False
    workloads = list(dict.fromkeys(c["workload"] for c in report["cases"]))
    modes = [m for m in MODES if any(c["mode"] == m for c in report["cases"])]
    panels = [("steady step (ms, median)", [(m, m, "steady_ms") for m in modes]),  # title, [(label, mode, key)]
              ("first step (s)", [(m, m, "first_s") for m in modes])]
    if any("warm_start_s" in case for case in ok.values()):
        natives = [m for m in ("native_benchmark", "native_heuristic") if m in modes]
        panels.append(("start-up (s): native first steps, cache_warm's load + prepare + first step",
                       [(f"{m} first step", m, "first_s") for m in natives]
                       + [("cache_warm warm start", "cache_warm", "warm_start_s")]))
    figure, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 2.2 * len(workloads)), 4.5 * len(panels)),
                                constrained_layout=True)
    for axis, (title, series) in zip(axes, panels):
        width = 0.8 / len(series)
        for index, (label, mode, key) in enumerate(series):
            values = [ok.get((w, mode), {}).get(key) for w in workloads]
            values = [math.nan if v is None else v for v in values]
            positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(workloads))]
            bars = axis.bar(positions, values, width, label=label, color=f"C{list(MODES).index(mode)}")
            axis.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.3g}" for v in values], fontsize=7,
                           rotation=90, padding=2)
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xticks(range(len(workloads)))
        axis.set_xticklabels([workload_label(w) for w in workloads], fontsize=8, rotation=15, ha="right")
        axis.margins(y=0.25)
        axis.legend(fontsize=8)
    env = report["environment"]
    figure.suptitle(f"cudnn_cache ({report['settings']['backend']}) vs native cuDNN: {env['gpu']}, "
                    f"torch {env['torch']}, cuDNN {env['cudnn']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_reports(report: dict, json_path: pathlib.Path, output_dir: pathlib.Path) -> str:
    """Adds the derived columns and the targets, writes the JSON, the markdown tables and the chart (when
    matplotlib is there); returns the markdown."""
    add_derived(report["cases"])
    report["targets"] = check_targets(report)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "bench.md").write_text(text)
    if plot(report, output_dir / "bench.png"):
        print(f"bench: wrote {output_dir / 'bench.png'}")
    return text


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", choices=[*WORKLOADS, OVERHEAD], metavar="NAME",
                        help=f"a subset of: {', '.join([*WORKLOADS, OVERHEAD])} (default: all; with --quick: "
                             f"{', '.join(QUICK_WORKLOADS)})")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), metavar="MODE",
                        help=f"a subset of: {', '.join(MODES)} (default: all; cache_warm needs cache_cold)")
    parser.add_argument("--backend", choices=BACKENDS, default="graph",
                        help="cudnn_cache.set_backend for the cache modes and the overhead case (default graph)")
    parser.add_argument("--audit", action="store_true",
                        help="after cache_cold, time every tuned key against native's choices (cudnn_cache.audit)")
    parser.add_argument("--combine", nargs="+", type=pathlib.Path, metavar="JSON",
                        help="no benchmark: one report (JSON, markdown, chart) of the JSON reports of runs split "
                             "in parts, e.g. to fit a time limit")
    parser.add_argument("--tuning", nargs="*", default=[], metavar="NAME=VALUE",
                        help="cudnn_cache.set_tuning_options for the cache cases, e.g. flush_l2=0 max_candidates=5")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: --steps 20, --warmup 3 and the --quick workloads, unless given")
    parser.add_argument("--steps", type=int, help="steady steps timed per case (>= 20; default 30, --quick 20)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default 5, --quick 3)")
    parser.add_argument("--output-dir", type=pathlib.Path, default=ROOT / "docs",
                        help="where bench.md and bench.png go (default: docs/ of the repository)")
    parser.add_argument("--json", type=pathlib.Path, help="the JSON report (default: OUTPUT_DIR/bench.json)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case process (default 180)")
    # Internal: --case runs one case in this process (WORKLOAD:MODE or 'overhead') and prints one JSON line;
    # --device cpu runs everything on the CPU, to test the plumbing without a GPU.
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--cache-file", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workloads is None:
        args.workloads = list(QUICK_WORKLOADS) if args.quick else [*WORKLOADS, OVERHEAD]
    if args.steps is None:
        args.steps = 20 if args.quick else 30
    if args.warmup is None:
        args.warmup = 3 if args.quick else 5
    if args.steps < 20:
        parser.error("--steps must be >= 20 (the steady step is a median over them)")
    if args.warmup < 0 or args.timeout <= 0:
        parser.error("--warmup must be >= 0 and --timeout > 0")
    for mode in LOADS_COLD_FILE:
        if mode in args.modes and "cache_cold" not in args.modes:
            parser.error(f"{mode} loads the file cache_cold writes: add cache_cold to --modes")
    args.workloads = list(dict.fromkeys(args.workloads))
    tuning = {}
    for item in args.tuning:
        name, _, value = item.partition("=")
        if not value:
            parser.error(f"--tuning takes NAME=VALUE, got {item!r} (e.g. flush_l2=0)")
        try:
            tuning[name] = float(value) if name == "give_up_ratio" else int(value)
        except ValueError:
            parser.error(f"--tuning {name}: {value!r} is not a number")
        if name == "flush_l2":
            tuning[name] = bool(tuning[name])
    args.tuning = tuning
    args.json = args.json or args.output_dir / "bench.json"
    return args


def combine(paths: List[pathlib.Path]) -> dict:
    """One report of the JSON reports of several runs of this script on one machine (a run split in parts to
    fit a time limit): their cases and overhead, the first run's environment and settings, each part's
    workloads and date in settings['parts']. Refuses reports of different GPUs, versions or settings."""
    reports = [json.loads(path.read_text()) for path in paths]
    first = reports[0]
    same = ("gpu", "torch", "cudnn")
    for path, report in zip(paths[1:], reports[1:]):
        for key in same:
            if report["environment"].get(key) != first["environment"].get(key):
                raise SystemExit(f"bench --combine: {path} ran with {key} {report['environment'].get(key)!r}, "
                                 f"{paths[0]} with {first['environment'].get(key)!r}: runs of one setup only")
        for key in ("backend", "steps", "warmup", "tuning", "audit"):
            if report["settings"].get(key) != first["settings"].get(key):
                raise SystemExit(f"bench --combine: {path} has setting {key}={report['settings'].get(key)!r}, "
                                 f"{paths[0]} {first['settings'].get(key)!r}: combine runs of the same settings")
    combined = {"environment": first["environment"], "settings": dict(first["settings"]), "notes": first["notes"],
                "cases": [case for report in reports for case in report["cases"]],
                "overhead": next((r["overhead"] for r in reports if r.get("overhead")), None)}
    combined["settings"]["parts"] = [{"file": str(path), "workloads": r["settings"]["workloads"],
                                      "date": r["environment"].get("date")} for path, r in zip(paths, reports)]
    combined["settings"]["workloads"] = [w for r in reports for w in r["settings"]["workloads"]]
    return combined


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.combine:
        report = combine(args.combine)
        print(write_reports(report, args.json, args.output_dir))
        print(f"bench: combined {len(args.combine)} runs into {args.json} and {args.output_dir / 'bench.md'}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench: no CUDA GPU is visible (torch.cuda.is_available() is False); this benchmark times cuDNN and "
              "needs one. Nothing was written.", file=sys.stderr)
        return 2
    if args.case:
        return run_case(args)
    settings = {"workloads": args.workloads, "modes": args.modes, "backend": args.backend, "quick": args.quick,
                "audit": args.audit, "tuning": args.tuning,
                "steps": args.steps, "warmup": args.warmup, "timeout_s": args.timeout, "device": args.device}
    report = {"environment": environment(args.device), "settings": settings, "notes": notes(settings)}
    report.update(run_all(args))
    print()
    print(write_reports(report, args.json, args.output_dir))
    print(f"bench: wrote {args.json} and {args.output_dir / 'bench.md'}")
    results = report["cases"] + ([report["overhead"]] if report["overhead"] else [])
    return 1 if any("error" in result for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
