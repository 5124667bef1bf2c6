"""CUDNN_CACHE_PATH: with it set, the cache file loads when cudnn_cache is imported and is saved when the
process exits, with no call in the training script.

    CUDNN_CACHE_PATH=/data/convs.cache      that file
    CUDNN_CACHE_PATH=/data/caches/          a directory: one file per GPU and cuDNN identity in it
    CUDNN_CACHE_PATH=default                the directory $XDG_CACHE_HOME/cudnn_cache (~/.cache/cudnn_cache)

A file that cannot be loaded (corrupt, truncated, of a newer cudnn_cache) is moved aside, never overwritten,
with a warning; the process starts with an empty cache. In a directory, files are named after the GPU
(name, compute capability, SM count) and cuDNN major.minor, e.g. NVIDIA_H200-sm90-132sms-cudnn9.19.cache,
so machines of different kinds can share one directory. The save at exit merges with what the file holds by
then, under its lock (cudnn_cache.save), so many processes may share one file.
"""

import atexit
import os
import pathlib
import re
import time
import warnings
from typing import Optional

import torch

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


def resolve(value: str) -> Optional[pathlib.Path]:
    """The file CUDNN_CACHE_PATH=value names, or None in directory mode without a GPU (whose identity names
    the file)."""
    if value == DEFAULT:
        directory = default_directory()
    else:
        path = pathlib.Path(value).expanduser()
        if not (path.is_dir() or value.endswith(os.sep)):
            return path
        directory = path
    if not torch.cuda.is_available():
        return None
    return directory / identity_file_name()


_active: Optional[pathlib.Path] = None


def active_file() -> Optional[pathlib.Path]:
    """The file CUDNN_CACHE_PATH made this process load and save, or None."""
    return _active


def activate(value: str) -> Optional[pathlib.Path]:
    """Loads the file CUDNN_CACHE_PATH=value names (if it exists) and saves the cache to it at exit."""
    import cudnn_cache

    global _active
    path = resolve(value)
    if path is None:
        cudnn_cache.logger.info("%s=%s names a directory, and without a GPU there is no file to use", ENVIRONMENT,
                                value)
        return None
    if path.exists():
        try:
            cudnn_cache.load(path)
        except RuntimeError as error:
            aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            warnings.warn(f"cudnn_cache: {ENVIRONMENT} names {path}, which cannot be loaded "
                          f"({str(error).splitlines()[0]}). It was moved to {aside}; this process starts with an "
                          "empty cache and saves a new file at exit.", RuntimeWarning, stacklevel=2)
    if _active is None:
        atexit.register(_save_at_exit)
    _active = path
    return path


def _save_at_exit() -> None:
    import cudnn_cache

    if _active is None or cudnn_cache.size() == 0:
        return
    try:
        _active.parent.mkdir(parents=True, exist_ok=True)
        cudnn_cache.save(_active)
    except (OSError, RuntimeError) as error:
        warnings.warn(f"cudnn_cache: could not save the cache to {_active} ({error}); what this process tuned "
                      "is lost, the file on disk is unchanged", RuntimeWarning)
