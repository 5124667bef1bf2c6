"""scripts/step_host_time.py on the CPU: the rows it reports, their statistics and the profile table. (Its
figures mean something only on a GPU, where it also times steps behind a queued kernel; the code is the same.)"""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "step_host_time.py"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def test_reports_each_way_against_native_paired_per_round_with_a_profile(tmp_path):
    output = tmp_path / "step_host_time.json"
    done = run("--workload", "seed", "--rounds", "6", "--profile", "--json", output)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(output.read_text())
    assert result["workload"] == "seed" and result["rounds"] == 6 and result["deterministic"] is False
    assert [(row["state"], row["way"]) for row in result["rows"]] == [("idle", way) for way in ("native", "graph",
                                                                                                 "legacy")]
    for row in result["rows"]:
        for figure in (row["host_ms"], row["ratio_to_native"]):
            assert set(figure) == {"median", "lo", "hi", "n"} and figure["n"] == 6
            assert figure["lo"] <= figure["median"] <= figure["hi"]
        assert row["host_ms"]["lo"] > 0
    assert result["rows"][0]["ratio_to_native"] == {"median": 1.0, "lo": 1.0, "hi": 1.0, "n": 6}
    assert result["gpu_rows"] == []  # no GPU time on the CPU, and no table of it
    assert result["plans"] == "search" and result["plans_prepared"] == 0
    profile = result["self_cpu_us"]["idle"]
    assert set(profile) == {"native", "graph", "legacy"}
    assert all(profile[way]["aten::convolution"]["calls"] == 2 for way in profile)  # the seed model's two convs
    assert "| idle | native | " in done.stdout and "Self CPU us per step (idle)" in done.stdout


def test_deterministic_runs_every_way_under_deterministic_algorithms(tmp_path):
    output = tmp_path / "step_host_time.json"
    done = run("--workload", "seed", "--rounds", "6", "--deterministic", "--json", output)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(output.read_text())
    assert result["deterministic"] is True and len(result["rows"]) == 3
    assert "6 rounds, cpu, deterministic" in done.stdout


def test_refuses_too_few_rounds_and_a_kernel_of_no_length():
    done = run("--rounds", "5")
    assert done.returncode == 2 and "--rounds must be >= 6" in done.stderr
    done = run("--busy-ms", "0")
    assert done.returncode == 2 and "--busy-ms must be > 0" in done.stderr
    done = run("--plans", "pool")
    assert done.returncode == 2 and "--plans pool needs a CUDA device" in done.stderr


def test_the_gpu_time_table_shows_each_way_against_native():
    sys.path.insert(0, str(ROOT / "scripts"))
    import step_host_time

    figure = lambda m: {"median": m, "lo": m - 0.1, "hi": m + 0.1, "n": 6}  # noqa: E731
    result = {"rows": [{"state": "idle", "way": way, "host_ms": figure(9.0), "ratio_to_native": figure(1.0)}
                       for way in step_host_time.WAYS],
              "gpu_rows": [{"way": way, "gpu_ms": figure(ms), "ratio_to_native": figure(ms / 6.0)}
                           for way, ms in zip(step_host_time.WAYS, (6.0, 6.2, 6.1))]}
    table = step_host_time.table(result)
    assert "| way | GPU ms per step, median [95%] |" in table
    assert "| graph | 6.200 [6.100, 6.300] | 1.033 [0.933, 1.133] |" in table
