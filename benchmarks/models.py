"""Whole training steps: cudnn_cache against PyTorch's own cuDNN autotuning, each case in a fresh process.

Per workload the modes run one after another, each in its own Python process:
    native_benchmark   torch.backends.cudnn.benchmark=True: PyTorch times engines on the first step
    native_heuristic   benchmark=False: cuDNN's heuristics, no timing
    cache_cold         cudnn_cache.convert(model), an empty cache, miss policy 'tune': the first step tunes every
                       convolution (--settle, the default with --tuning exhaustive=1: then cudnn_cache.settle(), as
                       scripts/warm_start.py does); then the cache is saved
    cache_warm         loads that file, converts the model, miss policy 'error', prepare(); warm start = import +
                       load + prepare + first step
    cache_intercept    as cache_warm, the model not converted: cudnn_cache.intercept() routes its convolutions
Then (unless --no-interleaved) one process per native mode takes a steady step natively, through the converted
model and under intercept, in turn, --steps rounds (WORKLOAD:interleaved:NATIVE_MODE): separate processes differ by
more than the modes do, so these per-round ratios are the wall-clock comparison the steady targets judge. The
workload 'overhead' is host_cost.py's micro case: host time per call or training iteration against native's.

A training step is zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward. Each case sets up
CUDA, cuBLAS and cuDNN on a tiny convolution first, then times its first and second steps, --steps steady steps
after --warmup (wall_ms), and, in the order of Note [Profiling last] (measure.py), the audit (cache_cold, --audit),
the step's replays in a CUDA graph (graph_ms) and its GPU time under torch.profiler (gpu_ms), each a median with its
95% interval. With --rounds N a workload's modes run N times in turn, a case reporting its rounds' medians.

Targets (check_targets): warm first step <= native_heuristic's; warm start <= 0.3 s; warm steady <= native_benchmark's
and <= the better native's (stretch 0.95), a higher median a loss only where the 95% intervals are apart; cold
first step <= 0.5 x native_benchmark's (depthwise also <= native_heuristic's) or, with --tuning exhaustive=1, warm
GPU time <= the better native's and <= 0.97 x on half the workloads; cold steady and intercepted steady <= 1.02 x
warm (paired by round with --rounds); with --audit, no key slower than native's choices beyond its resolution
(--audit-repeats N: in every audit); interleaved, each ratio's interval reaching 1.00; the overhead's <= +1 us.

    python3 -m benchmarks models --update                 # everything: about 3-6 minutes on an H200
    python3 -m benchmarks models --workloads overhead     # the micro case alone: models_overhead.json
    python3 -m benchmarks models --workloads seed --modes native_heuristic,cache_cold,cache_warm --steps 20

Writes bench-results/models.json and its tables (models.md) after every case ("complete": false until the last).
Exit codes: 0 every case ran; 1 some case failed (recorded, the run goes on); 2 bad arguments or no GPU.
"""

import argparse
import datetime
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from benchmarks import (add_arguments, case_command, combine, no_gpu, output_paths, parse, run_case, run_plan,
                        write_result)
from benchmarks.measure import gpu_time_per_step, graph_time_per_step, in_turn, initialise_libraries, timed, timed_call
from benchmarks.host_cost import TARGETS as OVERHEAD_TARGETS
from benchmarks.workloads import WORKLOADS, model_and_input
from benchmarks.performance_doc import render_models
from benchmarks.report import interval
from benchmarks.stats import intervals_overlap, median_interval


OVERHEAD = "overhead"  # the host-overhead micro case, selected with --workloads like a workload
MODES = ("native_benchmark", "native_heuristic", "cache_cold", "cache_warm", "cache_intercept")  # in run order
NATIVE_MODES = ("native_benchmark", "native_heuristic")
LOADS = ("cache_warm", "cache_intercept")  # the modes that load the file cache_cold saved
INTERLEAVED = "interleaved"  # the cases WORKLOAD:interleaved:NATIVE_MODE, one process per native mode (PyTorch
INTERLEAVED_NATIVE = ("native_heuristic", "native_benchmark")  # keeps one plan cache for both of its modes)
# cudnn_cache.set_tuning_options' options that are flags; the other (build_threads) is a count.
TUNING_FLAGS = ("exhaustive", "rank_deterministic")
AUDIT_NOISE = 1.02  # an audited time within 2% of another counts as a tie
# The targets (check_targets).
TARGET_WARM_START_S = 0.3          # import + load + prepare + first step (cache_warm)
TARGET_COLD_RATIO = 0.5            # cache_cold's first step over native_benchmark's
TARGET_TUNING_PROCESS_RATIO = 1.02  # cache_cold's steady step over cache_warm's: the tuning process at warm speed
TARGET_INTERCEPT_RATIO = 1.02      # cache_intercept's steady step over cache_warm's (run-to-run noise)
TARGET_STEADY_STRETCH = 0.95       # of the better native steady step; 'met' is judged at 1.00
TARGET_EXHAUSTIVE_GPU = 0.97       # exhaustive: warm GPU time over the better native's, on half the workloads
TARGET_OVERHEAD_US = 1.0           # host time per call or iteration above native's
ALL_WORKLOADS = "all workloads"    # the workload of a target judged over every workload of the run


