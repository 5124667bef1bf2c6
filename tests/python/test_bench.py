"""scripts/bench.py without a GPU: the reports (derived columns, JSON, markdown table, chart when matplotlib is
importable) from synthetic results, the driver's handling of failing and timed-out cases, the exit codes, and
the per-case subprocess plumbing end to end on the CPU (hidden --device cpu)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_bench()

# workload -> (native_benchmark first s, steady ms, native_heuristic first s, steady ms), from MEASURED.md
NATIVE = {
    "resnet50_fp32": (16.07, 29.9, 0.47, 24.9),
    "resnet50_bf16_cl": (13.55, 24.2, 0.74, 27.5),
    "resnet18_fp16_cl": (7.72, 9.47, 0.56, 11.2),
    "conv3d_fp32": (4.20, 11.6, 0.27, 11.9),
    "seed": (3.41, 0.95, 0.20, 0.98),
}
FAILED_ERROR = "exit code 1: RuntimeError: cudnn_cache: miss | key (forward, ...)\nTraceback: more"


def stats(tunes: int) -> dict:
    return {"hits": 600, "misses": tunes, "tunes": tunes, "fallbacks": 0, "entries": 159}


def synthetic_report() -> dict:
    """Results shaped like the child processes print them, for every workload and mode; resnet18's cache_warm
    failed."""
    cases = []
    for workload, (bench_first, bench_steady, heuristic_first, heuristic_steady) in NATIVE.items():
        cases += [
            {"workload": workload, "mode": "native_benchmark", "first_s": bench_first, "steady_ms": bench_steady,
             "steps_ms": [bench_steady] * 20, "tuning_estimate_s": bench_first - bench_steady / 1e3},
            {"workload": workload, "mode": "native_heuristic", "first_s": heuristic_first,
             "steady_ms": heuristic_steady, "steps_ms": [heuristic_steady] * 20},
            {"workload": workload, "mode": "cache_cold", "first_s": 5.0, "steady_ms": 1.3 * heuristic_steady,
             "steps_ms": [1.3 * heuristic_steady] * 20, "tuning_estimate_s": 4.9, "plan_build_s": None,
             "stats": stats(159), "save_s": 0.002},
        ]
        if workload == "resnet18_fp16_cl":
            cases.append({"workload": workload, "mode": "cache_warm", "error": FAILED_ERROR, "process_s": 4.0})
        else:
            cases.append({"workload": workload, "mode": "cache_warm", "first_s": 0.3,
                          "steady_ms": 1.25 * heuristic_steady, "steps_ms": [1.25 * heuristic_steady] * 20,
                          "plan_build_s": None, "load_s": 0.0012, "loaded_entries": 159, "stats": stats(0)})
    overhead = {"workload": "overhead", "input": [1, 8, 8, 8], "weight": [8, 8, 3, 3], "padding": 1, "calls": 1000,
                "repeats": 5, "stats": stats(0),
                "results": {name: {"wall_us": us, "host_us": us - 1, "wall_us_rounds": [us] * 5}
                            for name, us in (("native_heuristic", 9.0), ("native_benchmark", 8.5),
                                             ("cudnn_cache", 11.0))}}
    settings = {"workloads": [*NATIVE, "overhead"], "modes": list(bench.MODES), "steps": 30, "warmup": 5,
                "timeout_s": 180.0, "device": "cuda"}
    environment = {"date": "2026-11-29T00:00:00+00:00", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130",
                   "cuda": "13.0", "cudnn": 91900, "cudnn_allow_tf32": True, "python": "3.11", "host": "test"}
    return {"environment": environment, "settings": settings, "notes": bench.notes(settings), "cases": cases,
            "overhead": overhead}


def table_rows(markdown: str) -> list:
    """The main table's rows (header and separator included), each split into cells on unescaped pipes."""
    lines = markdown.split("\n\n## ")[0].splitlines()
    rows = [line for line in lines if line.startswith("|")]
    return [line.replace("\\|", "").strip("|").split("|") for line in rows]


def test_reports_from_synthetic_results(tmp_path, capsys):
    report = synthetic_report()
    markdown = bench.write_reports(report, tmp_path / "out" / "bench.json", tmp_path)

    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["environment"]["gpu"] == "NVIDIA H200"
    assert len(data["cases"]) == 20 and data["overhead"]["results"]["cudnn_cache"]["wall_us"] == 11.0
    by_case = {(c["workload"], c["mode"]): c for c in data["cases"]}
    heuristic = by_case[("resnet50_fp32", "native_heuristic")]["derived"]
    assert heuristic["steady_vs_native_benchmark"] == pytest.approx(24.9 / 29.9)
    assert heuristic["steady_vs_best_native"] == pytest.approx(1.0)
    warm = by_case[("resnet50_bf16_cl", "cache_warm")]
    assert warm["plan_build_s"] is None
    assert warm["derived"]["steady_vs_best_native"] == pytest.approx(1.25 * 27.5 / 24.2)
    assert warm["derived"]["first_vs_native_heuristic_first"] == pytest.approx(0.3 / 0.74)
    failed = by_case[("resnet18_fp16_cl", "cache_warm")]
    assert "derived" not in failed and failed["error"] == FAILED_ERROR

    assert (tmp_path / "bench.md").read_text() == markdown
    rows = table_rows(markdown)
    assert len(rows) == 2 + 20
    assert all(len(row) == len(rows[0]) for row in rows), "every row has as many cells as the header"
    assert "ResNet-50 bf16 channels_last bs64 | cache_warm | 0.30 s | 34.38 ms | 1.42 | 1.42 | 0.41 |" in markdown
    assert "| 1.2 ms (159 entries) |" in markdown and "| 4.90 s (159) |" in markdown
    assert "FAILED: exit code 1: RuntimeError: cudnn_cache: miss \\| key" in markdown
    assert "Traceback: more" not in markdown  # the first line of the error only
    assert "| cudnn_cache.functional.conv2d | 11.0 us | 10.0 us |" in markdown
    assert "plan_build_s is null" in markdown

    chart = tmp_path / "bench.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert not chart.exists()
        assert "matplotlib is not installed" in capsys.readouterr().out
    else:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_derived_columns_without_native_cases(tmp_path):
    report = synthetic_report()
    report["cases"] = [c for c in report["cases"] if c["mode"].startswith("cache_")]
    report["overhead"] = None
    markdown = bench.write_reports(report, tmp_path / "bench.json", tmp_path)
    warm = next(c for c in report["cases"] if c["mode"] == "cache_warm" and "error" not in c)
    assert set(warm["derived"].values()) == {None}
    assert "| ResNet-50 fp32 bs32 | cache_warm | 0.30 s | 31.12 ms | - | - | - | - | 1.2 ms" in markdown
    assert "Host overhead" not in markdown


