#!/usr/bin/env python3
"""Whole-model benchmark: cudnn_cache against PyTorch's own cuDNN autotuning, each case in a fresh process.

For every workload, four modes run one after another, each in its own Python process (so no in-process cache
carries over between them):

    native_benchmark   torch.backends.cudnn.benchmark=True: PyTorch times engines on the first step
    native_heuristic   benchmark=False: cuDNN's heuristics, no timing
    cache_cold         cudnn_cache.convert(model), empty cache, miss policy 'tune': the first step tunes every
                       convolution; the cache is then saved to a temporary file
    cache_warm         a fresh process loads that file (timed), converts the model and sets miss policy 'error',
                       so a convolution the file does not cover fails loudly instead of tuning

A training step is model.zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward (no
optimizer step; the same in every mode), with the input requiring grad, as in the baseline measurement
(../shared/context/baseline_autotune.py, results in ../shared/context/MEASURED.md). Before the first step each
process initialises CUDA, cuBLAS and cuDNN on an unrelated tiny convolution, so the first step measures
tuning and per-shape set-up only. Per case it reports the first step (s, synchronized), the median of --steps
steady steps after --warmup steps (ms, synchronized per step), the tuning estimate (first step minus steady
step), the cache load time, and the cache counters. A separate micro case measures host overhead per call of a
tiny convolution, native F.conv2d against cudnn_cache.functional.conv2d.

Usage (after scripts/build.sh; needs a CUDA GPU, else it says so and exits 2):

    python3 scripts/bench.py                                   # everything: about 3-6 minutes on an H200
    python3 scripts/bench.py --workloads resnet18_fp16_cl seed --modes native_heuristic cache_cold cache_warm
    python3 scripts/bench.py --steps 50 --timeout 300 --output-dir /tmp/bench

Writes <output-dir>/bench.json (environment, settings, every raw per-case result; --json to move it),
<output-dir>/bench.md (the table, also printed) and <output-dir>/bench.png (needs matplotlib; skipped with a
message without it). A case that fails or times out is recorded with its error text and the run goes on.

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
from typing import Callable, Dict, List, Optional

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


MODES: Dict[str, Mode] = {
    "native_benchmark": Mode(benchmark=True, miss_policy=None, tunes=True),
    "native_heuristic": Mode(benchmark=False, miss_policy=None, tunes=False),
    "cache_cold": Mode(benchmark=False, miss_policy="tune", tunes=True),
    "cache_warm": Mode(benchmark=False, miss_policy="error", tunes=False),
}

# The micro case: a tiny convolution, forward only, called OVERHEAD_CALLS times without synchronizing.
OVERHEAD_INPUT = (1, 8, 8, 8)
OVERHEAD_WEIGHT = (8, 8, 3, 3)
OVERHEAD_CALLS = 1000
OVERHEAD_REPEATS = 5

PLAN_BUILD_NOTE = ("plan build: not applicable. cudnn_cache replays legacy cuDNN algorithms "
                   "(cudnnConvolution*Algo_t) and builds no graph-API execution plans, so plan_build_s is null.")


# ---------------------------------------------------------------------------------------------------------------
# One case, in its own process (--case)
# ---------------------------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of function(), with the device synchronized before and after."""
    synchronize(device)
    started = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - started


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


