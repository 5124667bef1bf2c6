"""cudnn_cache: a persisted cuDNN algorithm cache for PyTorch.

Tune each convolution once, save the rankings, and start later processes at tuned speed::

    import cudnn_cache
    model = cudnn_cache.convert(model)           # nn.Conv*d / nn.ConvTranspose*d -> cached modules
    with cudnn_cache.persistent("convs.cache"):  # load if present, build its plans in the background; save on exit
        train(model)

The ops live in torch.ops.cudnn_cache (usable from TorchScript and LibTorch); this package is a thin,
documented layer over them.
"""

import contextlib
import logging
import os
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from . import _environment
from ._library import library_path, load_library

# Every variable is checked before anything is loaded: See Note [Bad environment variables] in _environment.py.
_intercept_at_import = _environment.intercept()
_log_level_at_import = _environment.log_level()
_environment.plan_cache_limit()  # read by the C++ runtime when it starts, as is the next one
_environment.workspace_limit()
_environment.miss_policy()
_remote_at_import = _environment.remote()
load_library()

from . import functional  # noqa: E402  (needs the ops registered)
from .modules import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d, convert  # noqa: E402

__version__ = "0.1.0"

_ops = torch.ops.cudnn_cache

# Loads, saves and prepares are logged here (INFO). The C++ runtime reports hits, misses, tunes and plans
# (CUDNN_CACHE_LOG=debug) and prepare (info) on stderr, and warns about fallbacks once through warnings.
logger = logging.getLogger("cudnn_cache")
_LEVELS = {"off": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}


def _configure_logging_from_environment() -> None:
    """CUDNN_CACHE_LOG=info|debug also shows this package's messages on stderr (unless the application
    configured the logger itself)."""
    level = _log_level_at_import
    if level in ("info", "debug"):
        logger.setLevel(_LEVELS[level])
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("cudnn_cache [%(levelname)s] %(message)s"))
            logger.addHandler(handler)


_configure_logging_from_environment()

FORMAT_VERSION = _ops.format_version()  # the cache file format this build writes; it reads 1 up to this one

__all__ = [
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Preparation",
    "active_file", "audit", "backend", "clear", "conv_key", "convert", "describe_convolution", "describe_filter",
    "describe_tensor", "distributed", "fill", "functional", "intercept", "intercepting", "library_path", "load",
    "log_level", "logger", "miss_policy", "persistent", "plan_cache_limit", "prepare", "query", "remote_url",
    "reset_stats", "save", "set_backend", "set_log_level", "set_miss_policy", "set_plan_cache_limit", "set_remote",
    "set_tuning_options",
    "set_workspace_limit", "settle", "size",
    "stats", "tuning_options",
]


def load(path: str) -> int:
    """Merges the cache file at `path` into this process's cache and returns how many entries it held; with a
    remote store set (set_remote), then merges this GPU's entries from it too (pull_remote).

    All or nothing: a truncated, corrupt, wrong-magic or newer-format file raises RuntimeError naming the file
    and the reason, and the cache stays as it was.
    """
    path = os.fspath(path)
    started = time.perf_counter()
    entries = _ops.load(path)
    logger.info("loaded %d entries from %s in %.1f ms", entries, path, 1e3 * (time.perf_counter() - started))
    pull_remote()
    return entries


def save(path: str, merge: bool = True, lock_timeout: float = 60.0) -> int:
    """Writes every entry of this process's cache to `path`, atomically (temp file, fsync, rename), and
    returns the number of entries the file holds now; with a remote store set (set_remote), then pushes the
    file's entries to it, each merged on the server.

    The file is shared safely: the save holds an advisory lock on "<path>.lock" (waiting at most
    `lock_timeout` seconds, then raising RuntimeError naming the file) and, with `merge` (the default), keeps
    what the file already holds, merged with this cache (the faster measurement wins), so processes saving
    into one file lose nothing; an entry settle() changed replaces the file's entry for its key instead. A
    file there that cannot be read is never overwritten by a merging save; pass merge=False to replace the
    file with exactly this cache. Where the file system has no locks, it warns and saves without one. This
    process's cache is not changed.
    """
    path = os.fspath(path)
    started = time.perf_counter()
    entries = _ops.save(path, merge, float(lock_timeout))
    logger.info("saved %d entries to %s (%d from this process) in %.1f ms", entries, path, size(),
                1e3 * (time.perf_counter() - started))
    if _remote is not None:
        with open(path, "rb") as saved:
            _push_remote(saved.read(), path, _ops.replaced_entry_names())
    return entries