def training_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).float().sum().backward()


# --- The cases, each in its own process (--case WORKLOAD:MODE) ----------------------------------------------------

def training_case(workload_name: str, mode: str, args, result: dict) -> None:
    workload, device = WORKLOADS[workload_name], torch.device(args.device)
    torch.backends.cudnn.benchmark = mode == "native_benchmark"
    cache = None
    if mode.startswith("cache_"):
        started = time.perf_counter()
        import cudnn_cache as cache
        result["import_s"] = time.perf_counter() - started  # the process's first import: part of a warm start
        cache.set_backend(args.backend)
        cache.set_tuning_options(**args.tuning)
        result["backend"] = cache.backend()
    initialise_libraries(device, cache)
    if cache is not None:
        cache.clear()
        cache.reset_stats()  # here, so that what load() counts (plans_deserialized) stays in the stats
        if mode in LOADS:
            result["loaded_entries"], result["load_s"] = timed_call(lambda: cache.load(args.cache_file), device)
    model, x, result["convolutions"] = model_and_input(workload, device, cache, convert=mode != "cache_intercept")
    if cache is not None:
        cache.set_miss_policy("tune" if mode == "cache_cold" else "error")
        cache.intercept(mode == "cache_intercept")
        if mode in LOADS:  # no cuDNN on the CPU, so no plan to build: prepare is not called, and counts as 0 s
            result["prepared_plans"], result["prepare_s"] = (timed_call(cache.prepare, device)
                                                             if device.type == "cuda" else (None, None))
    step = lambda: training_step(model, x)  # noqa: E731
    result["first_s"] = timed(step, device)
    if mode == "cache_cold" and device.type == "cuda" and args.settle:
        result["settle"] = settle(cache)  # as scripts/warm_start.py does after its steps
    if args.warmup > 0:  # the first warm-up step, timed alone: what only the first step pays is first_s - second_s
        result["second_s"] = timed(step, device)
    for _ in range(args.warmup - 1):
        step()
    try:
        audited = cache if mode == "cache_cold" and args.audit and device.type == "cuda" else None
        steady_figures(step, device, args, result, audited)
    finally:  # the warm cases load this file: it is written even where the audit or the profiler fails
        if mode == "cache_cold":
            started = time.perf_counter()
            cache.save(args.cache_file)
            result["save_s"] = time.perf_counter() - started
    if mode in ("native_benchmark", "cache_cold"):  # the modes that tune on their first step
        result["tuning_estimate_s"] = result["first_s"] - result["steady_ms"] / 1e3
    if cache is not None:
        stats = result["stats"] = cache.stats()
        # None where this build of the ops does not count them
        result["tune_s"], result["plan_build_s"] = (None if stats.get(key) is None else stats[key] / 1e6
                                                    for key in ("tune_us", "plan_build_us"))
        if mode in LOADS:
            result["warm_start_s"] = (result["import_s"] + result["load_s"] + (result["prepare_s"] or 0.0)
                                      + result["first_s"])


def steady_figures(step: Callable[[], None], device: torch.device, args, result: dict, audited=None) -> None:
    """A training case's steady figures, in the order of Note [Profiling last]: args.steps synchronized steps
    (steps_ms, wall_ms and steady_ms, its median); the audit where `audited` is the cudnn_cache module; the GPU
    time of args.steps replays of the step captured in a CUDA graph (graph_steps_ms, graph_ms; graph_error where
    it cannot be captured); then of args.steps more steps under torch.profiler (gpu_steps_ms, gpu_ms)."""
    result["steps_ms"] = [1e3 * timed(step, device) for _ in range(args.steps)]
    result["wall_ms"] = median_interval(result["steps_ms"])
    result["steady_ms"] = result["wall_ms"]["median"]
    if audited is not None:
        started = time.perf_counter()
        result["audit"] = audit(audited.audit, args.audit_repeats)
        result["audit"]["seconds"] = time.perf_counter() - started
    result["graph_steps_ms"], error = graph_time_per_step(step, device, args.steps)
    result["graph_ms"] = result["graph_steps_ms"] and median_interval(result["graph_steps_ms"])
    if error is not None:
        result["graph_error"] = error
    result["gpu_steps_ms"] = gpu_time_per_step(step, device, args.steps)
    result["gpu_ms"] = result["gpu_steps_ms"] and median_interval(result["gpu_steps_ms"])


