"""scripts/bench.py without a GPU: the reports (derived columns, targets, JSON, markdown tables, chart when
matplotlib is importable) from synthetic results, the driver's handling of failing and timed-out cases, the
arguments (--quick, --backend) and exit codes, and the per-case subprocess plumbing end to end on the CPU (hidden
--device cpu)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench.py"


sys.path.insert(0, str(SCRIPT.parent))  # the bench's modules import one another by name, as the script does
import bench  # noqa: E402
import bench_cases  # noqa: E402
import bench_report  # noqa: E402

# workload -> (native_benchmark first s, steady ms, native_heuristic first s, steady ms), from MEASURED.md
# (MobileNetV2's made up)
NATIVE = {
    "resnet50_fp32": (16.07, 29.9, 0.47, 24.9),
    "resnet50_bf16_cl": (13.55, 24.2, 0.74, 27.5),
    "resnet18_fp16_cl": (7.72, 9.47, 0.56, 11.2),
    "mobilenet_v2_bf16_cl": (6.0, 12.0, 0.6, 12.5),
    "conv3d_fp32": (4.20, 11.6, 0.27, 11.9),
    "seed": (3.41, 0.95, 0.20, 0.98),
}
FAILED_ERROR = "exit code 1: RuntimeError: cudnn_cache: miss | key (forward, ...)\nTraceback: more"
WARM_START_S = 0.0012 + 0.25 + 0.3  # load + prepare + first step of every synthetic cache_warm


def stats(tunes: int, plans_built: int) -> dict:
    return {"hits": 600, "misses": tunes, "tunes": tunes, "fallbacks": 0, "entries": 159, "tune_us": 26_400 * tunes,
            "plans_built": plans_built, "plan_build_us": 2000 * plans_built, "plans_deserialized": 0,
            "plan_rebuilds": 0}


def synthetic_report() -> dict:
    """Results shaped like the child processes print them, for every workload and mode; resnet18's cache_warm
    failed. cache_warm's steady step is 1.25 x native_heuristic's (0.9 x for MobileNetV2)."""
    cases = []
    for workload, (bench_first, bench_steady, heuristic_first, heuristic_steady) in NATIVE.items():
        warm_steady = (0.9 if workload == "mobilenet_v2_bf16_cl" else 1.25) * heuristic_steady
        cases += [
            {"workload": workload, "mode": "native_benchmark", "first_s": bench_first, "steady_ms": bench_steady,
             "steps_ms": [bench_steady] * 20, "tuning_estimate_s": bench_first - bench_steady / 1e3},
            {"workload": workload, "mode": "native_heuristic", "first_s": heuristic_first,
             "steady_ms": heuristic_steady, "steps_ms": [heuristic_steady] * 20},
            {"workload": workload, "mode": "cache_cold", "backend": "graph", "first_s": 5.0,
             "steady_ms": 1.3 * heuristic_steady, "steps_ms": [1.3 * heuristic_steady] * 20,
             "tuning_estimate_s": 4.9, "tune_s": 4.1976, "plan_build_s": 0.318, "stats": stats(159, 159),
             "save_s": 0.002},
        ]
        if workload == "resnet18_fp16_cl":
            cases.append({"workload": workload, "mode": "cache_warm", "error": FAILED_ERROR, "process_s": 4.0})
        else:
            cases.append({"workload": workload, "mode": "cache_warm", "backend": "graph", "first_s": 0.3,
                          "steady_ms": warm_steady, "steps_ms": [warm_steady] * 20, "tune_s": 0.0,
                          "plan_build_s": 0.2, "load_s": 0.0012, "loaded_entries": 159, "prepare_s": 0.25,
                          "prepared_plans": 100, "warm_start_s": WARM_START_S, "plans_deserialized": 0,
                          "stats": stats(0, 100)})
    overhead = {"workload": "overhead", "backend": "graph", "input": [1, 8, 8, 8], "weight": [8, 8, 3, 3],
                "padding": 1, "calls": 1000, "repeats": 5, "stats": stats(0, 0), "op_overhead_above_native_us": 1.5,
                "eager_op_overhead_above_native_us": 1.5,
                "results": {name: {"wall_us": us + 1, "host_us": us, "wall_us_rounds": [us + 1] * 5}
                            for name, us in (("native_heuristic", 8.0), ("native_benchmark", 7.5), ("op", 9.0),
                                             ("functional", 10.0))}}
    settings = {"workloads": [*NATIVE, "overhead"], "modes": list(bench_cases.MODES), "backend": "graph", "quick": False,
                "steps": 30, "warmup": 5, "timeout_s": 180.0, "device": "cuda"}
    environment = {"date": "2026-11-29T00:00:00+00:00", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130",
                   "cuda": "13.0", "cudnn": 91900, "cudnn_allow_tf32": True, "python": "3.11", "host": "test"}
    return {"environment": environment, "settings": settings, "notes": bench_report.notes(settings), "cases": cases,
            "overhead": overhead}


def section(markdown: str, title: str) -> str:
    """The text of the markdown section '## title', up to the next one."""
    return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str) -> list:
    """The rows of the table in `text` (header and separator included), each split into cells on unescaped
    pipes."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [line.replace("\\|", "").strip("|").split("|") for line in rows]


