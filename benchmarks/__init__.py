"""cudnn_cache's benchmarks, one entry point: `python3 -m benchmarks SUBCOMMAND [options]` (see __main__.py).

What the subcommands share lives here: where results go (a run writes bench-results/NAME, gitignored; with
--update also benchmarks/results/NAME, the committed file docs/PERFORMANCE.md's figures come from), the options
they have in common (add_arguments), and the case runner: every case runs in a fresh process, its module's
`python3 -m benchmarks.MODULE --case WORKLOAD:MODE` from the repository's root, so that nothing cached in one case
carries over to the next, and prints its result as one JSON line.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = ROOT / "bench-results"                 # a run's results, not committed
RESULTS = ROOT / "benchmarks" / "results"     # the committed results, written with --update
if str(ROOT / "torch_ops") not in sys.path:
    sys.path.insert(0, str(ROOT / "torch_ops"))  # `import cudnn_cache` from the source checkout (ops in build/)


def output_paths(name: str, output=None, update: bool = False) -> List[pathlib.Path]:
    """Where a benchmark writes its result file `name`: `output` (default bench-results/NAME), and also the
    committed benchmarks/results/NAME only with `update`."""
    paths = [pathlib.Path(output) if output else RUNS / name]
    committed = RESULTS / name
    return paths + [committed] if update and committed.resolve() != paths[0].resolve() else paths


def write_result(data: dict, paths: List[pathlib.Path], markdown: Optional[str] = None) -> None:
    """The JSON at each path, whole or not at all (a run killed by a time limit leaves the last complete file),
    and `markdown`, where given, beside it as .md."""
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(data, indent=1, default=str) + "\n")  # paths as text
        part.replace(path)
        if markdown is not None:
            path.with_suffix(".md").write_text(markdown.rstrip("\n") + "\n")


def add_arguments(parser: argparse.ArgumentParser, name: str, workloads: Sequence[str] = (),
                  modes: Sequence[str] = (), timeout: Optional[float] = None, rounds: bool = False) -> None:
    """The options the subcommands share: --output (alias --json) and --update for the result file `name`; with
    `workloads` and `modes`, lists of them (comma- or space-separated) and --case, the hidden option that runs one
    case in this process; with `timeout`, the case runner's --timeout, --budget and --combine; with `rounds`,
    --rounds; and the hidden --device (cpu: the plumbing, tested without a GPU). parse() checks the lists."""
    add = parser.add_argument
    add("--output", "--json", type=pathlib.Path, help=f"the result file (default bench-results/{name}, the "
                                                      "tables beside it as .md)")
    add("--update", action="store_true", help=f"also write the committed benchmarks/results/{name}")
    if workloads:
        add("--workloads", nargs="+", metavar="NAME", help=f"of {', '.join(workloads)}")
    if modes:
        add("--modes", nargs="+", metavar="MODE", help=f"of {', '.join(modes)} (default: all, in that order)")
    if rounds:
        add("--rounds", type=int, default=1, help="each workload's modes this many times in turn (default 1)")
    if timeout is not None:
        add("--timeout", type=float, default=timeout, help=f"seconds per case's process (default {timeout:g})")
        add("--budget", type=float, help="seconds: start no case once the run has taken this long")
        add("--combine", nargs="+", type=pathlib.Path, metavar="JSON",
            help="run nothing: one report of the result files of a run made in parts")
    if workloads:
        add("--case", help=argparse.SUPPRESS)
        add("--cache-file", help=argparse.SUPPRESS)
    add("--device", default="cuda", choices=("cuda", "cpu"), help=argparse.SUPPRESS)


def parse(parser: argparse.ArgumentParser, argv, workloads: Sequence[str] = (), modes: Sequence[str] = ()):
    """parser.parse_args(argv), with --workloads and --modes split on commas, checked against their choices and
    kept in the order given (None where not given); --rounds >= 1 and --timeout > 0."""
    args = parser.parse_args(argv)
    for option, choices in (("workloads", workloads), ("modes", modes)):
        if getattr(args, option, None) is not None:
            items = list(dict.fromkeys(item for text in getattr(args, option) for item in text.split(",") if item))
            unknown = [item for item in items if item not in choices]
            if unknown or not items:
                parser.error(f"--{option}: unknown {', '.join(map(repr, unknown)) or 'nothing'}; the {option} are: "
                             f"{', '.join(choices)}")
            setattr(args, option, items)
    if getattr(args, "rounds", 1) < 1 or getattr(args, "timeout", 1) <= 0:
        parser.error("--rounds must be >= 1 and --timeout > 0")
    return args


def no_gpu(device: str, tool: str) -> bool:
    """Says so on stderr where CUDA is asked for and there is none."""
    import torch

    missing = device == "cuda" and not torch.cuda.is_available()
    if missing:
        print(f"{tool}: no CUDA GPU is visible (torch.cuda.is_available() is False); this benchmark times cuDNN "
              "and needs one. Nothing was run.", file=sys.stderr)
    return missing


def case_command(module: str, *arguments) -> List[str]:
    """The command of one case process: this interpreter running benchmarks.MODULE (from ROOT: run_subprocess)."""
    return [sys.executable, "-m", f"benchmarks.{module}", *map(str, arguments)]


def run_subprocess(command: List[str], timeout: float, env: Optional[dict] = None) -> dict:
    """Runs one case's command from ROOT (in `env`, default this process's environment); returns the JSON object
    of its last '{' stdout line, or {'error': text} when it fails, times out or prints none; a case that reports
    its own {'error': ...} and fails keeps that. Adds process_s (the process's wall time) either way. The case's
    stderr (a CUDNN_CACHE_LOG log, warnings) goes on to this process's stderr once it ends, however it ends."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
        sys.stderr.write(stderr or "")
        return {"error": f"timed out after {timeout:g} s\n{(stderr or '')[-2000:]}".strip(),
                "process_s": time.perf_counter() - started}
    sys.stderr.write(done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if "error" not in result and (done.returncode != 0 or not lines):
        text = (done.stderr.strip() or done.stdout.strip() or "no output")[-2000:]
        result = {"error": f"exit code {done.returncode}: {text}"}
    result["process_s"] = time.perf_counter() - started
    return result


def run_case(measure: Callable[[dict], None], result: dict) -> int:
    """The body of a case process: measure(result) fills `result`, which is printed as one JSON line; an exception
    is recorded in it ('error', 'traceback') beside what was measured until then, and the exit code is 1."""
    try:
        measure(result)
    except Exception as error:  # noqa: BLE001 - recorded: the run goes on with the next case
        result.update(error=f"{type(error).__name__}: {error}"[:2000], traceback=traceback.format_exc()[-3000:])
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


def run_plan(plan: List[Tuple[str, str, int]], loads: Dict[str, str], command_of: Callable, args,
             describe: Callable[[dict], str], after_each: Callable[[List[dict]], None]) -> List[dict]:
    """Runs each (workload, mode, round) of `plan` in order, each in its own process, and returns their results,
    each named by its workload, mode and round however it ended; after_each(results) runs after every case, so
    that a run stopped by a time limit keeps what it finished. A mode in `loads` loads the cache file that the mode
    it names wrote for the same workload and round, and is skipped where there is none; every other mode starts
    with its own file absent. command_of(workload, mode, cache_file) gives the case's command and environment
    (None: this process's). No case starts once the run has taken longer than args.budget seconds."""
    results, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cudnn_cache_bench_") as folder:
        for index, (workload, mode, round_) in enumerate(plan, 1):
            source = loads.get(mode)
            cache_file = pathlib.Path(folder) / f"{workload}-{round_}-{source or mode}.cache"
            if source is None:
                cache_file.unlink(missing_ok=True)
            if args.budget is not None and time.perf_counter() - started > args.budget:
                result = {"error": f"skipped: the run passed --budget {args.budget:g} s"}
            elif source is not None and not cache_file.exists():
                result = {"error": f"skipped: {source} of this workload and round wrote no cache file"}
            else:
                command, env = command_of(workload, mode, cache_file)
                result = run_subprocess(command, args.timeout, env)
            result.update(workload=workload, mode=mode, round=round_)
            results.append(result)
            line = "FAILED: " + result["error"].splitlines()[0] if "error" in result else describe(result)
            print(f"[{index}/{len(plan)}] {workload}:{mode} round {round_}: {line}", flush=True)
            after_each(results)
    return results


def combine(paths: List[pathlib.Path], lists: Sequence[str] = ("cases",)) -> dict:
    """One report of the result files of a run made in parts (by workloads, modes or rounds): each field the first
    file's that has it, each list in `lists` joined, a later file's entry replacing an earlier one of the same
    workload, mode (or native_mode) and round; `parts` names the files, `complete` says whether all ran to the end."""
    reports = [json.loads(pathlib.Path(path).read_text()) for path in paths]
    merged: dict = {}
    for report in reports:
        merged.update({key: value for key, value in report.items() if merged.get(key) is None})
    merged.update(parts=[str(path) for path in paths], complete=all(r.get("complete", True) for r in reports))
    for name in lists:
        entries = {(e.get("workload"), e.get("mode", e.get("native_mode")), e.get("round", 1)): e
                   for report in reports for e in report.get(name) or []}
        merged[name] = list(entries.values())
    return merged