def summarize_audit(rows: List[dict]) -> dict:
    """cudnn_cache.audit()'s rows, summarised: the keys slower than the faster native choice (all measured the
    same way) by more than AUDIT_NOISE and by more than their own resolution, the keys faster, and the worst. A
    key's resolution is the gap between its stored config's two timings in the same rounds (stored_ms and
    stored_again_ms): a smaller difference says nothing about which config is faster. The stored config's time is
    their mean: with the configs in a fresh order each round, judging by the first alone called a key slower
    whenever that one drew the noise. Each row gains stored_mean_ms, resolution_us and slower_than_native."""
    summary = {"keys": len(rows), "rows": rows}
    ratios = []
    for row in rows:
        again = row.get("stored_again_ms", row["stored_ms"])  # absent from older builds: resolution 0
        row["stored_mean_ms"], row["resolution_us"] = (row["stored_ms"] + again) / 2, 1e3 * abs(row["stored_ms"] - again)
        best = min(row["heuristic_ms"], row["benchmark_ms"])
        ratios.append(row["stored_mean_ms"] / best)
        row["slower_than_native"] = ratios[-1] > AUDIT_NOISE and row["stored_mean_ms"] - best > row["resolution_us"] / 1e3
    if rows:
        worst = max(range(len(rows)), key=ratios.__getitem__)
        summary.update(slower_than_native=sum(row["slower_than_native"] for row in rows),
                       faster_than_native=sum(r < 1 / AUDIT_NOISE for r in ratios), worst_ratio=ratios[worst],
                       worst_key=f"{rows[worst]['direction']} {rows[worst]['key']}")
    return summary


def audit(run_audit: Callable[[], List[dict]], repeats: int) -> dict:
    """The first of `repeats` audits in this process, summarised, with the keys each found slower (slower_per_audit)
    and those all did (slower_in_every_audit, named in slower_in_every_audit_keys): from one audit to the next a
    config's time moves by more than its resolution (on the H100, of the keys one audit found slower, the next
    found one in seven again), and a verdict that does not repeat is noise."""
    summaries = [summarize_audit(run_audit()) for _ in range(max(repeats, 1))]
    first = summaries[0]
    if len(summaries) > 1:
        flagged = [{f"{row['direction']} {row['key']}" for row in s["rows"] if row["slower_than_native"]}
                   for s in summaries]
        in_every = set.intersection(*flagged)
        first.update(audit_repeats=len(summaries), slower_per_audit=[len(keys) for keys in flagged],
                     slower_in_every_audit=len(in_every), slower_in_every_audit_keys=sorted(in_every))
    return first


def settle(cache) -> dict:
    """cudnn_cache.settle() (Note [Settling in steady state]) after the tuning step: its seconds, the keys it
    decided again, and those whose config it changed, each with its direction, key and engine configs."""
    started = time.perf_counter()
    rows = cache.settle()
    changes = [{"direction": row["direction"], "key": row["key"], "from": row["stored_engine"],
                "to": row["settled_engine"]} for row in rows if row["changed"]]
    return {"seconds": time.perf_counter() - started, "keys": len(rows), "changed": len(changes), "changes": changes}


