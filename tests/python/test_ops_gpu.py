"""The cudnn_cache ops on a CUDA GPU: numerics against torch's own convolutions over dims, dtypes, layouts,
groups, stride and dilation, transposed or not, through the graph backend (the default) and the legacy one;
determinism; warm start in a fresh process; the miss policies; query, fill and prepare; and a TorchScript
model that trains. Every test is marked gpu (skipped without CUDA)."""

import collections
import contextlib
import copy
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cudnn_cache
import testing_ops
from cudnn_cache import distributed
from conftest import intercepting, through, uses_cache

pytestmark = pytest.mark.gpu

ops = torch.ops.cudnn_cache

# Tolerances relative to the largest magnitude of the expected tensor: both sides run cuDNN, possibly with
# different algorithms, which round differently. float32 runs with TF32 off (the fixture below), so it is tight.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

SPATIAL_SIZE = {1: (12,), 2: (9, 10), 3: (8, 9, 10)}
CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}


@pytest.fixture(autouse=True)
def restore_state(cache_state, torch_flags):
    """Every test starts with an empty cache, zero counters and the 'tune' policy; flags come back after."""
    assert cudnn_cache.miss_policy() == "tune"
    yield


def randn(*sizes, dtype=torch.float32, memory_format=torch.contiguous_format, seed=0):
    """Normal values made on the CPU (the same on every machine), then moved to the GPU."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(sizes, generator=generator).to(dtype)
    return values.cuda().contiguous(memory_format=memory_format)


def assert_close_scaled(actual, expected, tolerance, what):
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * scale,
                               msg=lambda message: f"{what}: {message}")


def run_both(ours, native, tensors, input_view, grad_seed=9):
    """Forward and backward of ours and native on separate leaf copies of `tensors` (None allowed), the input
    seen through `input_view`: returns (output, [grad of each tensor]) for each."""
    results = []
    for conv in (ours, native):
        leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]
        output = conv(input_view(leaves[0]), *leaves[1:])
        output.backward(randn(*output.shape, dtype=output.dtype, seed=grad_seed))
        results.append((output.detach(), [leaf.grad for leaf in leaves if leaf is not None]))
    return results


def check_against_native(ours, native, tensors, dtype, input_view=lambda x: x):
    (output, grads), (expected_output, expected_grads) = run_both(ours, native, tensors, input_view)
    assert output.shape == expected_output.shape and output.dtype == expected_output.dtype
    assert_close_scaled(output, expected_output, TOLERANCE[dtype], "output")
    for grad, expected, what in zip(grads, expected_grads, ["grad input", "grad weight", "grad bias"]):
        assert_close_scaled(grad, expected, TOLERANCE[dtype], what)


@contextlib.contextmanager
def conv_through(path, cached, name):
    """The convolution function `name` (e.g. "conv2d") as a caller of `path` meets it (conftest's through and
    uses_cache): cudnn_cache.functional's for a cached convert pass, torch's otherwise."""
    with through(path, cached):
        yield getattr(cudnn_cache.functional if uses_cache(path, cached) else F, name)


# --- Numerics against torch ------------------------------------------------------------------------------------

@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2)], ids=["s1d1", "s2d1", "s1d2"])
@pytest.mark.parametrize("groups", ["1", "2", "depthwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64],
                         ids=lambda dtype: str(dtype).replace("torch.", ""))
@pytest.mark.parametrize("dims, channels_last", [(1, False), (2, False), (2, True), (3, False), (3, True)],
                         ids=["1d", "2d", "2d_channels_last", "3d", "3d_channels_last_3d"])
def test_matches_native(dims, channels_last, dtype, groups, stride, dilation, transposed):
    # float64 channels-last used to fail ("cuDNN found no algorithm that runs"): cuDNN has no NHWC algorithm for
    # double, so the ops must keep float64 contiguous, as PyTorch does.
    torch.backends.cudnn.allow_tf32 = False  # restored by torch_flags
    in_channels, out_channels, group_count = {"1": (4, 8, 1), "2": (4, 8, 2), "depthwise": (4, 4, 4)}[groups]
    memory_format = CHANNELS_LAST[dims] if channels_last else torch.contiguous_format
    kernel = (3,) * dims
    if transposed:  # weight (in, out / groups, *kernel); output_padding 1 where stride 2 leaves a choice
        weight_size = (in_channels, out_channels // group_count, *kernel)
        kwargs = dict(stride=stride, padding=1, output_padding=stride - 1, groups=group_count, dilation=dilation)
        name = f"conv_transpose{dims}d"
    else:
        weight_size = (out_channels, in_channels // group_count, *kernel)
        kwargs = dict(stride=stride, padding=1, dilation=dilation, groups=group_count)
        name = f"conv{dims}d"
    x = randn(2, in_channels, *SPATIAL_SIZE[dims], dtype=dtype, memory_format=memory_format, seed=1)
    w = randn(*weight_size, dtype=dtype, memory_format=memory_format, seed=2)
    b = randn(out_channels, dtype=dtype, seed=3)
    ours, native = getattr(cudnn_cache.functional, name), getattr(F, name)
    check_against_native(lambda *t: ours(*t, **kwargs), lambda *t: native(*t, **kwargs), (x, w, b), dtype)


@pytest.mark.parametrize("case", ["sliced_input", "batch_1", "batch_1_transposed", "bias_free"])
def test_unusual_inputs_match_native(case):
    torch.backends.cudnn.allow_tf32 = False
    w = randn(8, 4, 3, 3, seed=2)
    b = randn(8, seed=3)
    x = randn(1 if case.startswith("batch_1") else 2, 4, 20 if case == "sliced_input" else 10, 10, seed=1)
    # The sliced input is a non-contiguous view (every other row) of the leaf that receives the gradient.
    input_view = (lambda t: t[:, :, ::2]) if case == "sliced_input" else (lambda t: t)
    if case == "batch_1_transposed":
        ours, native = cudnn_cache.functional.conv_transpose2d, F.conv_transpose2d
        w = randn(4, 8, 3, 3, seed=2)
    else:
        ours, native = cudnn_cache.functional.conv2d, F.conv2d
    tensors = (x, w, None if case == "bias_free" else b)
    check_against_native(lambda *t: ours(*t, stride=2, padding=1), lambda *t: native(*t, stride=2, padding=1),
                         tensors, torch.float32, input_view)


def test_channels_last_output_stays_channels_last():
    x = randn(2, 4, 10, 10, memory_format=torch.channels_last)
    w = randn(8, 4, 3, 3, memory_format=torch.channels_last)
    assert ops.convolution(x, w, None, [1], [1], [1], 1).is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("transposed", ["input", "weight"])
@pytest.mark.parametrize("path", ["convert", "intercept"])
def test_a_1d_convolution_of_transposed_tensors_keeps_native_layout(path, transposed):
    """(N, L, C) activations transposed to (N, C, L), as audio and text models feed Conv1d: PyTorch makes the input
    contiguous before cuDNN sees it, so outputs and gradients are contiguous. A weight transposed from (O, K, C) is
    channels-last as cuDNN's (O, C, 1, K) view, and then everything is. The cache keeps native's strides in both."""
    torch.backends.cudnn.allow_tf32 = False  # restored by torch_flags; both sides compute in float32
    x = randn(4, 16, 20)
    w = randn(8, 16, 3)
    if transposed == "input":
        x = randn(4, 20, 16).transpose(1, 2)  # strides (320, 1, 16)
    else:
        w = randn(8, 3, 16).transpose(1, 2)  # strides (48, 1, 16)
    x.requires_grad_()
    w.requires_grad_()
    results = []
    for cached in (False, True):
        with conv_through(path, cached, "conv1d") as conv:
            y = conv(x, w, None, 1, 1)
            grads = torch.autograd.grad(y, [x, w], randn(*y.shape, seed=3))
        results.append((y, *grads))
    assert cudnn_cache.stats()["misses"] > 0
    for native, ours in zip(*results):
        assert ours.stride() == native.stride()
        assert_close_scaled(ours, native, TOLERANCE[torch.float32], "1-D")


def two_gpus_of_one_model() -> bool:
    return torch.cuda.device_count() >= 2 and torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1)


@pytest.mark.skipif(not two_gpus_of_one_model(), reason="needs two GPUs of one model (the nvidia-h100-x2 kind)")
@pytest.mark.parametrize("path", ["convert", "intercept"])
def test_two_gpus_of_one_model_share_the_rankings_and_each_runs_its_own_plans(path):
    """GPUs of one model are one origin: one cache serves both, and one search of a key serves both (Note
    [Selection, merge and fallback policy]), while each GPU runs plans of its own. Each thread's memo of its hits
    (Note [Each thread's own hits]) holds a call on each GPU apart: calls on the two in turn, from one thread, compute
    what PyTorch computes on each, with no fallback."""
    torch.backends.cudnn.allow_tf32 = False  # restored by torch_flags
    results = {}
    for cached in (True, False):
        with conv_through(path, cached, "conv2d") as conv:
            for step in range(3):
                for device in ("cuda:0", "cuda:1"):
                    x = randn(4, 8, 12, 12).to(device).requires_grad_()
                    w = randn(16, 8, 3, 3, seed=1).to(device).requires_grad_()
                    y = conv(x, w, None, 1, 1)
                    results[cached, step, device] = (y, *torch.autograd.grad(y, (x, w), torch.ones_like(y)))
    stats = cudnn_cache.stats()
    assert stats["tunes"] == 3 and stats["misses"] == 3, stats  # searched on the first GPU, hits on the second
    assert stats["hits"] == 3 * 2 * 3 - 3 and stats["fallbacks"] == 0, stats
    for step in range(3):
        for device in ("cuda:0", "cuda:1"):
            for ours, native in zip(results[True, step, device], results[False, step, device]):
                assert ours.device == torch.device(device)
                assert_close_scaled(ours, native, TOLERANCE[torch.float32], f"step {step} on {device}")


@pytest.mark.parametrize("backend", ["graph", "legacy"])
def test_every_direction_runs_on_the_current_stream(backend):
    """The three directions' kernels (and their workspace) go to the current stream: with the default stream held
    by a long sleep kernel, a side stream's forward and backward through the cache finish first."""
    cudnn_cache.set_backend(backend)
    x = randn(4, 8, 12, 12).requires_grad_()
    w = randn(16, 8, 3, 3).requires_grad_()
    grad = randn(4, 16, 12, 12, seed=1)

    def step():
        output = ops.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], 1)
        return torch.autograd.grad(output, (x, w), grad)

    step()  # tunes the three keys and builds their plans, on the default stream
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    torch.cuda._sleep(2 * 10**9)  # about a second of spinning on the default stream (2e9 cycles at ~2 GHz)
    with torch.cuda.stream(side):
        gradients = step()
        done = torch.cuda.Event()
        done.record(side)
    waited = time.monotonic()
    while not done.query() and time.monotonic() - waited < 0.5:
        time.sleep(0.001)
    default_busy = not torch.cuda.current_stream().query()
    finished = done.query()
    torch.cuda.synchronize()
    assert finished and default_busy, (finished, default_busy)
    assert cudnn_cache.stats()["misses"] == 3 and all(g.isfinite().all() for g in gradients)


