"""One table of cases, run through both command lines: python -m cudnn_cache and the C++ cudnn_cache_tool (for
machines without Python) give the same exit code, the same stdout and the same stderr, the program's name aside,
and leave the same files. Help texts are each command line's own; `tune`, `remote` and `run` need Python (and a
GPU or Redis) and are the Python command line's alone."""
import subprocess
import sys

import pytest

PYTHON = "python -m cudnn_cache"
TOOL = "cudnn_cache_tool"

# (id, arguments, exit code). Names in the arguments: good.cache (3 synthetic entries), other.cache (5, seed 2),
# junk.cache (not a cache file), export.json (good.cache's export), missing.cache (does not exist), out (a file
# each case may write: compared after the run), no/ (a missing folder).
CASES = [
    ("inspect", ["inspect", "good.cache"], 0),
    ("validate", ["validate", "good.cache"], 0),
    ("validate_many", ["validate", "good.cache", "junk.cache", "other.cache"], 3),
    ("validate_missing", ["validate", "missing.cache"], 3),
    ("stats", ["stats", "other.cache"], 0),
    ("diff_same", ["diff", "good.cache", "good.cache"], 0),
    ("diff_different", ["diff", "good.cache", "other.cache"], 1),
    ("diff_junk", ["diff", "good.cache", "junk.cache"], 3),
    ("merge", ["merge", "good.cache", "other.cache", "-o", "out"], 0),
    ("merge_long_option", ["merge", "good.cache", "--output=out"], 0),
    ("merge_junk", ["merge", "good.cache", "junk.cache", "-o", "out"], 3),
    ("merge_missing_folder", ["merge", "good.cache", "-o", "no/out"], 3),
    ("export", ["export", "good.cache", "--json"], 0),
    ("export_to_file", ["export", "other.cache", "--json", "-o", "out"], 0),
    ("import", ["import", "export.json", "-o", "out"], 0),
    ("import_flag", ["import", "--json", "export.json", "-o", "out"], 0),
    ("import_junk", ["import", "good.cache", "-o", "out"], 3),
    ("synth", ["synth", "out", "--entries", "4", "--seed", "9"], 0),
    ("synth_missing_folder", ["synth", "no/out", "--entries", "4"], 3),
    # usage errors: exit 2, one line, nothing written
    ("no_command", [], 2),
    ("validate_nothing", ["validate"], 2),
    ("inspect_two", ["inspect", "good.cache", "other.cache"], 2),
    ("unknown_option", ["stats", "--frob", "good.cache"], 2),
    ("export_without_json", ["export", "good.cache"], 2),
    ("merge_without_output", ["merge", "good.cache"], 2),
    ("output_without_value", ["merge", "good.cache", "-o"], 2),
    ("synth_without_entries", ["synth", "out"], 2),
    ("synth_bad_count", ["synth", "out", "--entries", "ten"], 2),
    ("synth_negative_count", ["synth", "out", "--entries", "-1"], 2),
    ("synth_too_many", ["synth", "out", "--entries", "99999999999999"], 2),
    ("synth_bad_seed", ["synth", "out", "--entries", "1", "--seed", "x"], 2),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, build_dir):
    """The inputs of the cases, made once (by the tool, whose synth the table checks against Python's)."""
    path = tmp_path_factory.mktemp("command_lines")
    tool = str(build_dir / "cudnn_cache_tool")
    for name, entries, seed in (("good.cache", 3, 1), ("other.cache", 5, 2)):
        subprocess.run([tool, "synth", name, "--entries", str(entries), "--seed", str(seed)], cwd=path, check=True,
                       capture_output=True)
    (path / "junk.cache").write_bytes(b"not a cache file\n")
    subprocess.run([tool, "export", "good.cache", "--json", "-o", "export.json"], cwd=path, check=True)
    return path


def run(command, args, folder, env=None):
    """(exit code, stdout, stderr with the program's name as PROGRAM, the bytes `out` holds after, or None)."""
    out = folder / "out"
    out.unlink(missing_ok=True)
    done = subprocess.run([*command, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    program = PYTHON if command[0] == sys.executable else TOOL
    return done.returncode, done.stdout, done.stderr.replace(program, "PROGRAM"), \
        out.read_bytes() if out.exists() else None


@pytest.fixture
def both(folder, build_dir, child_env):
    """args -> (python -m cudnn_cache's result, cudnn_cache_tool's), each as run() gives it."""
    return lambda args: (run([sys.executable, "-m", "cudnn_cache"], args, folder, child_env),
                         run([str(build_dir / "cudnn_cache_tool")], args, folder))


@pytest.mark.parametrize("args, code", [pytest.param(a, c, id=i) for i, a, c in CASES])
def test_both_command_lines_answer_alike(args, code, both):
    python, tool = both(args)
    assert python[0] == code, python
    assert tool[0] == code, tool
    assert tool[1] == python[1], f"stdout differs for {args}:\n  tool:   {tool[1][:300]}\n  python: {python[1][:300]}"
    assert tool[2] == python[2], f"stderr differs for {args}:\n  tool:   {tool[2]}\n  python: {python[2]}"
    assert tool[3] == python[3], f"{args}: the two wrote other bytes (or one wrote none)"
    if code == 2:  # a usage error: one line, as argparse writes it, and nothing written
        assert len(tool[2].splitlines()) == 1 and tool[2].startswith("PROGRAM"), tool[2]
        assert tool[3] is None
    if code == 0 and args[0] in ("merge", "import", "synth") or args[-2:-1] == ["-o"] and code == 0:
        assert tool[3], f"{args} wrote no file"


def test_an_unknown_command_is_refused_alike(both):
    """The one usage error whose text differs: each lists its own commands."""
    python, tool = both(["frobnicate"])
    assert python[0] == tool[0] == 2
    prefix = ("PROGRAM: argument COMMAND: invalid choice: 'frobnicate' (choose from 'inspect', 'validate', 'stats', "
              "'diff', 'merge', 'export', 'import', 'synth'")
    assert python[2].startswith(prefix) and tool[2].startswith(prefix), (python[2], tool[2])