def interleaved_case(workload_name: str, native_mode: str, args, result: dict) -> None:
    """Steady steps of one workload natively (native_mode), through the converted model on the file cache_cold
    saved (cache_warm) and through the unmodified model under intercept (cache_intercept), one of each a round in
    an order drawn anew each round (in_turn); each cache mode's ratio to native is taken per round (paired)."""
    import cudnn_cache

    workload, device = WORKLOADS[workload_name], torch.device(args.device)
    torch.backends.cudnn.benchmark = native_mode == "native_benchmark"
    cudnn_cache.set_backend(args.backend)
    initialise_libraries(device, cudnn_cache)
    cudnn_cache.clear()
    result.update(native_mode=native_mode, backend=cudnn_cache.backend(),
                  loaded_entries=cudnn_cache.load(args.cache_file))
    cudnn_cache.set_miss_policy("error")
    native, x, result["convolutions"] = model_and_input(workload, device, None)
    converted, _, _ = model_and_input(workload, device, cudnn_cache)
    if device.type == "cuda":
        cudnn_cache.prepare()
    ways = {"native": (native, False), "cache_warm": (converted, False), "cache_intercept": (native, True)}

    def step(mode: str) -> float:
        model, intercepting = ways[mode]
        cudnn_cache.intercept(intercepting)
        try:
            return 1e3 * timed(lambda: training_step(model, x), device)
        finally:
            cudnn_cache.intercept(False)

    for mode in ways:  # native benchmark mode tunes on its first step
        for _ in range(args.warmup + 1):
            step(mode)
    cudnn_cache.reset_stats()
    times: Dict[str, List[float]] = {mode: [] for mode in ways}
    for round_index in range(args.steps):
        for mode in in_turn(list(ways), round_index):
            times[mode].append(step(mode))
    result.update(steps_ms=times, wall_ms={mode: median_interval(values) for mode, values in times.items()},
                  ratio_to_native={mode: median_interval([a / b for a, b in zip(times[mode], times["native"])])
                                   for mode in LOADS},
                  stats=cudnn_cache.stats())


def case_main(args) -> int:
    workload, mode = args.case.split(":", 1)
    result = {"workload": workload, "mode": mode}
    if workload == OVERHEAD:
        from benchmarks.host_cost import overhead_case

        return run_case(lambda result: overhead_case(args, result), result)
    if mode.startswith(INTERLEAVED):
        return run_case(lambda result: interleaved_case(workload, mode.split(":")[1], args, result), result)
    return run_case(lambda result: training_case(workload, mode, args, result), result)


# --- The report: rounds merged, derived figures, targets ---------------------------------------------------------

# What a case process measures once: with --rounds, the median over the rounds' processes stands for the case.
ONCE_PER_PROCESS = ("first_s", "second_s", "import_s", "load_s", "prepare_s", "warm_start_s", "save_s", "tune_s",
                    "plan_build_s", "tuning_estimate_s", "process_s")


def merge_rounds(rounds: List[dict]) -> dict:
    """One case of a workload and mode from its rounds' results: the first round's, with each once-per-process
    figure the median over the rounds (each round's values, with its steady median, in `rounds`; the first step's
    lowest and highest in first_s_range) and the steady clocks over every round's steps (a GPU clock none where a
    round did not measure it). A round that failed makes the case failed, naming the round."""
    if len(rounds) == 1:
        return rounds[0]
    for number_, result in enumerate(rounds, 1):
        if "error" in result:
            return dict(result, error=f"round {number_} of {len(rounds)}: {result['error']}")
    case = dict(rounds[0], rounds=[{key: result.get(key) for key in (*ONCE_PER_PROCESS, "steady_ms") if key in result}
                                   for result in rounds])
    for key in ONCE_PER_PROCESS:
        values = [result.get(key) for result in rounds]
        if key in case and None not in values:
            case[key] = statistics.median(values)
    case["first_s_range"] = [min(r["first_s"] for r in rounds), max(r["first_s"] for r in rounds)]
    for steps_key, clock in (("steps_ms", "wall_ms"), ("gpu_steps_ms", "gpu_ms"), ("graph_steps_ms", "graph_ms")):
        steps = [result.get(steps_key) for result in rounds]
        case[steps_key] = None if None in steps else [step for some in steps for step in some]
        case[clock] = None if None in steps else median_interval(case[steps_key])
    case["steady_ms"] = case["wall_ms"]["median"]
    return case


def round_ratios(case: Optional[dict], reference: Optional[dict]) -> Optional[List[float]]:
    """With --rounds, the steady step of `case` ÷ that of `reference` in each round (the two ran one after the
    other in every round, where pooled intervals also hold what changed on the machine between rounds); None with
    one round, or where either lacks a round's steady median."""
    rounds = [(case or {}).get("rounds"), (reference or {}).get("rounds")]
    if None in rounds or len(rounds[0]) < 2 or len(rounds[0]) != len(rounds[1]):
        return None
    pairs = [(mine.get("steady_ms"), theirs.get("steady_ms")) for mine, theirs in zip(*rounds)]
    return None if any(None in pair for pair in pairs) else [mine / theirs for mine, theirs in pairs]


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if numerator is None or not denominator else numerator / denominator