def test_mismatched_devices_are_rejected_as_pytorch_rejects_them():
    x, w = randn(2, 4, 8, 8), torch.randn(8, 4, 3, 3)
    with pytest.raises(RuntimeError) as native:
        F.conv2d(x, w, None, 1, 1)
    with pytest.raises(RuntimeError) as ours:
        ops.convolution(x, w, None, [1], [1], [1], 1)
    assert str(ours.value) == str(native.value)


# --- Determinism -----------------------------------------------------------------------------------------------

def test_deterministic_mode_gives_bitwise_identical_weight_gradients():
    torch.use_deterministic_algorithms(True)  # restored by torch_flags
    torch.backends.cudnn.allow_tf32 = False  # so that native's gradient is as exact as ours, below
    # Large enough that cuDNN's fastest backward-filter algorithms would be ones that use atomics.
    x = randn(32, 32, 32, 32, seed=1)
    w = randn(64, 32, 3, 3, seed=2)
    grad_output = randn(32, 64, 32, 32, seed=3)
    gradients = []
    for _ in range(2):
        weight = w.clone().requires_grad_()
        ops.convolution(x, weight, None, [1], [1], [1], 1).backward(grad_output)
        gradients.append(weight.grad)
    assert cudnn_cache.stats()["hits"] >= 2  # the second run used what the first one tuned
    assert torch.equal(gradients[0], gradients[1])
    # Through the graph API (Note [Deterministic calls]): its ranking holds deterministic configs, and the
    # legacy backend, which deterministic calls took before file format 5, was not used.
    key = cudnn_cache.conv_key("backward_filter", x, w, [1, 1], [1, 1], [1, 1], 1)
    ranking = cudnn_cache.query("backward_filter", key)
    assert ranking is not None and any(entry["deterministic"] for entry in ranking)
    assert cudnn_cache.query("backward_filter", key, backend="legacy") is None
    native = w.clone().requires_grad_()
    F.conv2d(x, native, None, 1, 1).backward(grad_output)
    assert_close_scaled(gradients[0], native.grad, TOLERANCE[torch.float32], "deterministic weight gradient")


