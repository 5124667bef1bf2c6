"""Packaging for C++ users and the versions Python users can read: the build installs a CMake package, and a
project that calls find_package(cudnn_cache) builds against it and runs, with the core and the ops."""

import os
import re
import shutil
import subprocess

import pytest
import torch

import cudnn_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_versions_are_readable():
    project = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    assert re.search(r"project\(cudnn_cache VERSION (\S+)", project).group(1) == cudnn_cache.__version__
    assert cudnn_cache.FORMAT_VERSION == torch.ops.cudnn_cache.format_version() == 6


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None, reason="needs cmake and ninja")
def test_find_package_finds_the_installed_core_and_ops(build_dir, tmp_path):
    prefix, consumer = tmp_path / "prefix", tmp_path / "consumer"

    def run(*command):
        result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=600)
        shown = " ".join(map(str, command))
        assert result.returncode == 0, f"{shown}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    run("cmake", "--install", build_dir, "--prefix", prefix)
    assert (prefix / "lib" / "cmake" / "cudnn_cache" / "cudnn_cacheConfig.cmake").exists()
    assert (prefix / "include" / "cudnn_cache" / "checkpoint.h").exists()
    run("cmake", "-S", os.path.join(ROOT, "tests", "packaging"), "-B", consumer, "-G", "Ninja",
        f"-DCMAKE_PREFIX_PATH={prefix};{torch.utils.cmake_prefix_path}")
    run("cmake", "--build", consumer)
    output = run(consumer / "consumer", tmp_path / "made.cache").stdout
    assert "core: 12 entries for 1 device/cuDNN origin(s); file format 6" in output
    assert "ops: format_version 6" in output
