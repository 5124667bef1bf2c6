"""pip install . from a clean copy of the repository, into a clean virtual environment, builds everything and
installs a package that imports, finds its own ops library and tool, and the `cudnn_cache` command; the tool
finds the cuDNN it was built against through its RUNPATH (PyTorch's, in site-packages/nvidia/cudnn), not
whichever one the loader's configuration names. Takes minutes: it builds the ops library from scratch
(Release)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def library_of(binary: pathlib.Path, name: str, env: dict) -> pathlib.Path:
    """Where the loader finds the library `name` for `binary` (ldd), without its ".." (symbolic links kept)."""
    listing = subprocess.run(["ldd", str(binary)], env=env, capture_output=True, text=True, check=True).stdout
    found = [line.split("=>")[1].split("(")[0].strip() for line in listing.splitlines() if f"{name} =>" in line]
    assert found and found[0] != "not found", listing
    return pathlib.Path(os.path.normpath(found[0]))


# .git is a folder in a clone and a file in a worktree (git worktree add): either is a checkout to clone from.
@pytest.mark.skipif(shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")),
                    reason="needs git and a git checkout to copy the committed sources from")
@pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("ldd") is None, reason="needs readelf and ldd")
def test_pip_install_builds_and_installs_everything(tmp_path, tool):
    import nvidia.cudnn

    source, venv = tmp_path / "source", tmp_path / "venv"
    subprocess.run(["git", "clone", "--quiet", ROOT, str(source)], check=True)
    # The environment's own packages stay visible (torch is not downloaded again); cudnn_cache goes into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--quiet",
                              str(source)], capture_output=True, text=True, timeout=3000)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    package = site / "cudnn_cache"
    assert (package / "lib" / "libcudnn_cache_ops.so").is_file() and (package / "bin" / "cudnn_cache_tool").is_file()

    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "LD_LIBRARY_PATH") and not key.startswith("CUDNN_CACHE_")}
    check = subprocess.run([str(python), "-c", "import cudnn_cache; print(cudnn_cache.library_path()); "
                            "print(cudnn_cache.__version__, cudnn_cache.FORMAT_VERSION); "
                            "print(cudnn_cache.functional._EAGER_CALLS.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    library, versions, eager = check.stdout.splitlines()
    assert library == str(package / "lib" / "libcudnn_cache_ops.so") and versions == "0.1.0 6"
    # cudnn_cache._eager (Note [Eager calls]) beside it: this environment has Python's headers.
    assert pathlib.Path(eager).parent == package / "lib" and pathlib.Path(eager).name.startswith("_eager."), eager

    # The tool: its RUNPATH names PyTorch's cuDNN relative to itself first (where pip puts torch and cudnn_cache
    # side by side), then the absolute folder it was built against (here the base environment's, as the venv
    # shares it), and the loader takes that cuDNN.
    installed_tool = package / "bin" / "cudnn_cache_tool"
    dynamic = subprocess.run(["readelf", "-d", str(installed_tool)], capture_output=True, text=True, check=True).stdout
    runpath = next(line for line in dynamic.splitlines() if "RUNPATH" in line).split("[")[1].rstrip("]").split(":")
    built_against = pathlib.Path(nvidia.cudnn.__path__[0]) / "lib"
    assert runpath[0] == "$ORIGIN/../../nvidia/cudnn/lib" and str(built_against) in runpath, runpath
    assert library_of(installed_tool, "libcudnn.so.9", env) == built_against / "libcudnn.so.9"
    # Moved next to an nvidia/cudnn of its own (a site-packages elsewhere), it takes that one.
    moved = tmp_path / "site" / "cudnn_cache" / "bin" / "cudnn_cache_tool"
    moved.parent.mkdir(parents=True)
    shutil.copy2(installed_tool, moved)
    (tmp_path / "site" / "nvidia" / "cudnn").mkdir(parents=True)
    (tmp_path / "site" / "nvidia" / "cudnn" / "lib").symlink_to(built_against)
    assert library_of(moved, "libcudnn.so.9", env) == tmp_path / "site" / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9"

    cache = tmp_path / "synth.cache"
    assert tool("synth", cache, "--entries", 20).returncode == 0
    assert subprocess.run([str(installed_tool), "validate", str(cache)], env=env).returncode == 0

    # One command for everything: the CLI, the tool's commands and the runner.
    command = venv / "bin" / "cudnn_cache"
    for args, expected in ((["validate", cache], "valid, 20 entries"), (["--help"], "usage: cudnn_cache "),
                           (["synth", tmp_path / "new.cache", "--entries", 5], "wrote 5 synthetic entries"),
                           (["run", "--help"], "usage: cudnn_cache run ")):
        done = subprocess.run([str(command), *map(str, args)], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and expected in done.stdout, (args, done.stdout, done.stderr)
    refused = subprocess.run([str(command), "stats", str(tmp_path / "missing.cache")], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3 and refused.stdout == ""
    assert refused.stderr.startswith("cudnn_cache stats: cannot read ") and len(refused.stderr.splitlines()) == 1