def test_reports_from_synthetic_results(tmp_path, capsys):
    report = synthetic_report()
    markdown = bench.write_reports(report, tmp_path / "out" / "bench.json", tmp_path)

    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert data["environment"]["gpu"] == "NVIDIA H200" and data["settings"]["backend"] == "graph"
    assert len(data["cases"]) == 24 and data["overhead"]["results"]["op"]["host_us"] == 9.0
    by_case = {(c["workload"], c["mode"]): c for c in data["cases"]}
    heuristic = by_case[("resnet50_fp32", "native_heuristic")]["derived"]
    assert heuristic["steady_vs_native_benchmark"] == pytest.approx(24.9 / 29.9)
    assert heuristic["steady_vs_best_native"] == pytest.approx(1.0)
    assert heuristic["warm_start_vs_native_heuristic_first"] is None
    warm = by_case[("resnet50_bf16_cl", "cache_warm")]
    assert warm["derived"]["steady_vs_best_native"] == pytest.approx(1.25 * 27.5 / 24.2)
    assert warm["derived"]["first_vs_native_heuristic_first"] == pytest.approx(0.3 / 0.74)
    assert warm["derived"]["warm_start_vs_native_heuristic_first"] == pytest.approx(WARM_START_S / 0.74)
    failed = by_case[("resnet18_fp16_cl", "cache_warm")]
    assert "derived" not in failed and failed["error"] == FAILED_ERROR
    assert len(data["targets"]) == 6 * 5 + 1 and data["targets"] == report["targets"]

    assert (tmp_path / "bench.md").read_text() == markdown
    for title, columns in (("First step and start-up", bench_report.START_COLUMNS),
                           ("Steady state", bench_report.STEADY_COLUMNS)):
        rows = table_rows(section(markdown, title))
        assert len(rows) == 2 + 24 and len(rows[0]) == len(columns)
        assert all(len(row) == len(columns) for row in rows), f"{title}: every row has as many cells as the header"
    start, steady = section(markdown, "First step and start-up"), section(markdown, "Steady state")
    assert ("| ResNet-50 bf16 channels_last bs64 | cache_warm | 0.30 s | 0.41 | - | 0.00 s | 0.200 s | "
            "1.2 ms (159 entries) | 250.0 ms (100) | 0.55 s | 0.74 |") in start
    assert "| two-conv model of the seed (bs7, 32x32) | cache_cold | 5.00 s | 25.00 | 4.90 s (159) | 4.20 s |" in start
    assert ("| ResNet-50 bf16 channels_last bs64 | cache_warm | 34.38 ms | - | 1.42 | 1.42 | 600 / 0 / 0 / 0 | "
            "100 / 0 / 0 |") in steady
    assert "| MobileNetV2 bf16 channels_last bs64 | native_heuristic | 12.50 ms | - | 1.04 | 1.04 | - | - |" in steady
    for text in (start, steady):
        assert "FAILED: exit code 1: RuntimeError: cudnn_cache: miss \\| key" in text
        assert "Traceback: more" not in text  # the first line of the error only
    overhead = section(markdown, "Host overhead per call")
    assert "| torch.ops.cudnn_cache.convolution | 10.0 us | 9.0 us |" in overhead
    assert "| cudnn_cache.functional.conv2d | 11.0 us | 10.0 us |" in overhead
    assert "above the better native's: 1.5 us" in overhead
    assert "cudnn_cache.set_backend('graph')" in section(markdown, "Notes") and "plan_build_s is null" not in markdown

    chart = tmp_path / "bench.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert not chart.exists()
        assert "matplotlib is not installed" in capsys.readouterr().out
    else:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_targets_met_missed_and_without_data(tmp_path):
    report = synthetic_report()
    markdown = bench.write_reports(report, tmp_path / "bench.json", tmp_path)
    targets = {(t["workload"], t["target"].split(" ≤")[0]): t for t in bench_report.check_targets(report)}
    assert all(set(t) >= {"workload", "target", "value", "limit", "met"} for t in targets.values())

    first = targets[("resnet50_fp32", "warm first step")]
    assert (first["value"], first["limit"], first["met"]) == (0.3, 0.47, True)
    assert targets[("seed", "warm first step")]["met"] is False  # 0.30 s > native_heuristic's 0.20 s
    start = targets[("resnet50_fp32", "warm start (load + prepare + first step)")]
    assert start["value"] == pytest.approx(WARM_START_S) and start["limit"] == 1.5 and start["met"] is True
    versus_bench = targets[("resnet50_fp32", "warm steady ÷ native_benchmark steady")]
    assert versus_bench["value"] == pytest.approx(1.25 * 24.9 / 29.9) and versus_bench["met"] is False
    best = targets[("resnet50_fp32", "warm steady ÷ better native steady")]
    assert (best["value"], best["met"], best["stretch_limit"], best["stretch_met"]) == (1.25, False, 0.95, False)
    best = targets[("mobilenet_v2_bf16_cl", "warm steady ÷ better native steady")]
    assert best["value"] == pytest.approx(0.9 * 12.5 / 12.0) and best["met"] is True and best["stretch_met"] is True
    tuning = "cold tuning (cache_cold first step − steady step)"
    assert targets[("resnet50_fp32", tuning)]["met"] is True and targets[("seed", tuning)]["met"] is False
    no_warm = targets[("resnet18_fp16_cl", "warm first step")]  # its cache_warm failed
    assert no_warm["value"] is None and no_warm["met"] is None
    assert targets[("resnet18_fp16_cl", tuning)]["met"] is True
    op = targets[("overhead", "op host time per call")]
    assert (op["value"], op["limit"], op["met"]) == (1.5, 2.0, True)

    text = section(markdown, "Targets")
    rows = table_rows(text)
    assert len(rows) == 2 + 31 and all(len(row) == 5 for row in rows)
    assert "| ResNet-50 fp32 bs32 | warm first step ≤ native_heuristic first step | 0.30 s | 0.47 s | met |" in text
    assert "| ResNet-50 fp32 bs32 | warm steady ÷ native_benchmark steady ≤ 1.00 | 1.04 | 1.00 | missed |" in text
    assert "| 1.25 | 1.00 | missed; stretch 0.95: missed |" in text
    assert "| 0.94 | 1.00 | met; stretch 0.95: met |" in text
    assert ("| ResNet-18 fp16 channels_last bs64 | warm first step ≤ native_heuristic first step | - | 0.56 s | "
            "no data |") in text
    assert "| host overhead | op host time per call ≤ better native's + 2 us | 1.5 us | 2.0 us | met |" in text
    met = sum(t["met"] is True for t in report["targets"])
    assert f"{met} of 31 met" in text


