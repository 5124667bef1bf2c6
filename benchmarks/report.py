"""The models benchmark's reports: the derived figures, the targets, the markdown tables, and --combine's merge of
the JSON reports of several runs."""

import json
import math
import pathlib
import statistics
from typing import Dict, List, Optional, Tuple

from benchmarks.cases import AUDIT_NOISE, INTERLEAVED_NATIVE, OVERHEAD, OVERHEAD_LABELS, WORKLOADS
from benchmarks.stats import format_interval, intervals_overlap, median_interval

# The targets (see check_targets).
TARGET_WARM_START_S = 0.3          # import + load + prepare + first step (cache_warm); import + first step (cache_env)
TARGET_COLD_RATIO = 0.5            # cache_cold's first step over native_benchmark's
TARGET_TUNING_PROCESS_RATIO = 1.02  # cache_cold's steady step over cache_warm's: the tuning process at warm speed
TARGET_STEADY_STRETCH = 0.95       # of the better native steady step; 'met' is judged at 1.00
TARGET_OP_OVERHEAD_US = 1.0        # the op's host time per call above native's, in TorchScript
TARGET_TRAIN_OVERHEAD_US = 1.0     # host time per forward + backward above the better native's, eager
TARGET_INTERCEPT_RATIO = 1.02      # cache_intercept's steady step over cache_warm's (run-to-run noise)
TARGET_EXHAUSTIVE_GPU = 0.97       # exhaustive=True: warm GPU time per step over the better native's, on half the
                                   # workloads at least (and never above 1.00 on any)
ALL_WORKLOADS = "all workloads"    # the workload of a target judged over every workload of the run


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return None if numerator is None or not denominator else numerator / denominator


def successful(cases: List[dict]) -> Dict[Tuple[str, str], dict]:
    """The cases that ran, by (workload, mode)."""
    return {(c["workload"], c["mode"]): c for c in cases if "error" not in c}


NATIVE_MODES = ("native_benchmark", "native_heuristic")
# Each a median_interval result per case, in ms: the wall step; the GPU time per step torch.profiler records
# (gpu_ms); the GPU time of the step captured in a CUDA graph, each replay timed by CUDA events (graph_ms, Note
# [GPU time without a profiler] in cases.py). The GPU clocks are null on the CPU, graph_ms where the step
# could not be captured (and in runs before it was measured).
CLOCKS = ("wall_ms", "gpu_ms", "graph_ms")
GPU_CLOCK_NAMES = {"graph_ms": "graph replay", "gpu_ms": "profiler"}


def gpu_clock(ok: Dict[Tuple[str, str], dict], workload: str, mode: str) -> str:
    """The GPU clock to compare `mode` with native on: graph_ms where the mode and every native mode of the
    workload that ran measured it (no profiler attached), else gpu_ms."""
    cases = [ok[(workload, m)] for m in (mode, *NATIVE_MODES) if (workload, m) in ok]
    return "graph_ms" if cases and all(case.get("graph_ms") is not None for case in cases) else "gpu_ms"


def better_native(ok: Dict[Tuple[str, str], dict], workload: str, clock: str) -> Optional[dict]:
    """The figure (median and interval) on `clock` of whichever native mode has the lower median on that
    clock; None when neither ran or measured it."""
    figures = [ok[(workload, m)].get(clock) for m in NATIVE_MODES if (workload, m) in ok]
    figures = [figure for figure in figures if figure is not None]
    return min(figures, key=lambda figure: figure["median"]) if figures else None


def median_of(figure: Optional[dict]) -> Optional[float]:
    return None if figure is None else figure["median"]


def wall_loss(figure: Optional[dict], reference: Optional[dict]) -> Optional[bool]:
    """Whether `figure` loses to `reference` on the wall clock: its median is higher and the two 95% intervals
    do not overlap (a higher median inside the spread is not counted as a loss); None without both."""
    if figure is None or reference is None:
        return None
    return figure["median"] > reference["median"] and not intervals_overlap(figure, reference)


# What a case process measures once (its first step, its start-up and its tuning): with --rounds, the median over
# the rounds' processes stands for the case, and each round's value is kept.
ONCE_PER_PROCESS = ("first_s", "second_s", "import_s", "load_s", "prepare_s", "warm_start_s", "save_s", "tune_s",
                    "plan_build_s", "tuning_estimate_s", "process_s")


