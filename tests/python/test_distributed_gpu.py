"""The NCCL path of cudnn_cache.distributed.sync on two GPUs: two ranks tune a ResNet-50's convolutions,
each about half, and end with the same entries, which cover the model (a second step under the 'error' miss
policy runs without a miss); the tuning time is measured against one rank (python3 -m benchmarks distributed)."""

import json
import math
import pathlib
import subprocess
import sys

import pytest
import torch

import cudnn_cache  # noqa: F401  (the ops)

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_two_ranks_tune_resnet50_in_about_half_the_time(child_env, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs for NCCL, this machine shows {torch.cuda.device_count()}")
    output = tmp_path / "distributed.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks", "distributed", "--world-sizes", "1,2",
                             "--output", str(output)], env=child_env, capture_output=True, text=True, timeout=1200,
                            cwd=ROOT)
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


class _Net(torch.nn.Module):
    """Three convolutions of different shapes, 1-D included; the first's input needs no gradient."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2)
        self.c = torch.nn.Conv1d(4, 8, 5, padding=2)

    def forward(self, x, s):
        return self.b(self.a(x)).float().sum() + self.c(s).float().sum()


@pytest.mark.gpu
@pytest.mark.parametrize("backend,dtype,channels_last", [("graph", torch.float32, False),
                                                         ("graph", torch.bfloat16, True),
                                                         ("legacy", torch.float16, False)])
def test_recorded_misses_are_tuned_from_their_keys_and_then_cover_the_model(cache_state, backend, dtype,
                                                                            channels_last):
    from cudnn_cache import distributed

    cudnn_cache = cache_state
    cudnn_cache.set_backend(backend)
    distributed.clear_recorded_misses()
    model = cudnn_cache.convert(_Net()).cuda().to(dtype)
    x = torch.randn(4, 3, 32, 32, device="cuda", dtype=dtype)
    s = torch.randn(4, 4, 40, device="cuda", dtype=dtype, requires_grad=True)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    cudnn_cache.set_miss_policy("record")
    model(x, s).backward()
    misses = distributed.recorded_misses()
    assert len(misses) == 3 * 3 - 1  # three directions each; no backward-data for the input x
    assert {backend_ for _, backend_, _ in misses} == {backend}
    assert cudnn_cache.stats()["tunes"] == 0 and cudnn_cache.size() == 0  # recording tunes nothing

    report = distributed.sync()  # no process group: this process tunes them all, from the keys alone
    assert (report.untuned, report.tuned, report.failed) == (8, 8, [])
    assert distributed.recorded_misses() == []  # covered now
    cudnn_cache.set_miss_policy("error")
    cudnn_cache.reset_stats()
    model.zero_grad(set_to_none=True)
    model(x, s).backward()  # every key of the real calls hits what sync() tuned
    assert cudnn_cache.stats()["misses"] == 0 and cudnn_cache.stats()["hits"] == 8