def test_deterministic_mode_adds_no_fill_kernel_native_does_not_run():
    """Under torch.use_deterministic_algorithms, at::empty fills each new tensor with NaN (torch.utils.deterministic
    .fill_uninitialized_memory). PyTorch's cuDNN convolutions allocate their outputs without that fill, since
    cuDNN writes every element; the cache's must too (a fill kernel per output was 3% of a ResNet-18 step)."""
    from torch.profiler import ProfilerActivity, profile

    torch.use_deterministic_algorithms(True)  # restored by torch_flags
    x, w = randn(8, 16, 32, 32, seed=1), randn(32, 16, 3, 3, seed=2)
    grad_output = randn(8, 32, 32, 32, seed=3)

    def fills(convolution) -> int:
        def step():
            inputs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
            convolution(*inputs).backward(grad_output)
            torch.cuda.synchronize()
        step()  # tuned (the cache) and warm (both)
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            step()
        return sum(event.count for event in profiler.key_averages() if "FillFunctor" in event.key)

    native = fills(lambda a, b: F.conv2d(a, b, None, 1, 1))
    ours = fills(lambda a, b: ops.convolution(a, b, None, [1], [1], [1], 1))
    assert ours <= native, f"{ours} fill kernels through the cache, {native} natively"


# --- Warm start in a fresh process -----------------------------------------------------------------------------

# Runs the seed's two-convolution model once: `tune` starts empty and saves the cache; `replay` loads it with
# the miss policy 'error'. Writes the output, the gradients and the counters.
WARM_START_SCRIPT = """
import sys
import torch
from torch import nn
import cudnn_cache

mode, cache_file, result_file = sys.argv[1:4]
if mode == "replay":
    assert cudnn_cache.load(cache_file) > 0
    cudnn_cache.set_miss_policy("error")


class GlobalMeanPool(nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3))


torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding="same"), nn.ReLU(), nn.Conv2d(64, 32, 3), nn.ReLU(),
                      GlobalMeanPool(), nn.Flatten(), nn.Linear(32, 1))
model = cudnn_cache.convert(model).cuda()
x = torch.randn(7, 3, 32, 32, generator=torch.Generator().manual_seed(1)).cuda()
cudnn_cache.reset_stats()
output = model(x)
output.sum().backward()
torch.cuda.synchronize()
stats = cudnn_cache.stats()
if mode == "tune":
    cudnn_cache.save(cache_file)
torch.save({"output": output.detach().cpu(), "stats": stats,
            "grads": {name: p.grad.cpu() for name, p in model.named_parameters()}}, result_file)
"""


def test_a_fresh_process_that_loaded_the_cache_tunes_nothing(child_env, tmp_path):
    cache_file = tmp_path / "convs.cache"
    results = {}
    for mode in ("tune", "replay"):
        result_file = tmp_path / f"{mode}.pt"
        process = subprocess.run([sys.executable, "-c", WARM_START_SCRIPT, mode, str(cache_file), str(result_file)],
                                 env=child_env, capture_output=True, text=True, timeout=300)
        assert process.returncode == 0, f"{mode} run failed:\n{process.stderr}"
        results[mode] = torch.load(result_file)
    tune, replay = results["tune"], results["replay"]

    # conv1: forward and backward-filter (its input needs no gradient); conv2: all three directions.
    assert tune["stats"]["tunes"] == 5 and tune["stats"]["misses"] == 5, tune["stats"]
    assert replay["stats"]["tunes"] == 0 and replay["stats"]["misses"] == 0, replay["stats"]
    assert replay["stats"]["hits"] == 5 and replay["stats"]["fallbacks"] == 0, replay["stats"]

    # The same algorithms on the same inputs. Forward algorithms are deterministic, so the output is bitwise
    # equal. Some backward algorithms cuDNN may rank best accumulate with atomics (non-deterministic order), so
    # the gradients are compared with a tolerance far below any algorithm difference.
    assert torch.equal(replay["output"], tune["output"])
    assert replay["grads"].keys() == tune["grads"].keys()
    for name, grad in tune["grads"].items():
        assert_close_scaled(replay["grads"][name], grad, 1e-5, name)


# --- Miss policies, query and fill -----------------------------------------------------------------------------

def test_pending_keys_are_saved_tuned_offline_by_the_cli_and_run_tuned_in_the_next_process(cli, tmp_path):
    """Note [Pending keys]: the record policy's misses are saved in the file; `python -m cudnn_cache tune FILE`
    tunes them in another process and saves them into the file; a process that loads it misses nothing."""
    cudnn_cache.set_miss_policy("record")
    x, w = randn(2, 4, 8, 8), randn(8, 4, 3, 3)
    ops.convolution(x, w, None, [1], [1], [1], 1)
    assert cudnn_cache.size() == 0 and len(distributed.recorded_misses()) == 1
    path = tmp_path / "pending.cache"
    cudnn_cache.save(str(path))
    assert "; 1 pending keys" in cli("validate", path).stdout
    tuned = cli("tune", path, "--max-seconds", "60")
    assert tuned.returncode == 0, tuned.stderr
    assert "tuned 1 pending keys" in tuned.stdout and "; 0 pending keys" in tuned.stdout
    cudnn_cache.clear()
    cudnn_cache.load(str(path))
    cudnn_cache.set_miss_policy("error")  # a miss would raise
    torch.testing.assert_close(ops.convolution(x, w, None, [1], [1], [1], 1), F.conv2d(x, w, padding=1))
    assert distributed.recorded_misses() == []


def test_tune_pending_tunes_this_gpus_pending_keys_within_its_time(cache_state):
    cudnn_cache.set_miss_policy("record")
    x, w = randn(2, 4, 8, 8).requires_grad_(), randn(8, 4, 3, 3).requires_grad_()
    ops.convolution(x, w, None, [1], [1], [1], 1).sum().backward()
    assert len(distributed.recorded_misses()) == 3  # forward, backward-data, backward-filter
    assert cudnn_cache.tune_pending(max_seconds=0) == 0  # no time: nothing is started
    assert cudnn_cache.tune_pending() == 3 and cudnn_cache.size() == 3
    assert distributed.recorded_misses() == [] and cudnn_cache.stats()["tunes"] == 3



def train_nearest_case(batch, size, channels=8, seed=0):
    """Forward and backward of a 3x3 convolution (channels -> 16) through the cache, checked against native."""
    x, w = randn(batch, channels, size, size, seed=seed), randn(16, channels, 3, 3, seed=seed + 1)
    ours, native = run_both(lambda x, w: ops.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1),
                            lambda x, w: F.conv2d(x, w, padding=1), [x, w], lambda x: x)
    assert_close_scaled(ours[0], native[0], TOLERANCE[torch.float32], "output")
    for what, a, b in zip(("grad input", "grad weight"), ours[1], native[1]):
        assert_close_scaled(a, b, TOLERANCE[torch.float32], what)


