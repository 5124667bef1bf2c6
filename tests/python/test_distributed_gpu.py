"""The NCCL path of cudnn_cache.distributed.sync on two GPUs: two ranks tune a ResNet-50's convolutions,
each about half, and end with the same entries, which cover the model (a second step under the 'error' miss
policy runs without a miss); the tuning time is measured against one rank (scripts/bench_distributed.py)."""

import json
import math
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_two_ranks_tune_resnet50_in_about_half_the_time(child_env, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs for NCCL, this machine shows {torch.cuda.device_count()}")
    output = tmp_path / "bench_distributed.json"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_distributed.py"), "--world-sizes", "1,2",
                             "--output", str(output)], env=child_env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    bench = json.loads(output.read_text())
    one, two = bench["runs"]
    print(json.dumps({key: bench[key] for key in ("gpu", "tune_speedup", "sync_speedup")}),
          json.dumps(one), json.dumps(two), sep="\n")
    assert one["keys_untuned"] == two["keys_untuned"] == one["keys_needed"] > 30  # ~23 convolutions x 3 directions
    assert one["tuned_per_rank"] == [one["keys_untuned"]]
    assert sum(two["tuned_per_rank"]) == two["keys_untuned"]  # nobody tuned a key twice
    assert max(two["tuned_per_rank"]) <= math.ceil(two["keys_untuned"] / 2)
    assert one["consistent"] and two["consistent"] and two["entries"][0] == two["entries"][1]
    assert two["tune_s"] < one["tune_s"]  # the point of it; about half is expected
