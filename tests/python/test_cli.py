"""python -m cudnn_cache end to end, in child processes: every command, its output and its exit code, on
synthetic cache files (no GPU needed); a JSON export edited by hand makes the conflicting file."""

import json
import subprocess
import sys

import pytest


@pytest.fixture
def files(tool, tmp_path):
    """Two synthetic files: b holds a's 30 entries and 10 more."""
    a, b = tmp_path / "a.cache", tmp_path / "b.cache"
    for path, entries in ((a, 30), (b, 40)):
        assert tool("synth", path, "--entries", entries, "--seed", 5).returncode == 0
    return a, b


def test_help_lists_every_command_and_the_exit_codes(cli):
    result = cli("--help")
    assert result.returncode == 0
    for command in ("inspect", "validate", "stats", "diff", "merge", "export", "import"):
        assert command in result.stdout
    assert "Exit codes: 0 success" in result.stdout and "3 a file is missing" in result.stdout


def test_usage_errors_exit_2(cli, files):
    assert cli().returncode == 2
    assert cli("bogus").returncode == 2
    assert cli("merge", *files).returncode == 2  # no -o
    assert cli("export", files[0]).returncode == 2  # no --json


def test_validate_and_inspect_and_stats(cli, files, tmp_path):
    a, b = files
    result = cli("validate", a, b)
    assert result.returncode == 0, result.stderr
    assert f"{a}: valid, 30 entries for 1 device/cuDNN origin(s); file format 6" in result.stdout
    assert f"{b}: valid, 40 entries" in result.stdout

    table = cli("inspect", a)
    assert table.returncode == 0 and table.stdout.startswith("direction")
    assert len(table.stdout.splitlines()) == 30 + 2  # header, entries, summary

    stats = cli("stats", b)
    assert stats.returncode == 0 and "legacy forward" in stats.stdout and "stored plans 0 (0 B)" in stats.stdout


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated"])
def test_a_bad_file_exits_3_with_the_reason(cli, files, tmp_path, damage):
    path = tmp_path / "bad.cache"
    if damage == "garbage":
        path.write_text("not a cache\n")
    elif damage == "truncated":
        path.write_bytes(files[0].read_bytes()[:100])
    result = cli("validate", files[0], path)
    assert result.returncode == 3
    assert f"{files[0]}: valid" in result.stdout
    reason = {"missing": "cannot read", "garbage": "wrong magic", "truncated": "truncated"}[damage]
    assert f"{path}: invalid" in result.stderr and reason in result.stderr
    for command in (("inspect", path), ("stats", path), ("diff", files[0], path), ("export", path, "--json")):
        assert cli(*command).returncode == 3


def test_diff_exits_0_for_the_same_entries_and_1_otherwise(cli, files):
    a, b = files
    same = cli("diff", a, a)
    assert same.returncode == 0 and "0 only in" in same.stdout and "30 the same" in same.stdout
    different = cli("diff", a, b)
    assert different.returncode == 1
    assert sum(line.startswith("> ") for line in different.stdout.splitlines()) == 10
    assert f"0 only in {a}, 10 only in {b}, 0 with another best, 30 the same" in different.stdout


