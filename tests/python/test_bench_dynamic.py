"""scripts/bench_dynamic.py without a GPU: the epochs of both workloads, and the tables and targets from
synthetic results (a met and a missed target each, a failed case, a run cut short)."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_dynamic  # noqa: E402


@pytest.mark.parametrize("workload", bench_dynamic.WORKLOADS)
def test_an_epoch_is_24_distinct_sizes_in_a_fixed_random_order_then_a_smaller_last_batch(workload):
    epoch = bench_dynamic.shapes(workload)
    assert epoch == bench_dynamic.shapes(workload)  # the same in every process
    assert len(epoch) == 25 and len({size for _, size in epoch}) == 24 and len(set(epoch)) == 25
    assert all(batch == bench_dynamic.BATCH for batch, _ in epoch[:-1]) and epoch[-1][0] == bench_dynamic.LAST_BATCH
    sizes = [size for _, size in epoch[:-1]]
    assert sizes != sorted(sizes)
    if workload == "detection":
        assert all(480 <= side <= 800 and side % 32 == 0 for size in sizes for side in size)
    else:
        assert all(len(size) == 1 and 16000 <= size[0] <= 80000 for size in sizes)
    middle = bench_dynamic.middle(epoch)
    assert middle in epoch and middle[0] == bench_dynamic.BATCH


def case(mode, epoch1, epoch2, gpu, wall=None, **extra):
    """A synthetic result: steady GPU (and wall) ms per shape."""
    steady = [{"batch": 8, "size": [i], "gpu_ms": g, "wall_ms": (wall or gpu)[i]} for i, g in enumerate(gpu)]
    result = {"workload": "audio", "mode": mode, "epoch1": {"total_s": epoch1, "slowest_ms": 900.0},
              "epoch2": {"total_s": epoch2, "slowest_ms": 10.0}, "steady": steady}
    result.update(extra)
    return result


def test_the_targets_are_judged_from_the_cases():
    shapes = 8
    stats = {"misses": 50, "tunes": 0, "lent": 40, "fallbacks": 0}
    results = [
        case("native_heuristic", 2.0, 1.9, [1.2] * shapes),
        case("native_benchmark", 20.0, 1.6, [1.0] * shapes),
        case("cache_nearest", 2.06, 1.9, [1.0] * shapes, steady_lent=[{"gpu_ms": 1.1, "wall_ms": 1.1}] * shapes,
             epoch3={"total_s": 1.6}, tune_pending_s=12.0, seed_s=2.5, stats_epochs=stats),
        case("cache_next", 1.7, 1.6, [1.0] * (shapes - 1) + [1.05], load_prepare_s=0.2),
    ]
    table, targets = bench_dynamic.report(results, {"date": "2026-12-01", "device": "GPU", "torch": "2.11",
                                                   "cudnn": 91900})
    verdicts = {t["target"]: t["verdict"] for t in targets["audio"]}
    assert verdicts["nearest epoch 1 / native_heuristic epoch 1"] == "met"  # 1.03
    assert verdicts["nearest epoch 1 / native_benchmark epoch 1"] == "met"  # 0.103
    assert verdicts["next process, worst shape's GPU time / native_benchmark's"] == "MISSED"  # 1.05
    assert verdicts["next process, epoch 1 / native_heuristic epoch 1 (no tuning stall)"] == "met"
    assert "| cache_nearest | 2.06 / 1.90 / 1.60 |" in table
    assert "lent 40" in table and "seed step 2.50 s" in table and "tune_pending 12.00 s" in table and "load+prepare 0.20 s" in table
    assert "| cache_nearest, lent (epoch 2) | | | 1.100" in table


def test_a_failed_or_missing_case_leaves_its_targets_unjudged(tmp_path):
    results = [case("native_heuristic", 2.0, 1.9, [1.2] * 6),
               {"workload": "audio", "mode": "native_benchmark", "error": "Traceback\nRuntimeError: boom\n"}]
    environment = {"date": "2026-12-01", "device": "GPU", "torch": "2.11", "cudnn": 91900}
    out = tmp_path / "dynamic.json"
    table = bench_dynamic.write(results, environment, out)
    assert "| native_benchmark | failed: RuntimeError: boom |" in table
    written = json.loads(out.read_text())
    assert written["results"] == results and out.with_suffix(".md").read_text() == table + "\n"
    judged = [t for t in written["targets"]["audio"] if t["verdict"] != "-"]
    assert judged == []


def test_cache_next_needs_cache_nearest_and_no_gpu_exits_2(capsys):
    with pytest.raises(SystemExit) as refused:
        bench_dynamic.main(["--modes", "native_heuristic", "cache_next"])
    assert refused.value.code == 2 and "cache_next loads the file cache_nearest saves" in capsys.readouterr().err
    if not bench_dynamic.torch.cuda.is_available():
        assert bench_dynamic.main(["--modes", "native_heuristic"]) == 2
