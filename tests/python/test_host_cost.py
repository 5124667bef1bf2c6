"""The host-cost benchmark (python3 -m benchmarks host-cost) on the CPU: the convolutions it records from a models
workload, the rows it reports and their statistics. (Its figures mean something only on a GPU; the code is the
same.)"""

import json
import pathlib
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import host_cost  # noqa: E402


def test_records_every_distinct_convolution_of_the_workload():
    convolutions = host_cost.convolutions_of("seed", torch.device("cpu"))
    # the seed model: Conv2d(3, 64, 3, padding='same'), then Conv2d(64, 32, 3)
    assert [(tuple(c.x.shape), tuple(c.w.shape), c.padding, c.layers) for c in convolutions] == [
        ((7, 3, 32, 32), (64, 3, 3, 3), [1, 1], 1), ((7, 64, 32, 32), (32, 64, 3, 3), [0, 0], 1)]
    assert [tuple(c.g.shape) for c in convolutions] == [(7, 64, 32, 32), (7, 32, 30, 30)]  # like each output


def test_the_overhead_workload_is_the_overhead_cases_training_convolution():
    [convolution] = host_cost.convolutions_of("overhead", torch.device("cpu"))
    assert tuple(convolution.x.shape) == host_cost.TRAIN_INPUT and tuple(convolution.w.shape) == host_cost.TRAIN_WEIGHT
    assert convolution.padding == [1, 1] and tuple(convolution.g.shape) == host_cost.TRAIN_INPUT  # 16 -> 16, same size


def test_each_directions_loop_makes_its_calls_natively_and_through_the_op():
    [convolution] = host_cost.convolutions_of("overhead", torch.device("cpu"))
    loop = torch.jit.script(host_cost.scripted_calls)
    outputs = {direction: loop(*convolution.arguments(), 2, direction, False) for direction in host_cost.DIRECTIONS}
    assert [len(outputs[d]) for d in host_cost.DIRECTIONS] == [2, 2, 2, 4]
    assert outputs["backward_data"][0].shape == convolution.x.shape
    assert outputs["backward_filter"][0].shape == convolution.w.shape


def test_reports_each_convolution_and_direction_with_paired_differences(tmp_path):
    output = tmp_path / "host_cost.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "host-cost", "--device", "cpu", "--workload",
                           "seed", "--rounds", "6", "--calls", "1", "--json", str(output)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(output.read_text())["rows"]
    assert [(row["convolution"].split(" ")[0], row["direction"]) for row in rows] == [
        (shape, direction) for shape in ("7x3x32x32", "7x64x32x32") for direction in host_cost.DIRECTIONS]
    for row in rows:
        for figure in (row["native_us"], row["native_benchmark_minus_native_us"], row["op_minus_native_us"],
                       row["intercept_minus_native_us"]):
            assert set(figure) == {"median", "lo", "hi", "n"} and figure["n"] == 6
            assert figure["lo"] <= figure["median"] <= figure["hi"]
        assert row["native_us"]["lo"] > 0 and row["stored"] == {}  # no cache entries off a GPU
    assert "| 7x3x32x32 * 64x3x3x3 float32 contiguous stride [1, 1] padding [1, 1] groups 1 | 1 | forward |" in done.stdout
    assert "Per training step" in done.stdout and output.with_suffix(".md").exists()


def test_refuses_too_few_rounds():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "host-cost", "--device", "cpu", "--rounds", "5"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--rounds must be >= 6" in done.stderr