def test_derived_columns_without_native_cases(tmp_path):
    report = synthetic_report()
    report["cases"] = [c for c in report["cases"] if c["mode"].startswith("cache_")]
    report["overhead"] = None
    markdown = bench.write_reports(report, tmp_path / "bench.json", tmp_path)
    warm = next(c for c in report["cases"] if c["mode"] == "cache_warm" and "error" not in c)
    assert set(warm["derived"].values()) == {None}
    assert "| ResNet-50 fp32 bs32 | cache_warm | 0.30 s | - | - | 0.00 s | 0.200 s | 1.2 ms" in markdown
    assert "| ResNet-50 fp32 bs32 | cache_warm | 31.12 ms | - | - |" in markdown
    assert "Host overhead" not in markdown
    first = next(t for t in report["targets"] if t["workload"] == "resnet50_fp32")
    assert first["limit"] is None and first["met"] is None  # no native_heuristic case to compare with
    assert all(t["workload"] != "overhead" for t in report["targets"])


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
        assert command[command.index("--backend") + 1] == "legacy"
        if case == "seed:cache_cold":
            return {"error": "exit code 1: tuning failed", "process_s": 1.0}
        if case.endswith(":cache_cold"):  # a cache_cold that works saves the file cache_warm loads
            pathlib.Path(command[command.index("--cache-file") + 1]).write_bytes(b"cache")
        if case == "overhead":
            return {"workload": "overhead", "results": {"op": {"wall_us": 1.0, "host_us": 1.0}}}
        return {"workload": case.split(":")[0], "mode": case.split(":")[1], "first_s": 1.0, "steady_ms": 2.0}

    monkeypatch.setattr(bench, "run_subprocess", fake)
    args = bench.parse_args(["--workloads", "seed", "overhead", "conv3d_fp32", "--device", "cpu",
                             "--backend", "legacy"])
    results = bench.run_all(args)
    assert commands == ["seed:native_benchmark", "seed:native_heuristic", "seed:cache_cold",
                        "conv3d_fp32:native_benchmark", "conv3d_fp32:native_heuristic", "conv3d_fp32:cache_cold",
                        "conv3d_fp32:cache_warm", "conv3d_fp32:cache_intercept", "overhead"]
    modes = [(c["workload"], c["mode"], c.get("error", "")[:7]) for c in results["cases"]]
    assert ("seed", "cache_cold", "exit co") in modes and ("seed", "cache_warm", "skipped") in modes
    assert ("seed", "cache_intercept", "skipped") in modes
    assert len(results["cases"]) == 10 and results["overhead"]["workload"] == "overhead"
    assert "[3/11] seed:cache_cold: FAILED: exit code 1: tuning failed" in capsys.readouterr().out


