"""scripts/bench.py's reports: the derived figures, the targets, the markdown tables, and --combine's merge of
the JSON reports of several runs."""

import json
import math
import pathlib
from typing import Dict, List, Optional, Tuple

from bench_cases import AUDIT_NOISE, GPU_TIME_STEPS, OVERHEAD, OVERHEAD_LABELS, WORKLOADS

# The targets (see check_targets).
TARGET_WARM_START_S = 1.5          # load + prepare + first step of cache_warm
TARGET_STEADY_STRETCH = 0.95       # of the better native steady step; 'met' is judged at 1.00
TARGET_OP_OVERHEAD_US = 2.0        # the op's host time per call above the better native's
TARGET_INTERCEPT_RATIO = 1.02      # cache_intercept's steady step over cache_warm's (run-to-run noise)


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
             "up, L2 flushed, interleaved rounds, median; the stored config twice, and the gap between a key's "
             "two times of its stored config is that key's resolution. A key counts as slower when its stored "
             f"choice is more than {AUDIT_NOISE:g}x and more than its own resolution slower than a native choice. "
             "resolution: the median and the widest of the keys' resolutions. Ratios are stored ÷ native; below 1 "
             "is faster.", ""]
    rows = []
    for case in audited:
        a = case["audit"]
        resolution = "-"
        if "resolution_us_median" in a:
            resolution = f"{a['resolution_us_median']:.1f} / {a['resolution_us_max']:.1f} us"
        rows.append([workload_label(case["workload"]), str(a["keys"]), resolution, str(a["slower_than_native"]),
                     str(a["faster_than_native"]), f"{a['geomean_vs_heuristic']:.3f}",
                     f"{a['geomean_vs_benchmark']:.3f}",
                     f"{a['stored_total_ms']:.2f} / {a['heuristic_total_ms']:.2f} / {a['benchmark_total_ms']:.2f} ms",
                     f"{a['worst_ratio']:.3f}", f"{a['seconds']:.1f} s"])
    return lines + table(["workload", "keys", "resolution median / max", "slower", f"faster < 1/{AUDIT_NOISE:g}",
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

