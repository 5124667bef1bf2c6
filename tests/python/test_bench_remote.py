"""The remote store benchmark's report from synthetic results: each target met and missed (its cases run in
test_remote.py against a real server)."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import remote as bench_remote  # noqa: E402


def results(pull_ms, lost=0, not_fastest=0, extra=0, gap_ms=None, remote_tunes=0):
    out = {"environment": {"date": "2026-12-02", "machine": "x86_64 CPU, 2 cores", "redis": "7.0.15"},
           "targets": bench_remote.TARGETS}
    if gap_ms is None:
        out["cpu"] = {"push_new": {"seconds": 1.5, "entries": 10000, "stored": 10000, "unchanged": 0},
                      "push_again": {"seconds": 0.1, "entries": 10000, "stored": 0, "unchanged": 10000},
                      "pull": {"ms": {"median": pull_ms, "lo": pull_ms - 1, "hi": pull_ms + 1}, "entries": 10000,
                               "refused": 0},
                      "writers": {"writers": 16, "entries_each": 1000, "seconds": 4.0, "retries": 12, "stored": 16000,
                                  "lost": lost, "extra": extra, "not_fastest": not_fastest}}
    else:
        out["gpu"] = {"workload": "ResNet-50 fp32 bs32", "entries": 159, "gap_ms": gap_ms,
                      "gap_interval_ms": {"median": gap_ms, "lo": gap_ms - 5, "hi": gap_ms + 5},
                      "local": {"warm_start_ms": 300.0, "entries_ms": 20.0, "tunes": 0},
                      "remote": {"warm_start_ms": 300.0 + gap_ms, "entries_ms": 40.0, "tunes": remote_tunes}}
    return out


@pytest.mark.parametrize("case, all_met, missed", [
    (results(80.0), True, []),
    (results(120.0), False, ["pull"]),
    (results(80.0, lost=1), False, ["writers"]),
    (results(80.0, not_fastest=2), False, ["writers"]),
    (results(80.0, extra=1), False, []),
    (results(80.0, gap_ms=30.0), True, []),
    (results(80.0, gap_ms=70.0), False, ["remote store alone"]),
    (results(80.0, gap_ms=10.0, remote_tunes=3), False, []),
])
def test_the_report_judges_each_target(case, all_met, missed):
    table = bench_remote.report(case)
    assert case["all_met"] is all_met
    missed_rows = [line for line in table.splitlines() if line.endswith("| missed |")]
    assert len(missed_rows) == len(missed) and all(word in row for word, row in zip(missed, missed_rows))
    if "cpu" in case:
        pull = case["cpu"]["pull"]["ms"]["median"]
        assert f"| pull 10000 entries | {pull:.0f} ms [{pull - 1:.0f}, {pull + 1:.0f}] | <= 100 ms |" in table
