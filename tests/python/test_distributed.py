"""cudnn_cache.distributed.sync over gloo on the CPU, with real process groups of several processes
(distributed_worker.py is one rank): the split of the untuned problems, the exchange and the merge are the
real ones; only the search is replaced by synthetic rankings, since there is no GPU to time on. Also the
shared-file saves from Python (locks, merging, persistent). The NCCL path with ResNet-50 is in
test_distributed_gpu.py."""

import collections
import fcntl
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

import cudnn_cache
import testing_ops
from cudnn_cache import distributed

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")


@pytest.fixture
def ranks(child_env, tmp_path):
    """Runs `world_size` worker processes of a scenario together; returns their results, by rank."""

    def run(scenario, world_size, timeout=300):
        out = tmp_path / scenario
        out.mkdir()
        store = tmp_path / f"{scenario}.store"
        started = time.perf_counter()
        workers = [subprocess.Popen([sys.executable, str(WORKER), scenario, str(rank), str(world_size), str(store),
                                     str(out)], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for rank in range(world_size)]
        outputs = [worker.communicate(timeout=timeout)[0] for worker in workers]
        for rank, (worker, output) in enumerate(zip(workers, outputs)):
            assert worker.returncode == 0, f"rank {rank} of {scenario} failed:\n{output}"
        results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world_size)]
        print(f"{scenario}: {world_size} processes in {time.perf_counter() - started:.1f} s (imports included)")
        return results, out

    return run


def problem_set(items):
    return {(backend, tuple(key)) for backend, key in items}


def test_four_ranks_split_the_untuned_problems_and_all_end_with_the_union(ranks):
    results, _ = ranks("split", 4)
    needed = problem_set(results[0]["needed"])
    for result in results[1:]:
        needed |= problem_set(result["needed"])
    held = problem_set(results[0]["held"])
    untuned = needed - held
    tuned = collections.Counter((backend, tuple(key)) for result in results for backend, key in result["tuned"])
    assert set(tuned) == untuned  # every untuned problem was tuned, and none that rank 0 held
    assert max(tuned.values()) == 1  # by exactly one rank
    counts = [len(result["tuned"]) for result in results]
    assert max(counts) - min(counts) <= 1 and sum(counts) == len(untuned)  # 1/N each, give or take one
    for rank, result in enumerate(results):
        report = result["report"]
        assert (report["rank"], report["world_size"], report["peers"]) == (rank, 4, 4)
        assert (report["needed"], report["untuned"], report["tuned"]) == (len(needed), len(untuned), counts[rank])
        assert report["failed"] == []
    # Every rank ends with the same entries: everything needed, with the same content.
    assert all(result["state"] == results[0]["state"] for result in results)
    assert {(backend, tuple(key)) for _, backend, key, _ in results[0]["state"]} == needed
    # Each entry crossed the wire once: rank 0's held entries by rank 0, tuned ones by their tuner.
    assert sum(result["report"]["sent"] for result in results) == len(needed)


