"""Finds and loads libcudnn_cache_ops.so, the C++ library that registers the torch.ops.cudnn_cache ops."""

import importlib.machinery
import importlib.util
import os
import pathlib
from types import ModuleType
from typing import Optional

import torch

from . import _environment

_NAME = "libcudnn_cache_ops.so"
_PACKAGE = pathlib.Path(__file__).resolve().parent
_REPOSITORY = _PACKAGE.parents[1]


def library_path() -> str:
    """The ops library this package loads.

    $CUDNN_CACHE_LIBRARY when set (it must name a file); else the copy installed with the package
    (``pip install .``), then the one a development build left in ``<repository>/build/torch_ops``
    (``scripts/build.sh``; $CUDNN_CACHE_BUILD_DIR names another build folder).
    """
    override = os.environ.get(_environment.LIBRARY)
    if override:
        if not os.path.isfile(override):
            _environment.refuse(_environment.LIBRARY, override, f"no such file; unset it, or point it at {_NAME}")
        return override
    candidates = [_PACKAGE / "lib" / _NAME,
                  _REPOSITORY / os.environ.get("CUDNN_CACHE_BUILD_DIR", "build") / "torch_ops" / _NAME]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    if os.environ.get("CUDNN_CACHE_BUILD_DIR"):
        _environment.refuse("CUDNN_CACHE_BUILD_DIR", os.environ["CUDNN_CACHE_BUILD_DIR"],
                            f"{candidates[1]} does not exist; name a folder scripts/build.sh built (BUILD_DIR)")
    raise ImportError(f"cudnn_cache: {_NAME} not found (searched {', '.join(map(str, candidates))}); build it with "
                      f"scripts/build.sh or pip install --no-build-isolation ., or point {_environment.LIBRARY} at it")


def load_library() -> None:
    """Registers the ops with torch.ops.load_library, with a one-line, actionable error if the build does not
    match."""
    path = library_path()
    try:
        torch.ops.load_library(path)
    except OSError as error:
        problem = (f"cannot be loaded ({error}); it must be built against this PyTorch ({torch.__version__}) and "
                   "its cuDNN: rebuild with scripts/build.sh or pip install --no-build-isolation .")
        if os.environ.get(_environment.LIBRARY):
            _environment.refuse(_environment.LIBRARY, path, problem)
        raise ImportError(f"cudnn_cache: {path} {problem}") from error


def eager_calls() -> Optional[ModuleType]:
    """cudnn_cache._eager, the ops called from eager Python at a torch function's cost (Note [Eager calls] in
    torch_ops/csrc/python/eager_calls.cpp), from beside the ops library this package loaded (after load_library);
    None where the build made none (CMake found no Python headers or libtorch_python): the modules then call the
    ops through torch.ops, with the same results."""
    folder = pathlib.Path(library_path()).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"_eager{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location("cudnn_cache._eager", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None
