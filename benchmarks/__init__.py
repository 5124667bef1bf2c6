"""cudnn_cache's benchmarks, one entry point: `python3 -m benchmarks SUBCOMMAND [options]` (see __main__.py).

Results are data. A run writes its result file to bench-results/NAME (gitignored); with --update it also
writes benchmarks/results/NAME, the committed file that docs/PERFORMANCE.md's figures come from. The case
processes a benchmark starts run its module (`python3 -m benchmarks.MODULE --case ...`) from the repository's
root, each fresh, so nothing cached in one process carries over to the next.
"""

import json
import pathlib
import subprocess
import sys
import time
from typing import List, Optional

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
        part.write_text(json.dumps(data, indent=1) + "\n")
        part.replace(path)
        if markdown is not None:
            path.with_suffix(".md").write_text(markdown.rstrip("\n") + "\n")


def case_command(module: str, *arguments: str) -> List[str]:
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
    elapsed = time.perf_counter() - started
    sys.stderr.write(done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if "error" not in result and (done.returncode != 0 or not lines):
        text = (done.stderr.strip() or done.stdout.strip() or "no output")[-2000:]
        result = {"error": f"exit code {done.returncode}: {text}"}
    result["process_s"] = elapsed
    return result
