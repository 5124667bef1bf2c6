"""scripts/key_probe.py: its arguments, what it does per tuning (against a stand-in for cudnn_cache on the CPU),
and one small run on a GPU."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import key_probe  # noqa: E402

GROUPED = ["--input", "64,208,14,14", "--weight", "208,8,3,3", "--padding", "1,1", "--groups", "26",
           "--direction", "backward_filter"]


def test_the_convolution_gets_one_default_per_spatial_dimension_and_typed_tuning_options():
    args = key_probe.parse(GROUPED + ["--tuning", "exhaustive=1", "repetitions=9"])
    assert (args.stride, args.padding, args.dilation) == ((1, 1), (1, 1), (1, 1))
    assert args.tuning == {"exhaustive": True, "repetitions": 9}
    assert key_probe.parse(["--input", "2,4,8,8,8", "--weight", "8,4,3,3,3", "--direction", "forward"]).stride == \
        (1, 1, 1)
    assert key_probe.parse(GROUPED + ["--stride", "2"]).stride == (2, 2)  # one value for every dimension


@pytest.mark.parametrize("change, message", [
    (["--groups", "4"], "--groups 4: the input's 208 channels must be groups x the weight's 8"),
    (["--stride", "1,1,1"], "--stride (1, 1, 1): one value per spatial dimension (2)"),
    (["--weight", "208,8,3"], "of the same length"),
    (["--input", "64,208,14,x"], "'64,208,14,x' is not a comma-separated list of integers"),
    (["--tunings", "0"], "--tunings must be at least 1"),
    (["--tuning", "exhaustive"], "--tuning takes NAME=VALUE"),
])
def test_a_convolution_that_cannot_be_is_refused_before_anything_is_tuned(change, message, capsys):
    with pytest.raises(SystemExit) as refused:
        key_probe.parse(GROUPED + change)
    assert refused.value.code == 2
    assert message in capsys.readouterr().err


class StandIn:
    """cudnn_cache's calls the probe makes, recorded: each tuning stores the next of `stored`, and each audit
    times it at the next of `stored_us` against native picks at 100 us (resolution 0.5 us)."""

    def __init__(self, stored, stored_us):
        self.options = {"repetitions": 7, "exhaustive": False}
        self.stored, self.stored_us = list(stored), list(stored_us)
        self.calls = []

    def tuning_options(self):
        return dict(self.options)

    def set_tuning_options(self, **options):
        self.calls.append(("options", options))
        self.options.update(options)

    def clear(self):
        self.calls.append(("clear",))

    def tune(self):
        self.calls.append(("tune", dict(self.options)))
        self.current = self.stored.pop(0)

    def query(self, direction, key):
        self.calls.append(("query", direction, key))
        return [{"engine": self.current, "time_ms": 0.09}, {"engine": "engine 23", "time_ms": 0.1}]

    def audit(self):
        self.calls.append(("audit", self.options["repetitions"]))
        stored_ms = self.stored_us.pop(0) / 1e3
        return [{"direction": direction, "key": f"{direction}: a key", "stored_engine": self.current,
                 "stored_ms": stored_ms, "stored_again_ms": stored_ms + 0.0005, "heuristic_engine": "engine 30",
                 "heuristic_ms": 0.3, "benchmark_engine": "engine 23", "benchmark_ms": 0.1}
                for direction in key_probe.DIRECTIONS]


def test_each_tuning_starts_from_a_fresh_cache_and_each_audit_is_judged_as_the_bench_judges_it():
    cache = StandIn(["engine 20", "engine 23"], [150.0, 120.0, 99.0, 100.2])
    args = key_probe.parse(GROUPED + ["--tunings", "2", "--audit-rounds", "21", "--tuning", "exhaustive=1"])
    result = key_probe.probe(cache, cache.tune, (1, 2, 3), args)
    tunes = [call for call in cache.calls if call[0] == "tune"]
    assert len(tunes) == 2 and all(call[1]["exhaustive"] and call[1]["repetitions"] == 7 for call in tunes)
    assert [call for call in cache.calls if call[0] == "audit"] == [("audit", 21)] * 4
    assert cache.calls.count(("clear",)) == 2 and cache.calls.count(("query", "backward_filter", (1, 2, 3))) == 2
    assert cache.options == {"repetitions": 7, "exhaustive": False}  # put back afterwards
    first, second = result["tunings"]
    assert [audit["slower_than_native"] for audit in first["audits"]] == [True, True]  # 1.5x, 1.2x of 100 us
    assert [audit["slower_than_native"] for audit in second["audits"]] == [False, False]  # 0.99x, 1.002x
    assert first["audits"][0]["stored_us"] == pytest.approx(150.25)
    assert first["audits"][0]["stored_over_better_native"] == pytest.approx(1.5025)
    assert first["ranking"][0] == {"engine": "engine 20", "time_us": pytest.approx(90.0)}
    assert result["stored_engines"] == {"engine 20": 1, "engine 23": 1}
    assert (result["audits_slower"], result["audits"], result["tunings_slower_in_every_audit"]) == (2, 4, 1)
    text = key_probe.table(result)
    assert "| 1 |" in text and "| engine 20 | 150.25 |" in text and "| yes |" in text and "| no |" in text
    assert text.endswith("backward_filter: stored engine 20 x1, engine 23 x1; 2 of 4 audits found the stored "
                         "config slower than native; 1 of 2 tunings slower in every audit")


def test_the_tunings_take_their_own_repetitions_and_the_audits_theirs():
    cache = StandIn(["engine 20"], [100.0])
    args = key_probe.parse(GROUPED + ["--tunings", "1", "--audit-repeats", "1", "--tuning", "repetitions=9"])
    key_probe.probe(cache, cache.tune, (1,), args)
    assert [call[1]["repetitions"] for call in cache.calls if call[0] == "tune"] == [9]
    assert [call for call in cache.calls if call[0] == "audit"] == [("audit", 21)]
    assert cache.options == {"repetitions": 7, "exhaustive": False}


def test_options_are_put_back_when_a_tuning_fails():
    cache = StandIn([], [])
    args = key_probe.parse(GROUPED + ["--tuning", "exhaustive=1"])
    with pytest.raises(IndexError):
        key_probe.probe(cache, cache.tune, (1,), args)
    assert cache.options == {"repetitions": 7, "exhaustive": False}


@pytest.mark.gpu
def test_a_small_grouped_convolution_probed_on_the_gpu(child_env, tmp_path):
    output = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "key_probe.py"), "--input", "8,16,10,10",
                           "--weight", "16,4,3,3", "--padding", "1,1", "--groups", "4", "--direction",
                           "backward_filter", "--tunings", "2", "--audit-repeats", "2", "--audit-rounds", "3",
                           "--json", str(output)], env=child_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(output.read_text())
    assert result["direction"] == "backward_filter" and len(result["tunings"]) == 2 and result["audits"] == 4
    for tuning in result["tunings"]:
        assert tuning["ranking"] and tuning["ranking"][0]["time_us"] > 0 and len(tuning["audits"]) == 2
        for audit in tuning["audits"]:
            assert audit["stored_engine"].split()[:2] == tuning["ranking"][0]["engine"].split()[:2]  # engine N
            assert audit["stored_us"] > 0 and audit["heuristic_us"] > 0 and audit["benchmark_us"] > 0
    assert sum(result["stored_engines"].values()) == 2
    assert result["convolution"]["groups"] == 4 and "backward_filter: stored " in done.stdout