def prepare(workload: Workload, device: torch.device, cache) -> tuple:
    """The model (converted when `cache` is the cudnn_cache module), its input, and its convolution count."""
    torch.manual_seed(0)
    model = build_model(workload)
    convolutions = sum(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    if cache is not None:
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


def run_training_case(workload_name: str, mode_name: str, args) -> dict:
    workload, mode, device = WORKLOADS[workload_name], MODES[mode_name], torch.device(args.device)
    torch.backends.cudnn.benchmark = mode.benchmark
    cache = None
    if mode.miss_policy is not None:
        import cudnn_cache as cache
    initialise_libraries(device, cache)

    result = {"workload": workload_name, "mode": mode_name}
    if cache is not None:
        cache.clear()
        result["plan_build_s"] = None  # see PLAN_BUILD_NOTE
        if mode_name == "cache_warm":
            started = time.perf_counter()
            result["loaded_entries"] = cache.load(args.cache_file)
            result["load_s"] = time.perf_counter() - started
    model, x, result["convolutions"] = prepare(workload, device, cache)
    if cache is not None:
        cache.set_miss_policy(mode.miss_policy)
        cache.reset_stats()

    def step():
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()

    result["first_s"] = timed(step, device)
    for _ in range(args.warmup):
        step()
    steps = [timed(step, device) for _ in range(args.steps)]
    result["steps_ms"] = [1e3 * s for s in steps]
    result["steady_ms"] = 1e3 * statistics.median(steps)
    if mode.tunes:
        result["tuning_estimate_s"] = result["first_s"] - result["steady_ms"] / 1e3
    if cache is not None:
        result["stats"] = cache.stats()
        if mode_name == "cache_cold":
            started = time.perf_counter()
            cache.save(args.cache_file)
            result["save_s"] = time.perf_counter() - started
    return result


def run_overhead_case(args) -> dict:
    """Host overhead per call: OVERHEAD_CALLS forward calls of a tiny convolution with no synchronize between
    them, then one synchronize; the per-call wall time (and the host-only time, before that synchronize), the
    median over OVERHEAD_REPEATS rounds. The cache is warm: tuned before timing, then miss policy 'error'."""
    import torch.nn.functional as F

    import cudnn_cache

    device = torch.device(args.device)
    initialise_libraries(device, cudnn_cache)
    x = torch.rand(*OVERHEAD_INPUT, device=device)
    w = torch.rand(*OVERHEAD_WEIGHT, device=device)
    calls = {  # name -> (cudnn.benchmark, the convolution)
        "native_heuristic": (False, F.conv2d),
        "native_benchmark": (True, F.conv2d),
        "cudnn_cache": (False, cudnn_cache.functional.conv2d),
    }

    def time_calls(benchmark: bool, conv) -> tuple:
        torch.backends.cudnn.benchmark = benchmark
        synchronize(device)
        started = time.perf_counter()
        for _ in range(OVERHEAD_CALLS):
            conv(x, w, padding=1)
        queued = time.perf_counter()
        synchronize(device)
        finished = time.perf_counter()
        return 1e6 * (finished - started) / OVERHEAD_CALLS, 1e6 * (queued - started) / OVERHEAD_CALLS

    with torch.no_grad():
        cudnn_cache.set_miss_policy("tune")
        for benchmark, conv in calls.values():  # warm-up: tunes the cache entry and native's benchmark cache
            time_calls(benchmark, conv)
        cudnn_cache.set_miss_policy("error")
        cudnn_cache.reset_stats()
        rounds = {name: [] for name in calls}
        for _ in range(OVERHEAD_REPEATS):  # interleaved, so drift hits every variant alike
            for name, (benchmark, conv) in calls.items():
                rounds[name].append(time_calls(benchmark, conv))

    results = {name: {"wall_us": statistics.median(r[0] for r in rounds[name]),
                      "host_us": statistics.median(r[1] for r in rounds[name]),
                      "wall_us_rounds": [r[0] for r in rounds[name]]} for name in calls}
    return {"workload": OVERHEAD, "input": list(OVERHEAD_INPUT), "weight": list(OVERHEAD_WEIGHT), "padding": 1,
            "calls": OVERHEAD_CALLS, "repeats": OVERHEAD_REPEATS, "results": results, "stats": cudnn_cache.stats()}


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
               "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if cache_file is not None:
        command += ["--cache-file", str(cache_file)]
    return command


def describe(result: dict) -> str:
    """One progress line for a finished case."""
    if "error" in result:
        return "FAILED: " + result["error"].splitlines()[0]
    if result["workload"] == OVERHEAD:
        return ", ".join(f"{name} {r['wall_us']:.1f} us/call" for name, r in result["results"].items())
    return f"first step {result['first_s']:.2f} s, steady {result['steady_ms']:.2f} ms"


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
            if mode == "cache_warm" and not cache_file.exists():
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
# Reports: derived columns, JSON, markdown, chart
# ---------------------------------------------------------------------------------------------------------------

def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if numerator is None or not denominator else numerator / denominator


def add_derived(cases: List[dict]) -> None:
    """Adds case['derived'] to every successful case: steady ÷ native_benchmark steady, steady ÷ the better of
    the two native steadies, and first step ÷ native_heuristic first step (all within the same workload)."""
    ok = {(c["workload"], c["mode"]): c for c in cases if "error" not in c}
    for case in ok.values():
        def native(mode, key):
            return ok.get((case["workload"], mode), {}).get(key)

        natives = [s for s in (native("native_benchmark", "steady_ms"), native("native_heuristic", "steady_ms"))
                   if s is not None]
        case["derived"] = {
            "steady_vs_native_benchmark": ratio(case["steady_ms"], native("native_benchmark", "steady_ms")),
            "steady_vs_best_native": ratio(case["steady_ms"], min(natives) if natives else None),
            "first_vs_native_heuristic_first": ratio(case["first_s"], native("native_heuristic", "first_s")),
        }


def number(value: Optional[float], spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


TABLE_HEADER = ("| workload | mode | first step | steady step | ÷ bench steady | ÷ best native steady | "
                "first ÷ heuristic first | tuning est. (tunes) | load | hits / misses / tunes / fallbacks |")


def table_row(case: dict) -> str:
    label = WORKLOADS[case["workload"]].label if case["workload"] in WORKLOADS else case["workload"]
    if "error" in case:
        error = " ".join(case["error"].splitlines()[:1])[:160].replace("|", "\\|")
        return f"| {label} | {case['mode']} | FAILED: {error} |" + " |" * 7
    derived, stats = case["derived"], case.get("stats")
    tuning = number(case.get("tuning_estimate_s"), ".2f", " s")
    if stats is not None and case["mode"] == "cache_cold":
        tuning += f" ({stats['tunes']})"
    load = "-"
    if "load_s" in case:
        load = f"{1e3 * case['load_s']:.1f} ms ({case['loaded_entries']} entries)"
    counters = "-" if stats is None else " / ".join(str(stats[k]) for k in ("hits", "misses", "tunes", "fallbacks"))
    cells = [label, case["mode"], number(case["first_s"], ".2f", " s"), number(case["steady_ms"], ".2f", " ms"),
             number(derived["steady_vs_native_benchmark"], ".2f"), number(derived["steady_vs_best_native"], ".2f"),
             number(derived["first_vs_native_heuristic_first"], ".2f"), tuning, load, counters]
    return "| " + " | ".join(cells) + " |"


def overhead_table(overhead: Optional[dict]) -> List[str]:
    if overhead is None:
        return []
    lines = ["", "## Host overhead per call"]
    if "error" in overhead:
        return lines + ["", "FAILED: " + overhead["error"].splitlines()[0]]
    shape = "x".join(map(str, overhead["input"]))
    lines += ["", f"conv2d forward, input {shape}, weight {'x'.join(map(str, overhead['weight']))}, padding 1: "
              f"{overhead['calls']} calls with no synchronize between them, then one; median of "
              f"{overhead['repeats']} rounds. The cache was tuned first (warm), then ran with miss policy 'error'.",
              "", "| call | wall per call (incl. final synchronize) | host per call (before it) |", "|---|---|---|"]
    for name, r in overhead["results"].items():
        call = "cudnn_cache.functional.conv2d" if name == "cudnn_cache" else f"F.conv2d ({name})"
        lines.append(f"| {call} | {r['wall_us']:.1f} us | {r['host_us']:.1f} us |")
    return lines


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# cudnn_cache against native cuDNN autotuning: whole training steps", "",
        f"{env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}), cuDNN {env['cudnn']}; {env['date']}. "
        "Each case ran in a fresh process (`scripts/bench.py`).", "",
        TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|",
    ]
    lines += [table_row(case) for case in report["cases"]]
    lines += overhead_table(report.get("overhead"))
    lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def notes(settings: dict) -> List[str]:
    return [
        "A training step: zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward; no optimizer "
        "step. The input requires grad. The same in every mode.",
        "first step: wall time of the first training step, synchronized, after CUDA, cuBLAS and cuDNN were set up "
        f"on an unrelated tiny convolution. steady step: median of {settings['steps']} steps, synchronized per "
        f"step, after {settings['warmup']} warm-up steps.",
        "tuning est.: first step minus steady step, for the modes that tune (native_benchmark, cache_cold); in "
        "parentheses, the convolutions cudnn_cache tuned (stats()['tunes']).",
        "load: cudnn_cache.load() of the file cache_cold saved (cache_warm, which runs with miss policy 'error').",
        "÷ bench steady: steady step ÷ native_benchmark's; ÷ best native steady: ÷ the faster of native_benchmark "
        "and native_heuristic; first ÷ heuristic first: first step ÷ native_heuristic's first step.",
        "hits / misses / tunes / fallbacks: cudnn_cache.stats() over the first step and all later ones.",
        PLAN_BUILD_NOTE,
    ]


def plot(report: dict, path: pathlib.Path) -> bool:
    """Grouped bars per workload and mode: steady step (top) and first step (bottom), both on log scales.
    Returns False, saying why, when matplotlib is missing or no training case succeeded."""
    ok = {(c["workload"], c["mode"]): c for c in report["cases"] if "error" not in c}
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
    width = 0.8 / max(len(modes), 1)
    figure, axes = plt.subplots(2, 1, figsize=(max(8.0, 2.2 * len(workloads)), 9), constrained_layout=True)
    panels = [("steady_ms", "steady step (ms, median)"), ("first_s", "first step (s)")]
    for axis, (key, title) in zip(axes, panels):
        for index, mode in enumerate(modes):
            values = [ok[(w, mode)][key] if (w, mode) in ok else math.nan for w in workloads]
            positions = [i + (index - (len(modes) - 1) / 2) * width for i in range(len(workloads))]
            bars = axis.bar(positions, values, width, label=mode)
            axis.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.3g}" for v in values], fontsize=7,
                           rotation=90, padding=2)
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xticks(range(len(workloads)))
        axis.set_xticklabels([WORKLOADS[w].label if w in WORKLOADS else w for w in workloads], fontsize=8,
                             rotation=15, ha="right")
        axis.margins(y=0.25)
        axis.legend(fontsize=8)
    env = report["environment"]
    figure.suptitle(f"cudnn_cache vs native cuDNN: {env['gpu']}, torch {env['torch']}, cuDNN {env['cudnn']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_reports(report: dict, json_path: pathlib.Path, output_dir: pathlib.Path) -> str:
    """Adds the derived columns, writes the JSON, the markdown table and the chart (when matplotlib is there);
    returns the markdown."""
    add_derived(report["cases"])
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
    parser.add_argument("--workloads", nargs="+", choices=[*WORKLOADS, OVERHEAD], default=[*WORKLOADS, OVERHEAD],
                        metavar="NAME", help=f"a subset of: {', '.join([*WORKLOADS, OVERHEAD])} (default: all)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), metavar="MODE",
                        help=f"a subset of: {', '.join(MODES)} (default: all; cache_warm needs cache_cold)")
    parser.add_argument("--steps", type=int, default=30, help="steady steps timed per case (>= 20; default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
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
    if args.steps < 20:
        parser.error("--steps must be >= 20 (the steady step is a median over them)")
    if args.warmup < 0 or args.timeout <= 0:
        parser.error("--warmup must be >= 0 and --timeout > 0")
    if "cache_warm" in args.modes and "cache_cold" not in args.modes:
        parser.error("cache_warm loads the file cache_cold writes: add cache_cold to --modes")
    args.workloads = list(dict.fromkeys(args.workloads))
    args.json = args.json or args.output_dir / "bench.json"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench: no CUDA GPU is visible (torch.cuda.is_available() is False); this benchmark times cuDNN and "
              "needs one. Nothing was written.", file=sys.stderr)
        return 2
    if args.case:
        return run_case(args)
    settings = {"workloads": args.workloads, "modes": args.modes, "steps": args.steps, "warmup": args.warmup,
                "timeout_s": args.timeout, "device": args.device}
    report = {"environment": environment(args.device), "settings": settings, "notes": notes(settings)}
    report.update(run_all(args))
    print()
    print(write_reports(report, args.json, args.output_dir))
    print(f"bench: wrote {args.json} and {args.output_dir / 'bench.md'}")
    results = report["cases"] + ([report["overhead"]] if report["overhead"] else [])
    return 1 if any("error" in result for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