_remote = None  # remote.Remote, or None: see set_remote
_remote_warned = False


def set_remote(url: Optional[str], timeout: float = 1.0) -> None:
    """A shared store under the local file (Note [Remote store] in remote.py): a Redis URL,
    redis://[[user]:password@]host[:port][/db] or rediss:// for TLS (?ssl_ca_certs=CA.pem for a private CA;
    CUDNN_CACHE_REMOTE sets it at start), or None for none. load() then also merges this GPU's entries from it,
    and save() pushes the file's entries to it, each merged on the server (per candidate the faster measurement
    wins; an entry settle() changed replaces the server's copy). A store that cannot be reached or answers
    slower than `timeout` seconds costs one warning per process; the local file works as before.
    Nothing is sent until then: a bad URL raises ValueError here, an unreachable server warns at load or save."""
    global _remote, _remote_warned
    from . import remote as _remote_module

    _remote = None if url is None else _remote_module.Remote(url, timeout=timeout)
    _remote_warned = False


def remote_url() -> Optional[str]:
    """The remote store's URL, its password hidden; None when there is none (set_remote)."""
    return None if _remote is None else _remote.name


def _remote_failed(error: Exception, what: str) -> None:
    """Warns of the remote store's failure once per process (Note [Remote store]); logs every one."""
    global _remote_warned
    logger.info("remote store: %s", error)
    if not _remote_warned:
        _remote_warned = True
        warnings.warn(f"cudnn_cache: {error}; {what}", RuntimeWarning, stacklevel=4)


def pull_remote(device: Optional[int] = None) -> int:
    """Merges the remote store's entries of this GPU (or CUDA device `device`) and this cuDNN into the cache and
    returns how many it merged; 0 with no remote store set, without a GPU, or when the store cannot be
    reached (then it warns, once per process). Entries that fail the file's checks are left out (logged)."""
    if _remote is None or not torch.cuda.is_available():
        return 0
    from . import remote as _remote_module

    started = time.perf_counter()
    try:
        tags = [_ops.origin_tag(*_ops.device_origin(device))]
        data, report = _remote.pull(tags)
    except _remote_module.RemoteError as error:
        _remote_failed(error, "this process goes on with its local file")
        return 0
    for name, reason in report.refused:
        logger.info("remote store %s: left out %s: %s", _remote.name, name, reason)
    merged = _ops.import_entries(_remote_module._tensor(data), f"remote store {_remote.name}")
    logger.info("merged %d entries from remote store %s in %.1f ms (%d left out)", merged, _remote.name,
                1e3 * (time.perf_counter() - started), len(report.refused))
    return merged


def _push_remote(data: bytes, source: str, replacing: List[str]) -> None:
    from . import remote as _remote_module

    try:
        report = _remote.push(data, source, replacing=frozenset(replacing))
    except _remote_module.RemoteError as error:
        _remote_failed(error, f"{source} is saved; its entries go to the remote store at the next save")
        return
    logger.info("pushed %s to remote store %s: %d stored, %d unchanged, %d replaced, %.1f ms", source, _remote.name,
                report.stored, report.unchanged, report.replaced, 1e3 * report.seconds)


@contextlib.contextmanager
def persistent(path: str, prepare_plans: bool = True) -> Iterator[Optional["Preparation"]]:
    """Loads `path` if it exists, and the remote store's entries of this GPU if one is set (then, with a GPU
    and `prepare_plans`, starts building their plans with prepare(background=True): the block's first calls
    build what it has not reached yet, and load + prepare + first step is shorter than with prepare() first),
    and saves the cache to it atomically when the block exits (also when it raises: what was tuned stays valid).
    The save merges with what the file holds then, under its lock (see save()), so several processes may
    use one file. Yields the Preparation (its wait() gives the plans ready), or None where nothing prepares."""
    path = os.fspath(path)
    if os.path.exists(path):
        load(path)
    else:
        pull_remote()
    preparation = None
    if prepare_plans and torch.cuda.is_available() and size() > 0:
        preparation = prepare(background=True)
    try:
        yield preparation
    finally:
        save(path)


