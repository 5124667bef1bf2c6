"""Whole-model benchmark: cudnn_cache against PyTorch's own cuDNN autotuning, each case in a fresh process.

For every workload, six modes run one after another, each in its own Python process (so no in-process cache
carries over between them):

    native_benchmark   torch.backends.cudnn.benchmark=True: PyTorch times engines on the first step
    native_heuristic   benchmark=False: cuDNN's heuristics, no timing
    cache_cold         cudnn_cache.convert(model), empty cache, miss policy 'tune': the first step tunes every
                       convolution (with --settle, the default with --tuning exhaustive=1, cudnn_cache.settle()
                       then decides every key again in steady state, as scripts/warm_start.py does); the cache is
                       then saved to a temporary file
    cache_warm         a fresh process loads that file (timed), converts the model, sets miss policy 'error'
                       (a convolution the file does not cover fails loudly instead of tuning) and builds the
                       execution plans of the loaded entries with cudnn_cache.prepare() (timed) before the
                       first step; warm start = import + load + prepare + first step
    cache_intercept    as cache_warm, but the model is not converted: cudnn_cache.intercept() routes PyTorch's
                       own convolutions (aten::convolution and its backward) through the cache
    cache_env          as a process CUDNN_CACHE_PATH starts: the import loads that file and intercepts; the first
                       convolution starts prepare() in the background; warm start = import + first step

Then, unless --no-interleaved, two more processes per workload (WORKLOAD:interleaved:NATIVE_MODE), one per
native mode: each loads cache_cold's file and takes a steady step natively, through the converted model and
under intercept, in turn, --steps rounds, and reports each cache mode's step over native's per round (paired).
Separate processes differ by more than the modes do (host jitter, clocks), so these are the wall-clock
comparisons the steady targets judge; PyTorch keeps one plan cache for both its modes, hence one process each
(--interleaved-against picks one of them).

The cache modes run through the backend --backend names (cudnn_cache.set_backend): 'graph' (default) runs
cuDNN graph-API engine configs, 'legacy' replays cudnnConvolution*Algo_t.

A training step is model.zero_grad(set_to_none=True), forward, loss = output.float().sum(), backward (no
optimizer step; the same in every mode), with the input requiring grad. Before the first step each
process initialises CUDA, cuBLAS and cuDNN on an unrelated tiny convolution, so the first step measures
tuning and per-shape set-up only. Per case it reports the first step (s, synchronized) and the second (the
first warm-up step, timed alone: first minus second is what only a first step pays), the wall-clock time of
--steps steady steps after --warmup steps (ms, synchronized per step) and the GPU time of --steps more steps
(torch.profiler, each step on its own), each as a median with its 95% interval (stats.py), the tuning
estimate (first step minus the median steady step), the cache load and prepare times, and the cache counters
(tuning and plan-build time among them). A separate micro case measures host overhead per call: a tiny
convolution's forward, native F.conv2d against the op torch.ops.cudnn_cache.convolution called directly and
against cudnn_cache.functional.conv2d (and both in TorchScript); and the training path, forward +
backward of a 16 -> 16 3x3 convolution, native F.conv2d against the op and against F.conv2d under
cudnn_cache.intercept(True), from Python and in a TorchScript loop.

Targets, checked per workload from its cases and once for the op's host overhead (met or missed):
    warm first step <= native_heuristic first step;  warm start <= 0.3 s (cache_warm, and cache_env's);
    warm steady <= native_benchmark steady;  warm steady <= the better native steady (stretch: 0.95 of it),
        on wall-clock medians, a higher median counting as a loss only when the 95% intervals do not overlap;
    cold first step <= 0.5 x native_benchmark's; on the depthwise network (MobileNetV2), <= native_heuristic's;
    cold steady (the tuning process) <= 1.02 x warm steady, on wall-clock medians as above;
    intercepted steady <= 1.02 x the converted model's (cache_warm) steady, with nothing tuned;
    with --audit, no key whose stored choice is > 2% slower than a native choice measured the same way, by
    more than that key's resolution (the gap between its own two timings of its stored config); with
        --audit-repeats N, also none that every one of N audits in the process finds slower (--audit-rounds
        sets each audit's rounds per key);
    with --tuning exhaustive=1 (offline tuning, paid once) no cold first-step targets; instead warm GPU time
        per step <= the better native's on every workload, and <= 0.97 of it on at least half of them;
    the op's host time per call in TorchScript <= native's + 1 us; the eager training path's host time per
    iteration, through the op and through intercept, <= the better native's + 1 us; the same iteration made by a
    TorchScript loop (as LibTorch training makes it), through either, <= native's in such a loop + 1 us.

Usage (after scripts/build.sh; needs a CUDA GPU, else it says so and exits 2):

    python3 -m benchmarks models                                   # everything: about 3-6 minutes on an H200
    python3 -m benchmarks models --quick                           # 20 steps, seed, ResNet-18, MobileNetV2, overhead
    python3 -m benchmarks models --workloads resnet18_fp16_cl seed --modes native_heuristic cache_cold cache_warm
    python3 -m benchmarks models --backend legacy --steps 50 --timeout 300 --output-dir /tmp/bench
    python3 -m benchmarks models --workloads mobilenet_v2_bf16_cl --modes native_heuristic cache_cold --rounds 3

Writes bench-results/models.json (environment, settings, every raw per-case result, the targets; --json to
move it, --update to write benchmarks/results/models.json too; the overhead case alone writes
models_overhead.json), models.md (the tables, also printed) and
models.png (needs matplotlib; skipped with a message without it) beside each. A case that fails or times out
is recorded with its error text and the run goes on. The JSON is written again after every case, with
"complete": false until the last one has run, so a run killed by a time limit (a GPU machine's per-call limit)
keeps what it finished; --combine takes such a file too.

Exit codes: 0 every case ran; 1 some case failed (the reports are still written); 2 bad arguments or no GPU.

This file is the command line and the driver. The cases (what each fresh process runs) are in cases.py, the
derived figures, targets and tables in report.py, the chart in plot.py.
"""

