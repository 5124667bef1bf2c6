"""cudnn_cache_tool end to end: synth writes valid files, and validate rejects every damaged one cleanly (exit 3, as
python -m cudnn_cache; tests/python/test_command_lines.py holds the two to the same answers)."""

import random
import subprocess

import pytest


def run_tool(build_dir, *args):
    return subprocess.run([str(build_dir / "cudnn_cache_tool"), *map(str, args)], capture_output=True, text=True)


def assert_rejected(result, path):
    """Exit 3 (never a signal or abort), one line on stderr that names the file and a reason."""
    assert result.returncode == 3, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0]
    assert any(word in lines[0] for word in ("truncated", "corrupt", "wrong magic", "newer")), lines[0]


@pytest.fixture(scope="module")
def synth_file(build_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("tool") / "cache.bin"
    result = run_tool(build_dir, "synth", path, "--entries", 1000)
    assert result.returncode == 0, result.stderr
    return path


def test_synth_then_validate(build_dir, synth_file):
    result = run_tool(build_dir, "validate", synth_file)
    assert result.returncode == 0, result.stderr
    assert "1000 entries" in result.stdout


def test_inspect_lists_every_entry(build_dir, synth_file):
    result = run_tool(build_dir, "inspect", synth_file)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["direction", "input", "weight", "output"]
    assert len(lines) == 1 + 1000 + 1
    directions = {line.split()[0] for line in lines[1:-1]}
    assert directions == {"forward", "backward_data", "backward_filter"}


def test_every_truncation_of_a_small_file_is_rejected(build_dir, tmp_path):
    source = tmp_path / "small.bin"
    assert run_tool(build_dir, "synth", source, "--entries", 3).returncode == 0
    data = source.read_bytes()
    damaged = tmp_path / "damaged.bin"
    for length in range(len(data)):
        damaged.write_bytes(data[:length])
        assert_rejected(run_tool(build_dir, "validate", damaged), damaged)


def test_truncations_and_bit_flips_of_a_large_file_are_rejected(build_dir, synth_file, tmp_path):
    data = synth_file.read_bytes()
    rng = random.Random(2026)
    damaged = tmp_path / "damaged.bin"
    for _ in range(100):
        damaged.write_bytes(data[: rng.randrange(len(data))])
        assert_rejected(run_tool(build_dir, "validate", damaged), damaged)
    for _ in range(200):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        damaged.write_bytes(flipped)
        assert_rejected(run_tool(build_dir, "validate", damaged), damaged)


def test_usage_errors_exit_2(build_dir, tmp_path):
    assert run_tool(build_dir).returncode == 2
    assert run_tool(build_dir, "frobnicate").returncode == 2
    assert run_tool(build_dir, "synth", tmp_path / "x.bin").returncode == 2
    assert run_tool(build_dir, "synth", tmp_path / "x.bin", "--entries", "many").returncode == 2
    assert not (tmp_path / "x.bin").exists()


def test_missing_file_names_the_path(build_dir, tmp_path):
    missing = tmp_path / "nope.bin"
    result = run_tool(build_dir, "validate", missing)
    assert result.returncode == 3
    assert str(missing) in result.stderr and "No such file" in result.stderr
    assert result.stdout == ""  # the verdict is printed after the file was read, never before


@pytest.mark.parametrize("command", ["inspect", "validate", "stats", "diff", "merge", "export", "import", "synth"])
def test_every_command_has_its_own_help(build_dir, command):
    for args in ((command, "--help"), (command, "-h"), ("help", command), (command, "x.bin", "--help")):
        result = run_tool(build_dir, *args)
        assert result.returncode == 0 and result.stderr == "", (args, result.stderr)
        assert result.stdout.startswith(f"usage: cudnn_cache_tool {command} "), (args, result.stdout)
        assert "exit codes:" in result.stdout
    listing = run_tool(build_dir, "--help").stdout
    assert all(f"  {name} " in listing for name in ("inspect", "validate", "stats", "diff", "merge", "export",
                                                     "import", "synth"))
    assert "build-plans" not in listing
