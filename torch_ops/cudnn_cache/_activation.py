"""CUDNN_CACHE_PATH: with it set, the cache file loads when cudnn_cache is imported and is saved when the
process exits, with no call in the training script.

    CUDNN_CACHE_PATH=/data/convs.cache      that file
    CUDNN_CACHE_PATH=/data/caches/          a directory: one file per GPU and cuDNN identity in it
    CUDNN_CACHE_PATH=default                the directory $XDG_CACHE_HOME/cudnn_cache (~/.cache/cudnn_cache)

With CUDNN_CACHE_REMOTE set too, this GPU's entries of that shared store are merged after the file (also when
there is no file yet), and the save at exit pushes the file's entries to it (cudnn_cache.set_remote).

A file that cannot be loaded (corrupt, truncated, of a newer cudnn_cache) is moved aside, never overwritten,
with a warning; the process starts with an empty cache. In a directory, files are named after the GPU
(name, compute capability, SM count) and cuDNN major.minor, e.g. NVIDIA_H200-sm90-132sms-cudnn9.19.cache,
so machines of different kinds can share one directory. Nothing is prepared at import (the script has not
picked its GPU yet): the first convolution on each GPU starts prepare() of that GPU in the background. The
save at exit merges with what the file holds by then, under its lock (cudnn_cache.save), so many processes may
share one file; a process that holds nothing but what it loaded from the file writes nothing. Without a GPU,
a directory names no file: the process says so and uses none. A value no file can be made of (a FIFO, a path
through a regular file) ends the process with one line (Note [Bad environment variables] in _environment.py).
"""

import atexit
import os
import pathlib
import re
import time
import warnings
from typing import List, Optional

import torch

from . import _environment

ENVIRONMENT = "CUDNN_CACHE_PATH"
DEFAULT = "default"


def default_directory() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "cudnn_cache"


def identity_file_name(device: Optional[int] = None) -> str:
    """The file name of the current (or given) CUDA device and this process's cuDNN, for directory mode."""
    properties = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
    cudnn = torch.backends.cudnn.version() or 0
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", properties.name).strip("_")
    return (f"{name}-sm{properties.major}{properties.minor}-{properties.multi_processor_count}sms-"
            f"cudnn{cudnn // 10000}.{cudnn % 10000 // 100}.cache")


def _check_usable(value: str, path: pathlib.Path, directory: bool) -> None:
    """Refuses a value whose file could never be loaded nor saved: a FIFO or device where the file would be, or
    a file where a folder would be (See Note [Bad environment variables] in _environment.py)."""
    if path.exists() and not (path.is_dir() if directory else path.is_file()):
        _environment.refuse(ENVIRONMENT, value, f"{path} is not a {'directory' if directory else 'regular file'}; "
                                                "name a cache file, a directory, or 'default'")
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                _environment.refuse(ENVIRONMENT, value, f"{folder} is not a directory")
            return


def resolve(value: str) -> Optional[pathlib.Path]:
    """The file CUDNN_CACHE_PATH=value names, or None in directory mode without a GPU (whose identity names
    the file). Ends the process on a value no file can be made of."""
    if value == DEFAULT:
        directory = default_directory()
    else:
        path = pathlib.Path(value).expanduser()
        if not (path.is_dir() or value.endswith(os.sep)):
            _check_usable(value, path, directory=False)
            return path
        directory = path
    _check_usable(value, directory, directory=True)
    if not torch.cuda.is_available():
        return None
    return directory / identity_file_name()


_active: Optional[pathlib.Path] = None
_loaded: List[object] = []  # the cache's content once the file was loaded (_content): See _save_at_exit


def active_file() -> Optional[pathlib.Path]:
    """The file CUDNN_CACHE_PATH made this process load and save, or None."""
    return _active


def activate(value: str) -> Optional[pathlib.Path]:
    """Loads the file CUDNN_CACHE_PATH=value names (if it exists) and saves the cache to it at exit."""
    import cudnn_cache

    global _active
    path = resolve(value)
    if path is None:
        warnings.warn(f"cudnn_cache: {ENVIRONMENT}={value} names a directory, whose files are named after the GPU; "
                      "without a GPU this process loads and saves no cache file", RuntimeWarning, stacklevel=2)
        return None
    loaded = False
    if path.exists():
        try:
            cudnn_cache.load(path)  # and the remote store's entries of this GPU
            loaded = True
        except RuntimeError as error:
            reason = str(error).splitlines()[0]
            aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
            try:
                os.replace(path, aside)
            except OSError as move_error:
                warnings.warn(f"cudnn_cache: {ENVIRONMENT} names {path}, which cannot be loaded ({reason}) nor moved "
                              f"aside ({move_error}); it is left as it is, and this process loads and saves no "
                              "cache file", RuntimeWarning, stacklevel=2)
                return None
            warnings.warn(f"cudnn_cache: {ENVIRONMENT} names {path}, which cannot be loaded ({reason}). It was "
                          f"moved to {aside}; this process starts with an empty cache and saves a new file at exit.",
                          RuntimeWarning, stacklevel=2)
    if not loaded:
        cudnn_cache.pull_remote()  # a new machine: it has no file yet, the fleet's store may have its entries
    # Not prepared here: the script has not picked its GPU yet. The first call on each GPU prepares it in the
    # background (Note [Prepare at the first call] in runtime.cpp), unless the script calls prepare() first.
    torch.ops.cudnn_cache.prepare_at_first_call(cudnn_cache.size() > 0)
    if _active is None:
        atexit.register(_save_at_exit)
    _active = path
    _loaded[:] = _content()
    return path


def _content() -> List[object]:
    """The digests of every entry of the cache (origin, cache, key, ranking, stored plan), sorted, then its pending
    keys (Note [Pending keys]), sorted, then how many attention plans it stores (a store only gains them):
    equal lists, equal caches."""
    from . import distributed

    return [sorted(torch.ops.cudnn_cache.inventory()[2][:, 2].tolist()), sorted(distributed.recorded_misses()),
            torch.ops.cudnn_cache.stats()["attention_plans"]]


def _save_at_exit() -> None:
    """Saves the cache into the active file, unless it holds nothing (no entry, no pending key) or nothing this
    process did not load from that file: then there is nothing to add, and a file this process cannot write is
    no concern of it."""
    import cudnn_cache  # imported already: activate() ran at the end of the package's import

    if _active is None or _content() in (_loaded, [[], [], 0]):
        return
    try:
        _active.parent.mkdir(parents=True, exist_ok=True)
        cudnn_cache.save(_active)
    except (OSError, RuntimeError) as error:
        warnings.warn(f"cudnn_cache: could not save the cache to {_active} ({str(error).splitlines()[0]}); what "
                      "this process tuned is lost, the file on disk is unchanged", RuntimeWarning)
