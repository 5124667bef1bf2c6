"""benchmarks/real_workloads.py without a GPU: argument errors, targets and report from synthetic results, where
results go, failing cases recorded as errors, and the runner end to end on the CPU (hidden --device cpu)."""

import json
import pathlib
import subprocess
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import benchmarks  # noqa: E402
from benchmarks import real_workloads as rw  # noqa: E402

COMMITTED = ROOT / "benchmarks" / "results" / "real_workloads.json"


def case(workload, mode, wall, gpu=None, round_=1, spread=0.01, first=1.0, second=0.5, reserved=4.0):
    """A successful case: steady medians with a 95% interval of +- spread."""
    gpu = wall if gpu is None else gpu
    return {"workload": workload, "mode": mode, "round": round_, "first_step_s": 0.5, "start_to_first_step_s": 3.0,
            "first_epoch_s": first, "second_epoch_s": second, "peak_allocated_gib": reserved / 2,
            "peak_reserved_gib": reserved, "stats": {"tunes": 3, "misses": 3, "lent": 0, "entries": 9},
            **{key: {"median": v, "lo": v * (1 - spread), "hi": v * (1 + spread), "n": 20}
               for key, v in (("steady_wall_ms", wall), ("steady_gpu_ms", gpu))}}


def verdicts(cases):
    """(workload, the target's first three words, e.g. '2 warm steady') -> its row."""
    return {(row["workload"], " ".join(row["target"].split()[:3])): row for row in rw.targets(cases)}


@pytest.mark.parametrize("argv, named, choices", [
    (["--workloads", "gan,foo"], "'foo'", "detection, speech, gan, dense, grouped"),
    (["--modes", "native_heuristics,cache_hot"], "'cache_hot'", "native_benchmark, native_heuristics, cache_cold"),
    (["--modes", "cache_cold", "cache_hot"], "'cache_hot'", "cache_nearest, cache_warm"),
])
def test_unknown_names_are_refused_naming_them_and_the_choices(argv, named, choices, capsys):
    with pytest.raises(SystemExit) as exited:
        rw.parse_args(argv)
    error = capsys.readouterr().err
    assert exited.value.code == 2 and named in error and choices in error, error


def test_warm_needs_cold_and_defaults_skip_native_benchmark_for_detection(capsys):
    with pytest.raises(SystemExit):
        rw.parse_args(["--modes", "native_heuristics,cache_warm"])
    assert "add cache_cold" in capsys.readouterr().err
    args = rw.parse_args([])
    assert args.workloads == ["detection", "speech", "gan", "dense", "grouped"]
    assert rw.modes_of("detection", args.modes) == ["native_heuristics", "cache_cold", "cache_nearest", "cache_warm"]
    assert rw.modes_of("dense", args.modes) == rw.modes_of("detection", args.modes)
    assert rw.modes_of("gan", args.modes) == list(rw.MODES)
    assert rw.modes_of("detection", rw.parse_args(["--modes", "cache_warm,native_benchmark,cache_cold"]).modes) == [
        "native_benchmark", "cache_cold", "cache_warm"]


def test_each_round_orders_the_modes_anew_with_warm_after_the_cold_it_loads():
    orders = [rw.round_order(list(rw.MODES), r) for r in range(1, 9)]
    for order in orders:
        assert sorted(order) == sorted(rw.MODES)
        assert order.index("cache_cold") < order.index("cache_warm")
    # a drift over a round must not always land on the same mode: no mode is always last, none always first
    assert len({order[-1] for order in orders}) > 1 and len({order[0] for order in orders}) > 1
    assert rw.round_order(["native_heuristics", "cache_warm"], 3) == rw.round_order(["native_heuristics", "cache_warm"], 3)


def test_each_mode_runs_with_the_variables_a_user_would_set():
    assert rw.case_environment("native_benchmark", "/c") == {"CUDA_CACHE_DISABLE": "1"}
    assert rw.case_environment("cache_cold", "/c") == {"CUDA_CACHE_DISABLE": "1", "CUDNN_CACHE_PATH": "/c"}
    assert rw.case_environment("cache_warm", "/c")["CUDNN_CACHE_PATH"] == "/c"
    assert rw.case_environment("cache_nearest", "/n") == {"CUDA_CACHE_DISABLE": "1", "CUDNN_CACHE_PATH": "/n",
                                                          "CUDNN_CACHE_MISS_POLICY": "nearest"}


def test_targets_verdicts():
    cases = [case("gan", "native_benchmark", 10.0), case("gan", "native_heuristics", 10.5, gpu=10.0, spread=0.02),
             case("gan", "cache_nearest", 10.5, gpu=10.15, first=1.2), case("gan", "cache_cold", 11.0, reserved=5.0),
             case("gan", "cache_warm", 10.3),  # 3% slower than native_benchmark, the better native
             case("dense", "native_heuristics", 20.0, gpu=20.0, spread=0.01), case("dense", "cache_nearest", 20.0,
                                                                                  gpu=20.6, first=1.04),
             case("dense", "cache_cold", 20.0, reserved=4.7), case("dense", "cache_warm", 19.9)]
    rows = verdicts(cases)
    assert rows[("gan", "2 warm steady")]["verdict"] == "missed"
    assert rows[("gan", "2 warm steady")]["native_mode"] == "native_benchmark"
    assert rows[("gan", "2 warm steady")]["ratio"] == pytest.approx(1.03)
    assert rows[("gan", "1 nearest steady")]["verdict"] == "within noise"  # 1.015 with native's upper spread 0.02
    assert rows[("dense", "1 nearest steady")]["verdict"] == "missed"  # 1.03, spread 0.01
    assert rows[("gan", "1 nearest first")]["verdict"] == "missed" and rows[("dense", "1 nearest first")]["verdict"] == "met"
    assert rows[("gan", "4 cold peak")]["verdict"] == "missed" and rows[("dense", "4 cold peak")]["verdict"] == "met"
    assert rows[("dense", "2 warm steady")]["verdict"] == "met" and rows[("dense", "2 warm steady")]["native_mode"] == \
        "native_heuristics"
    assert not any(r["target"].startswith("3") for r in rw.targets(cases))  # fixed shapes: no epoch target