def test_run_subprocess_parses_success_and_records_failures():
    python = sys.executable
    ok = bench.run_subprocess([python, "-c", "print('noise'); print('{\"first_s\": 1.5}')"], timeout=60)
    assert ok["first_s"] == 1.5 and ok["process_s"] > 0
    failed = bench.run_subprocess([python, "-c", "import sys; sys.exit('boom: no such key')"], timeout=60)
    assert failed["error"].startswith("exit code 1:") and "boom: no such key" in failed["error"]
    silent = bench.run_subprocess([python, "-c", "pass"], timeout=60)
    assert silent["error"] == "exit code 0: no output"
    slow = bench.run_subprocess([python, "-c", "import time; time.sleep(60)"], timeout=1)
    assert slow["error"].startswith("timed out after 1 s")


def test_run_all_goes_on_after_a_failure_and_skips_warm_without_cold(monkeypatch, capsys):
    commands = []

    def fake(command, timeout):
        case = command[command.index("--case") + 1]
        commands.append(case)
        if case == "seed:cache_cold":
            return {"error": "exit code 1: tuning failed", "process_s": 1.0}
        if case.endswith(":cache_cold"):  # a cache_cold that works saves the file cache_warm loads
            pathlib.Path(command[command.index("--cache-file") + 1]).write_bytes(b"cache")
        if case == "overhead":
            return {"workload": "overhead", "results": {"cudnn_cache": {"wall_us": 1.0, "host_us": 1.0}}}
        return {"workload": case.split(":")[0], "mode": case.split(":")[1], "first_s": 1.0, "steady_ms": 2.0}

    monkeypatch.setattr(bench, "run_subprocess", fake)
    args = bench.parse_args(["--workloads", "seed", "overhead", "conv3d_fp32", "--device", "cpu"])
    results = bench.run_all(args)
    assert commands == ["seed:native_benchmark", "seed:native_heuristic", "seed:cache_cold",
                        "conv3d_fp32:native_benchmark", "conv3d_fp32:native_heuristic", "conv3d_fp32:cache_cold",
                        "conv3d_fp32:cache_warm", "overhead"]
    modes = [(c["workload"], c["mode"], c.get("error", "")[:7]) for c in results["cases"]]
    assert ("seed", "cache_cold", "exit co") in modes and ("seed", "cache_warm", "skipped") in modes
    assert len(results["cases"]) == 8 and results["overhead"]["workload"] == "overhead"
    assert "[3/9] seed:cache_cold: FAILED: exit code 1: tuning failed" in capsys.readouterr().out


def run_script(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_without_a_gpu_exits_2_and_writes_nothing(tmp_path):
    done = run_script("--output-dir", tmp_path, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 2, done.stderr
    assert "no CUDA GPU" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arguments", [["--steps", "10"], ["--modes", "cache_warm"], ["--workloads", "vgg"],
                                       ["--timeout", "0"]])
def test_bad_arguments_exit_2(arguments):
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(arguments)
    assert raised.value.code == 2


def test_default_arguments():
    args = bench.parse_args([])
    assert args.workloads == [*bench.WORKLOADS, "overhead"] and args.modes == list(bench.MODES)
    assert (args.steps, args.warmup, args.device) == (30, 5, "cuda")
    assert args.json == args.output_dir / "bench.json" and args.output_dir == ROOT / "docs"


def test_every_case_in_its_own_process_on_the_cpu(tmp_path):
    done = run_script("--device", "cpu", "--workloads", "seed", "overhead", "--steps", "20", "--warmup", "1",
                      "--output-dir", tmp_path, "--json", tmp_path / "raw.json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "raw.json").read_text())
    assert [c["mode"] for c in data["cases"]] == list(bench.MODES)
    for case in data["cases"]:
        assert "error" not in case, case
        assert len(case["steps_ms"]) == 20 and case["convolutions"] == 2 and case["first_s"] > 0
    cold, warm = data["cases"][2:]
    assert cold["plan_build_s"] is None and "save_s" in cold and set(cold["stats"]) >= {"hits", "tunes"}
    assert warm["load_s"] >= 0 and warm["loaded_entries"] == 0  # the CPU runs native convolutions: no entries
    assert set(data["overhead"]["results"]) == {"native_heuristic", "native_benchmark", "cudnn_cache"}
    assert (tmp_path / "bench.md").exists() and "| cache_warm |" in done.stdout
