"""The environment variables cudnn_cache reads, each checked where it is read.

    CUDNN_CACHE_PATH       a cache file, a directory (one file per GPU and cuDNN), or 'default' (_activation.py)
    CUDNN_CACHE_INTERCEPT  1/true/on/yes (the default) or 0/false/off/no: route PyTorch's convolutions through
                           the cache while CUDNN_CACHE_PATH is set, and under python -m cudnn_cache.run
    CUDNN_CACHE_LOG        off (the default), info or debug
    CUDNN_CACHE_PLAN_CACHE_LIMIT  the most execution plans kept in memory: a non-negative integer (default
                           10000; 0: no bound); read by the C++ runtime, checked here
    CUDNN_CACHE_WORKSPACE_LIMIT  the most bytes of workspace a convolution may use: a non-negative integer
                           (default: no limit); read by the C++ runtime, checked here
    CUDNN_CACHE_MISS_POLICY  what a convolution whose key is not cached does: tune (the default), heuristic,
                           error, record or nearest; read by the C++ runtime, checked here
    CUDNN_CACHE_REMOTE     a shared store under the local file: redis://[[user]:password@]host[:port][/db] or
                           rediss:// (remote.py)
    CUDNN_CACHE_LIBRARY    the ops library to load instead of the package's own (_library.py)
    CUDNN_CACHE_BUILD_DIR  where a source checkout's ops library is, when the package has none (default build)

Note [Bad environment variables]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A variable is set once for many processes (a CI job, a cluster's profile), so a bad value is refused loudly
rather than ignored, and before anything is loaded, registered or scheduled for exit: the process ends with
one line on stderr that names the variable, its value and what it takes (SystemExit, exit status 1), with no
traceback and no second report from an exit handler. A file named by CUDNN_CACHE_PATH that cannot be loaded is
another matter: the variable is fine, the file is moved aside with a warning and the process goes on.
"""

import os
from typing import NoReturn, Optional, Tuple

INTERCEPT = "CUDNN_CACHE_INTERCEPT"
LOG = "CUDNN_CACHE_LOG"
LIBRARY = "CUDNN_CACHE_LIBRARY"
PLAN_CACHE_LIMIT = "CUDNN_CACHE_PLAN_CACHE_LIMIT"
WORKSPACE_LIMIT = "CUDNN_CACHE_WORKSPACE_LIMIT"
MISS_POLICY = "CUDNN_CACHE_MISS_POLICY"
REMOTE = "CUDNN_CACHE_REMOTE"

_TRUE, _FALSE = ("1", "true", "on", "yes", ""), ("0", "false", "off", "no")
LOG_LEVELS = ("off", "info", "debug")
MISS_POLICIES = ("tune", "heuristic", "error", "record", "nearest")


def refuse(variable: str, value: str, problem: str) -> NoReturn:
    """Ends the process with one line naming the variable, its value and what is wrong (See Note [Bad
    environment variables])."""
    raise SystemExit(f"cudnn_cache: {variable}={value!r}: {problem}")


def intercept() -> bool:
    """CUDNN_CACHE_INTERCEPT: unset or 1/true/on/yes intercepts, 0/false/off/no does not."""
    value = os.environ.get(INTERCEPT, "1")
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    refuse(INTERCEPT, value, "use 1 (intercept PyTorch's convolutions, the default with CUDNN_CACHE_PATH) or 0 "
                             "(only converted models and the cudnn_cache ops use the cache)")


def _one_of(variable: str, names: Tuple[str, ...], what: str) -> Optional[str]:
    """A variable that names a setting: None when unset or empty, else one of `names`, as the C++ runtime reads
    it; anything else is refused with `what` it takes."""
    value = os.environ.get(variable, "")
    if value == "":
        return None
    if value not in names:
        refuse(variable, value, what)
    return value


def log_level() -> Optional[str]:
    """CUDNN_CACHE_LOG: None when unset or empty, else one of LOG_LEVELS."""
    return _one_of(LOG, LOG_LEVELS, "use off, info (loads, saves, prepare) or debug (also every hit, miss, tune "
                                    "and plan)")


def _count(variable: str, what: str) -> Optional[int]:
    """A variable that holds a count: None when unset or empty, else a non-negative integer that fits 64 bits, as
    the C++ runtime reads it; anything else is refused with `what` it takes."""
    value = os.environ.get(variable, "")
    if value == "":
        return None
    if not (value.isascii() and value.isdigit()) or int(value) >= 2**64:
        refuse(variable, value, f"use a non-negative integer: {what}")
    return int(value)


def plan_cache_limit() -> Optional[int]:
    """CUDNN_CACHE_PLAN_CACHE_LIMIT: the most execution plans kept in memory, or None when unset."""
    return _count(PLAN_CACHE_LIMIT, "the most execution plans kept in memory (default 10000; 0 keeps every plan)")


def workspace_limit() -> Optional[int]:
    """CUDNN_CACHE_WORKSPACE_LIMIT: the most bytes of workspace a convolution may use, or None when unset."""
    return _count(WORKSPACE_LIMIT, "the most bytes of workspace a convolution may use (unset: no limit)")


def miss_policy() -> Optional[str]:
    """CUDNN_CACHE_MISS_POLICY: None when unset or empty, else one of MISS_POLICIES."""
    return _one_of(MISS_POLICY, MISS_POLICIES, "use tune (time a missed key now, the default), heuristic, error, "
                                               "record or nearest (a neighbour's choice now, the key tuned later)")


def remote() -> Optional[str]:
    """CUDNN_CACHE_REMOTE: None when unset or empty, else a Redis URL (remote.check_url's form)."""
    value = os.environ.get(REMOTE, "")
    if value == "":
        return None
    from .remote import check_url, redacted  # no op is used to check a URL

    try:
        return check_url(value)
    except ValueError as error:
        refuse(REMOTE, redacted(value), str(error))