import argparse
import datetime
import pathlib
import platform
import sys
import tempfile
from typing import Callable, List, Optional

import torch

from benchmarks import case_command as module_command, output_paths, run_subprocess, write_result
from benchmarks.cases import (INTERLEAVED, INTERLEAVED_NATIVE, LOADS_COLD_FILE, MODES, OVERHEAD, WORKLOADS,
                              run_case, tuning_arguments)
from benchmarks.plot import plot
from benchmarks.report import add_derived, check_targets, combine, markdown, merge_rounds, notes
from benchmarks.stats import format_interval

QUICK_WORKLOADS = ("seed", "resnet18_fp16_cl", "mobilenet_v2_bf16_cl", OVERHEAD)  # what --quick runs
BACKENDS = ("graph", "legacy")  # cudnn_cache.set_backend
MIN_STEPS = 30        # timed steps per figure in a full run
MIN_STEPS_QUICK = 20  # in a --quick run; torch.profiler covers as many

# ---------------------------------------------------------------------------------------------------------------
# The driver: one subprocess per case
# ---------------------------------------------------------------------------------------------------------------

def case_command(case: str, args, cache_file: Optional[pathlib.Path]) -> List[str]:
    command = module_command("models", "--case", case, "--device", args.device, "--steps", args.steps,
                             "--warmup", args.warmup, "--backend", args.backend)
    if cache_file is not None:
        command += ["--cache-file", str(cache_file)]
    if args.audit:
        command += ["--audit", "--audit-repeats", str(args.audit_repeats)]
        if args.audit_rounds is not None:
            command += ["--audit-rounds", str(args.audit_rounds)]
    command.append("--settle" if args.settle else "--no-settle")
    if args.quick:
        command.append("--quick")  # which allows fewer --steps
    command += ["--tuning", *(f"{name}={int(value) if isinstance(value, bool) else value}"
                              for name, value in args.tuning.items())]
    return command


def describe(result: dict) -> str:
    """One progress line for a finished case."""
    if "error" in result:
        return "FAILED: " + result["error"].splitlines()[0]
    if result["workload"] == OVERHEAD:
        return ", ".join(f"{name} {r['host_us']:.1f} us/call (host)" for name, r in result["results"].items())
    if "ratio_to_native" in result:
        return ", ".join(f"{mode} ÷ native {format_interval(r, '.3f')}" for mode, r in result["ratio_to_native"].items())
    line = f"first step {result['first_s']:.2f} s, steady {format_interval(result['wall_ms'], '.2f', ' ms')}"
    if result.get("graph_ms") is not None:
        line += f", GPU {format_interval(result['graph_ms'], '.2f', ' ms')} (graph replay)"
    elif "graph_error" in result:
        line += f", not captured in a CUDA graph ({result['graph_error']})"
    if "warm_start_s" in result:
        line += f", warm start {result['warm_start_s']:.2f} s"
    if "settle" in result:
        settle = result["settle"]
        line += f", settled {settle['changed']} of {settle['keys']} keys to another config in {settle['seconds']:.1f} s"
    return line


