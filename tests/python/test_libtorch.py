"""cudnn_cache_run_model, the LibTorch program: it runs a model scripted in Python, with the ops linked in and a
cache file loaded, and computes what Python computes for the same model and input."""

import subprocess

import pytest
import torch
from torch import nn

import cudnn_cache

INPUT_SIZE = (2, 3, 16, 16)


@pytest.fixture(scope="module")
def run_model(build_dir):
    """Runs cudnn_cache_run_model with the given arguments; returns the CompletedProcess (text output)."""
    binary = build_dir / "torch_ops" / "cudnn_cache_run_model"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build it with cmake --build {build_dir} --target cudnn_cache_run_model "
                    "(or scripts/build.sh)")

    def run(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)

    return run


def parse(stdout: str) -> dict:
    """The program's `name=value` lines (and the words of its `stats a=1 b=2` line) as a dict of strings."""
    values = {}
    for line in stdout.splitlines():
        words = line.split(" ")[1:] if line.startswith("stats ") else [line]
        for word in words:
            name, _, value = word.partition("=")
            values[name] = value
    return values


class Echo(nn.Module):
    def forward(self, x):
        return x


def make_model():
    torch.manual_seed(0)
    return cudnn_cache.convert(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU()))


def python_reference(model, device="cpu"):
    """Output sum and parameter-gradient sum (and its magnitude) for the input the program makes."""
    torch.manual_seed(0)
    x = torch.randn(INPUT_SIZE).to(device)
    model.zero_grad()
    output = model(x)
    output.sum().backward()
    grads = [p.grad for p in model.parameters()]
    return output, sum(g.sum().item() for g in grads), sum(g.abs().sum().item() for g in grads)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.pt"
    torch.jit.script(make_model()).save(str(path))
    return path


def test_cpp_and_python_randn_agree(run_model, tmp_path):
    path = tmp_path / "echo.pt"
    torch.jit.script(Echo()).save(str(path))
    result = run_model(path, "--input", ",".join(map(str, INPUT_SIZE)))
    assert result.returncode == 0, result.stderr
    torch.manual_seed(0)
    assert float(parse(result.stdout)["output_sum"]) == pytest.approx(torch.randn(INPUT_SIZE).sum().item(), rel=1e-5)


def test_runs_a_scripted_model_with_a_cache_like_python(run_model, model_file, tool, tmp_path):
    cache_file = tmp_path / "synth.bin"
    assert tool("synth", cache_file, "--entries", 50).returncode == 0

    result = run_model(model_file, "--cache", cache_file, "--device", "cpu", "--input",
                       ",".join(map(str, INPUT_SIZE)), "--train-step")
    assert result.returncode == 0, result.stderr
    values = parse(result.stdout)

    output, grad_sum, grad_magnitude = python_reference(make_model())
    assert values["cache_entries"] == "50"
    assert values["output_shape"] == str(list(output.shape))
    assert float(values["output_sum"]) == pytest.approx(output.sum().item(), rel=1e-4)
    assert float(values["grad_sum"]) == pytest.approx(grad_sum, rel=1e-4, abs=1e-5 * grad_magnitude)
    # The CPU kernels never consult the cache: it holds what was loaded and counts nothing.
    assert {name: values[name] for name in ("hits", "misses", "tunes", "entries")} == \
        {"hits": "0", "misses": "0", "tunes": "0", "entries": "50"}


def test_a_cache_file_that_does_not_exist_yet_is_not_an_error(run_model, model_file, tmp_path):
    result = run_model(model_file, "--cache", tmp_path / "new.bin", "--input", "1,3,8,8")
    assert result.returncode == 0, result.stderr
    assert parse(result.stdout)["cache_entries"].startswith("0 ")
    assert "grad_sum" not in parse(result.stdout)


@pytest.mark.parametrize("arguments, status, message", [
    pytest.param(["{missing}"], 1, "model file '{missing}' does not exist", id="missing_model"),
    pytest.param(["{model}", "--cache", "{garbage}"], 1, "'{garbage}' is not a cudnn_cache file", id="corrupt_cache"),
    pytest.param(["{model}", "--input", "1,3"], 1, "input to conv2d, but got input of size: [1, 3]", id="input_rank"),
    pytest.param(["{model}", "--input", "1,x,8,8"], 2, "--input: '1,x,8,8' is not a list", id="input_syntax"),
    pytest.param(["{model}", "--device", "tpu"], 2, "--device must be cpu or cuda", id="device"),
    pytest.param(["{model}", "--frobnicate"], 2, "unknown option --frobnicate", id="option"),
    pytest.param([], 2, "no model given", id="no_model"),
])
def test_errors_exit_non_zero_with_a_clear_message(run_model, model_file, tmp_path, arguments, status, message):
    names = dict(model=model_file, missing=tmp_path / "missing.pt", garbage=tmp_path / "garbage.bin")
    names["garbage"].write_bytes(b"garbage" * 10)
    result = run_model(*[argument.format(**names) for argument in arguments])
    assert result.returncode == status, (result.stdout, result.stderr)
    assert message.format(**names) in result.stderr
    assert result.stderr.startswith("cudnn_cache_run_model: ")


@pytest.mark.gpu
def test_cuda_run_uses_a_cache_tuned_from_python(run_model, model_file, cache_state, tmp_path):
    """A cache that Python tuned for this model serves the C++ program on the GPU: no misses, no tuning."""
    model = make_model().cuda()
    output, grad_sum, grad_magnitude = python_reference(model, device="cuda")
    assert cudnn_cache.stats()["tunes"] > 0
    cache_file = tmp_path / "tuned.bin"
    cudnn_cache.save(cache_file)

    result = run_model(model_file, "--cache", cache_file, "--device", "cuda", "--input",
                       ",".join(map(str, INPUT_SIZE)), "--train-step")
    assert result.returncode == 0, result.stderr
    values = parse(result.stdout)
    assert values["misses"] == "0" and values["tunes"] == "0" and int(values["hits"]) > 0, values
    # Same algorithms, same input: only the order of atomic accumulation can differ.
    assert float(values["output_sum"]) == pytest.approx(output.sum().item(), rel=1e-4)
    assert float(values["grad_sum"]) == pytest.approx(grad_sum, rel=1e-4, abs=1e-5 * grad_magnitude)