def run_script(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def test_combine_makes_one_report_of_runs_split_in_parts(tmp_path):
    full = synthetic_report()
    workloads = sorted({c["workload"] for c in full["cases"]})
    parts = []
    for index, chosen in enumerate((workloads[:1], workloads[1:])):
        part = json.loads(json.dumps(full))
        part["cases"] = [c for c in part["cases"] if c["workload"] in chosen]
        part["settings"]["workloads"] = chosen
        part["overhead"] = full["overhead"] if index == 1 else None
        parts.append(tmp_path / f"part{index}.json")
        parts[-1].write_text(json.dumps(part))
    assert bench.main(["--combine", *map(str, parts), "--output-dir", str(tmp_path / "out"),
                       "--json", str(tmp_path / "out" / "all.json")]) == 0
    combined = json.loads((tmp_path / "out" / "all.json").read_text())
    assert len(combined["cases"]) == len(full["cases"]) and combined["overhead"] == full["overhead"]
    assert [p["workloads"] for p in combined["settings"]["parts"]] == [workloads[:1], workloads[1:]]
    assert {t["workload"] for t in combined["targets"]} == {t["workload"] for t in bench_report.check_targets(full)}

    other = json.loads(parts[1].read_text())
    other["environment"]["gpu"] = "NVIDIA A100"
    parts[1].write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="ran with gpu 'NVIDIA A100'"):
        bench.main(["--combine", *map(str, parts), "--output-dir", str(tmp_path / "out2")])


def test_compare_kernels_without_a_gpu_exits_2_and_says_why():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_kernels.py"), "--input", "1,3,8,8",
                           "--weight", "4,3,3,3"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr


def test_without_a_gpu_exits_2_and_writes_nothing(tmp_path):
    done = run_script("--output-dir", tmp_path, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 2, done.stderr
    assert "no CUDA GPU" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arguments", [["--steps", "10"], ["--quick", "--steps", "19"], ["--modes", "cache_warm"],
                                       ["--workloads", "vgg"], ["--timeout", "0"], ["--backend", "cudnn"],
                                       ["--tuning", "flush_l2"], ["--tuning", "repetitions=many"]])
