"""--shard I/N (tests/python/conftest.py): the GPU suite split between processes that run at once, as
scripts/gpu_check.sh runs it. Every test runs in exactly one shard."""
import subprocess
import sys

from conftest import ROOT

TESTS = "tests/python/test_bad_input.py"  # many tests, cheap to collect


def collected(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", TESTS, "--collect-only", "-q", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ids(result: subprocess.CompletedProcess) -> list:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


test_ids.__test__ = False  # a helper, not a test


def test_shards_split_the_collection_without_loss_or_overlap():
    everything = test_ids(collected())
    shards = [test_ids(collected("--shard", f"{index}/3")) for index in range(3)]
    assert len(everything) > 30
    assert sorted(sum(shards, [])) == sorted(everything)  # each test in exactly one shard
    assert all(abs(len(shard) - len(everything) / 3) <= 1 for shard in shards)  # every third, so balanced
    assert shards[0][:2] == [everything[0], everything[3]]


def test_a_bad_shard_is_refused_naming_the_option_and_the_form():
    for value in ("3/3", "1", "a/b", "-1/2", "1/0"):
        result = collected(f"--shard={value}")
        assert result.returncode == 4, (value, result.stdout, result.stderr)  # pytest's usage error
        assert f"--shard '{value}': expected I/N with 0 <= I < N" in result.stderr