def merge_rounds(rounds: List[dict]) -> dict:
    """One case of a workload and mode from its rounds' results (--rounds; each round a fresh process, the rounds
    of a workload's modes taken in turn): the first round's result, with each once-per-process figure the median
    over the rounds (their values in `rounds`, with each round's own steady median, for round_ratios; the first
    step's lowest and highest in `first_s_range`) and the steady clocks over every round's steps (a GPU clock none
    where a round did not measure it). A round that failed makes the case failed, naming the round."""
    if len(rounds) == 1:
        return rounds[0]
    for number, result in enumerate(rounds, 1):
        if "error" in result:
            return dict(result, error=f"round {number} of {len(rounds)}: {result['error']}")
    case = dict(rounds[0])
    case["rounds"] = [{key: result.get(key) for key in (*ONCE_PER_PROCESS, "steady_ms") if key in result}
                      for result in rounds]
    for key in ONCE_PER_PROCESS:
        values = [result.get(key) for result in rounds]
        if key in case and None not in values:
            case[key] = statistics.median(values)
    firsts = [result["first_s"] for result in rounds]
    case["first_s_range"] = [min(firsts), max(firsts)]
    case["steps_ms"] = [step for result in rounds for step in result["steps_ms"]]
    case["wall_ms"] = median_interval(case["steps_ms"])
    case["steady_ms"] = case["wall_ms"]["median"]
    for clock in ("gpu", "graph"):  # a GPU clock over every round's steps, or none where a round lacks it
        steps = [result.get(f"{clock}_steps_ms") for result in rounds]
        case[f"{clock}_steps_ms"] = None if None in steps else [step for some in steps for step in some]
        case[f"{clock}_ms"] = None if None in steps else median_interval(case[f"{clock}_steps_ms"])
    return case


def round_ratios(case: Optional[dict], reference: Optional[dict]) -> Optional[List[float]]:
    """With --rounds, the steady step of `case` ÷ that of `reference` in each round: the two ran in turn in every
    round, each a fresh process, so a round's ratio pairs processes that ran minutes apart at most, where the
    pooled intervals also hold whatever changed on the machine between rounds. None with one round, or where
    either case lacks a round's steady median."""
    rounds = [(case or {}).get("rounds"), (reference or {}).get("rounds")]
    if None in rounds or len(rounds[0]) < 2 or len(rounds[0]) != len(rounds[1]):
        return None
    pairs = [(mine.get("steady_ms"), theirs.get("steady_ms")) for mine, theirs in zip(*rounds)]
    return None if any(None in pair for pair in pairs) else [mine / theirs for mine, theirs in pairs]


def add_derived(cases: List[dict]) -> None:
    """Adds case['derived'] to every successful case, within its workload, None where a case is missing:
    steady_vs_native_benchmark, steady_vs_best_native: the wall-clock median over native_benchmark's and over
    the better native mode's; gpu_vs_best_native and graph_vs_best_native: the median on each GPU clock over the
    better native mode's on that clock (graph_vs_best_native only where every native mode that ran has
    graph_ms: see gpu_clock); wall_loss_vs_best_native: see wall_loss; first step ÷ native_heuristic first step
    and (cache_warm) warm start ÷ native_heuristic first step."""
    ok = successful(cases)
    for case in ok.values():
        def native(mode, key):
            return ok.get((case["workload"], mode), {}).get(key)

        best_wall, best_gpu, best_graph = (better_native(ok, case["workload"], clock) for clock in CLOCKS)
        replayed = gpu_clock(ok, case["workload"], case["mode"]) == "graph_ms"
        case["derived"] = {
            "steady_vs_native_benchmark": ratio(case["steady_ms"], native("native_benchmark", "steady_ms")),
            "steady_vs_best_native": ratio(case["steady_ms"], median_of(best_wall)),
            "gpu_vs_best_native": ratio(median_of(case.get("gpu_ms")), median_of(best_gpu)),
            "graph_vs_best_native": ratio(median_of(case.get("graph_ms")), median_of(best_graph)) if replayed else None,
            "wall_loss_vs_best_native": wall_loss(case.get("wall_ms"), best_wall),
            "first_vs_native_heuristic_first": ratio(case["first_s"], native("native_heuristic", "first_s")),
            "warm_start_vs_native_heuristic_first": ratio(case.get("warm_start_s"),
                                                          native("native_heuristic", "first_s")),
        }


