"""The dynamic-shape benchmark (python3 -m benchmarks dynamic) without a GPU: the epochs of both workloads, and the
targets and tables from synthetic results (a met and a missed target each, a failed case, the memory case)."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import dynamic as bench_dynamic  # noqa: E402

ENVIRONMENT = {"date": "2026-12-01", "device": "GPU", "torch": "2.11", "cudnn": 91900}


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


def case(mode, epoch1, epoch2, **extra):
    return {"workload": "audio", "mode": mode, "epoch1": {"total_s": epoch1, "slowest_ms": 900.0},
            "epoch2": {"total_s": epoch2, "slowest_ms": 10.0}, **extra}


def test_the_targets_are_judged_from_the_cases(tmp_path):
    paired = [{"ratios": [0.99, 1.01, 0.98, 0.99, 1.0, 0.97]}] * 7 + [{"ratios": [1.01, 1.02, 1.005, 1.01, 1.03, 1.01]}]
    results = [case("native_heuristic", 2.0, 1.9), case("native_benchmark", 20.0, 1.6),
               case("cache_nearest", 2.06, 1.9, epoch3={"total_s": 1.6}), case("cache_next", 1.7, 1.6, steady_paired=paired)]
    table = bench_dynamic.write(results, ENVIRONMENT, [tmp_path / "dynamic.json"])
    targets = {t["target"]: t for t in json.loads((tmp_path / "dynamic.json").read_text())["targets"]["audio"]}
    assert targets["nearest epoch 1 / native_heuristic epoch 1"]["verdict"] == "met"  # 1.03
    assert targets["nearest epoch 1 / native_benchmark epoch 1"]["value"] == pytest.approx(0.103)
    worst = targets["next process, worst shape: median of its per-round GPU time ratios to native_benchmark's, side by "
                    "side in one process"]
    assert worst["value"] == pytest.approx(1.01) and worst["verdict"] == "MISSED"
    slower = targets["next process, shapes slower than native_benchmark in every round side by side"]
    assert (slower["value"], slower["verdict"]) == (1, "MISSED")
    assert targets["next process, epoch 1 / native_heuristic epoch 1 (no tuning stall)"]["verdict"] == "met"
    # The table is the PERFORMANCE.md section's: a row per mode, then the targets.
    assert "| audio | cache_nearest | 2.06 s | 1.90 s | 900 ms |" in table
    assert "| audio | nearest epoch 1 / native_heuristic epoch 1 | 1.030 | 1.05 | met |" in table
    assert (tmp_path / "dynamic.md").read_text() == table + "\n"


def test_a_failed_or_missing_case_leaves_its_targets_unjudged(tmp_path):
    results = [case("native_heuristic", 2.0, 1.9),
               {"workload": "audio", "mode": "native_benchmark", "error": "Traceback\nRuntimeError: boom\n"}]
    table = bench_dynamic.write(results, ENVIRONMENT, [tmp_path / "dynamic.json"])
    assert "| audio | native_benchmark | failed |" in table
    written = json.loads((tmp_path / "dynamic.json").read_text())
    assert written["results"] == results
    assert [t["verdict"] for t in written["targets"]["audio"]] == ["-", "-"]  # the next process's: no data


def test_cache_next_needs_cache_nearest_and_no_gpu_exits_2(capsys):
    with pytest.raises(SystemExit) as refused:
        bench_dynamic.main(["--modes", "native_heuristic", "cache_next"])
    assert refused.value.code == 2 and "cache_next loads the file cache_nearest saves" in capsys.readouterr().err
    if not bench_dynamic.torch.cuda.is_available():
        assert bench_dynamic.main(["--modes", "native_heuristic"]) == 2


def test_the_memory_sizes_are_1000_distinct_and_fixed():
    sizes = bench_dynamic.memory_sizes()
    assert sizes == bench_dynamic.memory_sizes() and len(set(sizes)) == bench_dynamic.MEMORY_SHAPES == 1000
    assert all(64 <= side < 192 and side % 4 == 0 for size in sizes for side in size) and sizes != sorted(sizes)


def memory_case(mode, resident, plans=None, limit=None):
    samples = []
    for i, mib in enumerate(resident, 1):
        sample = {"shapes": 100 * i, "seconds": 3.0 * i, "resident_mib": mib, "reserved_mib": 40.0}
        if plans is not None:
            sample["plans_in_memory"] = plans[i - 1]
        samples.append(sample)
    return {"workload": "memory", "mode": mode, "samples": samples, **({"plan_limit": limit} if limit else {})}


@pytest.mark.parametrize("cache_resident,cache_plans,verdicts", [
    ([1000 + i for i in range(10)], [500, 900, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000], ["met", "met"]),
    ([1000 + 9 * i for i in range(10)], [500, 900, 1001] + [1000] * 7, ["MISSED", "MISSED"]),
])
def test_the_memory_targets_compare_growth_with_native_and_plans_with_the_bound(cache_resident, cache_plans,
                                                                                verdicts, tmp_path):
    native = memory_case("native_heuristic", [900 + 5 * i for i in range(10)])
    cache = memory_case("cache_nearest", cache_resident, cache_plans, limit=1000)
    table = bench_dynamic.write([native, cache], ENVIRONMENT, [tmp_path / "dynamic_memory.json"])
    targets = json.loads((tmp_path / "dynamic_memory.json").read_text())["targets"]["memory"]
    assert [t["verdict"] for t in targets] == verdicts
    assert targets[1]["value"] == pytest.approx((cache_resident[-1] - cache_resident[4]) - 25.0)
    assert "| plans in memory at any sample / the plan cache's bound |" in table
