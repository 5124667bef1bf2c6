"""scripts/warm_start.py: its arguments, what it does without a GPU, and on a GPU the exhaustive search it runs
with --exhaustive (more engine configs timed per key than the default search, and every key settled again
before the save) and the pending keys it tunes with --pending."""

import pathlib
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "warm_start.py"
sys.path.insert(0, str(SCRIPT.parent))
import warm_start  # noqa: E402


def test_arguments_take_exhaustive_and_repeated_shapes():
    args = warm_start.parse_args(["--model", "resnet18", "--shape", "3,32,32", "--shape", "3,64,64",
                                  "--batch-size", "2", "--output", "x.cache", "--exhaustive"])
    assert args.exhaustive and args.shape == [(3, 32, 32), (3, 64, 64)] and args.batch_size == [2]
    assert not warm_start.parse_args(["--model", "resnet18", "--shape", "3,32,32", "--batch-size", "2",
                                      "--output", "x.cache"]).exhaustive
    # --exhaustive settles unless told not to; the default search does not unless told to.
    assert args.settle
    assert not warm_start.parse_args(["--model", "resnet18", "--shape", "3,32,32", "--batch-size", "2",
                                      "--output", "x.cache", "--exhaustive", "--no-settle"]).settle
    assert not warm_start.parse_args(["--model", "resnet18", "--shape", "3,32,32", "--batch-size", "2",
                                      "--output", "x.cache"]).settle
    assert warm_start.parse_args(["--model", "resnet18", "--shape", "3,32,32", "--batch-size", "2",
                                  "--output", "x.cache", "--settle"]).settle
    assert not warm_start.parse_args(["--pending", "shapes.cache"]).settle
    assert warm_start.parse_args(["--pending", "shapes.cache", "--settle"]).settle  # pending keys settle too


