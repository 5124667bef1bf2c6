"""scripts/layer_time.py on the CPU: the layers it times, the modes it interleaves and what it reports. (Its
figures mean something only on a GPU; the code is the same.)"""

import json
import pathlib
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import layer_time  # noqa: E402


def test_a_layer_called_twice_in_one_forward_counts_both_calls_and_other_modules_are_not_timed():
    relu = torch.nn.ReLU()
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), relu, torch.nn.Flatten(), relu)
    drained = []
    timer = layer_time.LayerTimer(model, lambda: drained.append(1))
    assert timer.kinds == {"0": "Conv2d", "1": "ReLU"}  # the shared ReLU is one module; Flatten is not timed
    model(torch.rand(1, 1, 5, 5))
    assert set(timer.current) == {"0", "1"} and all(seconds > 0 for seconds in timer.current.values())
    assert len(drained) == 3  # every timed call starts drained: the conv and both calls of the ReLU


def test_reports_every_mode_and_layer_of_the_workload(tmp_path):
    output = tmp_path / "layers.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "layer_time.py"), "--device", "cpu", "--workload",
                           "seed", "--rounds", "6", "--warmup", "1", "--drain", "--json", str(output)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(output.read_text())
    assert result["drain"] and result["rounds"] == 6 and result["native_mode"] == "heuristic"
    # the seed model: Conv2d, ReLU, Conv2d, ReLU, pooling and a linear head (not timed)
    assert result["layer_kinds"] == {"0": "Conv2d", "1": "ReLU", "2": "Conv2d", "3": "ReLU"}
    assert set(result["forward_ms"]) == set(layer_time.MODES)
    assert set(result["forward_ratio_to_native"]) == set(layer_time.MODES) - {"native"}
    for mode in layer_time.MODES:
        figure = result["forward_ms"][mode]
        assert set(figure) == {"median", "lo", "hi", "n"} and figure["n"] == 6
        assert 0 < figure["lo"] <= figure["median"] <= figure["hi"]
        assert set(result["layers_us"][mode]) == set(result["layer_kinds"])
        assert result["allocator_per_step"][mode] == {"num_device_alloc": 0, "num_device_free": 0,
                                                      "num_alloc_retries": 0}  # no CUDA allocator on the CPU
    assert result["entries"] == {"tuned": 0, "native_pick": 0}  # nothing is tuned off a GPU
    assert "| native_pick |" in done.stdout and "every layer drained" in done.stdout
    assert "| 0 | Conv2d |" in done.stdout


def test_refuses_too_few_rounds():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "layer_time.py"), "--device", "cpu", "--rounds",
                           "5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--rounds must be >= 6" in done.stderr