def successful(cases: List[dict]) -> Dict[tuple, dict]:
    """The cases that ran, by (workload, mode)."""
    return {(c["workload"], c["mode"]): c for c in cases if "error" not in c}


def better_native(ok: Dict[tuple, dict], workload: str, clock: str) -> Optional[dict]:
    """The figure on `clock` (wall_ms, gpu_ms, graph_ms) of the native mode with the lower median on it."""
    figures = [ok[(workload, m)].get(clock) for m in NATIVE_MODES if (workload, m) in ok]
    return min((f for f in figures if f is not None), key=lambda f: f["median"], default=None)


def gpu_clock(ok: Dict[tuple, dict], workload: str, mode: str) -> str:
    """graph_ms where `mode` and every native mode of the workload that ran measured it (no profiler attached:
    Note [GPU time without a profiler]), else gpu_ms."""
    cases = [ok[(workload, m)] for m in (mode, *NATIVE_MODES) if (workload, m) in ok]
    return "graph_ms" if cases and all(case.get("graph_ms") is not None for case in cases) else "gpu_ms"


def median_of(figure: Optional[dict]) -> Optional[float]:
    return None if figure is None else figure["median"]


def add_derived(cases: List[dict]) -> None:
    """Adds case['derived'] to every successful case: its median on each clock over the better native mode's on
    it (steady_vs_best_native: wall; gpu_vs_best_native: profiler; graph_vs_best_native where gpu_clock allows),
    None where a case is missing."""
    ok = successful(cases)
    for case in ok.values():
        best = {clock: median_of(better_native(ok, case["workload"], clock)) for clock in ("wall_ms", "gpu_ms", "graph_ms")}
        graph = gpu_clock(ok, case["workload"], case["mode"]) == "graph_ms"
        case["derived"] = {"steady_vs_best_native": ratio(case["steady_ms"], best["wall_ms"]),
                           "gpu_vs_best_native": ratio(median_of(case.get("gpu_ms")), best["gpu_ms"]),
                           "graph_vs_best_native": ratio(median_of(case.get("graph_ms")), best["graph_ms"]) if graph else None}


