import contextlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH_OPS = ROOT / "torch_ops"

# `import cudnn_cache` from the source tree, without installing it (it finds the ops library in the build).
if str(TORCH_OPS) not in sys.path:
    sys.path.insert(0, str(TORCH_OPS))


def pytest_configure(config):
    # Also declared in the repository's pytest.ini; registering here keeps the marker known when pytest is
    # started with another rootdir or config.
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped where torch.cuda.is_available() is False)")
    config.addinivalue_line("markers", "gpu_memory: needs much of the GPU's memory (run alone by gpu_check.sh)")


def pytest_addoption(parser):
    parser.addoption("--shard", metavar="I/N", default=None,
                     help="run only the I-th of N shards of the collected tests (0 <= I < N), every N-th test from the "
                          "I-th: N processes with 0/N ... N-1/N run each test once (scripts/gpu_check.sh)")


def shard_of(value: str):
    """(I, N) from --shard's 'I/N'; a pytest.UsageError that names the option and the fix for anything else."""
    index, _, count = value.partition("/")
    if index.isdigit() and count.isdigit() and int(index) < int(count):
        return int(index), int(count)
    raise pytest.UsageError(f"--shard {value!r}: expected I/N with 0 <= I < N, e.g. --shard 0/4 ... --shard 3/4")


def pytest_collection_modifyitems(config, items):
    if config.getoption("shard"):
        index, count = shard_of(config.getoption("shard"))
        config.hook.pytest_deselected(items=[item for position, item in enumerate(items) if position % count != index])
        items[:] = items[index::count]
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    reason = f"no CUDA GPU: torch.cuda.is_available() is False (torch {torch.__version__})"
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_teardown(item):
    """After a gpu_memory test, its tensors go back to the GPU, not to this process's caching allocator: the next
    such test may need that memory in one piece."""
    if item.get_closest_marker("gpu_memory") is None or "torch" not in sys.modules:
        return
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def zero_code_runs(child_env: dict, script: str, cache_file, runs: int = 2) -> list:
    """Runs `script` in `runs` fresh processes one after another, each with CUDNN_CACHE_PATH=cache_file (load at
    import, intercept, save at exit); returns the JSON object each printed last."""
    env = dict(child_env, CUDNN_CACHE_PATH=str(cache_file))
    env.pop("CUDNN_CACHE_INTERCEPT", None)
    reports = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        reports.append(json.loads(done.stdout.splitlines()[-1]))
    return reports


@contextlib.contextmanager
def intercepting(enabled: bool):
    """cudnn_cache.intercept(enabled) inside the block, the state before it after."""
    import cudnn_cache

    before = cudnn_cache.intercepting()
    cudnn_cache.intercept(enabled)
    try:
        yield
    finally:
        cudnn_cache.intercept(before)


def uses_cache(path: str, cached: bool) -> bool:
    """Whether a pass on `path` ("convert" or "intercept") uses cudnn_cache's own functions and modules: a cached
    convert pass."""
    return cached and path == "convert"


@contextlib.contextmanager
def through(path: str, cached: bool):
    """Native (cached False), or through cudnn_cache on `path`: interception on, or nothing to do (convert
    picks cudnn_cache's functions and modules itself, uses_cache)."""
    with intercepting(cached and path == "intercept"):
        yield


def cache_calls() -> int:
    """The cache's lookups so far (hits + misses): each call that runs through the cache adds one."""
    import cudnn_cache

    stats = cudnn_cache.stats()
    return stats["hits"] + stats["misses"]


@pytest.fixture(scope="session")
def child_env() -> dict:
    """The environment for a child Python process that must `import cudnn_cache` from the source tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TORCH_OPS), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def cli(child_env, tmp_path):
    """Runs `python -m cudnn_cache ARGS...` in a child process, in tmp_path; returns the CompletedProcess."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "cudnn_cache", *map(str, args)], env=child_env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    return run


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    """The CMake build folder: $CUDNN_CACHE_BUILD_DIR, or ./build (what scripts/build.sh makes)."""
    path = ROOT / os.environ.get("CUDNN_CACHE_BUILD_DIR", "build")
    if not (path / "cudnn_cache_tool").exists():
        pytest.fail(f"{path}/cudnn_cache_tool is missing: run scripts/build.sh first")
    return path


@pytest.fixture
def cache_state():
    """Restores the process-wide cache state a test may change: the miss policy, the backend, the tuning
    options, the plan cache's and the workspace's limits, the entries (cleared before and after) and the counters."""
    import cudnn_cache

    policy, backend, tuning = cudnn_cache.miss_policy(), cudnn_cache.backend(), cudnn_cache.tuning_options()
    plan_cache_limit, workspace_limit = cudnn_cache.plan_cache_limit(), cudnn_cache.workspace_limit()
    cudnn_cache.clear()
    cudnn_cache.reset_stats()
    yield cudnn_cache
    cudnn_cache.set_miss_policy(policy)
    cudnn_cache.set_plan_cache_limit(plan_cache_limit)
    cudnn_cache.set_workspace_limit(workspace_limit)
    cudnn_cache.set_backend(backend)
    cudnn_cache.set_tuning_options(**tuning)
    cudnn_cache.clear()
    cudnn_cache.reset_stats()


@pytest.fixture
def torch_flags():
    """Restores the global torch flags a test may change: cuDNN TF32, determinism, benchmark mode."""
    import torch

    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    (torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
     deterministic, warn_only) = saved
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


@pytest.fixture(scope="session")
def tool(build_dir):
    """Runs cudnn_cache_tool with the given arguments; returns the CompletedProcess (text output)."""

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(build_dir / "cudnn_cache_tool"), *map(str, args)], capture_output=True, text=True)

    return run