def test_json_export_and_import_round_trip(cli, files, tmp_path):
    a = files[0]
    exported = cli("export", a, "--json")
    assert exported.returncode == 0
    document = json.loads(exported.stdout)
    assert document["format_version"] == 6 and len(document["sections"]) == 1
    assert cli("export", a, "--json", "-o", tmp_path / "a.json").returncode == 0
    assert json.loads((tmp_path / "a.json").read_text()) == document

    imported = cli("import", "--json", tmp_path / "a.json", "-o", tmp_path / "back.cache")
    assert imported.returncode == 0 and "wrote 30 entries" in imported.stdout
    assert cli("diff", a, tmp_path / "back.cache").returncode == 0

    (tmp_path / "broken.json").write_text(exported.stdout[: len(exported.stdout) // 2])
    broken = cli("import", tmp_path / "broken.json", "-o", tmp_path / "never.cache")
    assert broken.returncode == 3 and "not a valid cudnn_cache JSON export" in broken.stderr
    assert not (tmp_path / "never.cache").exists()


def test_merge_keeps_the_faster_best_and_reports_the_conflict(cli, files, tmp_path):
    a, b = files
    # A copy of a in which one legacy forward entry's runner-up became much faster: another best. The fields
    # are swapped in place: cereal writes a class's version once, at its first object, which must stay first.
    document = json.loads(cli("export", a, "--json").stdout)
    section = document["sections"][0]
    entry = next(e for e in section["legacy_forward"] if len(e["ranking"]["candidates"]) > 1)
    first, second = entry["ranking"]["candidates"][:2]
    fields = ("algorithm", "status", "time_ms", "workspace_bytes", "determinism", "math_type")
    for field in fields:
        first[field], second[field] = second[field], first[field]
    first["time_ms"] = 0.0
    second["time_ms"] = max(second["time_ms"], 0.0)
    (tmp_path / "edited.json").write_text(json.dumps(document))
    assert cli("import", tmp_path / "edited.json", "-o", tmp_path / "edited.cache").returncode == 0

    merged = cli("merge", a, b, tmp_path / "edited.cache", "-o", tmp_path / "merged.cache")
    assert merged.returncode == 0, merged.stderr
    conflicts = [line for line in merged.stdout.splitlines() if line.startswith("conflict: ")]
    assert len(conflicts) == 1 and "legacy forward" in conflicts[0]
    assert "wrote 40 entries" in merged.stdout and "1 conflicts" in merged.stdout
    # The merged file's best for that key is the faster (edited) one.
    best = cli("diff", tmp_path / "edited.cache", tmp_path / "merged.cache")
    assert "0 with another best" in best.stdout


@pytest.fixture
def pending_file(cli, files, tmp_path):
    """a.cache with one pending key of the graph API (a legacy entry's key, which no graph entry holds), made
    by editing its JSON export as a person would."""
    exported = cli("export", files[0], "--json")
    assert exported.returncode == 0, exported.stderr
    document = json.loads(exported.stdout)
    section = document["sections"][0]
    key = section["legacy_forward"][1]["key"]  # not the first key: that one carries the class versions
    assert all(entry["key"] != key for entry in section["graph_forward"])
    section["pending_graph"] = [key]
    edited = tmp_path / "pending.json"
    edited.write_text(json.dumps(document, indent=4))
    path = tmp_path / "pending.cache"
    result = cli("import", edited, "-o", path)
    assert result.returncode == 0, result.stderr
    return path, key


def test_pending_keys_are_listed_and_survive_load_save_and_merge(cli, pending_file, files, tmp_path, cache_state):
    """Note [Pending keys]: a file's pending keys are the process's after a load, are saved again, and are kept
    by merge; the summary and stats count them."""
    path, key = pending_file
    assert "; 1 pending keys" in cli("validate", path).stdout
    assert "pending keys 1 graph, 0 legacy" in cli("stats", path).stdout
    from cudnn_cache import distributed

    cache_state.load(str(path))
    [(origin, backend, pending)] = distributed.recorded_misses()
    assert backend == "graph" and pending[0] == key["direction"]
    saved = tmp_path / "saved.cache"
    cache_state.save(str(saved), merge=False)
    assert "; 1 pending keys" in cli("validate", saved).stdout
    merged = tmp_path / "merged.cache"
    assert cli("merge", files[1], saved, "-o", merged).returncode == 0
    assert "; 1 pending keys" in cli("validate", merged).stdout
    cache_state.clear()  # clear() forgets pending keys with the entries
    assert distributed.recorded_misses() == []


def test_tune_without_a_gpu_exits_4_and_leaves_the_file_as_it_was(child_env, pending_file, tmp_path):
    path, _ = pending_file
    before = path.read_bytes()
    # No GPU is visible to the child, on any machine (tests/python/test_ops_gpu.py tunes with one).
    result = subprocess.run([sys.executable, "-m", "cudnn_cache", "tune", str(path)],
                            env={**child_env, "CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 4, result.stderr
    assert "no CUDA GPU here to time" in result.stderr and "1 pending keys" in result.stderr
    assert path.read_bytes() == before


def test_tune_refuses_a_missing_file_and_bad_options(cli, tmp_path):
    missing = cli("tune", tmp_path / "missing.cache")
    assert missing.returncode == 3 and "missing.cache" in missing.stderr
    assert cli("tune", tmp_path / "missing.cache", "--max-seconds", "-1").returncode == 2
    assert cli("tune", tmp_path / "missing.cache", "--max-seconds", "soon").returncode == 2


def test_tune_pending_refuses_a_negative_time(cache_state):
    with pytest.raises(ValueError, match="max_seconds must be a number of seconds >= 0"):
        cache_state.tune_pending(max_seconds=-1)
