"""Interception of PyTorch's own convolutions (cudnn_cache.intercept, CUDNN_CACHE_PATH, python -m cudnn_cache.run):
on the CPU, that the kernels are registered and given back, CPU convolutions are untouched, the environment
switches and the runner; on the GPU, that unmodified models match native in eager and compiled runs, and that
a second process of an unmodified torchvision ResNet tunes nothing."""

import json
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cudnn_cache
from conftest import cache_calls, zero_code_runs


def cuda_kernel_of(operator: str) -> str:
    """Where the CUDA kernel of an aten operator was registered, from the dispatcher's table."""
    lines = [line for line in torch._C._dispatch_dump(operator).splitlines() if line.startswith("CUDA:")]
    return lines[0] if lines else ""


@pytest.fixture
def intercept_state(cache_state):
    before = cudnn_cache.intercepting()
    yield
    cudnn_cache.intercept(before)


def test_intercept_registers_cuda_kernels_and_gives_them_back(intercept_state):
    cudnn_cache.intercept(False)
    native_backward = cuda_kernel_of("aten::convolution_backward")
    native_attention = [cuda_kernel_of(f"aten::_cudnn_attention_{op}") for op in ("forward", "backward")]
    assert "intercept.cpp" not in native_backward and cuda_kernel_of("aten::convolution") == ""
    assert all(kernel and "intercept.cpp" not in kernel for kernel in native_attention)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the expected override of PyTorch's kernel is not reported
        cudnn_cache.intercept(True)
        cudnn_cache.intercept(True)  # twice is once
    assert cudnn_cache.intercepting()
    assert "intercept.cpp" in cuda_kernel_of("aten::convolution")
    assert "intercept.cpp" in cuda_kernel_of("aten::convolution_backward")
    assert all("intercept.cpp" in cuda_kernel_of(f"aten::_cudnn_attention_{op}") for op in ("forward", "backward"))
    cudnn_cache.intercept(False)
    assert not cudnn_cache.intercepting()
    assert cuda_kernel_of("aten::convolution") == "" and cuda_kernel_of("aten::convolution_backward") == native_backward
    assert [cuda_kernel_of(f"aten::_cudnn_attention_{op}") for op in ("forward", "backward")] == native_attention


def test_cpu_convolutions_are_untouched_while_intercepting(intercept_state):
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 9, 9, requires_grad=True), torch.randn(4, 3, 3, 3, requires_grad=True)
    cudnn_cache.intercept(False)
    expected = F.conv2d(x, w, padding=1)
    expected_grad = torch.autograd.grad(expected.sum(), w)[0]
    cudnn_cache.intercept(True)
    actual = F.conv2d(x, w, padding=1)
    assert torch.equal(actual, expected)
    assert torch.equal(torch.autograd.grad(actual.sum(), w)[0], expected_grad)
    assert cudnn_cache.stats()["misses"] == 0 and cudnn_cache.stats()["hits"] == 0


ENVIRONMENT_SCRIPT = "import cudnn_cache; print(cudnn_cache.intercepting(), cudnn_cache.active_file())"


@pytest.mark.parametrize("setting, expected", [(None, "True"), ("1", "True"), ("on", "True"), ("0", "False"),
                                               ("false", "False")])
