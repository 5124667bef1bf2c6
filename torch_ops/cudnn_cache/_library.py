"""Finds and loads libcudnn_cache_ops.so, the C++ library that registers the torch.ops.cudnn_cache ops."""

import os
import pathlib

import torch

_NAME = "libcudnn_cache_ops.so"
_PACKAGE = pathlib.Path(__file__).resolve().parent
_REPOSITORY = _PACKAGE.parents[1]


def library_path() -> str:
    """The ops library this package loads.

    In order: $CUDNN_CACHE_LIBRARY; the copy installed with the package (``pip install .``); the one a
    development build left in ``<repository>/build/torch_ops`` (``scripts/build.sh``).
    """
    candidates = []
    if os.environ.get("CUDNN_CACHE_LIBRARY"):
        candidates.append(pathlib.Path(os.environ["CUDNN_CACHE_LIBRARY"]))
    candidates.append(_PACKAGE / "lib" / _NAME)
    candidates.append(_REPOSITORY / os.environ.get("CUDNN_CACHE_BUILD_DIR", "build") / "torch_ops" / _NAME)
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    searched = "\n  ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"cudnn_cache: {_NAME} not found. Searched:\n  {searched}\n"
        "Build it with scripts/build.sh (or pip install .), or point CUDNN_CACHE_LIBRARY at it.")


def load_library() -> None:
    """Registers the ops with torch.ops.load_library, with an actionable error if the build does not match."""
    path = library_path()
    try:
        torch.ops.load_library(path)
    except OSError as error:
        raise ImportError(
            f"cudnn_cache: cannot load {path}: {error}\n"
            f"It must be built against this PyTorch ({torch.__version__}) and its cuDNN; rebuild with "
            "scripts/build.sh or pip install .") from error
