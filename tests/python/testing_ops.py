"""Synthetic cache entries for the tests, through libcudnn_cache_testing.so (tests/torch/testing_ops.cpp): built
with the tests and never shipped, it writes the entries to a file, which is then loaded with cudnn_cache.load,
as any cache file is. So the shipped ops library carries no test helpers. It also shortens searches, for tests
that tune many keys (search_bounds)."""

import contextlib
import os
import pathlib
import tempfile
from typing import Sequence

import torch

import cudnn_cache

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ROOT / os.environ.get("CUDNN_CACHE_BUILD_DIR", "build") / "tests" / "libcudnn_cache_testing.so"


def _ops():
    if not hasattr(torch.ops.cudnn_cache_testing, "write_synthetic_entries"):
        if not LIBRARY.exists():
            raise RuntimeError(f"{LIBRARY} is missing: build the tests first (scripts/build.sh)")
        torch.ops.load_library(str(LIBRARY))
    return torch.ops.cudnn_cache_testing


def _load(write) -> None:
    with tempfile.TemporaryDirectory(prefix="cudnn_cache_synthetic_") as folder:
        path = os.path.join(folder, "synthetic.cache")
        write(path)
        cudnn_cache.load(path)


def add_synthetic_entries(entries: int, seed: int, origin_name: str, origin_numbers: Sequence[int]) -> None:
    """Merges `entries` synthetic entries of the origin (a device name and 5 numbers: compute capability major,
    minor, SM count, cuDNN major, minor) into this process's cache."""
    _load(lambda path: _ops().write_synthetic_entries(path, entries, seed, origin_name, list(origin_numbers)))


def add_synthetic_ranking(key: Sequence[int], backend: str, origin_name: str, origin_numbers: Sequence[int],
                          seed: int = 1) -> None:
    """Merges a synthetic ranking for the key (conv_key's words) into this process's cache of the backend, under
    the origin: where a search would store one."""
    _load(lambda path: _ops().write_synthetic_ranking(path, list(key), backend, origin_name, list(origin_numbers),
                                                      seed))


def set_search_bounds(**bounds) -> None:
    """This process's later searches time within `bounds` (warmup, repetitions, max_candidates, mode_b_candidates,
    knob_variants, finalists, flush_l2, give_up_ratio; the others at their constants; none: the constants), as a
    test that tunes many keys needs. No tuning option sets them: Note [Search bounds] in
    extension/src/search_bounds.h."""
    _ops().set_search_bounds(cudnn_cache.library_path(), **bounds)


@contextlib.contextmanager
def search_bounds(**bounds):
    """set_search_bounds(**bounds) within the block, the constants again after it."""
    set_search_bounds(**bounds)
    try:
        yield
    finally:
        set_search_bounds()
