import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    """The CMake build folder: $CUDNN_CACHE_BUILD_DIR, or ./build (what scripts/build.sh makes)."""
    path = ROOT / os.environ.get("CUDNN_CACHE_BUILD_DIR", "build")
    if not (path / "cudnn_cache_tool").exists():
        pytest.fail(f"{path}/cudnn_cache_tool is missing: run scripts/build.sh first")
    return path