def set_miss_policy(policy: str) -> None:
    """What a convolution does when its key is not cached: 'tune' (default: time all algorithms now, store the
    ranking), 'heuristic' (native heuristics' choice, what PyTorch runs with cudnn.benchmark off; not stored),
    'error' (raise, naming the key) or 'record' (like 'heuristic', and remember the key as pending:
    distributed.sync() then tunes what the ranks recorded, split between them; distributed.recorded_misses() lists
    them) or 'nearest' (run the choice stored for the same convolution at the nearest batch and spatial size, if it
    runs here and needs no run-time compilation, else the heuristic one; remember the key as pending, like 'record';
    nothing is timed). The CUDNN_CACHE_MISS_POLICY environment variable sets it when the library loads."""
    _ops.set_miss_policy(policy)


def miss_policy() -> str:
    """The current miss policy."""
    return _ops.get_miss_policy()


def set_plan_cache_limit(limit: int) -> None:
    """At most how many graph-API execution plans are kept in memory (default 10000, as PyTorch's own cuDNN
    plan cache; 0: no bound); past it, the least recently used are evicted and rebuilt if needed again
    (stats()['plan_evictions'] counts them). CUDNN_CACHE_PLAN_CACHE_LIMIT sets it at start. A lower limit
    evicts at once (down to 90% of it, as any sweep); a negative one raises RuntimeError and the limit stays."""
    _ops.set_plan_cache_limit(limit)


def plan_cache_limit() -> int:
    """The plan cache's limit (see set_plan_cache_limit)."""
    return _ops.get_plan_cache_limit()


def set_workspace_limit(limit: Optional[int]) -> None:
    """At most how many bytes of workspace a convolution may use; None (the default) sets no limit. Calls run
    the fastest cached candidate within it, without re-tuning (a ranking holds each candidate's workspace), and
    cuDNN's heuristics when none is; searches time only configs within it. CUDNN_CACHE_WORKSPACE_LIMIT sets it
    at start. A negative value raises RuntimeError and the limit stays. See Note [Workspace limit] in
    extension/include/cudnn_cache/runtime.h."""
    _ops.set_workspace_limit(limit)


def workspace_limit() -> Optional[int]:
    """The workspace limit in bytes, or None when there is none (see set_workspace_limit)."""
    return _ops.get_workspace_limit()


def set_backend(backend: str) -> None:
    """The cuDNN API convolutions run through: 'graph' (default where cuDNN has it: graph-API engine configs,
    the fastest engines on Hopper) or 'legacy' (cudnnConvolution*Algo_t). Each has its own cache entries, both
    kept in the same file. Deterministic calls (torch.use_deterministic_algorithms, cudnn.deterministic) run
    only configs cuDNN reports deterministic; under 'graph', keys whose entries recorded no determinism (files
    older than format 5) take 'legacy' for them."""
    _ops.set_backend(backend)


def backend() -> str:
    """The current backend: 'graph' or 'legacy'."""
    return _ops.get_backend()


def set_tuning_options(**options) -> None:
    """How later graph-API searches tune; the options not named keep their values. How a search times its
    candidates, and how many of each kind, are the search's own constants (Note [Search bounds] in
    extension/src/search_bounds.h): it times what native benchmark mode times and a little more, then decides
    between its fastest and native's two picks in paired rounds, so that a stored choice is not slower than
    native's pick (docs/HOW_IT_WORKS.md).

    - build_threads (0): threads that build the heuristics' runtime-compiled candidates (cuDNN compiles some
      engines at run time, 50-250 ms each) while the calling thread times those built; 0: the cores this
      process may run on; 1: build on the calling thread only;
    - exhaustive (False): for offline tuning (scripts/warm_start.py --exhaustive): every config of cuDNN's
      heuristics modes A and B and the fallback list, knob variants up to 4 steps away, 5 finalists at least,
      in place of the search's bounds. Minutes per model, paid once;
    - rank_deterministic (False): also time the deterministic configs again beside native's deterministic picks
      in the finalists' rounds, as a deterministic call's own search does, so that what deterministic calls
      run (the ranking's first deterministic config) is settled too; for tuning ahead of deterministic
      training (scripts/warm_start.py --deterministic). Those rounds make each search longer.

    Tuning many keys in parallel is done offline, in processes of its own: `python -m cudnn_cache tune FILE
    --jobs N` tunes a file's pending keys in N worker processes.
    """
    removed = sorted(set(options) & set(_REMOVED_TUNING_OPTIONS))
    if removed:
        raise TypeError(f"set_tuning_options: {', '.join(removed)} "
                        f"{'was' if len(removed) == 1 else 'were'} removed: "
                        f"{'; '.join(dict.fromkeys(_REMOVED_TUNING_OPTIONS[name] for name in removed))}")
    unknown = set(options) - set(tuning_options())
    if unknown:
        raise TypeError(f"set_tuning_options: unknown option(s) {sorted(unknown)}; "
                        f"the options are {sorted(tuning_options())}")
    _ops.set_tuning_options(**options)