def test_bad_arguments_exit_2(arguments):
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(arguments)
    assert raised.value.code == 2


def test_default_arguments():
    args = bench.parse_args([])
    assert args.workloads == [*bench.WORKLOADS, "overhead"] and args.modes == list(bench_cases.MODES)
    assert (args.steps, args.warmup, args.device, args.backend, args.quick) == (30, 5, "cuda", "graph", False)
    assert args.json == args.output_dir / "bench.json" and args.output_dir == ROOT / "docs"
    assert list(bench.WORKLOADS).index("mobilenet_v2_bf16_cl") == list(bench.WORKLOADS).index("resnet18_fp16_cl") + 1


def test_tuning_arguments_are_typed_and_passed_to_each_case():
    args = bench.parse_args(["--tuning", "flush_l2=0", "repetitions=9", "give_up_ratio=2.5", "--audit"])
    assert args.tuning == {"flush_l2": False, "repetitions": 9, "give_up_ratio": 2.5} and args.audit
    command = bench.case_command("seed:cache_cold", args, None)
    assert command[-4:] == ["--tuning", "flush_l2=0", "repetitions=9", "give_up_ratio=2.5"]
    assert "--audit" in command
    assert bench.parse_args(command[2:]).tuning == args.tuning  # what the case process parses back


def audit_row(stored, heuristic, benchmark, key, again=None):
    """A row as cudnn_cache.audit() returns it; `again` is the stored config's second timing (default: the same)."""
    return {"direction": "forward", "key": key, "stored_ms": stored, "heuristic_ms": heuristic,
            "benchmark_ms": benchmark, "stored_engine": "engine 1", "heuristic_engine": "engine 2",
            "benchmark_engine": "engine 3", "stored_again_ms": stored if again is None else again}


def test_audit_summary_counts_keys_slower_than_native_beyond_noise():
    rows = [audit_row(1.0, 1.0, 1.0, "tie"), audit_row(1.01, 1.0, 2.0, "within noise"),
            audit_row(1.5, 1.0, 1.2, "slower"), audit_row(0.5, 1.0, 1.0, "faster")]
    summary = bench_cases.summarize_audit(rows)
    assert summary["keys"] == 4 and summary["slower_than_native"] == 1 and summary["faster_than_native"] == 1
    assert summary["resolution_us_median"] == 0.0 and summary["resolution_us_max"] == 0.0
    assert [row["slower_than_native"] for row in summary["rows"]] == [False, False, True, False]
    assert summary["worst_ratio"] == pytest.approx(1.5) and summary["worst_key"] == "forward slower"
    assert summary["geomean_vs_heuristic"] == pytest.approx((1.0 * 1.01 * 1.5 * 0.5) ** 0.25)
    assert summary["stored_total_ms"] == pytest.approx(4.01)
    assert bench_cases.summarize_audit([]) == {"keys": 0, "rows": []}

    summary["seconds"] = 3.0
    case = {"workload": "seed", "mode": "cache_cold", "audit": summary}
    lines = bench_report.audit_table([case, {"workload": "seed", "mode": "native_benchmark"}])
    assert "## Per-key audit" in lines and any(bench_report.workload_label("seed") in line
                                               and "| 4 | 0.0 / 0.0 us | 1 | 1 |" in line for line in lines)
    assert bench_report.audit_table([{"workload": "seed", "mode": "cache_cold"}]) == []


