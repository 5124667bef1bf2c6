"""torch_ops/cudnn_cache/_tune_jobs.py: `python -m cudnn_cache tune FILE --jobs N` (and warm_start.py --pending
FILE --jobs N). Without a GPU: --jobs is checked, the keys are dealt into shares each key in exactly one, workers
go round the GPUs, and a failed worker is named; on a GPU, a file of pending keys tuned by two workers."""

import argparse
import collections
import re
import subprocess
import sys

import pytest
import torch

import cudnn_cache
from cudnn_cache import _tune_jobs, distributed


def keys(count, directions=("forward",)):
    """`count` distinct graph keys per direction, of different costs (1 to `count` output channels)."""
    x = torch.empty(2, 16, 8, 8, device="meta")
    return [("graph", cudnn_cache.conv_key(direction, x, torch.empty(channels, 16, 3, 3, device="meta"),
                                           [1], [1], [1], 1))
            for channels in range(1, count + 1) for direction in directions]


# --- --jobs ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["1", "2", "64"])
def test_jobs_takes_a_count_of_worker_processes(text):
    assert _tune_jobs.jobs_argument(text) == int(text)


@pytest.mark.parametrize("text", ["0", "65", "-1", "two", "1.5", " 2", "", "٣"])
def test_a_bad_jobs_names_the_value_and_the_fix(text):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        _tune_jobs.jobs_argument(text)
    assert str(refused.value) == (f"{text!r} is not a number of worker processes: give a number of worker "
                                  "processes from 1 to 64 (1, the default, tunes in this process)")


@pytest.mark.parametrize("jobs", [0, 65, -2, True, 2.0, "2", None])
def test_check_jobs_refuses_what_is_not_a_count(jobs):
    with pytest.raises(ValueError, match=re.escape(f"jobs={jobs!r} is not a number of worker processes: give a "
                                                   "number of worker processes from 1 to 64")):
        _tune_jobs.check_jobs(jobs)
    assert _tune_jobs.check_jobs(3) == 3


@pytest.mark.parametrize("jobs", ["0", "100", "x"])
def test_tune_refuses_a_bad_jobs_before_it_reads_the_file(cli, tmp_path, jobs):
    result = cli("tune", tmp_path / "missing.cache", "--jobs", jobs)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"python -m cudnn_cache tune: argument --jobs: {jobs!r} is not a number of worker "
                             "processes: give a number of worker processes from 1 to 64 (1, the default, tunes in "
                             "this process) (see python -m cudnn_cache tune --help)\n"), result.stderr


def test_tune_lists_jobs_in_its_help(cli):
    result = cli("tune", "--help")
    assert result.returncode == 0 and "--jobs N" in result.stdout


# --- Shares and devices ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("count, jobs", [(10, 1), (10, 2), (10, 3), (7, 7), (3, 5), (1, 4), (0, 3), (31, 8)])
def test_every_key_lands_in_exactly_one_share(count, jobs):
    problems = keys(count, ("forward", "backward_data", "backward_filter"))
    dealt = _tune_jobs.shares(problems, jobs)
    assert len(dealt) == min(jobs, len(problems)) and all(dealt)  # no empty share: no idle worker
    landed = collections.Counter(problem for share in dealt for problem in share)
    assert set(landed) == set(problems) and set(landed.values()) <= {1}
    sizes = [len(share) for share in dealt]
    assert not sizes or max(sizes) - min(sizes) <= 1
    assert _tune_jobs.shares(list(reversed(problems)), jobs) == dealt  # the same deal in any order


def test_shares_take_a_key_given_twice_once_and_deal_the_costliest_first():
    problems = keys(6)
    dealt = _tune_jobs.shares(problems + problems[:2], 2)
    assert sorted(problem for share in dealt for problem in share) == sorted(problems)
    # The costliest (6 output channels) opens the first share, the next one the second: distributed.split's deal.
    assert dealt[0][0] == problems[5] and dealt[1][0] == problems[4]
    assert dealt == [distributed.split(problems, [0, 1])[job] for job in (0, 1)]


def test_shares_refuse_a_bad_jobs():
    with pytest.raises(ValueError, match="jobs=0 is not a number of worker processes"):
        _tune_jobs.shares(keys(3), 0)


def test_workers_go_round_the_devices():
    assert _tune_jobs.worker_devices(5, [0, 1]) == [0, 1, 0, 1, 0]
    assert _tune_jobs.worker_devices(3, [2]) == [2, 2, 2]
    assert _tune_jobs.worker_devices(0, [0]) == []
    with pytest.raises(ValueError, match="no CUDA device"):
        _tune_jobs.worker_devices(2, [])


# --- tune_file without a GPU: the workers replaced -------------------------------------------------------------

ORIGIN = ("Test GPU A", 9, 0, 132, 9, 19)
OTHER = ("Test GPU B", 8, 0, 108, 9, 19)


@pytest.fixture
def no_gpu_workers(monkeypatch, tmp_path):
    """tune_file with this machine's GPUs, the file's pending keys and the worker processes replaced: the file
    holds 5 pending keys of ORIGIN and 2 of another GPU; returns what the fake workers were given."""
    pending = keys(5)
    other = keys(7)[5:]
    given = {}
    loads = []
    monkeypatch.setattr(cudnn_cache, "load", lambda path: loads.append(path) or 0)
    monkeypatch.setattr(_tune_jobs, "tuning_devices", lambda device: [0, 1] if device is None else [device])
    monkeypatch.setattr(distributed, "device_origin", lambda device=None: ORIGIN)
    monkeypatch.setattr(distributed, "recorded_misses",
                        lambda: [(ORIGIN, b, k) for b, k in pending] + [(OTHER, b, k) for b, k in other])

    def run_workers(path, dealt, devices, deadline, options):
        given.update(path=path, dealt=dealt, devices=devices, deadline=deadline, options=options)
        return [dict(tuned=len(share), tunes=len(share)) for share in dealt]

    monkeypatch.setattr(_tune_jobs, "_run_workers", run_workers)
    given["pending"], given["loads"] = pending, loads
    return given