# Options set_tuning_options once took, and what to do instead.
_FIXED_TIMING = ("how a search times each candidate (warm-up, the median of 7 runs, the L2 flush, the early stop) "
                 "is fixed: its paired rounds against native's picks rest on it (Note [Search bounds] in "
                 "extension/src/search_bounds.h); leave it out")
_FIXED_BOUNDS = ("the search's bounds are constants (Note [Search bounds] in extension/src/search_bounds.h); "
                 "for a wider search pass exhaustive=True (scripts/warm_start.py --exhaustive), and for less "
                 "tuning in the training process record the misses (set_miss_policy('record'), save) and tune the "
                 "file offline with `python -m cudnn_cache tune FILE --jobs N`")
_REMOVED_TUNING_OPTIONS = {
    **{name: _FIXED_TIMING for name in ("warmup", "repetitions", "flush_l2", "give_up_ratio")},
    **{name: _FIXED_BOUNDS for name in ("max_candidates", "mode_b_candidates", "knob_variants", "finalists")},
    "build_processes": "searches build plans in this process only (build_threads); to overlap cuDNN's "
                       "compilations across processes, record the keys (set_miss_policy('record'), save) and tune "
                       "the file with `python -m cudnn_cache tune FILE --jobs N`",
    "prefetch_backward": "backward keys are built by their own searches; to tune a model's keys ahead, record them "
                         "and run `python -m cudnn_cache tune FILE --jobs N`, or scripts/warm_start.py",
}


def tuning_options() -> Dict[str, Any]:
    """The graph-API search's options (see set_tuning_options)."""
    return dict(_ops.get_tuning_options())


def audit(device: Optional[int] = None) -> List[Dict[str, Any]]:
    """Times each graph-API entry of `device` (default: the current CUDA device) against the engine configs
    native PyTorch would run for it, all measured the same way (warmed up, L2 flushed, interleaved rounds, the
    median of `repetitions`), on random operands. One dict per entry: direction, key, and for 'stored' (the
    cache's choice), 'heuristic' (cudnn.benchmark=False) and 'benchmark' (cudnn.benchmark=True, PyTorch's
    single timing) the engine config (`*_engine`) and its time (`*_ms`); a native pick that is the stored
    config shares its time. 'stored_again_ms' times the stored config once more, in the same rounds: the gap
    between the two is how finely the audit resolves this key. Each run is timed from an idle stream, host
    launch included, so audit before any torch.profiler session of the process: the profiler may leave CUPTI
    attached, which slows every launch and most the configs that launch several kernels (docs/TROUBLESHOOTING.md)."""
    return [dict(row) for row in _ops.audit(device)]


def settle(device: Optional[int] = None) -> List[Dict[str, Any]]:
    """Decides each graph-API entry of `device` (default: the current CUDA device) again in steady state, where
    audit() measures: its stored config and native's two picks are timed as audit() times them, in three times
    the search's rounds, and a native pick takes the stored config's place only where those rounds show it
    faster (Note [Settling in steady state]); a near-tie keeps the stored config. A search decides inside the
    step that missed, where the tuning's own load is much of what keys of a few microseconds measure; call this
    after the steps that tuned, before saving (scripts/warm_start.py --settle). One dict per entry, as audit()
    returns (stored_* is the choice before), with 'settled_engine' (the entry's first config now) and 'changed'
    (whether that is another config). Like audit(), it times each key alone: a config that ties alone may cost
    more inside a network (the models benchmark's audit shows one). An entry it changed is saved in place of the
    file's entry for its key, not merged with it (a merge compares times taken under other loads, and could put
    the displaced config first again), until this process merges, erases or clears that key."""
    return [dict(row) for row in _ops.settle(device)]


class Preparation:
    """A prepare() running on a background thread: wait() blocks until it is done and returns the number of
    plans ready (or raises its error). Calls may run while it works; those that need a plan it has not built
    yet build it themselves."""

    def __init__(self) -> None:
        self._plans: Optional[int] = None

    def wait(self) -> int:
        if self._plans is None:
            self._plans = _ops.prepare_wait()
        return self._plans