def test_rounds_are_paired_and_changing_shapes_have_the_epoch_target():
    cases = []
    for round_, (native, warm) in enumerate([(10.0, 9.8), (11.0, 11.11), (10.0, 9.9)], 1):  # 0.98, 1.01, 0.99
        cases += [case("detection", "native_heuristics", native, round_=round_),
                  case("detection", "cache_warm", warm, round_=round_, first=1.0 if round_ < 3 else 3.0, second=0.6)]
    cases.append({"workload": "detection", "mode": "cache_cold", "round": 1, "error": "timed out after 240 s"})
    rows = verdicts(cases)
    assert rows[("detection", "2 warm steady")]["ratio"] == pytest.approx(0.99)
    assert rows[("detection", "2 warm steady")]["ratios"] == pytest.approx([0.98, 0.99, 1.01])
    assert rows[("detection", "2 warm steady")]["verdict"] == "met"
    assert rows[("detection", "3 warm first")]["verdict"] == "met"  # median first epoch 1.0 over 0.6
    assert rows[("detection", "4 cold peak")]["verdict"] == "no data"
    text = rw.markdown({"device": "NVIDIA H100", "torch": "2.11", "cudnn": 91900, "date": "today", "cases": cases,
                        "targets": rw.targets(cases)})
    assert "## detection" in text and "error: timed out after 240 s" in text
    assert "0.990 (rounds: 3, 0.980 to 1.010)" in text and "| no data |" in text


def test_results_go_to_bench_results_unless_update():
    default = benchmarks.output_paths(rw.NAME, None, update=False)
    assert default == [ROOT / "bench-results" / "real_workloads.json"]
    assert not any(COMMITTED.parent in path.parents for path in default)
    assert benchmarks.output_paths(rw.NAME, None, update=True) == [*default, COMMITTED]
    assert benchmarks.output_paths(rw.NAME, "/tmp/x.json", update=False) == [pathlib.Path("/tmp/x.json")]
    assert benchmarks.output_paths(rw.NAME, COMMITTED, update=True) == [COMMITTED]  # not written twice
    assert "/bench-results/" in (ROOT / ".gitignore").read_text().split()


def test_a_failing_case_is_an_error_record(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchaudio", None)  # import torchaudio raises ImportError
    args = types.SimpleNamespace(device="cpu", batch=None)
    assert benchmarks.run_case(lambda result: rw.measure("speech", "native_heuristics", args, result),
                               {"workload": "speech"}) == 1
    result = json.loads(capsys.readouterr().out)
    assert "needs torchaudio" in result["error"] and result["workload"] == "speech" and "traceback" in result


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_a_case_without_a_gpu_exits_2(capsys):
    assert rw.main(["--case", "dense:native_heuristics"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_runner_end_to_end_on_the_cpu(tmp_path):
    output = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "real-workloads", "--device", "cpu",
                           "--workloads", "gan", "--modes", "native_heuristics,cache_cold,cache_warm", "--batch", "2",
                           "--epoch-steps", "1", "--warmup", "0", "--steps", "2", "--output", str(output)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    report = json.loads(output.read_text())
    assert done.returncode == 1, done.stderr  # cache_warm: the CPU run tunes nothing, so cold saves no file
    assert report["benchmark"] == "real_workloads" and report["complete"] and output.with_suffix(".md").exists()
    cases = {case["mode"]: case for case in report["cases"]}
    assert [case["mode"] for case in report["cases"]] == rw.round_order(["native_heuristics", "cache_cold", "cache_warm"], 1)
    native, cold, warm = cases["native_heuristics"], cases["cache_cold"], cases["cache_warm"]
    assert (native["mode"], native["round"], native["cudnn_cache_imported"]) == ("native_heuristics", 1, False)
    assert native["steady_wall_ms"]["n"] == 2 and len(native["epoch_steps_ms"]) == 2 and native["jit_cache_disabled"]
    assert cold["intercepting"] and cold["cache_file"].endswith("gan-1-cache_cold.cache") and "entries" in cold["stats"]
    assert warm["error"].startswith("skipped") and "| cache_warm | 1 | error: skipped" in done.stdout
    rendered = subprocess.run([sys.executable, "-m", "benchmarks", "real-workloads", "--combine",
                               str(output), str(output)], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert rendered.count("| native_heuristics | 1 |") == 1  # the same case twice: the later replaces it


def test_performance_doc_states_the_committed_results_targets():
    """docs/PERFORMANCE.md's real-workloads table is the committed result file's targets, row for row."""
    committed = json.loads(COMMITTED.read_text())
    doc = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    for target in committed["targets"]:
        row = (f"| {target['workload']} | {target['target']} | {target['value']:.3f} | {target['native']:.3f} "
               f"({target['native_mode']}) | {target['ratio']:.3f} | {target['verdict']} |")
        assert row in doc, f"docs/PERFORMANCE.md lacks {row}: regenerate its table from {COMMITTED}"
    assert rw.targets(committed["cases"]) == committed["targets"], "the result file's targets are stale"