@pytest.mark.parametrize("backend", ["graph", "legacy"])
def test_nearest_runs_a_neighbours_choice_untimed_and_leaves_the_key_pending(backend):
    """Note [Nearest key]: a new batch and spatial size of a tuned convolution runs the tuned size's choice
    (graph: its plan is built for the new key), times nothing, counts no fallback, is pending until
    tune_pending() tunes it, and asks for its neighbour once; a convolution with no tuned size runs heuristics."""
    cudnn_cache.set_backend(backend)
    train_nearest_case(4, 16)
    assert cudnn_cache.stats()["tunes"] == 3 and cudnn_cache.size() == 3
    cudnn_cache.set_miss_policy("nearest")
    cudnn_cache.reset_stats()
    train_nearest_case(8, 12, seed=2)  # another batch and size
    after = cudnn_cache.stats()
    assert after["tunes"] == 0 and after["fallbacks"] == 0 and after["lent"] == 3 and after["misses"] == 3
    assert cudnn_cache.size() == 3 and len(distributed.recorded_misses()) == 3
    if backend == "graph":  # a lent config's plan is built for the new key
        assert after["plans_built"] > 0
    train_nearest_case(8, 12, seed=4)  # lent once: the second pass asks for nothing and builds nothing
    again = cudnn_cache.stats()
    assert again["lent"] == 3 and again["misses"] == 6 and again["plans_built"] == after["plans_built"]
    train_nearest_case(2, 12, channels=4)  # no tuned size of this convolution: native heuristics' choice
    assert cudnn_cache.stats()["lent"] == 6 and cudnn_cache.stats()["fallbacks"] == 0
    if backend == "graph":  # its plans are built once, on the first call, and kept for the next
        built = cudnn_cache.stats()["plans_built"]
        assert built == again["plans_built"] + 3
        train_nearest_case(2, 12, channels=4, seed=8)
        assert cudnn_cache.stats()["plans_built"] == built
    assert len(distributed.recorded_misses()) == 6
    assert cudnn_cache.tune_pending() == 6 and cudnn_cache.size() == 9
    cudnn_cache.reset_stats()
    train_nearest_case(8, 12, seed=6)  # tuned now: hits
    assert cudnn_cache.stats()["hits"] == 3 and cudnn_cache.stats()["misses"] == 0


def test_nearest_runs_heuristics_when_no_borrowed_config_builds_for_the_key(tmp_path):
    """The neighbour's configs are edited to an engine no cuDNN has: the new key's call falls to native
    heuristics' choice (one plan built per key, through the graph API), correct and without a fallback counted
    (nothing was cached for it)."""
    train_nearest_case(4, 16)
    path = tmp_path / "tuned.cache"
    cudnn_cache.save(str(path))
    document = json.loads(ops.file_export_json(str(path)))
    edited = 0
    for section in document["sections"]:
        for name, entries in section.items():
            if name.startswith("graph_") and isinstance(entries, list):
                for entry in entries:
                    for config in entry["ranking"]["candidates"]:
                        config["engine_id"] = (1 << 20) + edited  # no engine has this index
                        edited += 1
    assert edited >= 3
    (tmp_path / "edited.json").write_text(json.dumps(document))
    ops.file_import_json(str(tmp_path / "edited.json"), str(path))
    cudnn_cache.clear()
    cudnn_cache.load(str(path))
    cudnn_cache.set_miss_policy("nearest")
    cudnn_cache.reset_stats()
    train_nearest_case(8, 12, seed=2)
    stats = cudnn_cache.stats()
    assert stats["lent"] == 3 and stats["fallbacks"] == 0 and stats["tunes"] == 0 and stats["plans_built"] == 3

def test_error_policy_names_the_missing_key():
    cudnn_cache.set_miss_policy("error")
    with pytest.raises(RuntimeError, match="no cached engine config") as error:
        ops.convolution(randn(2, 4, 8, 8), randn(8, 4, 3, 3), None, [1], [1], [1], 1)
    assert "forward" in str(error.value) and "'error'" in str(error.value)
    assert cudnn_cache.stats()["misses"] == 1 and cudnn_cache.size() == 0


def test_heuristic_policy_runs_without_storing():
    torch.backends.cudnn.allow_tf32 = False
    cudnn_cache.set_miss_policy("heuristic")
    x, w = randn(2, 4, 8, 8), randn(8, 4, 3, 3)
    torch.testing.assert_close(ops.convolution(x, w, None, [1], [1], [1], 1), F.conv2d(x, w, padding=1))
    stats = cudnn_cache.stats()
    assert stats["misses"] == 1 and stats["tunes"] == 0 and cudnn_cache.size() == 0