def test_tune_file_deals_this_gpus_pending_keys_to_workers_round_the_gpus(no_gpu_workers, tmp_path):
    path = str(tmp_path / "shapes.cache")
    report = _tune_jobs.tune_file(path, jobs=3, options={"rank_deterministic": True})
    given = no_gpu_workers
    assert given["path"] == path and given["devices"] == [0, 1, 0] and given["options"] == {"rank_deterministic": True}
    assert sorted(p for share in given["dealt"] for p in share) == sorted(given["pending"])  # not the other GPU's
    assert given["deadline"] is None
    assert report == {"tuned": 5, "workers": [{"device": d, "keys": len(s), "tuned": len(s), "tunes": len(s)}
                                              for d, s in zip([0, 1, 0], given["dealt"])]}
    assert given["loads"] == [path, path]  # the file, then what the workers merged into it


def test_tune_file_gives_the_workers_one_deadline_and_refuses_a_negative_time(no_gpu_workers, tmp_path):
    _tune_jobs.tune_file(str(tmp_path / "shapes.cache"), jobs=2, device=1, max_seconds=30)
    assert no_gpu_workers["devices"] == [1, 1]  # --device names the GPU: every worker on it
    assert no_gpu_workers["deadline"] is not None
    with pytest.raises(ValueError, match="max_seconds must be a number of seconds >= 0"):
        _tune_jobs.tune_file(str(tmp_path / "shapes.cache"), jobs=2, max_seconds=-1)
    with pytest.raises(ValueError, match="jobs=0 is not a number of worker processes"):
        _tune_jobs.tune_file(str(tmp_path / "shapes.cache"), jobs=0)


def test_a_failed_worker_is_named_after_the_others_merged(no_gpu_workers, monkeypatch, tmp_path):
    def run_workers(path, dealt, devices, deadline, options):
        return [dict(tuned=len(dealt[0]), tunes=len(dealt[0])),
                dict(tuned=1, tunes=2, error="cuDNN graph API: no engine config runs forward: x float")]

    monkeypatch.setattr(_tune_jobs, "_run_workers", run_workers)
    path = str(tmp_path / "shapes.cache")
    with pytest.raises(RuntimeError) as failed:
        _tune_jobs.tune_file(path, jobs=2)
    assert str(failed.value) == (f"1 of 2 workers failed; what the others tuned is in {path}: worker 1 (cuda:1, 2 "
                                 "keys): cuDNN graph API: no engine config runs forward: x float")
    assert no_gpu_workers["loads"] == [path, path]  # loaded again: the cache holds what was merged


def test_a_worker_process_reports_what_failed_in_it(tmp_path):
    """_run_workers starts real spawned processes: one asked for a GPU this machine does not have reports why,
    and nothing is written."""
    path = tmp_path / "shapes.cache"
    [result] = _tune_jobs._run_workers(str(path), [keys(2)], [99], None, {})
    assert set(result) == {"error"} and result["error"], result
    assert not path.exists()


# --- On a GPU --------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_tune_with_two_jobs_tunes_every_pending_key_once_into_the_file(cache_state, child_env, tmp_path):
    """Note [Tuning in worker processes]: the record policy's misses of three layers (forward and both gradients:
    9 pending keys), saved in a file, are tuned by two worker processes, each key by one search; the file then
    holds every key, none pending, and a process that loads it misses nothing."""
    cudnn_cache.set_miss_policy("record")
    layers = [(torch.randn(2, channels, 10, 10, device="cuda", requires_grad=True),
               torch.randn(8, channels, 3, 3, device="cuda", requires_grad=True)) for channels in (4, 8, 12)]
    for x, w in layers:
        torch.ops.cudnn_cache.convolution(x, w, None, [1], [1], [1], 1).sum().backward()
    pending = [(backend, key) for _, backend, key in distributed.recorded_misses()]
    assert len(pending) == 9 and cudnn_cache.size() == 0
    path = tmp_path / "pending.cache"
    cudnn_cache.save(str(path))
    cudnn_cache.clear()

    result = subprocess.run([sys.executable, "-m", "cudnn_cache", "tune", str(path), "--jobs", "2"], env=child_env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tuned 9 pending keys of this GPU in 2 worker processes (" in result.stdout, result.stdout
    assert "; 0 pending keys" in result.stdout, result.stdout
    workers = re.findall(r"cuda:(\d+) (\d+) of (\d+) keys \((\d+) searches\)", result.stdout)
    assert len(workers) == 2, result.stdout
    # Each worker tuned its whole share with one search a key, and the shares add up to the 9 keys: none twice.
    assert all(tuned == keys and searches == keys for _, tuned, keys, searches in workers), workers
    assert sum(int(keys) for _, _, keys, _ in workers) == 9

    assert cudnn_cache.load(str(path)) == 9
    assert distributed.recorded_misses() == []
    directions = ("forward", "backward_data", "backward_filter")  # a key's first word (Direction in key.h)
    assert all(cudnn_cache.query(directions[key[0]], key, backend) for backend, key in pending)
    cudnn_cache.set_miss_policy("error")  # a miss would raise
    cudnn_cache.reset_stats()
    for x, w in layers:
        torch.ops.cudnn_cache.convolution(x, w, None, [1], [1], [1], 1).sum().backward()
    assert cudnn_cache.stats()["misses"] == 0