def check_targets(report: dict) -> List[dict]:
    """The targets (the module's docstring), per workload with a cache case, then the interleaved and the
    overhead's: {workload, target, value, limit, unit, met}, met None where a case it needs is missing or failed.
    A wall-clock target also has intervals_overlap: a median above the limit is met while the 95% intervals
    overlap; paired by round (--rounds), its value is the median of the rounds' ratios (round_ratios); a target
    with a stretch has stretch_limit and stretch_met, judged on the value alone."""
    ok, targets = successful(report["cases"]), []

    def target(workload, text, value, limit, unit, stretch=None, overlap=None, per_round=None):
        if per_round is not None:
            value, overlap = statistics.median(per_round), None
        row = {"workload": workload, "target": text, "value": value, "limit": limit, "unit": unit,
               "met": None if value is None or limit is None else value <= limit or bool(overlap)}
        if per_round is not None:
            row["round_ratios"] = per_round
        if overlap is not None:
            row["intervals_overlap"] = overlap
        if stretch is not None:
            row.update(stretch_limit=stretch, stretch_met=None if value is None else value <= stretch)
        targets.append(row)

    ran = {(c["workload"], c["mode"]) for c in report["cases"]}
    exhaustive = bool((report.get("settings", {}).get("tuning") or {}).get("exhaustive"))
    exhaustive_gpu: List[float] = []
    for workload in dict.fromkeys(c["workload"] for c in report["cases"] if c["mode"].startswith("cache_")):
        get = lambda mode, key: ok.get((workload, mode), {}).get(key)  # noqa: E731

        def overlap(figure, reference):
            return None if figure is None or reference is None else intervals_overlap(figure, reference)

        warm, warm_wall, best_wall = get("cache_warm", "steady_ms"), get("cache_warm", "wall_ms"), better_native(
            ok, workload, "wall_ms")
        target(workload, "warm first step ≤ native_heuristic first step", get("cache_warm", "first_s"),
               get("native_heuristic", "first_s"), "s")
        target(workload, f"warm start (import + load + prepare + first step) ≤ {TARGET_WARM_START_S:g} s",
               get("cache_warm", "warm_start_s"), TARGET_WARM_START_S, "s")
        target(workload, "warm steady ÷ native_benchmark steady ≤ 1.00",
               ratio(warm, get("native_benchmark", "steady_ms")), 1.0, "ratio",
               overlap=overlap(warm_wall, get("native_benchmark", "wall_ms")))
        target(workload, f"warm steady ÷ better native steady ≤ 1.00 (stretch {TARGET_STEADY_STRETCH:.2f})",
               ratio(warm, median_of(best_wall)), 1.0, "ratio", stretch=TARGET_STEADY_STRETCH,
               overlap=overlap(warm_wall, best_wall))
        if exhaustive:  # offline tuning pays its time once: judged on GPU time, not on its cold first step
            clock = gpu_clock(ok, workload, "cache_warm")
            gpu = ratio(median_of(get("cache_warm", clock)), median_of(better_native(ok, workload, clock)))
            target(workload, f"exhaustive: warm GPU time per step ({'graph replay' if clock == 'graph_ms' else 'profiler'})"
                   f" ÷ better native's ≤ 1.00 (stretch {TARGET_EXHAUSTIVE_GPU:.2f})", gpu, 1.0, "ratio",
                   stretch=TARGET_EXHAUSTIVE_GPU)
            exhaustive_gpu += [] if gpu is None else [gpu]
        else:
            target(workload, f"cold first step ÷ native_benchmark first step ≤ {TARGET_COLD_RATIO:.2f}",
                   ratio(get("cache_cold", "first_s"), get("native_benchmark", "first_s")), TARGET_COLD_RATIO, "ratio")
            if workload in WORKLOADS and WORKLOADS[workload].depthwise:
                target(workload, "cold first step ≤ native_heuristic first step (depthwise: native heuristics "
                       "compiles engines too)", get("cache_cold", "first_s"), get("native_heuristic", "first_s"), "s")
        target(workload, f"cold steady ÷ warm steady ≤ {TARGET_TUNING_PROCESS_RATIO:.2f} (the tuning process at warm "
               "speed)", ratio(get("cache_cold", "steady_ms"), warm), TARGET_TUNING_PROCESS_RATIO, "ratio",
               overlap=overlap(get("cache_cold", "wall_ms"), warm_wall),
               per_round=round_ratios(ok.get((workload, "cache_cold")), ok.get((workload, "cache_warm"))))
        if (workload, "cache_intercept") in ran:
            intercepted = ok.get((workload, "cache_intercept"))
            tuned = intercepted is None or intercepted.get("stats", {}).get("tunes")
            target(workload, f"intercepted steady ÷ converted (cache_warm) steady ≤ {TARGET_INTERCEPT_RATIO:.2f}, "
                   "tuning nothing", None if tuned else ratio(intercepted["steady_ms"], warm), TARGET_INTERCEPT_RATIO,
                   "ratio")
        found = get("cache_cold", "audit")
        if found is not None and found["keys"]:
            target(workload, f"keys whose stored choice is > {AUDIT_NOISE:g}x slower than a native choice, measured "
                   "the same way (cudnn_cache.audit)", found["slower_than_native"], 0, "count")
            if found.get("audit_repeats", 1) > 1:
                target(workload, f"keys whose stored choice every one of {found['audit_repeats']} audits in the "
                       f"process finds > {AUDIT_NOISE:g}x slower than a native choice (a verdict that repeats)",
                       found["slower_in_every_audit"], 0, "count")
    if exhaustive and exhaustive_gpu:
        target(ALL_WORKLOADS, f"exhaustive: workloads whose warm GPU time per step is above {TARGET_EXHAUSTIVE_GPU:.2f}x "
               f"the better native's, at most half of the {len(exhaustive_gpu)} measured",
               sum(gpu > TARGET_EXHAUSTIVE_GPU for gpu in exhaustive_gpu), len(exhaustive_gpu) // 2, "count")
    for workload in dict.fromkeys(r["workload"] for r in report.get("interleaved") or []):
        results = [r for r in report["interleaved"] if r["workload"] == workload and "error" not in r]
        both = {r["native_mode"] for r in results} == set(INTERLEAVED_NATIVE)
        for mode in LOADS:  # the better native is the one whose ratio is higher: each ran in its own process
            ratios = [r["ratio_to_native"][mode] for r in results]
            worst = max(ratios, key=lambda r: r["median"]) if both else None
            targets.append({"workload": workload, "unit": "ratio", "limit": 1.0, "interleaved": True,
                            "target": f"{mode} steady ÷ better native steady ≤ 1.00, interleaved in one process (the "
                                      "paired ratio per round; met while its 95% interval reaches 1.00)",
                            "value": worst and worst["median"], "interval": worst,
                            "met": all(r["lo"] <= 1.0 for r in ratios) if both else None})
    overhead = report.get("overhead")
    for figure, (_, natives, text) in OVERHEAD_TARGETS.items() if overhead else ():
        better = "native's" if len(natives) == 1 else "better native's"
        target(OVERHEAD, f"{text} ≤ {better} + {TARGET_OVERHEAD_US:g} us", overhead.get(figure), TARGET_OVERHEAD_US, "us")
    return targets


def assemble(results: List[dict]) -> dict:
    """The report's cases (each workload and mode's rounds merged), interleaved cases and overhead case."""
    training: Dict[tuple, List[dict]] = {}
    for result in results:
        if result["workload"] != OVERHEAD and not result["mode"].startswith(INTERLEAVED):
            training.setdefault((result["workload"], result["mode"]), []).append(result)
    return {"cases": [merge_rounds(rounds) for rounds in training.values()],
            "interleaved": [r for r in results if r["mode"].startswith(INTERLEAVED)],
            "overhead": next((r for r in results if r["workload"] == OVERHEAD), None)}


def write_reports(report: dict, paths, tables: bool = True) -> Optional[str]:
    """Adds the derived figures and the targets, and writes the JSON at each path and (with `tables`) the
    Markdown beside it; returns the Markdown."""
    add_derived(report["cases"])
    report["targets"] = check_targets(report)
    text = "\n".join(render_models(report, paths[0].name, include_overhead=True)) if tables else None
    write_result(report, paths, text)
    return text


def describe(result: dict) -> str:
    """One progress line for a finished case."""
    if result["workload"] == OVERHEAD:
        return ", ".join(f"{name} {r['host_us']:.1f} us/call (host)" for name, r in result["results"].items())
    if "ratio_to_native" in result:
        return ", ".join(f"{mode} ÷ native {interval(r, '.3f')}" for mode, r in result["ratio_to_native"].items())
    line = f"first step {result['first_s']:.2f} s, steady {interval(result['wall_ms'], '.2f', ' ms')}"
    if result.get("graph_ms") is not None:
        line += f", GPU {interval(result['graph_ms'], '.2f', ' ms')} (graph replay)"
    elif "graph_error" in result:
        line += f", not captured in a CUDA graph ({result['graph_error']})"
    if "warm_start_s" in result:
        line += f", warm start {result['warm_start_s']:.2f} s"
    if "settle" in result:
        s = result["settle"]
        line += f", settled {s['changed']} of {s['keys']} keys to another config in {s['seconds']:.1f} s"
    return line


def plan_of(args) -> List[tuple]:
    """Per workload, its modes in MODES order --rounds times, then its interleaved cases (on the last round's
    file); the overhead case last."""
    plan = []
    for workload in (w for w in args.workloads if w != OVERHEAD):
        plan += [(workload, mode, r) for r in range(1, args.rounds + 1) for mode in args.modes]
        if args.interleaved and "cache_cold" in args.modes:
            plan += [(workload, f"{INTERLEAVED}:{native}", args.rounds) for native in INTERLEAVED_NATIVE]
    return plan + ([(OVERHEAD, "host_time", 1)] if OVERHEAD in args.workloads else [])


def command_of(args) -> Callable:
    """The command of a case of this run: this module with --case and the run's settings."""
    tuning = [f"{name}={int(value) if isinstance(value, bool) else value}" for name, value in args.tuning.items()]

    def command(workload: str, mode: str, cache_file) -> tuple:
        return case_command("models", "--case", f"{workload}:{mode}", "--device", args.device, "--steps", args.steps,
                            "--warmup", args.warmup, "--overhead-rounds", args.overhead_rounds, "--backend", args.backend, "--cache-file", cache_file,
                            "--settle" if args.settle else "--no-settle", "--audit-repeats", args.audit_repeats,
                            *(["--audit"] if args.audit else []), "--tuning", *tuning), None
    return command


def tuning_arguments(items: List[str], error: Callable[[str], None]) -> Dict[str, object]:
    """--tuning's NAME=VALUE items, typed for cudnn_cache.set_tuning_options (flags as 0 or 1); `error` is called
    with what is wrong. Unknown names are left to set_tuning_options, which lists the options."""
    tuning: Dict[str, object] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            number_ = int(value)
        except ValueError:
            error(f"--tuning takes NAME=VALUE with a whole number, got {item!r} (e.g. exhaustive=1)")
            continue
        tuning[name] = bool(number_) if name in TUNING_FLAGS else number_
    return tuning


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "models.json", workloads=[*WORKLOADS, OVERHEAD], modes=MODES, timeout=180.0, rounds=True)
    add = parser.add_argument
    add("--backend", choices=("graph", "legacy"), default="graph", help="cudnn_cache.set_backend (default graph)")
    add("--steps", type=int, default=30, help="steady steps timed per case, and as many profiled and replayed; the "
                                              "interleaved cases' rounds (default 30)")
    add("--overhead-rounds", type=int, default=300, help="the overhead case's rounds (default 300)")
    add("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    add("--interleaved", action=argparse.BooleanOptionalAction, default=True,
        help="the interleaved cases after a workload's modes (need cache_cold; default on)")
    add("--audit", action="store_true", help="in cache_cold, after its timed steps, time every tuned key against "
                                             "native's choices (cudnn_cache.audit)")
    add("--audit-repeats", type=int, default=1, metavar="N", help="with --audit, audit N times (default 1)")
    add("--settle", action=argparse.BooleanOptionalAction,
        help="in cache_cold, after its first step, cudnn_cache.settle() (default: on with --tuning exhaustive=1, "
             "as scripts/warm_start.py --exhaustive settles)")
    add("--tuning", nargs="*", default=[], metavar="NAME=VALUE",
        help="cudnn_cache.set_tuning_options for the cache cases, e.g. exhaustive=1 build_threads=4")
    args = parse(parser, argv, [*WORKLOADS, OVERHEAD], MODES)
    args.workloads = args.workloads or [*WORKLOADS, OVERHEAD]
    args.modes = [mode for mode in MODES if mode in (args.modes or MODES)]
    if min(args.steps, args.overhead_rounds) < 6 or args.warmup < 0 or args.audit_repeats < 1:
        parser.error("--steps and --overhead-rounds must be >= 6 (every figure is a median with its 95% interval), "
                     "--warmup >= 0 and --audit-repeats >= 1")
    if args.audit_repeats > 1 and not args.audit:
        parser.error("--audit-repeats sets how the audit runs: add --audit")
    if any(mode in args.modes for mode in LOADS) and "cache_cold" not in args.modes:
        parser.error("cache_warm and cache_intercept load the file cache_cold writes: add cache_cold to --modes")
    args.tuning = tuning_arguments(args.tuning, parser.error)
    if args.settle is None:  # as scripts/warm_start.py decides it
        args.settle = bool(args.tuning.get("exhaustive", False))
    # The overhead case alone has its own committed file (PERFORMANCE.md reads both).
    args.paths = output_paths("models_overhead.json" if args.workloads == [OVERHEAD] else "models.json",
                              args.output, args.update)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.combine:
        report = combine(args.combine, ("cases", "interleaved"))
        report["settings"]["workloads"] = list(dict.fromkeys(
            [c["workload"] for c in report["cases"]] + ([OVERHEAD] if report.get("overhead") else [])))
        print(write_reports(report, args.paths))
        return 0
    if no_gpu(args.device, "models"):
        return 2
    if args.case:
        return case_main(args)
    settings = {key: getattr(args, key) for key in ("workloads", "modes", "backend", "audit", "audit_repeats", "settle",
                                                    "interleaved", "tuning", "steps", "warmup", "overhead_rounds", "rounds",
                                                    "device")}
    cuda = args.device == "cuda"
    report = {"environment": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              "gpu": torch.cuda.get_device_name(0) if cuda else "none (--device cpu)",
                              "torch": torch.__version__, "cuda": torch.version.cuda,
                              "cudnn": torch.backends.cudnn.version() if cuda else None,
                              "python": platform.python_version(), "host": platform.node()},
              "settings": dict(settings, timeout_s=args.timeout), "complete": False}

    def keep(results: List[dict]) -> None:  # after every case: a run stopped by a time limit keeps what it finished
        report.update(assemble(results))
        write_reports(report, args.paths, tables=False)

    results = run_plan(plan_of(args), {mode: "cache_cold" for mode in (*LOADS, *(f"{INTERLEAVED}:{n}" for n in
                                                                                INTERLEAVED_NATIVE))},
                       command_of(args), args, describe, keep)
    report.update(assemble(results), complete=True)
    print("\n" + write_reports(report, args.paths))
    print(f"models: wrote {', '.join(map(str, args.paths))} and the .md beside each")
    return 1 if any("error" in result for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
