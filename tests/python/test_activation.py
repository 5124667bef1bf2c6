"""CUDNN_CACHE_PATH, in child processes: the file loads at import and is saved at exit; a file that cannot be
loaded is moved aside, never overwritten; a directory holds one file per GPU and cuDNN identity."""

import os
import subprocess
import sys

import pytest
import torch

import cudnn_cache
from cudnn_cache import _activation

# Imports cudnn_cache (which acts on CUDNN_CACHE_PATH), loads the file argv[1] names if any (entries that the
# exit save then writes), and prints the size of the cache and the active file.
SCRIPT = r"""
import sys, cudnn_cache
if len(sys.argv) > 1:
    cudnn_cache.load(sys.argv[1])
print(cudnn_cache.size(), cudnn_cache.active_file())
"""


@pytest.fixture
def child(child_env, tmp_path):
    def run(value, *args):
        env = {key: item for key, item in child_env.items() if key != "CUDNN_CACHE_PATH"}
        if value is not None:
            env["CUDNN_CACHE_PATH"] = str(value)
        env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
        result = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        size, active = result.stdout.split()
        return int(size), active, result.stderr
    return run


@pytest.fixture
def synth(tool, tmp_path):
    def make(name, entries, seed=1):
        path = tmp_path / name
        assert tool("synth", path, "--entries", entries, "--seed", seed).returncode == 0
        return path
    return make


def test_unset_activates_nothing(child, synth):
    assert child(None) == (0, "None", "")


def test_a_file_loads_at_import_and_is_saved_at_exit(child, synth, tool, tmp_path):
    path = synth("convs.cache", 20)
    extra = synth("extra.cache", 30, seed=2)
    size, active, _ = child(path)
    assert (size, active) == (20, str(path))
    assert child(path, extra)[0] == 20 + 30  # loaded at import, then the script added 30
    assert "valid, 50 entries" in tool("validate", path).stdout  # saved at exit
    assert child(path)[0] == 50


def test_a_missing_file_is_created_at_exit_when_something_was_cached(child, synth, tmp_path):
    path = tmp_path / "new" / "convs.cache"
    assert child(path) == (0, str(path), "")
    assert not path.exists()  # nothing cached: nothing written
    child(path, synth("extra.cache", 5))
    assert path.exists() and child(path)[0] == 5


def test_a_file_that_cannot_be_loaded_is_moved_aside_not_overwritten(child, synth, tmp_path):
    path = tmp_path / "convs.cache"
    path.write_bytes(b"not a cache file")
    size, active, stderr = child(path, synth("extra.cache", 7))
    assert size == 7 and active == str(path)
    assert "cannot be loaded" in stderr and "wrong magic" in stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("convs.cache.unreadable-")]
    assert len(aside) == 1 and aside[0].read_bytes() == b"not a cache file"
    assert child(path)[0] == 7  # the new file


def test_resolution_of_files_and_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _activation.resolve(str(tmp_path / "convs.cache")) == tmp_path / "convs.cache"
    assert _activation.default_directory() == tmp_path / "xdg" / "cudnn_cache"
    for directory in (str(tmp_path), str(tmp_path / "new") + os.sep, "default"):
        if torch.cuda.is_available():
            assert _activation.resolve(directory).name == _activation.identity_file_name()
        else:
            assert _activation.resolve(directory) is None  # the GPU's identity names the file


def test_a_directory_names_no_file_without_a_gpu_and_the_identity_file_with_one(child, tmp_path):
    for value, directory in ((tmp_path, tmp_path), ("default", tmp_path / "xdg" / "cudnn_cache")):
        size, active, stderr = child(value)
        if torch.cuda.is_available():
            assert (size, active, stderr) == (0, str(directory / _activation.identity_file_name()), "")
        else:  # said, not silent: the variable is set and yet no file is in use
            assert (size, active) == (0, "None")
            assert f"CUDNN_CACHE_PATH={value} names a directory" in stderr and "no cache file" in stderr


def test_a_process_that_changed_nothing_writes_nothing_at_exit(child, synth):
    """Loading the file and exiting leaves it alone (a read-only file is no concern then); adding entries saves."""
    path = synth("convs.cache", 20)
    before = path.stat()
    assert child(path)[:2] == (20, str(path))
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # a save replaces the inode
    child(path, synth("extra.cache", 3, seed=2))
    assert path.stat().st_ino != before.st_ino


def test_a_file_that_can_be_neither_loaded_nor_moved_aside_is_left_alone(tmp_path, monkeypatch, cache_state):
    path = tmp_path / "convs.cache"
    path.write_bytes(b"not a cache file")

    def refuse(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_activation.os, "replace", refuse)
    monkeypatch.setattr(_activation, "_active", None)
    with pytest.warns(RuntimeWarning, match=r"cannot be loaded \(.*wrong magic.*\) nor moved aside \(.*Permission "
                                             r"denied\); it is left as it is"):
        assert _activation.activate(str(path)) is None
    assert _activation.active_file() is None and path.read_bytes() == b"not a cache file"


@pytest.mark.gpu
def test_a_directory_holds_one_file_per_identity(child, synth, tmp_path):
    name = _activation.identity_file_name()
    assert name.endswith(".cache") and "-sm" in name and "-cudnn" in name
    size, active, _ = child("default", synth("extra.cache", 3))
    assert active == str(tmp_path / "xdg" / "cudnn_cache" / name)
    assert child("default")[0] == 3
    assert cudnn_cache.active_file() is None  # this process did not set the variable


def test_the_save_at_exit_merges_with_what_the_file_holds_then(child_env, synth, tool, tmp_path):
    # The child loads the file at import, forgets it (as if another process had written those entries), adds
    # its own; its exit save keeps both, as several processes sharing one CUDNN_CACHE_PATH need.
    path = synth("convs.cache", 20)
    extra = synth("extra.cache", 6, seed=9)
    script = "import sys, cudnn_cache; cudnn_cache.clear(); cudnn_cache.load(sys.argv[1])"
    env = {**child_env, "CUDNN_CACHE_PATH": str(path)}
    result = subprocess.run([sys.executable, "-c", script, str(extra)], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "valid, 26 entries" in tool("validate", path).stdout