def run_all(args, after_each: Optional[Callable[[dict], None]] = None) -> dict:
    """Runs every selected case in its own process, in order (cache_warm after cache_cold of its workload, the
    interleaved cases after both); with --rounds N, a workload's modes N times in turn, merged into one case per
    mode (merge_rounds). after_each, if given, gets the results so far after every case."""
    plan = []
    for workload in args.workloads:
        if workload != OVERHEAD:
            plan += [(workload, mode) for _ in range(args.rounds) for mode in MODES if mode in args.modes]
            if args.interleaved and "cache_cold" in args.modes:
                plan += [(workload, f"{INTERLEAVED}:{native}") for native in INTERLEAVED_NATIVE
                         if native in args.interleaved_against]
    if OVERHEAD in args.workloads:
        plan.append((OVERHEAD, None))
    rounds, interleaved, overhead = {}, [], None  # rounds: (workload, mode) -> its rounds' results

    def so_far() -> dict:
        return {"cases": [merge_rounds(results) for results in rounds.values()], "interleaved": interleaved,
                "overhead": overhead}

    with tempfile.TemporaryDirectory(prefix="cudnn_cache_bench_") as folder:
        for index, (workload, mode) in enumerate(plan, 1):
            name = workload if mode is None else f"{workload}:{mode}"
            cache_file = pathlib.Path(folder) / f"{workload}.cache" if mode else None
            if mode == "cache_cold":  # a round's warm cases load the file of that round's cold case, or none
                cache_file.unlink(missing_ok=True)
            if mode is not None and (mode in LOADS_COLD_FILE or mode.startswith(INTERLEAVED)) and not cache_file.exists():
                result = {"error": "skipped: cache_cold of this workload wrote no cache file"}
            else:
                result = run_subprocess(case_command(name, args, cache_file), args.timeout)
            result.setdefault("workload", workload)
            if mode is None:
                overhead = result
            elif mode.startswith(INTERLEAVED):
                result.setdefault("native_mode", mode.split(":")[1])
                interleaved.append(result)
            else:
                result.setdefault("mode", mode)
                rounds.setdefault((workload, mode), []).append(result)
            print(f"[{index}/{len(plan)}] {name}: {describe(result)}", flush=True)
            if after_each is not None:
                after_each(so_far())
    return so_far()


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


