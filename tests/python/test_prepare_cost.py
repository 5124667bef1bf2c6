"""scripts/prepare_cost.py on the CPU: how it reads each plan's build time from a child's debug log. (Its
figures need a GPU; the parsing is the same.)"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import prepare_cost  # noqa: E402

LOG = """\
cudnn_cache [info] loaded 2 entries
== prepare
cudnn_cache [debug] plan built in 12.5 ms (11.25 ms of it heuristics' list): engine 7 (k3=2) as heuristics' config #0 for forward x=[7,3,32,32]
cudnn_cache [debug] plan built in 0.5 ms: engine 7 (k3=4) for backward_data x=[7,3,32,32]
cudnn_cache [debug] plan restored: engine 41 runtime-compiled for backward_filter x=[7,3,32,32]
cudnn_cache [debug] plan built in 30.25 ms: engine -2 for backward_filter x=[7,64,32,32]
== again
cudnn_cache [debug] plan built in 0.75 ms (0.5 ms of it heuristics' list): engine 7 (k3=2) as heuristics' config #0 for forward x=[7,3,32,32]
"""


def test_plan_times_sum_each_engines_builds_and_heuristics_time_per_phase_slowest_first():
    times = prepare_cost.plan_times(LOG)
    assert times == {"prepare": {"-2": [1, 30.25, 0.0], "7": [2, 13.0, 11.25]}, "again": {"7": [1, 0.75, 0.5]}}
    assert list(times["prepare"]) == ["-2", "7"]  # the slowest engine first


def test_lines_before_the_first_phase_count_nowhere():
    assert prepare_cost.plan_times("cudnn_cache [debug] plan built in 3.0 ms: engine 1 for forward\n") == {}