def prepare(device: Optional[int] = None, threads: int = 0, background: bool = False):
    """Builds the execution plan of every loaded graph-API entry of `device` (default: the current CUDA device)
    now, on `threads` threads (0: one per 16 entries, up to the cores this process may run on and at most 8:
    each thread makes a cuDNN handle first), so the first step builds nothing. Returns the number of plans
    ready, or with background=True a Preparation at once. Call it after load()."""
    if background:
        _ops.prepare(device, threads, True)
        logger.info("prepare started in the background")
        return Preparation()
    started = time.perf_counter()
    plans = _ops.prepare(device, threads, False)
    logger.info("prepared %d plans in %.1f ms", plans, 1e3 * (time.perf_counter() - started))
    return plans


def set_log_level(level: str) -> None:
    """What the C++ runtime reports on stderr: 'off' (default), 'info' (prepare) or 'debug' (also every hit,
    miss, tune and plan built or restored). CUDNN_CACHE_LOG sets it at start. This package's own messages go
    to the logging.Logger `cudnn_cache.logger` ("cudnn_cache"), whose level this sets as well."""
    _ops.set_log_level(level)
    logger.setLevel(_LEVELS[level])


def log_level() -> str:
    """The C++ runtime's log level."""
    return _ops.get_log_level()


def stats() -> Dict[str, int]:
    """Counters since start (or reset_stats): hits, misses, tunes, fallbacks; tune_us (time spent tuning);
    plans_built and plan_build_us (graph-API execution plans built, and the time it took); plans_deserialized
    and plan_rebuilds (stored plans restored, and those rebuilt instead); plan_evictions (plans evicted by
    the plan cache's limit); capture_misses; tune_waits (misses that waited for another thread's search of
    the same key instead of searching it again); lent (keys the 'nearest' miss policy lent a neighbour's
    choice); attention_plans_built, attention_plans_restored, attention_plan_rebuilds and attention_build_us
    (cuDNN attention plans compiled, restored from a file, or compiled again where this cuDNN rejected the stored
    bytes, and the time it took); and, not counters, plans (graph-API execution plans in memory now, at most
    plan_cache_limit()), attention_plans (attention plans stored now) and entries now cached."""
    return dict(_ops.stats())


def reset_stats() -> None:
    """Sets every counter of stats() but entries back to zero."""
    _ops.reset_stats()


def size() -> int:
    """Entries cached, for every GPU and cuDNN version."""
    return _ops.size()


def clear() -> None:
    """Forgets every entry, and every pending key."""
    _ops.clear()


def tune_pending(max_seconds: Optional[float] = None, device: Optional[int] = None) -> int:
    """Tunes the pending keys of CUDA device `device` (default: the current one) now, one after another, and
    returns how many it tuned. A key is pending when a call met it and did not tune it: a miss under the
    'record' miss policy (or under 'tune' during a CUDA-graph capture), or a pending key of a loaded file, of
    this GPU and cuDNN (distributed.recorded_misses() lists them all). Call it off the training path, between
    epochs for instance, then save(): the next process runs those shapes tuned. With max_seconds it stops
    starting keys once that much time has passed (the key under way finishes); the rest stay pending. To tune a
    file's pending keys in several processes, run `python -m cudnn_cache tune FILE --jobs N`."""
    if max_seconds is not None and not max_seconds >= 0:
        raise ValueError(f"cudnn_cache.tune_pending: max_seconds must be a number of seconds >= 0 or None, not "
                         f"{max_seconds!r}")
    from . import distributed

    return _tune_in_turn(distributed.pending_of(distributed.device_origin(device)), device, max_seconds)


def _tune_in_turn(problems, device: Optional[int], max_seconds: Optional[float]) -> int:
    """Tunes the (backend, key) problems on CUDA device `device` one after another, starting none after
    `max_seconds` (None: no bound); returns how many it tuned. What tune_pending() and each worker of
    `python -m cudnn_cache tune --jobs` run."""
    started = time.perf_counter()
    tuned = 0
    for backend, key in problems:
        if max_seconds is not None and time.perf_counter() - started >= max_seconds:
            break
        _ops.tune_key(list(key), backend, device)
        tuned += 1
    if tuned:
        logger.info("tuned %d pending keys in %.2f s", tuned, time.perf_counter() - started)
    return tuned


def active_file() -> Optional[str]:
    """The file CUDNN_CACHE_PATH made this process load at import and save at exit, or None."""
    path = _activation.active_file()
    return None if path is None else str(path)