def test_audit_resolution_is_each_keys_own():
    # A noisy key: its stored config timed 0.100 ms apart from itself, so 10% slower (0.1 ms) is within its
    # resolution. A steady key: timed identically twice, so 10% slower by 0.002 ms is beyond its resolution (0),
    # though within the noisy key's: a resolution taken over the workload would have hidden it.
    noisy = audit_row(1.10, 1.0, 1.05, "noisy", again=1.0)
    steady = audit_row(0.022, 0.020, 0.021, "steady")
    # A key 0.003 ms apart from itself, slower by 0.004 ms: beyond its own resolution.
    beyond = audit_row(0.054, 0.050, 0.050, "beyond", again=0.051)
    summary = bench_cases.summarize_audit([noisy, steady, beyond])
    by_key = {row["key"]: row for row in summary["rows"]}
    assert by_key["noisy"]["resolution_us"] == pytest.approx(100.0) and not by_key["noisy"]["slower_than_native"]
    assert by_key["steady"]["resolution_us"] == 0.0 and by_key["steady"]["slower_than_native"]
    assert by_key["beyond"]["resolution_us"] == pytest.approx(3.0) and by_key["beyond"]["slower_than_native"]
    assert summary["slower_than_native"] == 2
    assert summary["resolution_us_median"] == pytest.approx(3.0) and summary["resolution_us_max"] == pytest.approx(100.0)
    # Slower by less than its own resolution: a tie.
    within = bench_cases.summarize_audit([audit_row(0.054, 0.050, 0.050, "within", again=0.059)])
    assert within["slower_than_native"] == 0
    # A row from a build without stored_again_ms has resolution 0.
    old = audit_row(1.5, 1.0, 1.0, "old")
    del old["stored_again_ms"]
    assert bench_cases.summarize_audit([old])["rows"][0]["resolution_us"] == 0.0


def test_quick_arguments():
    args = bench.parse_args(["--quick"])
    assert args.workloads == ["seed", "resnet18_fp16_cl", "mobilenet_v2_bf16_cl", "overhead"]
    assert (args.steps, args.warmup, args.modes) == (20, 3, list(bench_cases.MODES))
    args = bench.parse_args(["--quick", "--workloads", "conv3d_fp32", "--steps", "25", "--warmup", "0"])
    assert (args.workloads, args.steps, args.warmup) == (["conv3d_fp32"], 25, 0)


def test_every_case_in_its_own_process_on_the_cpu(tmp_path):
    done = run_script("--device", "cpu", "--workloads", "seed", "overhead", "--steps", "20", "--warmup", "1",
                      "--output-dir", tmp_path, "--json", tmp_path / "raw.json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "raw.json").read_text())
    assert [c["mode"] for c in data["cases"]] == list(bench_cases.MODES)
    for case in data["cases"]:
        assert "error" not in case, case
        assert len(case["steps_ms"]) == 20 and case["convolutions"] == 2 and case["first_s"] > 0
    cold, warm, intercepted = data["cases"][2:]
    for case in (cold, warm, intercepted):
        assert case["backend"] == "graph" and set(case["stats"]) >= {"hits", "tunes"}
        plan_build_us = case["stats"].get("plan_build_us")  # None from a build that does not count it
        assert case["plan_build_s"] == (None if plan_build_us is None else plan_build_us / 1e6)
    assert "save_s" in cold
    assert warm["load_s"] >= 0 and warm["loaded_entries"] == 0  # the CPU runs native convolutions: no entries
    assert warm["prepare_s"] is None and warm["prepared_plans"] is None  # no cuDNN on the CPU: prepare not called
    assert warm["warm_start_s"] == pytest.approx(warm["load_s"] + warm["first_s"])
    assert warm["derived"]["warm_start_vs_native_heuristic_first"] is not None
    assert intercepted["loaded_entries"] == 0 and intercepted["stats"]["tunes"] == 0
    intercept_target = next(t for t in data["targets"] if t["target"].startswith("intercepted steady"))
    assert intercept_target["value"] == pytest.approx(intercepted["steady_ms"] / warm["steady_ms"])
    overhead = data["overhead"]
    results = overhead["results"]
    assert set(results) == {"native_heuristic", "native_benchmark", "op", "functional", "native_scripted",
                            "op_scripted"}
    native = min(results[name]["host_us"] for name in ("native_heuristic", "native_benchmark"))
    assert overhead["eager_op_overhead_above_native_us"] == pytest.approx(results["op"]["host_us"] - native)
    assert overhead["op_overhead_above_native_us"] == pytest.approx(
        results["op_scripted"]["host_us"] - results["native_scripted"]["host_us"])
    assert {t["workload"] for t in data["targets"]} == {"seed", "overhead"}
    assert (tmp_path / "bench.md").exists() and "| cache_warm |" in done.stdout and "## Targets" in done.stdout