@pytest.mark.parametrize("scenario", ["mixed", "mixed-own-only"])
def test_mixed_gpu_models_tune_within_their_identity(ranks, scenario):
    results, _ = ranks(scenario, 5)
    origin_a, origin_b = tuple(results[0]["origin"]), tuple(results[2]["origin"])
    needed = 30
    for members in ((0, 1), (2, 3)):
        tuned = collections.Counter((b, tuple(k)) for r in members for b, k in results[r]["tuned"])
        assert len(tuned) == needed and max(tuned.values()) == 1  # each identity tunes everything once
        assert [len(results[r]["tuned"]) for r in members] == [needed // 2] * 2
        for r in members:
            assert results[r]["report"]["peers"] == 2 and results[r]["report"]["untuned"] == needed
    assert results[4]["tuned"] == [] and results[4]["report"]["origin"] is None  # no GPU: tunes nothing

    def origins(state):
        return collections.Counter(tuple(origin) for origin, _, _, _ in state)

    both = {origin_a: needed, origin_b: needed}
    assert origins(results[4]["state"]) == both  # a rank without a GPU receives everything
    if scenario == "mixed":
        assert all(origins(result["state"]) == both for result in results)
    else:  # each keeps its own identity's entries only
        expected = [{origin_a: needed}] * 2 + [{origin_b: needed}] * 2
        assert [origins(result["state"]) for result in results[:4]] == expected
    # Every rank that keeps an identity's entries has the same content for it.
    for origin, keepers in ((origin_a, (0, 1, 4)), (origin_b, (2, 3, 4))):
        if scenario == "mixed":
            keepers = range(5)
        views = [[entry for entry in results[r]["state"] if tuple(entry[0]) == origin] for r in keepers]
        assert all(view == views[0] for view in views) and len(views[0]) == needed


def test_sync_merges_conflicting_measurements_as_the_file_merge_does(ranks, tool):
    results, out = ranks("merge", 3)
    assert all(result["report"]["untuned"] == 0 and result["report"]["tuned"] == 0 for result in results)
    assert results[0]["state"] == results[1]["state"] == results[2]["state"]  # one answer everywhere
    assert len(results[0]["state"]) == 12
    # Conflicting rankings: the same keys, different bests; the sync gives what the offline merge gives
    # (per candidate the faster measurement wins), whichever order it is done in.
    merged = out / "merged.cache"
    conflicts = torch.ops.cudnn_cache.file_merge([str(out / "before-1.cache"), str(out / "before-0.cache")],
                                                 str(merged))
    assert conflicts  # the two ranks disagreed on some best candidates
    for rank in range(3):
        only_first, only_second, different, same = torch.ops.cudnn_cache.file_diff(str(merged),
                                                                                   str(out / f"after-{rank}.cache"))
        assert (only_first, only_second, different, same) == ([], [], [], 12)


def test_bulk_sync_timing(ranks):
    results, _ = ranks("bulk", 4)
    for result in results:
        assert result["entries"] == 4 * 1000 + 60  # every rank's own entries, and the tuned ones
    seconds = [result["seconds"] for result in results]
    phases = {phase: max(r["report"]["seconds"][phase] for r in results) for phase in ("exchange", "tune", "share")}
    print(f"gloo sync, 4 ranks x 1000 entries + 60 tuned: {max(seconds):.3f} s ({phases})")


# --- In this process: the split, a world of one, and bad input ---------------------------------------------------

def keys(count):
    x = torch.empty(2, 16, 8, 8, device="meta")
    result = []
    for channels in range(1, count + 1):
        w = torch.empty(channels, 16, 3, 3, device="meta")
        result.append(("graph", cudnn_cache.conv_key("forward", x, w, [1], [1], [1], 1)))
    return result


def test_split_deals_costliest_first_in_snake_order():
    problems = keys(10)
    plan = distributed.split(problems, [3, 1, 2])
    assert sorted(plan) == [1, 2, 3]
    assert sorted(len(share) for share in plan.values()) == [3, 3, 4]
    assert sorted(p for share in plan.values() for p in share) == sorted(problems)
    costs = {rank: sum(distributed.estimated_cost(key) for _, key in share) for rank, share in plan.items()}
    assert max(costs.values()) / min(costs.values()) < 1.5
    # Costliest first: 10 output channels costs 10x one channel; rank 1 (lowest) gets the costliest.
    assert distributed.estimated_cost(problems[9][1]) == 10 * distributed.estimated_cost(problems[0][1])
    assert plan[1][0] == problems[9]
    assert distributed.split(list(reversed(problems)), [1, 2, 3]) == plan  # the same on every rank


def test_sync_without_a_process_group_tunes_everything_itself(cache_state):
    origin = ("Test GPU A", 9, 0, 132, 9, 19)
    tuned = []

    def tune(backend, key):
        tuned.append((backend, key))
        testing_ops.add_synthetic_ranking(list(key), backend, origin[0], list(origin[1:]), 1)

    problems = keys(5)
    report = distributed.sync(problems=problems + problems[:2], origin=origin, tune=tune)
    assert sorted(tuned) == sorted(problems)
    assert (report.world_size, report.needed, report.untuned, report.tuned, report.sent) == (1, 5, 5, 5, 5)
    assert cudnn_cache.size() == 5
    again = distributed.sync(problems=problems, origin=origin, tune=tune)
    assert (again.untuned, again.tuned, len(tuned)) == (0, 0, 5)  # held now: nothing to tune


def test_a_tuning_failure_is_reported_not_raised(cache_state):
    def tune(backend, key):
        raise RuntimeError("out of memory\nmore lines")

    with pytest.warns(RuntimeWarning, match="could not tune 2 of its 2"):
        report = distributed.sync(problems=keys(2), origin=("Test GPU A", 9, 0, 132, 9, 19), tune=tune)
    assert report.tuned == 0 and [reason for _, _, reason in report.failed] == ["out of memory"] * 2


def test_bad_problems_and_origins_are_refused_saying_what_to_pass(cache_state):
    origin = ("Test GPU A", 9, 0, 132, 9, 19)
    with pytest.raises(ValueError, match="unknown backend 'cudnn'.*'graph' or 'legacy'"):
        distributed.sync(problems=[("cudnn", keys(1)[0][1])], origin=origin)
    with pytest.raises(ValueError, match="a key is the 47 ints conv_key"):
        distributed.sync(problems=[("graph", (1, 2, 3))], origin=origin)
    with pytest.raises(ValueError, match="a problem is \\(backend, key\\)"):
        distributed.sync(problems=[42], origin=origin)
    with pytest.raises(ValueError, match="origin must be"):
        distributed.sync(problems=[], origin=("GPU", 9))


def test_recorded_misses_are_empty_without_a_gpu_run(cache_state):
    distributed.clear_recorded_misses()
    assert distributed.recorded_misses() == []
    cudnn_cache.set_miss_policy("record")
    assert cudnn_cache.miss_policy() == "record"
    with pytest.raises(RuntimeError, match="'tune', 'heuristic', 'error', 'record' or 'nearest'"):
        cudnn_cache.set_miss_policy("later")


def test_import_refuses_bytes_that_are_not_a_checkpoint(cache_state):
    with pytest.raises(RuntimeError, match="rank 3.*not a cudnn_cache file"):
        torch.ops.cudnn_cache.import_entries(torch.zeros(100, dtype=torch.uint8), "rank 3")
    with pytest.raises(RuntimeError, match="1-D uint8"):
        torch.ops.cudnn_cache.import_entries(torch.zeros(3, dtype=torch.float32), "rank 3")
    assert cudnn_cache.size() == 0


# --- Shared files from Python ----------------------------------------------------------------------------------

def synthetic(entries, seed, name="Test GPU A"):
    testing_ops.add_synthetic_entries(entries, seed, name, [9, 0, 132, 9, 19])


def test_save_merges_with_the_file_and_replaces_only_when_asked(cache_state, tmp_path):
    path = tmp_path / "shared.cache"
    synthetic(20, 1)
    assert cudnn_cache.save(path) == 20
    cudnn_cache.clear()
    synthetic(5, 2, name="Test GPU B")
    assert cudnn_cache.save(path) == 25  # the file's 20 are kept
    assert cudnn_cache.size() == 5  # and this process's cache is unchanged
    assert cudnn_cache.save(path, merge=False) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.cache", "shared.cache.lock"]


def test_a_held_lock_times_out_naming_the_file(cache_state, tmp_path):
    path = tmp_path / "shared.cache"
    synthetic(3, 1)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another saver, as far as cudnn_cache can tell
        started = time.perf_counter()
        with pytest.raises(RuntimeError, match=f"'{path}'.*held its lock.*0.2 s.*lock_timeout"):
            cudnn_cache.save(path, lock_timeout=0.2)
        assert time.perf_counter() - started < 5
    assert not path.exists()
    assert cudnn_cache.save(path, lock_timeout=0) == 3  # released: granted at once


def test_persistent_saves_merged_with_what_others_saved_meanwhile(cache_state, tmp_path):
    path = tmp_path / "shared.cache"
    with cudnn_cache.persistent(path, prepare_plans=False):
        synthetic(10, 1)
        # Meanwhile another process saves into the same file.
        subprocess.run([sys.executable, "-c", "import sys, cudnn_cache, testing_ops; "
                        "testing_ops.add_synthetic_entries(7, 3, 'Test GPU B', [8, 0, 108, 9, 19]); "
                        "cudnn_cache.save(sys.argv[1])", str(path)], env={**os.environ, "PYTHONPATH": os.pathsep.join(
                            [str(pathlib.Path(cudnn_cache.__file__).parents[1]), str(pathlib.Path(__file__).parent),
                             os.environ.get("PYTHONPATH", "")])},
                       check=True, timeout=120)
    cudnn_cache.clear()
    assert cudnn_cache.load(path) == 17
