"""pip install . from a clean copy of the repository builds everything and installs a package that imports,
finds its own ops library and tool, and runs python -m cudnn_cache. Takes minutes: it builds the ops library
from scratch (Release)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs git and a git checkout to copy the committed sources from")
def test_pip_install_builds_and_installs_everything(tmp_path, tool):
    source, target = tmp_path / "source", tmp_path / "site"
    subprocess.run(["git", "clone", "--quiet", ROOT, str(source)], check=True)
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--quiet",
                              "--target", str(target), str(source)], capture_output=True, text=True, timeout=3000)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    package = target / "cudnn_cache"
    assert (package / "lib" / "libcudnn_cache_ops.so").is_file() and (package / "bin" / "cudnn_cache_tool").is_file()

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "CUDNN_CACHE_LIBRARY")}
    env["PYTHONPATH"] = str(target)
    check = subprocess.run([sys.executable, "-c", "import cudnn_cache; print(cudnn_cache.library_path()); "
                            "print(cudnn_cache.__version__, cudnn_cache.FORMAT_VERSION)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    library, versions = check.stdout.splitlines()
    assert library == str(package / "lib" / "libcudnn_cache_ops.so") and versions == "0.1.0 3"

    cache = tmp_path / "synth.cache"
    assert tool("synth", cache, "--entries", 20).returncode == 0
    assert subprocess.run([str(package / "bin" / "cudnn_cache_tool"), "validate", str(cache)]).returncode == 0
    cli = subprocess.run([sys.executable, "-m", "cudnn_cache", "validate", str(cache)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "valid, 20 entries" in cli.stdout, cli.stderr