class RecordingCache:
    """What warm_start asks of cudnn_cache, in order, where the calls need no GPU."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return 0
        return record


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("jobs", [1, 3])
def test_pending_tunes_through_the_command_lines_code_with_its_jobs_and_options(tmp_path, monkeypatch, deterministic,
                                                                                jobs):
    """--pending runs what `cudnn_cache tune FILE --jobs N` runs (_tune_jobs.tune_file), with --deterministic's
    tuning option set here and handed to the workers, then saves."""
    from cudnn_cache import _tune_jobs

    path = tmp_path / "shapes.cache"
    path.write_bytes(b"")
    args = warm_start.parse_args(["--pending", str(path), "--jobs", str(jobs),
                                  *(["--deterministic"] if deterministic else [])])
    assert args.deterministic is deterministic and args.jobs == jobs
    cache = RecordingCache()
    cache.distributed = RecordingCache()  # recorded_misses() in the report
    cache.distributed.recorded_misses = lambda: []

    def tune_file(path, **arguments):
        cache.calls.append(("tune_file", (path,), arguments))
        return {"tuned": 0, "workers": []}

    monkeypatch.setattr(_tune_jobs, "tune_file", tune_file)
    assert warm_start.tune_pending_keys(args, cache, None) == 0
    names = [name for name, _, _ in cache.calls]
    assert names[-2:] == ["tune_file", "save"]
    options = {"rank_deterministic": True} if deterministic else {}
    assert cache.calls[-2] == ("tune_file", (str(path),), {"jobs": jobs, "device": None, "options": options})
    expected = [("set_tuning_options", (), options)] if deterministic else []
    assert [call for call in cache.calls if call[0] == "set_tuning_options"] == expected


def test_jobs_is_for_pending_alone_and_takes_a_count(capsys, monkeypatch):
    assert warm_start.parse_args(["--pending", "shapes.cache"]).jobs == 1
    assert warm_start.parse_args(["--pending", "shapes.cache", "--jobs", "8"]).jobs == 8
    for argv, message in (
            (["--model", "resnet18", "--shape", "3,32,32", "--batch-size", "2", "--output", "x.cache", "--jobs", "2"],
             "--jobs N tunes a file's pending keys: give --pending FILE, or leave out --jobs"),
            (["--pending", "shapes.cache", "--jobs", "0"],
             "argument --jobs: '0' is not a number of worker processes: give a number of worker processes from 1 "
             "to 64 (1, the default, tunes in this process)")):
        with pytest.raises(SystemExit) as exit:
            warm_start.parse_args(argv)
        assert exit.value.code == 2 and message in capsys.readouterr().err, argv
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun the ranks split the keys already
    with pytest.raises(SystemExit) as exit:
        warm_start.parse_args(["--pending", "shapes.cache", "--jobs", "2"])
    assert exit.value.code == 2 and "under torchrun the ranks split the keys already" in capsys.readouterr().err
    assert warm_start.parse_args(["--pending", "shapes.cache"]).jobs == 1


def test_pending_takes_the_file_alone_and_writes_into_it():
    args = warm_start.parse_args(["--pending", "shapes.cache"])
    assert args.pending == args.output == "shapes.cache"
    assert warm_start.parse_args(["--pending", "shapes.cache", "--output", "shapes.cache"]).output == "shapes.cache"
    for extra in (["--shape", "3,32,32"], ["--batch-size", "2"], ["--exhaustive"], ["--output", "other.cache"],
                  ["--model", "resnet18"]):
        with pytest.raises(SystemExit) as exit:
            warm_start.parse_args(["--pending", "shapes.cache", *extra])
        assert exit.value.code == 2, extra
    with pytest.raises(SystemExit):  # a model needs its shapes
        warm_start.parse_args(["--model", "resnet18", "--output", "x.cache"])


def test_remote_takes_a_redis_url_and_refuses_anything_else(capsys):
    args = warm_start.parse_args(["--pending", "shapes.cache", "--remote", "redis://:pw@cache-host:6379/1"])
    assert args.remote == "redis://:pw@cache-host:6379/1"
    with pytest.raises(SystemExit) as exit:
        warm_start.parse_args(["--pending", "shapes.cache", "--remote", "http://cache-host:6379"])
    assert exit.value.code == 2 and "--remote: remote store 'http://cache-host:6379': the scheme must be redis" in \
        capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path):
    output = tmp_path / "x.cache"
    process = subprocess.run([sys.executable, str(SCRIPT), "--model", "resnet18", "--shape", "3,32,32",
                              "--batch-size", "2", "--output", str(output), "--exhaustive"],
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 2, process.stderr
    assert "no CUDA GPU" in process.stderr and not output.exists()


@pytest.mark.gpu
def test_exhaustive_times_more_engine_configs_per_key_than_the_default(cache_state, child_env, tmp_path):
    cudnn_cache = cache_state
    torch.manual_seed(0)
    model = cudnn_cache.convert(nn.Conv2d(16, 32, 3, padding=1, bias=False)).cuda()
    torch.jit.script(model).save(str(tmp_path / "model.pt"))
    for name, extra in (("default", []), ("exhaustive", ["--exhaustive"])):
        process = subprocess.run([sys.executable, str(SCRIPT), "--torchscript", str(tmp_path / "model.pt"),
                                  "--shape", "16,20,20", "--batch-size", "4", "--output", str(tmp_path / name),
                                  *extra], env=child_env, capture_output=True, text=True, timeout=600)
        assert process.returncode == 0, process.stderr[-3000:]
        # --exhaustive settles by default: every key decided again in steady state before the save
        # (cudnn_cache.settle); the default search does not.
        assert (re.search(r"\d+ of 2 settled to another config in [\d.]+ s", process.stdout) is not None) == \
            (name == "exhaustive"), process.stdout
    x = torch.randn(4, 16, 20, 20, device="cuda")
    configs = {}
    for name in ("default", "exhaustive"):
        cudnn_cache.clear()
        # Forward and backward-filter: the warm start's input needs no gradient, so no backward-data runs.
        assert cudnn_cache.load(str(tmp_path / name)) == 2
        configs[name] = {direction: cudnn_cache.query(direction, cudnn_cache.conv_key(
            direction, x, model.weight, [1, 1], [1, 1], [1, 1], 1)) for direction in
            ("forward", "backward_filter")}
    for direction in configs["default"]:
        assert len(configs["exhaustive"][direction]) >= len(configs["default"][direction]), direction
    assert sum(map(len, configs["exhaustive"].values())) > sum(map(len, configs["default"].values()))


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic, jobs", [(False, 1), (True, 1), (True, 2)])
def test_pending_tunes_the_keys_a_record_run_saved(cache_state, child_env, tmp_path, torch_flags, deterministic,
                                                    jobs):
    """Note [Pending keys]: a run under the record policy saves what it met; warm_start --pending tunes it into
    the file (with --jobs 2, in two worker processes: Note [Tuning in worker processes]), and a process that loads
    it misses nothing; with --deterministic, deterministic calls run it on the graph path, a deterministic config
    of each ranking."""
    cudnn_cache = cache_state
    cudnn_cache.set_miss_policy("record")
    x = torch.randn(2, 8, 12, 12, device="cuda", requires_grad=True)
    conv = cudnn_cache.convert(nn.Conv2d(8, 8, 3, padding=1, bias=False)).cuda()
    conv(x).sum().backward()
    path = tmp_path / "shapes.cache"
    cudnn_cache.save(str(path))
    cudnn_cache.clear()
    process = subprocess.run([sys.executable, str(SCRIPT), "--pending", str(path), "--jobs", str(jobs),
                              *(["--deterministic"] if deterministic else [])],
                             env=child_env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    assert "tuned 3 pending keys" in process.stdout, process.stdout
    assert cudnn_cache.load(str(path)) == 3
    cudnn_cache.set_miss_policy("error")
    conv(x).sum().backward()
    if deterministic:
        # A ranking with no config known to be deterministic would send deterministic calls to the legacy
        # backend, whose miss the 'error' policy raises (Note [Deterministic calls]).
        torch.use_deterministic_algorithms(True)
        conv(x).sum().backward()
        for direction in ("forward", "backward_data", "backward_filter"):
            key = cudnn_cache.conv_key(direction, x, conv.weight, [1, 1], [1, 1], [1, 1], 1)
            assert any(entry["deterministic"] for entry in cudnn_cache.query(direction, key)), direction