def cudnn_kernels(step) -> collections.Counter:
    """The CUDA kernels one call of step() launches that are not ATen's own (cuDNN's, by name), counted; step()
    runs twice before, so that what a first call builds is built."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        step()
        torch.cuda.synchronize()
    return collections.Counter(event.name for event in profiler.events()
                               if event.device_type == torch.autograd.DeviceType.CUDA
                               and not event.name.startswith(("void at::", "at::", "Memset", "Memcpy")))


@pytest.mark.parametrize("policy", ["heuristic", "record", "nearest"])
def test_untuned_misses_run_the_kernels_native_heuristics_run(policy):
    """Note [Native heuristics' choice]: with nothing tuned, a training step of TF32, bf16 channels_last and
    depthwise convolutions, intercepted under each untuned miss policy, launches exactly the cuDNN kernels
    PyTorch launches with cudnn.benchmark off (the same kernels: the same GPU time), and builds each key's plan
    once, on its first call."""
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    fp32 = nn.Conv2d(64, 64, 3, padding=1).cuda()
    bf16 = nn.Sequential(nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.Conv2d(128, 128, 3, padding=1, groups=128),
                         nn.Conv2d(128, 64, 1)).to("cuda", torch.bfloat16, memory_format=torch.channels_last)
    x = randn(8, 64, 28, 28).requires_grad_()
    y = randn(8, 64, 28, 28, dtype=torch.bfloat16, memory_format=torch.channels_last).requires_grad_()

    def step():
        fp32(x).sum().backward()
        bf16(y).float().sum().backward()

    native = cudnn_kernels(step)
    assert native, "the profiler recorded no cuDNN kernel"
    cudnn_cache.set_miss_policy(policy)
    with intercepting(True):
        ours = cudnn_kernels(step)
    stats = cudnn_cache.stats()
    assert stats["plans_built"] >= 3 and stats["misses"] == 3 * stats["plans_built"], stats
    assert stats["tunes"] == 0 and stats["fallbacks"] == 0 and cudnn_cache.size() == 0, stats
    assert ours == native


@pytest.mark.parametrize("backend", ["graph", "legacy"])
def test_query_misses_then_lists_the_ranking_after_a_run(backend):
    cudnn_cache.set_backend(backend)
    other = {"graph": "legacy", "legacy": "graph"}[backend]
    x, w = randn(2, 4, 8, 8), randn(8, 4, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], 1)
    key = cudnn_cache.conv_key("forward", x, w, *args)
    assert cudnn_cache.query("forward", key) is None

    ops.convolution(x, w, None, *args)
    assert cudnn_cache.stats()["tunes"] == 1 and cudnn_cache.stats()["tune_us"] > 0
    ranking = cudnn_cache.query("forward", key)  # conv_key gives the key the op used
    assert isinstance(ranking, list) and len(ranking) > 0
    best = ranking[0]
    assert best["time_ms"] >= 0 and best["workspace_bytes"] >= 0
    ran = [entry for entry in ranking if entry.get("status", "CUDNN_STATUS_SUCCESS") == "CUDNN_STATUS_SUCCESS"]
    assert ranking[:len(ran)] == ran  # what failed to run comes after everything that ran
    assert all(a["time_ms"] <= b["time_ms"] for a, b in zip(ran, ran[1:]))
    if backend == "graph":
        assert best["engine_id"] >= 0 and best["engine"].startswith(f"engine {best['engine_id']}")
        assert len(best["knobs"]) % 2 == 0 and isinstance(best["runtime_compiled"], bool)
        assert all(isinstance(entry["deterministic"], bool) for entry in ranking)  # format 5 records it
        assert cudnn_cache.stats()["plans_built"] == 0  # the run used the plan kept after its search
    else:
        assert isinstance(best["algorithm"], str) and best["algorithm"]
        assert best["status"] == "CUDNN_STATUS_SUCCESS"
        assert {"deterministic", "math_type"} <= best.keys()
    assert cudnn_cache.query("forward", key, backend=other) is None  # each backend has its own entries
    assert cudnn_cache.query("backward_data", cudnn_cache.conv_key("backward_data", x, w, *args)) is None


def test_search_bounds_bound_what_a_search_stores():
    x, w = randn(4, 16, 16, 16, dtype=torch.float16), randn(32, 16, 3, 3, dtype=torch.float16)
    args = ([1, 1], [1, 1], [1, 1], 1)
    key = cudnn_cache.conv_key("forward", x, w, *args)
    with testing_ops.search_bounds(max_candidates=1, mode_b_candidates=0, knob_variants=0):
        ops.convolution(x, w, None, *args)
    only = cudnn_cache.query("forward", key)
    assert len(only) == 1

    cudnn_cache.clear()
    expected = F.conv2d(x, w, None, *args)
    with testing_ops.search_bounds(max_candidates=1, mode_b_candidates=0):  # the heuristic pick, knob neighbours
        assert_close_scaled(ops.convolution(x, w, None, *args), expected, TOLERANCE[torch.float16], "knob variant")
    ranking = cudnn_cache.query("forward", key)
    assert 1 <= len(ranking) <= 5
    assert {entry["engine_id"] for entry in ranking} == {only[0]["engine_id"]}
    assert len({tuple(entry["knobs"]) for entry in ranking}) == len(ranking)


def test_audit_times_every_entry_against_the_native_choices():
    x, w = randn(8, 32, 28, 28, dtype=torch.bfloat16, memory_format=torch.channels_last), randn(
        64, 32, 3, 3, dtype=torch.bfloat16, memory_format=torch.channels_last)
    x.requires_grad_()
    w.requires_grad_()
    cudnn_cache.functional.conv2d(x, w, padding=1).sum().backward()
    rows = cudnn_cache.audit()
    assert sorted(row["direction"] for row in rows) == ["backward_data", "backward_filter", "forward"]
    for row in rows:
        direction = row["direction"]
        stored = cudnn_cache.query(direction, cudnn_cache.conv_key(direction, x, w, [1, 1], [1, 1], [1, 1], 1))
        assert row["stored_engine"] == stored[0]["engine"]
        for choice in ("stored", "heuristic", "benchmark"):
            assert row[f"{choice}_ms"] > 0 and row[f"{choice}_engine"].startswith("engine ")
            if row[f"{choice}_engine"] == row["stored_engine"]:  # the same config is timed once
                assert row[f"{choice}_ms"] == row["stored_ms"]
        assert row["stored_again_ms"] > 0
    assert cudnn_cache.audit(device=0) is not None
    with pytest.raises(RuntimeError, match="device 99 does not exist"):
        cudnn_cache.audit(device=99)


def test_settle_decides_every_entry_again_and_the_file_keeps_what_it_settled(tmp_path):
    x, w = randn(8, 32, 28, 28, dtype=torch.bfloat16, memory_format=torch.channels_last), randn(
        64, 32, 3, 3, dtype=torch.bfloat16, memory_format=torch.channels_last)
    x.requires_grad_()
    w.requires_grad_()
    cudnn_cache.functional.conv2d(x, w, padding=1).sum().backward()
    key = {direction: cudnn_cache.conv_key(direction, x, w, [1, 1], [1, 1], [1, 1], 1)
           for direction in ("forward", "backward_data", "backward_filter")}
    before = {direction: cudnn_cache.query(direction, key[direction])[0]["engine"] for direction in key}
    # The file holds the search's rankings before the settle: the save after it merges with them
    # (Note [A settled key replaces the file's]).
    cudnn_cache.save(str(tmp_path / "settled.cache"))
    rows = cudnn_cache.settle()
    assert sorted(row["direction"] for row in rows) == ["backward_data", "backward_filter", "forward"]
    for row in rows:
        direction = row["direction"]
        assert row["stored_engine"] == before[direction]
        assert row["settled_engine"] == cudnn_cache.query(direction, key[direction])[0]["engine"]
        assert row["changed"] == (row["settled_engine"] != row["stored_engine"])
        if row["changed"]:  # only native's faster pick takes a stored config's place
            assert row["settled_engine"] in (row["heuristic_engine"], row["benchmark_engine"])
        assert row["stored_ms"] > 0 and row["heuristic_ms"] > 0 and row["benchmark_ms"] > 0
    # The entries it changed are the ones a save writes in place of the file's and a push of the server's.
    assert len(cudnn_cache._ops.replaced_entry_names()) == sum(row["changed"] for row in rows)
    # What runs now computes what native computes, and the file keeps the settled choices.
    y = cudnn_cache.functional.conv2d(x, w, padding=1)
    assert_close_scaled(y, F.conv2d(x, w, padding=1), TOLERANCE[torch.bfloat16], "settled forward")
    cudnn_cache.save(str(tmp_path / "settled.cache"))
    cudnn_cache.clear()
    assert cudnn_cache.load(str(tmp_path / "settled.cache")) == 3
    for row in rows:
        assert cudnn_cache.query(row["direction"], key[row["direction"]])[0]["engine"] == row["settled_engine"]
    with pytest.raises(RuntimeError, match="device 99 does not exist"):
        cudnn_cache.settle(device=99)


@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.bfloat16, True),
                                                  (torch.float16, True)], ids=["fp32", "bf16_nhwc", "fp16_nhwc"])
def test_legacy_backend_matches_native(dtype, channels_last):
    torch.backends.cudnn.allow_tf32 = False
    cudnn_cache.set_backend("legacy")
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    x = randn(2, 8, 12, 12, dtype=dtype, memory_format=memory_format, seed=1)
    w = randn(16, 4, 3, 3, dtype=dtype, memory_format=memory_format, seed=2)
    b = randn(16, dtype=dtype, seed=3)
    kwargs = dict(stride=2, padding=1, groups=2)
    check_against_native(lambda *t: cudnn_cache.functional.conv2d(*t, **kwargs), lambda *t: F.conv2d(*t, **kwargs),
                         (x, w, b), dtype)
    assert cudnn_cache.stats()["plans_built"] == 0 and cudnn_cache.stats()["tunes"] == 3


@pytest.mark.parametrize("offset", [1, 4])  # elements: 4 bytes (not even 16-byte aligned) and 16 bytes
def test_a_misaligned_view_runs_through_the_graph_backend(offset):
    """The graph API's tensors are declared 32-byte aligned; a view that is not is copied, not a fallback."""
    torch.backends.cudnn.allow_tf32 = False
    base = randn(2 * 4 * 8 * 8 + offset)
    x = base[offset:].view(2, 4, 8, 8)  # contiguous, but starts 4 * offset bytes into its storage
    assert x.data_ptr() % 32 != 0
    w = randn(8, 4, 3, 3, seed=2)
    torch.testing.assert_close(ops.convolution(x, w, None, [1], [1], [1], 1), F.conv2d(x, w, padding=1))
    assert cudnn_cache.stats()["fallbacks"] == 0


def test_prepare_builds_every_loaded_plan_so_calls_build_none(tmp_path):
    args = ([1, 1], [1, 1], [1, 1], 1)
    shapes = [((2, 4, 10, 10), (8, 4, 3, 3)), ((2, 8, 6, 6), (16, 8, 3, 3)), ((1, 3, 9, 9), (4, 3, 1, 1))]
    for input_size, weight_size in shapes:
        assert cudnn_cache.fill(randn(*input_size), randn(*weight_size), *args) == 3
    path = tmp_path / "convs.cache"
    cudnn_cache.save(path)
    cudnn_cache.clear()
    assert cudnn_cache.load(path) == 9
    # fill kept the plans its searches built for the best configs: prepare finds every one ready. (A fresh
    # process builds them: test_a_fresh_process_prepares_the_loaded_plans_before_its_first_call.)
    cudnn_cache.reset_stats()
    assert cudnn_cache.prepare(threads=2) == 9
    assert cudnn_cache.stats()["plans_built"] == 0
    preparation = cudnn_cache.prepare(background=True)
    assert preparation.wait() == 9 and preparation.wait() == 9  # the count is kept
    cudnn_cache.set_miss_policy("error")
    for input_size, weight_size in shapes:
        x = randn(*input_size).requires_grad_()
        w = randn(*weight_size).requires_grad_()
        ops.convolution(x, w, None, *args).sum().backward()
    stats = cudnn_cache.stats()
    assert stats["hits"] == 9 and stats["misses"] == 0 and stats["plans_built"] == 0, stats


PREPARE_SCRIPT = r"""
import sys, torch, cudnn_cache
cudnn_cache.load(sys.argv[1])
cudnn_cache.reset_stats()
ready = cudnn_cache.prepare(background=sys.argv[2] == "background")
ready = ready if isinstance(ready, int) else ready.wait()
built = cudnn_cache.stats()["plans_built"]
cudnn_cache.set_miss_policy("error")
x = torch.randn(2, 4, 10, 10, device="cuda", requires_grad=True)
w = torch.randn(8, 4, 3, 3, device="cuda", requires_grad=True)
torch.ops.cudnn_cache.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1).sum().backward()
torch.cuda.synchronize()
stats = cudnn_cache.stats()
print(ready, built, stats["plans_built"], stats["hits"], stats["fallbacks"])
"""


@pytest.mark.parametrize("mode", ["foreground", "background"])
def test_a_fresh_process_prepares_the_loaded_plans_before_its_first_call(child_env, tmp_path, mode):
    x, w = randn(2, 4, 10, 10), randn(8, 4, 3, 3)
    assert cudnn_cache.fill(x, w, [1, 1], [1, 1], [1, 1], 1) == 3
    path = tmp_path / "convs.cache"
    cudnn_cache.save(path)
    process = subprocess.run([sys.executable, "-c", PREPARE_SCRIPT, str(path), mode], env=child_env,
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    ready, built_by_prepare, built_in_all, hits, fallbacks = map(int, process.stdout.split())
    assert ready == 3 and built_by_prepare == 3 and built_in_all == 3  # the calls built nothing more
    assert hits == 3 and fallbacks == 0


# Loads argv[1], starts prepare(background=True) and at once captures a CUDA graph of native convolutions in
# PyTorch's default (global) capture mode, replays it and compares with the same convolutions run before.
CAPTURE_BESIDE_PREPARE_SCRIPT = r"""
import sys, torch, torch.nn.functional as F, cudnn_cache
x = torch.randn(4, 16, 24, 24, device="cuda")
w = torch.randn(16, 16, 3, 3, device="cuda") / 12
def convolutions():
    y = x
    for _ in range(20):
        y = F.conv2d(y, w, padding=1)
    return y
side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph's documentation asks
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    expected = convolutions()
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
cudnn_cache.load(sys.argv[1])
preparation = cudnn_cache.prepare(background=True)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    captured = convolutions()
graph.replay()
torch.cuda.synchronize()
print(preparation.wait(), torch.allclose(captured, expected, rtol=1e-3, atol=1e-3))
"""


def test_a_background_prepare_leaves_a_capture_on_another_thread_intact(child_env, tmp_path):
    # prepare's threads make cuDNN handles and build plans, which CUDA forbids beside a global-mode capture unless
    # the thread is in the relaxed mode (Note [Prepare beside a capture]): before it, 10 of 12 such processes
    # failed both the capture and the prepare on an H100.
    entries = 0
    for channels in (4, 8, 12, 16):
        for size in (8, 11):
            x, w = randn(2, channels, size, size), randn(channels, channels, 3, 3)
            entries += cudnn_cache.fill(x, w, [1, 1], [1, 1], [1, 1], 1)
    path = tmp_path / "convs.cache"
    cudnn_cache.save(path)
    for _ in range(3):
        process = subprocess.run([sys.executable, "-c", CAPTURE_BESIDE_PREPARE_SCRIPT, str(path)], env=child_env,
                                 capture_output=True, text=True, timeout=300)
        assert process.returncode == 0, process.stderr
        assert process.stdout.split() == [str(entries), "True"]


# A process CUDNN_CACHE_PATH starts (the file: argv[1], of `shapes` convolutions): its first convolution starts
# a prepare in the background, which builds the plans of every entry while this thread waits (until none has
# been built for 0.5 s); then every convolution, forward and backward, runs under 'error' and builds nothing more.
FIRST_CALL_PREPARE_SCRIPT = r"""
import sys, time, torch, torch.nn.functional as F, cudnn_cache
shapes, entries = eval(sys.argv[1]), int(sys.argv[2])
tensors = [(torch.randn(*i, device="cuda", requires_grad=True), torch.randn(*w, device="cuda", requires_grad=True))
           for i, w in shapes]
before = cudnn_cache.stats()["plans_built"]
F.conv2d(tensors[0][0].detach(), tensors[0][1].detach(), padding=1)  # one forward: one key of `entries`
deadline, prepared, still = time.monotonic() + 60, -1, 0
while time.monotonic() < deadline and still < 50:  # until it has built them all and 0.5 s passed with no build
    built = cudnn_cache.stats()["plans_built"]
    still = still + 1 if built == prepared and built >= entries else 0
    prepared = built
    time.sleep(0.01)
cudnn_cache.set_miss_policy("error")
for x, w in tensors:
    F.conv2d(x, w, padding=1).sum().backward()
torch.cuda.synchronize()
print(before, prepared, cudnn_cache.stats()["plans_built"], cudnn_cache.stats()["misses"])
"""


def test_the_first_call_of_a_zero_code_process_prepares_in_the_background(child_env, tmp_path):
    shapes = [((2, 4, 10, 10), (8, 4, 3, 3)), ((2, 8, 6, 6), (16, 8, 3, 3)), ((1, 3, 9, 9), (4, 3, 3, 3))]
    for input_size, weight_size in shapes:
        assert cudnn_cache.fill(randn(*input_size), randn(*weight_size), [1, 1], [1, 1], [1, 1], 1) == 3
    path = tmp_path / "convs.cache"
    cudnn_cache.save(path)
    env = dict(child_env, CUDNN_CACHE_PATH=str(path))
    process = subprocess.run([sys.executable, "-c", FIRST_CALL_PREPARE_SCRIPT, repr(shapes), "9"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    before, prepared, after, misses = map(int, process.stdout.split())
    # Nothing built at import; the one forward call led to all 9 plans (10 when the call and the prepare both
    # built its own), and the calls built none after them.
    assert before == 0 and prepared in (9, 10) and after == prepared and misses == 0, process.stdout


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "transposed"])
def test_fill_tunes_every_direction_that_the_ops_then_hit(transposed):
    if transposed:  # (2, 8, 5, 5) -> (2, 4, 10, 10)
        x, w = randn(2, 8, 5, 5, seed=1), randn(8, 4, 3, 3, seed=2)
        args, extra = ([2, 2], [1, 1], [1, 1], 1), dict(transposed=True, output_padding=[1, 1])
    else:
        x, w = randn(2, 4, 10, 10, seed=1), randn(8, 4, 3, 3, seed=2)
        args, extra = ([2, 2], [1, 1], [1, 1], 1), {}
    directions = ("forward", "backward_data", "backward_filter")
    keys = {d: cudnn_cache.conv_key(d, x, w, *args, **extra) for d in directions}
    assert all(cudnn_cache.query(d, keys[d]) is None for d in directions)

    assert cudnn_cache.fill(x, w, *args, **extra) == 3
    assert all(cudnn_cache.query(d, keys[d]) is not None for d in directions)
    assert cudnn_cache.size() == 3 and cudnn_cache.stats()["tunes"] == 3

    # The ops find all three: forward and backward run under 'error' without a miss.
    cudnn_cache.set_miss_policy("error")
    cudnn_cache.reset_stats()
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    if transposed:
        output = ops.convolution_transpose(*leaves, None, args[0], args[1], extra["output_padding"], args[2], 1)
    else:
        output = ops.convolution(*leaves, None, *args)
    output.sum().backward()
    assert cudnn_cache.stats()["misses"] == 0 and cudnn_cache.stats()["hits"] == 3


# --- TorchScript on the GPU ------------------------------------------------------------------------------------

def test_torchscript_model_trains_on_the_gpu(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                          nn.ReLU(), nn.ConvTranspose2d(8, 4, 2, stride=2), nn.Conv2d(4, 2, 1))
    path = tmp_path / "model.pt"
    torch.jit.script(cudnn_cache.convert(model)).save(str(path))
    scripted = torch.jit.load(str(path), map_location="cuda")
    assert "cudnn_cache::convolution" in str(scripted.inlined_graph)

    x, target = randn(4, 3, 16, 16, seed=1), randn(4, 2, 16, 16, seed=2)
    optimizer = torch.optim.SGD(scripted.parameters(), lr=0.05)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = F.mse_loss(scripted(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert cudnn_cache.stats()["hits"] > 0


DEBUG_LOG_SCRIPT = r"""
import torch, cudnn_cache
x = torch.randn(2, 4, 10, 10, device="cuda")
w = torch.randn(8, 4, 3, 3, device="cuda")
for _ in range(2):
    torch.ops.cudnn_cache.convolution(x, w, None, [1, 1], [1, 1], [1, 1], 1)
torch.cuda.synchronize()
"""


def test_cudnn_cache_log_debug_shows_misses_tunes_and_hits(child_env):
    env = dict(child_env, CUDNN_CACHE_LOG="debug")
    result = subprocess.run([sys.executable, "-c", DEBUG_LOG_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("cudnn_cache [debug] ")]
    assert any("miss (policy 'tune'): no engine config for forward" in line for line in lines), lines
    assert any(line.startswith("cudnn_cache [debug] tuned: ") and "best engine" in line and "; the search took " in line
               for line in lines), lines
    assert sum(line.startswith("cudnn_cache [debug] hit: engine config") for line in lines) == 1, lines
    # Each search's profile: its steps' times, where step 1's plans came from, and the key.
    profiles = [line for line in lines if line.startswith("cudnn_cache [debug] search profile: heuristics' list ")]
    assert len(profiles) == 1, lines
    assert all(part in profiles[0] for part in (", step 1 ", ", confirm ", " configs timed; for forward: x float")), \
        profiles
    # What its paired rounds measured: the reference, and per other finalist its times, ratio and wins.
    rounds = [line for line in lines if line.startswith("cudnn_cache [debug] search rounds: ")]
    assert len(rounds) == 1, lines
    assert all(part in rounds[0] for part in (" paired rounds of ", " configs; the reference engine ", ": first pass ",
                                              " of the reference, faster in ", "; for forward: x float")), rounds


REACH_SCRIPT = r"""
import torch, cudnn_cache, testing_ops
# Two candidates per search, built on worker threads in this process: bf16 channels-last depthwise and 1x1
# convolutions, whose heuristics' lists hold runtime-compiled candidates past their first two.
cudnn_cache.set_tuning_options(build_threads=4)
testing_ops.set_search_bounds(max_candidates=2, mode_b_candidates=0, knob_variants=0, finalists=0)
for c, k, groups in ((96, 3, 96), (96, 1, 1), (144, 3, 144)):
    x = torch.randn(8, c, 28, 28, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(c, c // groups, k, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = w.contiguous(memory_format=torch.channels_last)
    cudnn_cache.functional.conv2d(x, w, padding=k // 2, groups=groups).sum().backward()
torch.cuda.synchronize()
"""


def test_search_workers_build_only_what_step_1_takes(child_env):
    # Note [Parallel candidate builds]: a worker that compiled a candidate past step 1's reach compiled for
    # nothing, and the search waited for it at its end (on the H200, 350-540 ms in 60 of a cold MobileNetV2's
    # 90 searches).
    env = dict(child_env, CUDNN_CACHE_LOG="debug",  # and testing_ops beside this file
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), child_env["PYTHONPATH"]]))
    result = subprocess.run([sys.executable, "-c", REACH_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    profiles = [line for line in result.stderr.splitlines() if line.startswith("cudnn_cache [debug] search profile: ")]
    assert len(profiles) == 9, result.stderr
    passed_over = 0  # searches whose list had runtime-compiled candidates that step 1 did not take
    first_here = 0  # depthwise forward searches that built their compiled first candidate on the calling thread
    for line in profiles:
        listed = int(line.split(" runtime-compiled; ")[0].rsplit(" ", 1)[1])
        taken = line.split(" runtime-compiled; it took ")[1]
        by_workers = int(taken.split(" plans from workers")[0])
        here = int(taken.split(" compiled and ")[0].rsplit(" ", 1)[1])
        passed_over += listed > by_workers + here
        assert "; 0 built ahead and not taken; " in line, line
        if "; for forward: " in line and " groups 1 " not in line:
            first_here += by_workers == 0 and here == 1
    assert passed_over > 0, profiles  # else no worker could have built past the reach, and this tested nothing
    # Their first candidate is runtime-compiled; the calling thread compiles it (Note [Parallel candidate builds]:
    # a worker thread of this process compiled it more slowly).
    assert first_here == 2, profiles


# --- A file from another cuDNN (issue 8: edit the version in the file) -----------------------------------------

EDITED_FILE_SCRIPT = r"""
import json, sys, torch, torch.nn.functional as F, cudnn_cache
mode, path = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
# Depthwise 5x5 and 3x3 convolutions in bf16 channels-last: cuDNN compiles their best engines at run time,
# so the file stores plans for them.
shapes = [(8, 240, 14, 14, 5), (8, 144, 28, 28, 3), (8, 96, 56, 56, 3)]
tensors = []
for n, c, h, w, k in shapes:
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, k, k, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    tensors.append((x, weight, k // 2, c))
if mode == "create":  # tune and save; any other mode is the miss policy for loading the file
    for x, weight, padding, groups in tensors:
        cudnn_cache.functional.conv2d(x, weight, padding=padding, groups=groups)
    cudnn_cache.save(path)
else:
    cudnn_cache.load(path)
    cudnn_cache.set_miss_policy(mode)
    cudnn_cache.reset_stats()
    worst = 0.0
    for x, weight, padding, groups in tensors:
        ours = cudnn_cache.functional.conv2d(x, weight, padding=padding, groups=groups).float()
        native = F.conv2d(x, weight, padding=padding, groups=groups).float()
        worst = max(worst, ((ours - native).abs().max() / native.abs().max()).item())
    torch.cuda.synchronize()
    print(json.dumps({"stats": cudnn_cache.stats(), "worst": worst}))
"""


@pytest.mark.parametrize("edit", ["plan_version", "origin_version"])
def test_a_file_edited_to_another_cudnn_falls_back_cleanly(child_env, tmp_path, edit):
    import json

    path, edited = tmp_path / "convs.cache", tmp_path / "edited.cache"

    def child(mode, file):
        result = subprocess.run([sys.executable, "-c", EDITED_FILE_SCRIPT, mode, str(file)], env=child_env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return result

    child("create", path)
    document = json.loads(ops.file_export_json(str(path)))
    (section,) = document["sections"]
    stored = section["stored_plans"]
    assert len(stored) > 0, "no runtime-compiled winner: the plan edit would test nothing"
    if edit == "plan_version":  # plans of another cuDNN patch release: the engine configs still apply
        for entry in stored:
            entry["plan"]["cudnn_version"] += 1
    else:  # everything measured with another cuDNN minor: kept, never used
        section["origin"]["cudnn_minor"] += 1
    (tmp_path / "edited.json").write_text(json.dumps(document))
    ops.file_import_json(str(tmp_path / "edited.json"), str(edited))

    result = child("error" if edit == "plan_version" else "tune", edited)
    report = json.loads(result.stdout.splitlines()[-1])
    stats = report["stats"]
    assert report["worst"] < 5e-2, report
    if edit == "plan_version":
        assert stats["misses"] == 0 and stats["plans_deserialized"] == 0, stats
        assert stats["plan_rebuilds"] == len(stored) and stats["fallbacks"] == 0, stats
    else:
        assert stats["hits"] == 0 and stats["misses"] == stats["tunes"] == stats["fallbacks"] == 3, stats
        assert result.stderr.count("the cache holds it only for") == 1, result.stderr


PERSISTENT_SCRIPT = r"""
import sys, cudnn_cache
with cudnn_cache.persistent(sys.argv[1]) as preparing:
    print(preparing.wait(), cudnn_cache.stats()["plans_built"])
with cudnn_cache.persistent(sys.argv[1], prepare_plans=False) as preparing:
    print(preparing)
"""


def test_persistent_builds_the_plans_of_the_file_it_loads_in_the_background(child_env, tmp_path):
    assert cudnn_cache.fill(randn(2, 4, 10, 10), randn(8, 4, 3, 3), [1, 1], [1, 1], [1, 1], 1) == 3
    path = tmp_path / "convs.cache"
    cudnn_cache.save(path)
    process = subprocess.run([sys.executable, "-c", PERSISTENT_SCRIPT, str(path)], env=child_env,
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    assert process.stdout.split() == ["3", "3", "None"]


def test_a_plan_cache_smaller_than_the_model_evicts_and_trains_as_native():
    # Four convolutions give 11 keys, each with its plan (the first has no input gradient); with room for 3 plans,
    # every call after the first step finds its plan evicted, builds it again and evicts another, without
    # changing what is computed.
    torch.backends.cudnn.allow_tf32 = False  # restored by torch_flags
    torch.manual_seed(0)
    native = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2),
                           nn.ReLU(), nn.Conv2d(16, 16, 1), nn.ReLU(), nn.Conv2d(16, 4, 3, dilation=2)).cuda()
    ours = cudnn_cache.convert(copy.deepcopy(native))
    x = randn(4, 3, 20, 20)
    cudnn_cache.set_plan_cache_limit(3)  # restored by cache_state
    for step in range(3):  # the first step tunes, the later ones hit
        if step == 1:
            before = cudnn_cache.stats()
        for model in (ours, native):
            model.zero_grad()
            model(x).square().mean().backward()
        for (name, ours_p), native_p in zip(ours.named_parameters(), native.parameters()):
            assert_close_scaled(ours_p.grad, native_p.grad, TOLERANCE[torch.float32], f"step {step}: {name}.grad")
    after = cudnn_cache.stats()
    keys = 11
    assert after["misses"] == before["misses"] and after["hits"] == before["hits"] + 2 * keys, after
    # Which plans survive a sweep depends on the cache's order (Note [Plan cache]: a second chance, not a strict
    # LRU), so each step builds at least the 11 - 3 plans that cannot all have stayed; at the limit, every
    # plan built evicts one.
    built = after["plans_built"] - before["plans_built"]
    assert built >= 2 * (keys - 3), after
    assert after["plan_evictions"] - before["plan_evictions"] == built, after
    assert after["plans"] == 3, after  # the plans in memory, at the limit
    cudnn_cache.set_plan_cache_limit(0)
    ours(x).sum().backward()  # with no bound, every key's plan is built again and stays
    assert cudnn_cache.stats()["plans"] >= keys
