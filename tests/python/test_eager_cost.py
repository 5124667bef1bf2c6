"""scripts/eager_cost.py on the CPU: the parts and ways it times, their paired statistics, and what it refuses.
(Its figures mean something only on a GPU, where the cache ways run cuDNN plans; the code is the same.)"""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import eager_cost  # noqa: E402


def run(*args, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "eager_cost.py"), "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_times_every_part_each_way_with_paired_differences(tmp_path):
    output = tmp_path / "eager_cost.json"
    done = run("--rounds", "6", "--calls", "1", "--json", str(output))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(output.read_text())
    assert list(report["parts"]) == list(eager_cost.PARTS) and report["plans"] == "search"
    for entry in report["parts"].values():
        assert set(entry) == {"native_us", "op_us", "op_minus_native_us", "intercept_us",
                              "intercept_minus_native_us"}
        for figure in entry.values():
            assert set(figure) == {"median", "lo", "hi", "n"} and figure["n"] == 6
            assert figure["lo"] <= figure["median"] <= figure["hi"]
        assert entry["native_us"]["lo"] > 0
    assert report["stats"]["misses"] == 0  # timed under the error policy: everything was tuned before
    for part in eager_cost.PARTS:
        assert f"| {part} | " in done.stdout


def test_api_counts_each_parts_events_per_call(tmp_path):
    output = tmp_path / "eager_cost.json"
    done = run("--rounds", "6", "--calls", "2", "--api", "--json", str(output))
    assert done.returncode == 0, done.stdout + done.stderr
    api = json.loads(output.read_text())["api"]
    assert list(api) == list(eager_cost.PARTS) and all(list(ways) == list(eager_cost.WAYS) for ways in api.values())
    # Per call of a round of 2: one convolution each way (its operator's name differs between them).
    assert api["forward"]["native"]["aten::conv2d"]["calls"] == 1
    assert api["forward"]["op"]["cudnn_cache::convolution"]["calls"] == 1
    assert api["train"]["native"]["aten::convolution_backward"]["calls"] == 1
    for part in eager_cost.PARTS:
        assert f"{part}: per call, calls and self CPU time" in done.stdout
    assert "| aten::conv2d (count differs) | 1.0, " in done.stdout


def test_the_parts_call_what_training_calls():
    import torch

    parts = eager_cost.parts_of(torch.device("cpu"), calls=1)
    assert set(parts) == set(eager_cost.PARTS)
    for ways in parts.values():
        assert set(ways) == set(eager_cost.WAYS)
        for calls in ways.values():
            calls()  # each runs on the CPU as it is


def test_refuses_what_it_cannot_measure():
    done = run("--rounds", "5", timeout=120)
    assert done.returncode == 2 and "--rounds must be >= 6" in done.stderr
    done = run("--plans", "pool", timeout=120)
    assert done.returncode == 2 and "--plans pool needs a CUDA device" in done.stderr


def test_tuning_options_are_set_before_the_keys_are_tuned(tmp_path):
    output = tmp_path / "eager_cost.json"
    done = run("--rounds", "6", "--calls", "1", "--tuning", "max_candidates=1", "finalists=0", "flush_l2=0",
               "--json", str(output))
    assert done.returncode == 0, done.stdout + done.stderr
    tuning = json.loads(output.read_text())["tuning"]
    assert (tuning["max_candidates"], tuning["finalists"], tuning["flush_l2"]) == (1, 0, False)
    done = run("--tuning", "max_candidates=one", timeout=120)
    assert done.returncode == 2 and "--tuning max_candidates: 'one' is not a number" in done.stderr