def describe_tensor(input: torch.Tensor) -> Tuple[str, Tuple[int, ...], Tuple[int, ...]]:
    """(data type, dims, strides) of the cuDNN tensor descriptor cudnn_cache builds for `input`, read back
    with cudnnGetTensorNdDescriptor. 1-D inputs (N, C, L) appear as (N, C, 1, L)."""
    data_type, dims, strides = _ops.describe_tensor(input)
    return data_type, tuple(dims), tuple(strides)


def describe_filter(weight: torch.Tensor) -> Tuple[str, str, Tuple[int, ...]]:
    """(data type, format, dims) of the cuDNN filter descriptor for `weight` (format NHWC when channels-last)."""
    data_type, layout, dims = _ops.describe_filter(weight)
    return data_type, layout, tuple(dims)


def describe_convolution(stride: List[int], padding: List[int], dilation: List[int], groups: int,
                         dtype: torch.dtype) -> Tuple:
    """(padding, stride, dilation, groups, mode, compute type, math type) of the cuDNN convolution descriptor,
    read back with the cuDNN getters."""
    padding_, stride_, dilation_, groups_, mode, compute_type, math_type = _ops.describe_convolution(
        stride, padding, dilation, groups, dtype)
    return tuple(padding_), tuple(stride_), tuple(dilation_), groups_, mode, compute_type, math_type


def conv_key(direction: str, input: torch.Tensor, weight: torch.Tensor, stride: List[int], padding: List[int],
             dilation: List[int], groups: int = 1, transposed: bool = False,
             output_padding: Optional[List[int]] = None) -> Tuple[int, ...]:
    """The cache key of a convolution in one direction ('forward', 'backward_data', 'backward_filter'): a
    tuple of ints, hashable, and the same in every process. Tensors may live on any device, meta included."""
    return tuple(_ops.conv_key(direction, input, weight, stride, padding, dilation, groups, transposed,
                               output_padding or [0]))


def query(direction: str, key: Tuple[int, ...], backend: Optional[str] = None) -> Optional[List[Dict]]:
    """The ranked candidates cached for `key` on the current GPU by `backend` (default: the current one), best
    first; None on a miss. Graph entries: engine, engine_id, knobs (type, value, ...), time_ms,
    workspace_bytes, runtime_compiled, deterministic (None where a file older than format 5 recorded no
    numerical notes). Legacy entries: algorithm, status, time_ms, workspace_bytes,
    deterministic, math_type."""
    found = _ops.query(direction, list(key), backend)
    return None if found is None else [dict(candidate) for candidate in found]


def fill(input: torch.Tensor, weight: torch.Tensor, stride: List[int], padding: List[int], dilation: List[int],
         groups: int = 1, transposed: bool = False, output_padding: Optional[List[int]] = None) -> int:
    """Tunes forward, backward-data and backward-filter of this convolution now with the current backend, on
    CUDA tensors shaped like these, and stores the rankings. Returns the number of directions tuned."""
    return _ops.fill(input, weight, stride, padding, dilation, groups, transposed, output_padding or [0])


def intercept(enabled: bool = True) -> None:
    """Routes PyTorch's own CUDA convolutions through the cache (enabled=True) or gives them back (False).

    Taken: aten::convolution and aten::convolution_backward, which every nn.Conv*d, nn.ConvTranspose*d and
    F.conv* call (and torch.compile's graphs) reaches, on CUDA tensors of float, half, bfloat16 or double with
    1 to 3 spatial dimensions, not empty, while torch.backends.cudnn.enabled. Everything else runs PyTorch's
    own kernels unchanged. The model keeps its modules and autograd its native graph; the convolutions look
    up, tune and fall back as the cudnn_cache ops do. CUDNN_CACHE_PATH turns it on at import unless
    CUDNN_CACHE_INTERCEPT=0."""
    _ops.set_intercept(bool(enabled))


def intercepting() -> bool:
    """Whether PyTorch's CUDA convolutions run through the cache (see intercept)."""
    return _ops.get_intercept()


INTERCEPT_ENVIRONMENT = _environment.INTERCEPT


from . import distributed  # noqa: E402  (sync(): share tuning across ranks)
if _remote_at_import is not None:
    set_remote(_remote_at_import)
from . import _activation  # noqa: E402  (CUDNN_CACHE_PATH: load now, save at exit)

if os.environ.get(_activation.ENVIRONMENT):
    _activation.activate(os.environ[_activation.ENVIRONMENT])
    if _intercept_at_import:
        intercept(True)