def check_targets(report: dict) -> List[dict]:
    """The targets, for every workload with a cache_cold or cache_warm case, then for the host overhead:
    dicts {workload, target, value, limit, unit, met}, met = value <= limit, or None (no data) when a case it
    needs is missing or failed. The better-native-steady target also has stretch_limit and stretch_met.
    A run tuned with exhaustive=True (--tuning exhaustive=1: offline tuning) has no cold first-step targets;
    instead each workload's warm GPU time per step against the better native's (<= 1.00, stretch 0.97), and once
    for the run, at most half of the workloads above 0.97.

    The wall-clock steady targets (warm against either native, cold against warm) compare medians and also carry
    intervals_overlap, whether the 95% intervals of the two steady steps overlap: a median above the limit is a
    loss (met False) only when they do not (see wall_loss); the stretch is judged on the medians alone. With
    --rounds, cold against warm is paired by round instead: its value is the median of the rounds' ratios
    (round_ratios, kept in the row), met when that is within the limit."""
    ok, targets = successful(report["cases"]), []
    ran = ok.keys() | failed_cases(report["cases"])  # (workload, mode) of every case that ran, failed or not

    def target(workload, text, value, limit, unit, stretch_limit=None, overlap=None, per_round=None):
        if per_round is not None:  # paired by round (round_ratios): the median of the rounds' ratios, no intervals
            value, overlap = statistics.median(per_round), None
        row = {"workload": workload, "target": text, "value": value, "limit": limit, "unit": unit,
               "met": None if value is None or limit is None else value <= limit or bool(overlap)}
        if per_round is not None:
            row["round_ratios"] = per_round
        if overlap is not None:
            row["intervals_overlap"] = overlap
        if stretch_limit is not None:
            row.update(stretch_limit=stretch_limit, stretch_met=None if value is None else value <= stretch_limit)
        targets.append(row)

    workloads = dict.fromkeys(c["workload"] for c in report["cases"] if c["mode"].startswith("cache_"))
    exhaustive = bool((report.get("settings", {}).get("tuning") or {}).get("exhaustive"))
    exhaustive_gpu: List[float] = []  # the ratios of the exhaustive GPU target, per workload that has one
    for workload in workloads:
        def get(mode, key):
            return ok.get((workload, mode), {}).get(key)

        def overlap(figure, reference):
            return None if figure is None or reference is None else intervals_overlap(figure, reference)

        warm_steady, warm_wall = get("cache_warm", "steady_ms"), get("cache_warm", "wall_ms")
        best_wall = better_native(ok, workload, "wall_ms")
        target(workload, "warm first step ≤ native_heuristic first step", get("cache_warm", "first_s"),
               get("native_heuristic", "first_s"), "s")
        target(workload, f"warm start (import + load + prepare + first step) ≤ {TARGET_WARM_START_S:g} s",
               get("cache_warm", "warm_start_s"), TARGET_WARM_START_S, "s")
        if (workload, "cache_env") in ran:
            target(workload, f"zero-code warm start (CUDNN_CACHE_PATH: import with load + first step) ≤ "
                   f"{TARGET_WARM_START_S:g} s", get("cache_env", "warm_start_s"), TARGET_WARM_START_S, "s")
        target(workload, "warm steady ÷ native_benchmark steady ≤ 1.00",
               ratio(warm_steady, get("native_benchmark", "steady_ms")), 1.0, "ratio",
               overlap=overlap(warm_wall, get("native_benchmark", "wall_ms")))
        target(workload, f"warm steady ÷ better native steady ≤ 1.00 (stretch {TARGET_STEADY_STRETCH:.2f})",
               ratio(warm_steady, median_of(best_wall)), 1.0, "ratio", stretch_limit=TARGET_STEADY_STRETCH,
               overlap=overlap(warm_wall, best_wall))
        if exhaustive:
            # Offline tuning (warm_start.py --exhaustive) pays its time once, so the cold first step has no target;
            # what it is for is GPU time, judged on the clock that does not swing between processes, and with no
            # profiler attached where the step could be captured (gpu_clock).
            clock = gpu_clock(ok, workload, "cache_warm")
            gpu = ratio(median_of(get("cache_warm", clock)), median_of(better_native(ok, workload, clock)))
            target(workload, f"exhaustive: warm GPU time per step ({GPU_CLOCK_NAMES[clock]}) ÷ better native's ≤ "
                   f"1.00 (stretch {TARGET_EXHAUSTIVE_GPU:.2f})", gpu, 1.0, "ratio",
                   stretch_limit=TARGET_EXHAUSTIVE_GPU)
            if gpu is not None:
                exhaustive_gpu.append(gpu)
        else:
            target(workload, f"cold first step ÷ native_benchmark first step ≤ {TARGET_COLD_RATIO:.2f}",
                   ratio(get("cache_cold", "first_s"), get("native_benchmark", "first_s")), TARGET_COLD_RATIO,
                   "ratio")
            if workload in WORKLOADS and WORKLOADS[workload].depthwise:
                target(workload, "cold first step ≤ native_heuristic first step (depthwise: native heuristics "
                       "compiles engines too)", get("cache_cold", "first_s"), get("native_heuristic", "first_s"), "s")
        target(workload, f"cold steady ÷ warm steady ≤ {TARGET_TUNING_PROCESS_RATIO:.2f} (the tuning process at warm "
               "speed)", ratio(get("cache_cold", "steady_ms"), warm_steady), TARGET_TUNING_PROCESS_RATIO, "ratio",
               overlap=overlap(get("cache_cold", "wall_ms"), warm_wall),
               per_round=round_ratios(ok.get((workload, "cache_cold")), ok.get((workload, "cache_warm"))))
        if (workload, "cache_intercept") in ran:
            target(workload, f"intercepted steady ÷ converted (cache_warm) steady ≤ {TARGET_INTERCEPT_RATIO:.2f}, "
                   "tuning nothing", intercept_ratio(ok, workload), TARGET_INTERCEPT_RATIO, "ratio")
        audit = get("cache_cold", "audit")
        if audit is not None and audit["keys"]:
            target(workload, f"keys whose stored choice is > {AUDIT_NOISE:g}x slower than a native choice, "
                   "measured the same way (cudnn_cache.audit)", audit["slower_than_native"], 0, "count")
            if audit.get("audit_repeats", 1) > 1:
                target(workload, f"keys whose stored choice every one of {audit['audit_repeats']} audits in the "
                       f"process finds > {AUDIT_NOISE:g}x slower than a native choice (a verdict that repeats)",
                       audit["slower_in_every_audit"], 0, "count")
    if exhaustive and workloads:
        above = sum(gpu > TARGET_EXHAUSTIVE_GPU for gpu in exhaustive_gpu)
        target(ALL_WORKLOADS, f"exhaustive: workloads whose warm GPU time per step is above {TARGET_EXHAUSTIVE_GPU:.2f}x "
               f"the better native's, at most half of the {len(exhaustive_gpu)} measured",
               above if exhaustive_gpu else None, len(exhaustive_gpu) // 2 if exhaustive_gpu else None, "count")
    for workload, (results, ran) in interleaved_by_workload(report).items():
        for mode in ("cache_warm", "cache_intercept"):
            # The better native is the one whose ratio is higher; each was measured against its own process.
            ratios = [r["ratio_to_native"][mode] for r in results]
            row = {"workload": workload, "unit": "ratio", "limit": 1.0, "interleaved": True,
                   "target": f"{mode} steady ÷ better native steady ≤ 1.00, interleaved in one process (the "
                             "paired ratio per round; met while its 95% interval reaches 1.00)",
                   "value": max(r["median"] for r in ratios) if ran else None,
                   "interval": max(ratios, key=lambda r: r["median"]) if ran else None,
                   "met": all(r["lo"] <= 1.0 for r in ratios) if ran else None}
            targets.append(row)
    overhead = report.get("overhead")
    if overhead is not None:
        target(OVERHEAD, f"op host time per call in TorchScript ≤ native's + {TARGET_OP_OVERHEAD_US:g} us",
               overhead.get("op_overhead_above_native_us"), TARGET_OP_OVERHEAD_US, "us")
        target(OVERHEAD, "eager training path (forward + backward) through the op ≤ better native's + "
               f"{TARGET_TRAIN_OVERHEAD_US:g} us", overhead.get("train_op_overhead_above_native_us"),
               TARGET_TRAIN_OVERHEAD_US, "us")
        target(OVERHEAD, "eager training path (forward + backward) through intercept ≤ better native's + "
               f"{TARGET_TRAIN_OVERHEAD_US:g} us", overhead.get("train_intercept_overhead_above_native_us"),
               TARGET_TRAIN_OVERHEAD_US, "us")
        for way, key in (("the op", "scripted_train_op_overhead_above_native_us"),
                         ("intercept", "scripted_train_intercept_overhead_above_native_us")):
            if key in overhead:  # runs before the TorchScript training rows have none
                target(OVERHEAD, f"TorchScript training loop (forward + backward) through {way} ≤ native's + "
                       f"{TARGET_TRAIN_OVERHEAD_US:g} us", overhead[key], TARGET_TRAIN_OVERHEAD_US, "us")
    return targets


def interleaved_by_workload(report: dict) -> Dict[str, Tuple[List[dict], bool]]:
    """The interleaved cases by workload: (those that ran, whether both native modes did)."""
    grouped: Dict[str, Tuple[List[dict], bool]] = {}
    for result in report.get("interleaved") or []:
        results, _ = grouped.setdefault(result["workload"], ([], False))
        if "error" not in result:
            results.append(result)
    return {workload: (results, {r["native_mode"] for r in results} == set(INTERLEAVED_NATIVE))
            for workload, (results, _) in grouped.items()}


def interleaved_table(report: dict) -> List[str]:
    """The steady step of each workload natively and through the cache, taken in turn in one process."""
    results = report.get("interleaved") or []
    if not results:
        return []
    columns = ["workload", "native mode", "native", "cache_warm", "÷ native", "host ÷ native", "forward ÷ native",
               "cache_intercept", "÷ native", "host ÷ native", "forward ÷ native"]
    rows = []
    for result in results:
        if "error" in result:
            rows.append(failed_row(result, columns, mode="native_mode"))
            continue
        wall, ratios = result["wall_ms"], result["ratio_to_native"]
        host, forward = result.get("host_ratio_to_native", {}), result.get("forward_ratio_to_native", {})
        row = [workload_label(result["workload"]), result["native_mode"], interval_cell(wall["native"], ".2f", " ms")]
        for mode in ("cache_warm", "cache_intercept"):
            row += [interval_cell(wall[mode], ".2f", " ms"), interval_cell(ratios[mode], ".3f", ""),
                    interval_cell(host.get(mode), ".3f", ""), interval_cell(forward.get(mode), ".3f", "")]
        rows.append(row)
    steps = results[0].get("steps_ms", {}).get("native") or []
    return ["", "## Steady state, interleaved in one process", "",
            f"Per workload and native mode, one process takes a step natively, through the converted model "
            f"(cache_warm, on cache_cold's file) and under intercept, in turn, {len(steps)} rounds (the order "
            "is drawn anew each round). Wall-clock step, median [95% interval]; ÷ native: the ratio of the two "
            "steps of each round, median [95% interval]; host ÷ native: the same of the time until backward() "
            "returns, before the step's final synchronize; forward ÷ native: the same of the time until the loss is "
            "computed, the step's forward ('-' from runs that did not record them). Separate processes differ by "
            "more than the modes do, so this is the wall-clock comparison the targets use.", ""] + table(columns, rows)


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


def milliseconds(seconds: Optional[float]) -> str:
    return number(None if seconds is None else 1e3 * seconds, ".1f", " ms")


def table(columns: List[str], rows: List[List[str]]) -> List[str]:
    """A markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def workload_label(workload: str) -> str:
    return WORKLOADS[workload].label if workload in WORKLOADS else workload


START_COLUMNS = ["workload", "mode", "first step", "second step", "first ÷ heuristic first", "tuning est. (tunes)",
                 "tune time", "plan build", "import", "load", "prepare (plans)", "warm start",
                 "warm start ÷ heuristic first"]
STEADY_COLUMNS = ["workload", "mode", "wall step, median [95% CI]", "GPU time per step, median [95% CI]",
                  "graph replay, median [95% CI]", "wall ÷ bench", "wall ÷ better native", "GPU ÷ better native",
                  "graph ÷ better native",
                  "hits / misses / tunes / tune waits / fallbacks", "plans built / deserialized / rebuilt / evicted"]


def failed_row(case: dict, columns: List[str], mode: str = "mode") -> List[str]:
    error = " ".join(case["error"].splitlines()[:1])[:160].replace("|", "\\|")
    return [workload_label(case["workload"]), case[mode], f"FAILED: {error}"] + [""] * (len(columns) - 3)


def start_row(case: dict) -> List[str]:
    """The case's row of the first-step and start-up table."""
    if "error" in case:
        return failed_row(case, START_COLUMNS)
    derived, stats = case["derived"], case.get("stats")
    tuning = number(case.get("tuning_estimate_s"), ".2f", " s")
    if stats is not None and case["mode"] == "cache_cold":
        tuning += f" ({stats['tunes']})"
    load = "-"
    if "loaded_entries" in case:  # cache_env loads at import: its load time is in the import's
        load = f"{milliseconds(case['load_s'])} ({case['loaded_entries']} entries)"
    prepare = "-"
    if case.get("prepare_s") is not None:
        prepare = f"{milliseconds(case['prepare_s'])} ({case['prepared_plans']})"
    first = number(case["first_s"], ".2f", " s")
    if "first_s_range" in case:  # --rounds: the median, and the lowest and highest round
        first += f" ({case['first_s_range'][0]:.2f}-{case['first_s_range'][1]:.2f}, {len(case['rounds'])} rounds)"
    return [workload_label(case["workload"]), case["mode"], first, number(case.get("second_s"), ".3f", " s"),
            number(derived["first_vs_native_heuristic_first"], ".2f"), tuning, number(case.get("tune_s"), ".2f", " s"),
            number(case.get("plan_build_s"), ".3f", " s"),
            milliseconds(case.get("import_s")), load, prepare,
            number(case.get("warm_start_s"), ".2f", " s"),
            number(derived["warm_start_vs_native_heuristic_first"], ".2f")]


def interval_cell(figure: Optional[dict], spec: str, unit: str) -> str:
    return "-" if figure is None else format_interval(figure, spec, unit)


def wall_ratio_cell(derived: dict) -> str:
    """The wall-clock ratio against the better native mode, marked 'loss' when it is one (see wall_loss) and
    '(overlap)' when its median is higher but the intervals overlap."""
    cell = number(derived["steady_vs_best_native"], ".2f")
    if derived["wall_loss_vs_best_native"]:
        cell += " loss"
    elif derived["wall_loss_vs_best_native"] is False and derived["steady_vs_best_native"] > 1:
        cell += " (overlap)"
    return cell


def steady_row(case: dict) -> List[str]:
    """The case's row of the steady-state table."""
    if "error" in case:
        return failed_row(case, STEADY_COLUMNS)
    derived, stats = case["derived"], case.get("stats")
    counters = plans = "-"
    if stats is not None:
        # Result files of earlier versions lack the later counters: '-'.
        counters = " / ".join(str(stats.get(k, "-")) for k in ("hits", "misses", "tunes", "tune_waits", "fallbacks"))
        plans = " / ".join(str(stats.get(k, "-"))
                           for k in ("plans_built", "plans_deserialized", "plan_rebuilds", "plan_evictions"))
    return [workload_label(case["workload"]), case["mode"], interval_cell(case.get("wall_ms"), ".2f", " ms"),
            interval_cell(case.get("gpu_ms"), ".2f", " ms"), interval_cell(case.get("graph_ms"), ".2f", " ms"),
            number(derived["steady_vs_native_benchmark"], ".2f"), wall_ratio_cell(derived),
            number(derived["gpu_vs_best_native"], ".2f"), number(derived["graph_vs_best_native"], ".2f"), counters,
            plans]


def audit_table(cases: List[dict]) -> List[str]:
    audited = [c for c in cases if c.get("audit", {}).get("keys")]
    if not audited:
        return []
    lines = ["", "## Per-key audit", "", "cudnn_cache.audit() in cache_cold's process, after its timed steps "
             "and before its profiled ones (Note [Profiling last]): every tuned key's stored engine "
             "config against the configs native benchmark=False (first that runs, in heuristic order) and "
             "benchmark=True (fastest of 10, one timing each) would run, all three then timed the same way: warmed "
             "up, L2 flushed, interleaved rounds in a fresh order each, median; the stored config twice: its time "
             "is the mean of the two, and their gap is that key's resolution. A key counts as slower when its "
             f"stored choice is more than {AUDIT_NOISE:g}x and more than its own resolution slower than a native "
             "choice. "
             "resolution: the median and the widest of the keys' resolutions. Ratios are stored ÷ native; below 1 "
             "is faster. Where the process audited more than once (--audit-repeats), 'slower' gives each audit's "
             "count and, after 'in all', the keys every audit found slower; the other columns are the first "
             "audit's, and the audit time is all of them. rounds: each audit's interleaved rounds per key "
             "(--audit-rounds; else the tuning's repetitions).", ""]
    rows = []
    for case in audited:
        a = case["audit"]
        resolution = "-"
        if "resolution_us_median" in a:
            resolution = f"{a['resolution_us_median']:.1f} / {a['resolution_us_max']:.1f} us"
        slower = str(a["slower_than_native"])
        if a.get("audit_repeats", 1) > 1:
            slower = f"{' / '.join(map(str, a['slower_per_audit']))}, in all {a['slower_in_every_audit']}"
        rows.append([workload_label(case["workload"]), str(a["keys"]), resolution, slower,
                     str(a["faster_than_native"]), f"{a['geomean_vs_heuristic']:.3f}",
                     f"{a['geomean_vs_benchmark']:.3f}",
                     f"{a['stored_total_ms']:.2f} / {a['heuristic_total_ms']:.2f} / {a['benchmark_total_ms']:.2f} ms",
                     f"{a['worst_ratio']:.3f}", f"{a['seconds']:.1f} s", str(a.get("rounds", "-"))])
    return lines + table(["workload", "keys", "resolution median / max", "slower", f"faster < 1/{AUDIT_NOISE:g}",
                          "geomean ÷ heuristic", "geomean ÷ benchmark", "sum stored / heuristic / benchmark",
                          "worst key ratio", "audit time", "rounds"], rows)


def settle_table(cases: List[dict]) -> List[str]:
    """The keys cudnn_cache.settle() decided again in each cache_cold process (bench.py --settle, the default with
    --tuning exhaustive=1), and those it moved to another config."""
    settled = [c for c in cases if "settle" in c]
    if not settled:
        return []
    lines = ["", "## Settled in steady state", "", "cudnn_cache.settle() in cache_cold's process, after its first "
             "step (Note [Settling in steady state]): each tuned key's stored config and native's two picks timed "
             "as the audit times them, and a native pick the rounds show faster takes the stored config's place. "
             "The steps timed after it, the audit and the saved file (which cache_warm loads) have the settled "
             "choices.", ""]
    rows = [[workload_label(c["workload"]), str(c["settle"]["keys"]), str(c["settle"]["changed"]),
             f"{c['settle']['seconds']:.2f} s"] for c in settled]
    lines += table(["workload", "keys", "changed", "settle time"], rows)
    changes = [f"- {workload_label(c['workload'])}, {change['key']}: {change['from']} -> {change['to']}"
               for c in settled for change in c["settle"]["changes"]]
    return lines + (["", *changes] if changes else [])


def overhead_table(overhead: Optional[dict]) -> List[str]:
    if overhead is None:
        return []
    lines = ["", "## Host overhead per call"]
    if "error" in overhead:
        return lines + ["", "FAILED: " + overhead["error"].splitlines()[0]]
    shape = "x".join(map(str, overhead["input"]))
    lines += ["", f"conv2d forward, input {shape}, weight {'x'.join(map(str, overhead['weight']))}, padding 1, "
              f"no grad: {overhead['calls']} calls with no synchronize between them, then one; median of "
              f"{overhead['repeats']} rounds and its 95% interval. The cache was tuned first (warm), then ran with "
              "miss policy 'error'. The op's host time above native's, both in a TorchScript loop: "
              f"{overhead['op_overhead_above_native_us']:.1f} us; called from Python as a converted module calls it "
              f"(Note [Eager calls]), above the better native's: "
              f"{overhead.get('eager_op_overhead_above_native_us', math.nan):.1f} us.", ""]
    columns = ["call", "wall per call (incl. final synchronize)", "host per call (before it)"]
    forward = {n: r for n, r in overhead["results"].items() if not n.startswith("train_")}
    lines += table(columns, [overhead_row(name, r) for name, r in forward.items()])
    training = {n: r for n, r in overhead["results"].items() if n.startswith("train_")}
    if training:
        scripted = ""  # runs before the TorchScript training rows have none
        if "scripted_train_op_overhead_above_native_us" in overhead:
            scripted = (f"; in a TorchScript loop, above native's in one: through the op "
                        f"{overhead['scripted_train_op_overhead_above_native_us']:.1f} us, through intercept "
                        f"{overhead['scripted_train_intercept_overhead_above_native_us']:.1f} us")
        lines += ["", f"Eager training path: forward + backward (torch.autograd.grad of input and weight), input "
                  f"{'x'.join(map(str, overhead['train_input']))}, weight "
                  f"{'x'.join(map(str, overhead['train_weight']))}, padding 1: {overhead['train_calls']} "
                  f"iterations per round, {overhead['repeats']} rounds, per iteration. Host time above the better "
                  f"native's: through the op {overhead['train_op_overhead_above_native_us']:.1f} us, through "
                  f"intercept {overhead['train_intercept_overhead_above_native_us']:.1f} us{scripted}. In one process "
                  "PyTorch's two modes run the same cuDNN plans (its plan cache is not keyed by the benchmark "
                  "flag; the benchmark=False rows make them first), so the two native rows measure one thing "
                  "twice, and the better of them is the lower of two samples of it.", ""]
        lines += table(["iteration", "wall per iteration (incl. final synchronize)", "host per iteration (before it)"],
                       [overhead_row(name, r) for name, r in training.items()])
    return lines


def overhead_row(name: str, result: dict) -> List[str]:
    """A row of the overhead tables: wall and host time, each as median [95% interval], in us."""
    return [OVERHEAD_LABELS.get(name, name), interval_cell(result.get("wall_us_interval"), ".1f", " us"),
            interval_cell(result.get("host_us_interval"), ".1f", " us")]


TARGET_FORMATS = {"s": (".2f", " s"), "ratio": (".2f", ""), "us": (".1f", " us"), "count": ("d", "")}


def targets_table(targets: List[dict]) -> List[str]:
    if not targets:
        return []
    verdicts = {True: "met", False: "missed", None: "no data"}
    rows = []
    for t in targets:
        spec, unit = TARGET_FORMATS[t["unit"]]
        verdict = verdicts[t["met"]]
        if t.get("intervals_overlap") is not None and t["met"] is not None and t["value"] > t["limit"]:
            verdict += " (median above, intervals overlap)" if t["intervals_overlap"] else " (intervals apart)"
        if t.get("round_ratios"):
            verdict += f" (median of the rounds' ratios: {', '.join(f'{r:.2f}' for r in t['round_ratios'])})"
        if "stretch_limit" in t:
            verdict += f"; stretch {t['stretch_limit']:.2f}: {verdicts[t['stretch_met']]}"
        label = "host overhead" if t["workload"] == OVERHEAD else workload_label(t["workload"])
        # An interleaved ratio is resolved to 0.1%: print it so.
        value = number(t["value"], spec, unit) if t.get("interval") is None else interval_cell(t["interval"], ".3f", unit)
        rows.append([label, t["target"], value, number(t["limit"], spec, unit), verdict])
    met, without = sum(t["met"] is True for t in targets), sum(t["met"] is None for t in targets)
    return ["", "## Targets", "", f"{met} of {len(targets)} met" + (f", {without} without data" if without else "") +
            " (cache_warm and cache_cold against the native cases of the same workload).", ""] + \
        table(["workload", "target", "value", "limit", "result"], rows)


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# cudnn_cache against native cuDNN autotuning: whole training steps", "",
        f"{env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}), cuDNN {env['cudnn']}; {env['date']}. "
        f"Each case ran in a fresh process (`python3 -m benchmarks models`); cache backend '{report['settings']['backend']}'.",
    ]
    if report.get("complete") is False:
        cut = [part["file"] for part in report["settings"].get("parts", []) if not part["complete"]]
        lines += ["", f"**Cut short** ({', '.join(cut) or 'this run'}): the run was stopped before its last case; "
                      "the tables hold the cases it finished."]
    lines += ["", "## First step and start-up", ""]
    lines += table(START_COLUMNS, [start_row(case) for case in report["cases"]])
    lines += ["", "## Steady state", ""]
    lines += table(STEADY_COLUMNS, [steady_row(case) for case in report["cases"]])
    lines += interleaved_table(report)
    lines += audit_table(report["cases"])
    lines += settle_table(report["cases"])
    lines += overhead_table(report.get("overhead"))
    lines += targets_table(report.get("targets", []))
    lines += ["", "## Notes", ""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def notes(settings: dict) -> List[str]:
    lines = [
        "A training step: zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward; no optimizer "
        "step. The input requires grad. The same in every mode.",
        "first step: wall time of the first training step, synchronized, after CUDA, cuBLAS and cuDNN were set up "
        "on an unrelated tiny convolution; second step: the next one, the first warm-up step, timed alone (first "
        "minus second is what only a first step pays: tuning, plan builds, and PyTorch's own first-use costs such "
        "as loading kernels and growing the allocator's pool). wall step (wall_ms; steady_ms is its median): "
        f"{settings['steps']} steps, "
        f"synchronized per step, after {settings['warmup']} warm-up steps. GPU time per step (gpu_ms): the kernel "
        f"and copy time torch.profiler records in each of {settings['steps']} more steps, each step profiled on "
        "its own (an untraced step between two traced ones); a wall step well above it is host time the GPU "
        f"waits on. graph replay (graph_ms): the step captured once in a CUDA graph, then {settings['steps']} "
        "replays, each timed by CUDA events around it, before the profiler runs: the GPU's time for the step with "
        "no profiler attached (CUPTI slows some engine configs more than others); '-' where the step could not be "
        "captured (the case's graph_error says why). The exhaustive target is judged on it where the warm case and "
        "the native cases all have it.",
        "Intervals: every figure is a median [lo, hi] with lo and hi the distribution-free 95% confidence "
        "interval of the median from order statistics (binomial: for 30 values the 10th and 21st smallest, for "
        "20 the 6th and 15th); the overhead rows take it over their rounds. A wall-clock ratio above 1 is a loss "
        "only when the two intervals do not overlap ('loss' in the tables; '(overlap)' marks a higher median "
        "within the spread); the wall-clock steady targets are met when the median is within the limit or the "
        "intervals overlap, and say which.",
        f"backend: the cache modes ran with cudnn_cache.set_backend('{settings['backend']}'). 'graph' runs cuDNN "
        "graph-API engine configs, each through an execution plan built from its stored config (by prepare() or "
        "on its first call); 'legacy' replays cudnnConvolution*Algo_t and builds no plans.",
        "tuning est.: first step minus steady step, for the modes that tune (native_benchmark, cache_cold); in "
        "parentheses, the convolutions cudnn_cache tuned (stats()['tunes']).",
        "tune time, plan build: stats()['tune_us'] and stats()['plan_build_us'] over the case, in seconds: time "
        "spent tuning, and building execution plans (on first calls and in prepare()); '-' where this build of "
        "the ops does not count them.",
        "import: the process's first `import cudnn_cache` (the package and its ops library; for cache_env the load "
        "too). load: cudnn_cache.load() of the file cache_cold saved (cache_warm, which runs with miss policy "
        "'error'). prepare: cudnn_cache.prepare() after it, before the first step, which builds the execution plan "
        "of every loaded graph-API entry of the GPU (in parentheses, the plans it reports). warm start: import + "
        "load + prepare + first step. cache_env: a process as CUDNN_CACHE_PATH starts it (the import loads the "
        "file and routes PyTorch's convolutions through the cache; its first convolution starts prepare() in the "
        "background, and the calls build what it has not built yet), "
        "with miss policy 'error'; its stats count from the process's start, the set-up convolution included.",
        "wall ÷ bench: the wall-clock median ÷ native_benchmark's; wall ÷ better native, GPU ÷ better native, "
        "graph ÷ better native: "
        "each clock's median ÷ that of whichever of native_benchmark and native_heuristic has the lower median on "
        "that clock; first ÷ heuristic first, warm start ÷ heuristic first: ÷ native_heuristic's "
        "first step.",
        "hits / misses / tunes / tune waits / fallbacks, plans built / deserialized / rebuilt / evicted: "
        "cudnn_cache.stats() over the case (from before load, so prepare and the first step count): tune_waits "
        "(misses that waited for another thread's search of the key), plans_built, plans_deserialized (restored "
        "from the file instead of built), plan_rebuilds (stored plans that could not be used and were rebuilt), "
        "plan_evictions (plans the plan cache's bound dropped).",
    ]
    if settings.get("rounds", 1) > 1:
        lines.append(f"rounds: each workload's modes ran {settings['rounds']} times in turn, each case a fresh process "
                     "every time (a round's cache_warm loads the file its own cache_cold saved). The figures each "
                     "process measures once (first step, load, prepare, warm start, tuning) are medians over the "
                     "rounds, with the first step's lowest and highest in parentheses; the targets judge the "
                     "medians. The steady clocks are taken over every round's steps; the counters are the first "
                     "round's. cold steady ÷ warm steady is paired by round: each round's cache_cold steady median "
                     "÷ its cache_warm's (the two ran one after the other), and the target judges the median of "
                     "those ratios, not the pooled intervals, which also hold what changed on the machine "
                     "between rounds.")
    if settings["device"] == "cpu":
        lines.append("--device cpu: no cuDNN, so prepare() is not called: prepare_s and prepared_plans are null, "
                     "and warm start counts prepare as 0 s.")
    return lines


def combine(paths: List[pathlib.Path]) -> dict:
    """One report of the JSON reports of several runs of this script on one machine (a run split in parts to
    fit a time limit): their cases and overhead, the first run's environment and settings, each part's
    workloads, date and whether it ran to its end in settings['parts'] (complete: false for a run cut short,
    and then for the whole). Refuses reports of different GPUs, versions or settings, and
    reports written before the clocks had intervals."""
    reports = [json.loads(path.read_text()) for path in paths]
    for path, report in zip(paths, reports):
        if any("error" not in case and "wall_ms" not in case for case in report["cases"]):
            raise SystemExit(f"bench --combine: {path} has cases without wall_ms (written before the clocks had "
                             "intervals, when gpu_ms was one number): re-run them with this script")
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
                "interleaved": [result for report in reports for result in report.get("interleaved") or []],
                "overhead": next((r["overhead"] for r in reports if r.get("overhead")), None)}
    combined["settings"]["parts"] = [{"file": str(path), "workloads": r["settings"]["workloads"],
                                      "date": r["environment"].get("date"), "complete": r.get("complete", True)}
                                     for path, r in zip(paths, reports)]
    combined["complete"] = all(part["complete"] for part in combined["settings"]["parts"])
    combined["settings"]["workloads"] = [w for r in reports for w in r["settings"]["workloads"]]
    return combined