def test_cudnn_cache_path_intercepts_unless_cudnn_cache_intercept_says_no(child_env, tmp_path, setting, expected):
    env = dict(child_env, CUDNN_CACHE_PATH=str(tmp_path / "convs.cache"))
    env.pop("CUDNN_CACHE_INTERCEPT", None)
    if setting is not None:
        env["CUDNN_CACHE_INTERCEPT"] = setting
    done = subprocess.run([sys.executable, "-c", ENVIRONMENT_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected, str(tmp_path / "convs.cache")]


def test_without_cudnn_cache_path_nothing_is_intercepted(child_env):
    env = {k: v for k, v in child_env.items() if k not in ("CUDNN_CACHE_PATH", "CUDNN_CACHE_INTERCEPT")}
    done = subprocess.run([sys.executable, "-c", ENVIRONMENT_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None"]


def test_a_bad_cudnn_cache_intercept_names_the_variable_and_the_values(child_env, tmp_path):
    env = dict(child_env, CUDNN_CACHE_PATH=str(tmp_path / "convs.cache"), CUDNN_CACHE_INTERCEPT="maybe")
    done = subprocess.run([sys.executable, "-c", ENVIRONMENT_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0
    assert "CUDNN_CACHE_INTERCEPT='maybe': use 1" in done.stderr


RUN_TARGET = """
import json, sys, cudnn_cache
print(json.dumps({"argv": sys.argv, "name": __name__, "intercepting": cudnn_cache.intercepting(),
                  "file": cudnn_cache.active_file()}))
sys.exit(int(sys.argv[-1]))
"""


def run_runner(child_env, *arguments, cwd=None, environment=None):
    env = {k: v for k, v in child_env.items() if k not in ("CUDNN_CACHE_PATH", "CUDNN_CACHE_INTERCEPT")}
    env.update(environment or {})
    return subprocess.run([sys.executable, "-m", "cudnn_cache.run", *map(str, arguments)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_runner_runs_the_script_as_main_with_its_arguments_and_exit_status(child_env, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RUN_TARGET)
    done = run_runner(child_env, "--cache", tmp_path / "c.cache", script, "--epochs", "3", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"argv": [str(script), "--epochs", "3", "0"], "name": "__main__", "intercepting": True,
                      "file": str(tmp_path / "c.cache")}
    assert run_runner(child_env, "--cache", tmp_path / "c.cache", script, "7").returncode == 7

    done = run_runner(child_env, "--cache", tmp_path / "c.cache", "--no-intercept", script, "0")
    assert json.loads(done.stdout.splitlines()[-1])["intercepting"] is False


def test_runner_follows_cudnn_cache_intercept_as_import_does(child_env, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RUN_TARGET)
    done = run_runner(child_env, "--cache", tmp_path / "c.cache", script, "0",
                      environment={"CUDNN_CACHE_INTERCEPT": "0"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["intercepting"] is False


def test_runner_runs_a_module(child_env, tmp_path):
    (tmp_path / "trainer.py").write_text(RUN_TARGET)
    env = dict(child_env, PYTHONPATH=f"{tmp_path}:{child_env['PYTHONPATH']}")
    done = run_runner(env, "--cache", tmp_path / "c.cache", "-m", "trainer", "--lr", "0.1", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["argv"][1:] == ["--lr", "0.1", "0"] and report["name"] == "__main__"


@pytest.mark.parametrize("arguments, message", [([], "name a script to run"),
                                                (["no_such_script.py"], "no such script: no_such_script.py")])
def test_runner_usage_errors_exit_2_and_say_why(child_env, tmp_path, arguments, message):
    done = run_runner(child_env, *arguments, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr


# ------------------------------------------------------------------------------------------------------------
# On the GPU
# ------------------------------------------------------------------------------------------------------------

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def unmodified_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, groups=2),
                         nn.ConvTranspose2d(8, 4, 2, stride=2, output_padding=0), nn.ReLU(),
                         nn.Conv2d(4, 4, 1, bias=False))


def forward_backward(model, x):
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    output = model(x)
    output.square().sum().backward()
    return output.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def assert_same(actual, expected, tolerance):
    for a, e in zip([actual[0], actual[1], *actual[2]], [expected[0], expected[1], *expected[2]]):
        scale = max(e.abs().max().item(), 1.0)
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.bfloat16, True),
                                                  (torch.float16, False)], ids=["fp32", "bf16_nhwc", "fp16"])
def test_unmodified_model_matches_native_and_goes_through_the_cache(intercept_state, torch_flags, dtype,
                                                                    channels_last):
    torch.backends.cudnn.allow_tf32 = False
    model = unmodified_model().cuda().to(dtype)
    x = torch.randn(2, 3, 16, 16, device="cuda", dtype=dtype)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    cudnn_cache.intercept(False)
    expected = forward_backward(model, x)
    assert cudnn_cache.stats()["tunes"] == 0
    cudnn_cache.intercept(True)
    assert_same(forward_backward(model, x), expected, TOLERANCE[dtype])
    tuned = cudnn_cache.stats()
    assert tuned["tunes"] > 0 and tuned["misses"] == tuned["tunes"]
    cudnn_cache.set_miss_policy("error")  # a second pass is all hits
    assert_same(forward_backward(model, x), expected, TOLERANCE[dtype])
    assert cudnn_cache.stats()["tunes"] == tuned["tunes"] and cudnn_cache.stats()["hits"] > tuned["hits"]


@pytest.mark.gpu
def test_conv1d_conv3d_and_fallbacks_while_intercepting(intercept_state, torch_flags):
    torch.backends.cudnn.allow_tf32 = False
    cudnn_cache.intercept(True)
    for conv, x, w in [(F.conv1d, torch.randn(2, 4, 20), torch.randn(6, 4, 5)),
                       (F.conv3d, torch.randn(2, 4, 6, 7, 8), torch.randn(6, 4, 3, 3, 3))]:
        x, w = x.cuda(), w.cuda()
        before = cudnn_cache.stats()["misses"]
        actual = conv(x, w, padding=1)
        cudnn_cache.intercept(False)
        expected = conv(x, w, padding=1)
        cudnn_cache.intercept(True)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        assert cudnn_cache.stats()["misses"] == before + 1
    # Not taken: cuDNN disabled, and an empty batch; PyTorch's own kernels run them.
    before = cudnn_cache.stats()
    x, w = torch.randn(2, 3, 8, 8, device="cuda"), torch.randn(4, 3, 3, 3, device="cuda")
    with torch.backends.cudnn.flags(enabled=False):
        assert F.conv2d(x, w).shape == (2, 4, 6, 6)
    assert F.conv2d(x[:0], w).shape == (0, 4, 6, 6)
    assert cudnn_cache.stats()["misses"] == before["misses"] and cudnn_cache.stats()["hits"] == before["hits"]


@pytest.mark.gpu
def test_routing_follows_the_flags_of_each_call_and_of_its_backward(intercept_state, torch_flags):
    """Each thread remembers its routing answers (Note [A thread's routing answers] in routing.cpp): a call of
    shapes it answered before is asked again once cuDNN is disabled, deterministic mode is on, or autograd does not
    record, and its backward follows the flags at the time the backward runs, as native's does."""
    torch.backends.cudnn.allow_tf32 = False
    cudnn_cache.intercept(True)
    x = torch.randn(2, 8, 12, 12, device="cuda", requires_grad=True)
    w = torch.randn(8, 8, 3, 3, device="cuda", requires_grad=True)

    def taken(run) -> bool:
        before = cache_calls()
        run()
        return cache_calls() > before

    forward = lambda: F.conv2d(x, w, padding=1)  # noqa: E731
    for _ in range(2):  # the second time from the thread's answers
        assert taken(forward)
        with torch.backends.cudnn.flags(enabled=False):
            assert not taken(forward)
        with torch.no_grad():
            assert taken(forward)
    # Dilated NCHW in deterministic mode: PyTorch runs it with cuDNN, unless cuDNN is disabled.
    dilated = lambda: F.conv2d(x, w, padding=2, dilation=2)  # noqa: E731
    with torch.backends.cudnn.flags(enabled=True, deterministic=True):
        assert taken(dilated) == (torch._C._select_conv_backend(x, w, None, [1, 1], [2, 2], [2, 2], False, [0, 0], 1,
                                                                  None) == torch._C._ConvBackend.Cudnn)
    # A forward through the cache whose backward runs with cuDNN disabled: the backward is PyTorch's, its gradients
    # native's.
    for _ in range(2):
        y = forward()
        before = cache_calls()
        with torch.backends.cudnn.flags(enabled=False):
            grads = torch.autograd.grad(y.sum(), (x, w))
        assert cache_calls() == before
        cudnn_cache.intercept(False)
        with torch.backends.cudnn.flags(enabled=False):
            expected = torch.autograd.grad(F.conv2d(x, w, padding=1).sum(), (x, w))
        cudnn_cache.intercept(True)
        for actual, native in zip(grads, expected):
            assert torch.equal(actual, native)
        assert taken(lambda: torch.autograd.grad(forward().sum(), (x, w)))  # flags back: through the cache again


@pytest.mark.gpu
def test_a_compiled_unmodified_model_goes_through_the_cache_and_matches_eager(intercept_state, torch_flags):
    torch.backends.cudnn.allow_tf32 = False
    cudnn_cache.intercept(True)
    model = unmodified_model().cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    expected = forward_backward(model, x)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    cudnn_cache.clear()
    cudnn_cache.reset_stats()
    compiled = torch.compile(model, fullgraph=True)
    assert_same(forward_backward(compiled, x), expected, 1e-4)
    assert cudnn_cache.stats()["tunes"] > 0  # the compiled graph's convolutions reached the cache


RESNET_SCRIPT = r"""
import json, sys, time, torch, torchvision
import cudnn_cache  # CUDNN_CACHE_PATH is set: loads the file (if any), intercepts, saves at exit
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).cuda()
x = torch.randn(8, 3, 64, 64, device="cuda")
for _ in range(2):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
torch.cuda.synchronize()
print(json.dumps({"stats": cudnn_cache.stats(), "file": cudnn_cache.active_file()}))
"""


@pytest.mark.gpu
def test_an_unmodified_torchvision_resnet_tunes_once_and_a_second_process_tunes_nothing(child_env, tmp_path):
    pytest.importorskip("torchvision", reason="torchvision is installed by scripts/install_deps.sh")
    reports = zero_code_runs(child_env, RESNET_SCRIPT, tmp_path / "resnet.cache")
    first, second = reports[0]["stats"], reports[1]["stats"]
    assert first["tunes"] > 0 and first["tunes"] == first["misses"]
    assert (tmp_path / "resnet.cache").exists()
    assert second["tunes"] == 0 and second["misses"] == 0 and second["hits"] == first["hits"] + first["misses"]
