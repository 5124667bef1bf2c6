"""The benchmarks' one entry point, python3 -m benchmarks: it lists every subcommand, and each one's --help runs
(its module imports and its parser builds) without a GPU."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUBCOMMANDS = ("models", "dynamic", "distributed", "remote", "core", "real-workloads", "host-cost",
               "compare-kernels")


def benchmarks(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *arguments], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_help_lists_every_subcommand():
    done = benchmarks("--help")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.split("subcommands:\n")[1].splitlines() if line.strip()]
    assert listed == list(SUBCOMMANDS)


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_each_subcommands_help_runs(subcommand):
    done = benchmarks(subcommand, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python3 -m benchmarks {subcommand} ")


def test_an_unknown_subcommand_exits_2_and_lists_them():
    done = benchmarks("bench")
    assert done.returncode == 2 and "unknown subcommand 'bench'" in done.stderr and "host-cost" in done.stderr