def write_reports(report: dict, paths: List[pathlib.Path], tables: bool = True) -> str:
    """Adds the derived columns and the targets and writes the JSON at each path (write_result); with `tables`,
    the markdown and the chart (when matplotlib is there) beside each. Returns the markdown."""
    add_derived(report["cases"])
    report["targets"] = check_targets(report)
    text = markdown(report) if tables else None
    write_result(report, paths, text)
    for path in paths if tables else []:
        if plot(report, path.with_suffix(".png")):
            print(f"bench: wrote {path.with_suffix('.png')}")
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
    parser.add_argument("--interleaved", action=argparse.BooleanOptionalAction, default=True,
                        help="after a workload's modes, its steady step natively and through the cache taken in turn "
                             "in one process, once per native mode: the wall-clock comparison the targets use "
                             "(needs cache_cold; default on)")
    parser.add_argument("--interleaved-against", nargs="+", choices=INTERLEAVED_NATIVE, default=list(INTERLEAVED_NATIVE),
                        metavar="NATIVE_MODE",
                        help="the native modes the interleaved processes compare with (default both): one alone "
                             "re-measures its rows without paying for the other's process (native benchmark mode "
                             "tunes for up to a minute in its own); --combine joins the runs")
    parser.add_argument("--audit", action="store_true",
                        help="in cache_cold, after its timed steps and before its profiled ones, time every tuned key "
                             "against native's choices (cudnn_cache.audit)")
    parser.add_argument("--settle", action=argparse.BooleanOptionalAction,
                        help="in cache_cold, after its first step, decide every key again in steady state "
                             "(cudnn_cache.settle, as scripts/warm_start.py does): the JSON's settle holds its "
                             "seconds and the keys it changed (default: on with --tuning exhaustive=1, as "
                             "warm_start.py --exhaustive settles)")
    parser.add_argument("--audit-repeats", type=int, default=1, metavar="N",
                        help="with --audit, audit N times in the cache_cold process: the report counts the keys "
                             "every audit found slower too (default 1)")
    parser.add_argument("--audit-rounds", type=int, metavar="N",
                        help="with --audit, time each key's configs in N interleaved rounds (default: the tuning's "
                             "repetitions, 7): more rounds, a finer verdict; the search itself is not changed")
    parser.add_argument("--combine", nargs="+", type=pathlib.Path, metavar="JSON",
                        help="no benchmark: one report (JSON, markdown, chart) of the JSON reports of runs split "
                             "in parts, e.g. to fit a time limit")
    parser.add_argument("--tuning", nargs="*", default=[], metavar="NAME=VALUE",
                        help="cudnn_cache.set_tuning_options for the cache cases, e.g. flush_l2=0 max_candidates=5")
    parser.add_argument("--quick", action="store_true",
                        help="a short run: --steps 20, --warmup 3 and the --quick workloads, unless given")
    parser.add_argument("--steps", type=int,
                        help=f"steady steps timed per case and steps profiled for GPU time (>= {MIN_STEPS}, with "
                             f"--quick >= {MIN_STEPS_QUICK}; default 30, --quick 20); the overhead case runs 300 rounds, "
                             f"or this many if more (with --quick, this many)")
    parser.add_argument("--warmup", type=int, help="untimed steps before them (default 5, --quick 3)")
    parser.add_argument("--output-dir", type=pathlib.Path,
                        help="where models.json, models.md and models.png go (default: bench-results/)")
    parser.add_argument("--json", type=pathlib.Path, help="the JSON report (default: OUTPUT_DIR/models.json; the "
                                                          ".md and .png beside it)")
    parser.add_argument("--update", action="store_true",
                        help="also write the committed benchmarks/results/models.json (.md, .png)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each workload's modes this many times in turn, each case a fresh process every "
                             "time; first steps, start-up and tuning are reported as medians over the rounds, "
                             "with their range (default 1)")
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
    least = MIN_STEPS_QUICK if args.quick else MIN_STEPS
    if args.steps < least:
        parser.error(f"--steps must be >= {least}{' with --quick' if args.quick else ''} (every figure is a median "
                     "with its 95% interval over them)")
    if args.warmup < 0 or args.timeout <= 0 or args.rounds < 1 or args.audit_repeats < 1:
        parser.error("--warmup must be >= 0, --timeout > 0, --rounds >= 1 and --audit-repeats >= 1")
    if (args.audit_repeats > 1 or args.audit_rounds is not None) and not args.audit:
        parser.error("--audit-repeats and --audit-rounds set how the audit runs: add --audit")
    if args.audit_rounds is not None and args.audit_rounds < 1:
        parser.error("--audit-rounds must be >= 1")
    for mode in LOADS_COLD_FILE:
        if mode in args.modes and "cache_cold" not in args.modes:
            parser.error(f"{mode} loads the file cache_cold writes: add cache_cold to --modes")
    args.workloads = list(dict.fromkeys(args.workloads))
    args.tuning = tuning_arguments(args.tuning, parser.error)
    if args.settle is None:  # as scripts/warm_start.py decides it
        args.settle = bool(args.tuning.get("exhaustive", False))
    # The overhead case alone has its own committed file (PERFORMANCE.md reads both): a run of it does not replace
    # the workloads' results.
    name = "models_overhead.json" if args.workloads == [OVERHEAD] else "models.json"
    args.paths = output_paths(name, args.json or (args.output_dir and args.output_dir / name), args.update)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.combine:
        report = combine(args.combine)
        print(write_reports(report, args.paths))
        print(f"bench: combined {len(args.combine)} runs into {', '.join(map(str, args.paths))}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench: no CUDA GPU is visible (torch.cuda.is_available() is False); this benchmark times cuDNN and "
              "needs one. Nothing was written.", file=sys.stderr)
        return 2
    if args.case:
        return run_case(args)
    settings = {"workloads": args.workloads, "modes": args.modes, "backend": args.backend, "quick": args.quick,
                "audit": args.audit, "audit_repeats": args.audit_repeats, "audit_rounds": args.audit_rounds,
                "settle": args.settle,
                "interleaved": args.interleaved,
                "interleaved_against": args.interleaved_against, "tuning": args.tuning,
                "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "timeout_s": args.timeout,
                "device": args.device}
    report = {"environment": environment(args.device), "settings": settings, "notes": notes(settings),
              "complete": False}

    def keep(results: dict) -> None:  # after every case: a run killed by a time limit keeps the cases it finished
        report.update(results)
        write_reports(report, args.paths, tables=False)

    report.update(run_all(args, keep))
    report["complete"] = True
    print()
    print(write_reports(report, args.paths))
    print(f"bench: wrote {', '.join(map(str, args.paths))} and the .md beside each")
    results = report["cases"] + ([report["overhead"]] if report["overhead"] else [])
    return 1 if any("error" in result for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
