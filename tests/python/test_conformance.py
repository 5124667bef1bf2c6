"""Conformance with native PyTorch, on PyTorch's own convolution samples.

Every OpInfo sample of nn.functional.conv1d/2d/3d and conv_transpose1d/2d/3d (op_db, their error inputs too)
and every ModuleInfo sample of nn.Conv1d/2d/3d and nn.ConvTranspose1d/2d/3d (module_db; each Conv sample also
with every other padding mode), in float32, float16, bfloat16 and float64, contiguous and channels-last, runs
natively and through cudnn_cache, and:
  * the output, its memory format and the gradient of every input and parameter equal native within the
    dtype's tolerance; where native raises, cudnn_cache raises the same exception type;
  * on CUDA, a call reaches the cache exactly when native PyTorch would run it with cuDNN
    (torch._C._select_conv_backend), and otherwise gives native's bits;
  * nothing warns that an op has no autograd kernel.
Two paths: 'convert' (cudnn_cache.functional and cudnn_cache.convert(module); on the CPU in CI, the ops' own
autograd over ATen's kernels, and on the GPU) and 'intercept' (the unmodified call with cudnn_cache.intercept
on; GPU only). float32 runs with TF32 off, so both sides compute in float32, and again as 'float32_tf32' with
PyTorch's default (TF32 on) on the GPU.

test_transforms_*: fp64 gradcheck (with forward-mode AD) and gradgradcheck of every float64 sample, torch.func
jvp and vmap, gradient penalties (create_graph=True), autocast, CUDA graphs (capture on misses and on hits,
replay), a non-default stream and torch.compile (default and max-autotune-no-cudagraphs), each through both
paths against native.

CUDNN_CACHE_CONFORMANCE_REPORT=FILE appends one JSON line per (path, device, dtype, layout, source): samples
run and passed.
"""

import copy
import json
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cudnn_cache
import testing_ops
from conftest import cache_calls, intercepting, through, uses_cache

try:
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db
except ImportError as error:  # pragma: no cover - the README's test command installs expecttest
    raise ImportError(f"PyTorch's test material needs expecttest ({error}); run scripts/install_deps.sh") from error
finally:
    # Importing it freezes torch.backends' flags for the whole process (PyTorch's own tests set them only in
    # `with flags(...)` blocks); the other tests here set them directly, as users do.
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True

CONVOLUTIONS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
OPINFOS = [op for op in op_db if op.name.split(".")[-1] in CONVOLUTIONS and op.name.startswith("nn.functional.")]
MODULE_CLASSES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
MODULEINFOS = [info for info in module_db if info.module_cls in MODULE_CLASSES]
assert len(OPINFOS) == 6 and len(MODULEINFOS) == 6, "PyTorch's test material changed: update this module"

DTYPES = {"float32": torch.float32, "float32_tf32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "float64": torch.float64}
# Tolerances relative to the largest magnitude of native's tensor: both sides may run different algorithms,
# which round differently. OpInfo samples hold values up to 9 in magnitude.
TOLERANCE = {"float32": 1e-5, "float32_tf32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2, "float64": 1e-10}

CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
AUTOGRAD_WARNING = "autograd kernel was not registered"


# --- Cases: what to run, natively and through cudnn_cache --------------------------------------------------------

@dataclass
class Case:
    """One sample. run(cached) computes it natively (False) or through cudnn_cache (True), from fresh leaves,
    and returns (output, the leaves whose gradients are compared)."""
    name: str
    run: Callable[[bool], Tuple[torch.Tensor, List[torch.Tensor]]]
    # The arguments of aten::convolution the call reaches, in the case's layout, where known: (input, weight,
    # stride, padding, dilation, transposed, output_padding, groups), to ask which backend PyTorch picks.
    aten_arguments: Optional[Callable[[], tuple]] = None


def in_layout(tensor, memory_format):
    """A fresh leaf copy of `tensor` (which keeps requires_grad), in `memory_format` (None: as it is)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    copied = tensor.detach().clone()
    if memory_format is not None:
        copied = copied.contiguous(memory_format=memory_format)
    return copied.requires_grad_(tensor.requires_grad)


def channels_last_for(weight_dim: int, layout: str):
    """The memory format of the layout for tensors of a convolution whose weight has weight_dim dimensions."""
    return CHANNELS_LAST[weight_dim] if layout == "channels_last" else None


def functional_of(op_name: str, cached: bool):
    name = op_name.split(".")[-1]
    return getattr(cudnn_cache.functional if cached else F, name)


def aten_arguments(op_name: str, input, args, kwargs):
    """aten::convolution's arguments for an F.conv* call, where torch.nn.functional passes them on as they are
    (integer padding, batched input); None otherwise."""
    name = op_name.split(".")[-1]
    transposed = name.startswith("conv_transpose")
    weight = args[0]
    names = (["bias", "stride", "padding", "output_padding", "groups", "dilation"] if transposed
             else ["bias", "stride", "padding", "dilation", "groups"])
    values = dict(zip(names, args[1:]), **kwargs)
    spatial = weight.dim() - 2
    if isinstance(values.get("padding", 0), str) or input.dim() != weight.dim():
        return None

    def listed(value):
        return [value] * spatial if isinstance(value, int) else list(value)

    return (input, weight, listed(values.get("stride", 1)), listed(values.get("padding", 0)),
            listed(values.get("dilation", 1)), transposed, listed(values.get("output_padding", 0)),
            values.get("groups", 1))


def opinfo_cases(device: str, dtype: torch.dtype, layout: str) -> List[Case]:
    cases = []
    for op in OPINFOS:
        if dtype not in op.supported_dtypes(device):
            continue
        for index, sample in enumerate(op.sample_inputs(device, dtype, requires_grad=True)):
            weight_dim = sample.args[0].dim()
            if layout == "channels_last" and weight_dim not in CHANNELS_LAST:
                continue

            def tensors(sample=sample, format=channels_last_for(weight_dim, layout)):
                """Fresh leaves of the sample's input and args, in the layout."""
                input = in_layout(sample.input, format if sample.input.dim() == sample.args[0].dim() else None)
                return input, [in_layout(arg, format if isinstance(arg, torch.Tensor) and arg.dim() > 1 else None)
                               for arg in sample.args]

            def run(cached, op=op, sample=sample, tensors=tensors):
                input, args = tensors()
                output = functional_of(op.name, cached)(input, *args, **sample.kwargs)
                return output, [t for t in [input, *args] if isinstance(t, torch.Tensor) and t.requires_grad]

            def arguments(op=op, sample=sample, tensors=tensors):
                return aten_arguments(op.name, *tensors(), sample.kwargs)

            cases.append(Case(f"{op.name}[{index}] {describe(sample)}", run, arguments))
    return cases


def error_cases(device: str) -> List[Case]:
    cases = []
    for op in OPINFOS:
        if op.error_inputs_func is None:
            continue
        for index, error in enumerate(op.error_inputs(device)):
            sample = error.sample_input

            def run(cached, op=op, sample=sample):
                output = functional_of(op.name, cached)(sample.input, *sample.args, **sample.kwargs)
                return output, []

            cases.append(Case(f"{op.name} error[{index}] {describe(sample)}", run))
    return cases


def module_samples(info, device, dtype):
    """(constructor args, kwargs, forward args, description) of every ModuleInfo sample; each Conv sample also
    with every padding mode other than 'zeros' (ConvTranspose takes 'zeros' only)."""
    for sample in info.module_inputs_func(info, device=device, dtype=dtype, requires_grad=True, training=True):
        args, kwargs = sample.constructor_input.args, dict(sample.constructor_input.kwargs)
        modes = ["zeros"] if info.module_cls.__name__.startswith("ConvTranspose") else [
            "zeros", "reflect", "replicate", "circular"]
        for mode in modes:
            yield args, dict(kwargs, padding_mode=mode), sample.forward_input.args, f"{sample.desc} {mode}"


def module_cases(device: str, dtype: torch.dtype, layout: str) -> List[Case]:
    cases = []
    for info in MODULEINFOS:
        weight_dim = int(info.module_cls.__name__[-2]) + 2  # Conv2d: 4
        if layout == "channels_last" and weight_dim not in CHANNELS_LAST:
            continue
        format = channels_last_for(weight_dim, layout)
        for args, kwargs, forward_args, desc in module_samples(info, device, dtype):
            input = forward_args[0]

            def run(cached, cls=info.module_cls, args=args, kwargs=kwargs, input=input, format=format):
                torch.manual_seed(0)  # the same parameters for both sides
                module = cls(*args, **kwargs).to(device=device, dtype=dtype)
                if format is not None:
                    module = module.to(memory_format=format)
                if cached:
                    module = cudnn_cache.convert(module)
                x = in_layout(input, format if input.dim() == weight_dim else None)
                return module(x), [x, *module.parameters()]

            cases.append(Case(f"{info.module_cls.__name__}{args}{kwargs} {desc} input {tuple(input.shape)}", run))
    return cases


def describe(sample) -> str:
    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in [sample.input, *sample.args]]
    return f"{shapes} {sample.kwargs}"


# --- Running and comparing ---------------------------------------------------------------------------------------

@dataclass
class Outcome:
    error: Optional[BaseException] = None
    output: Optional[torch.Tensor] = None
    formats: Tuple[bool, ...] = ()
    grads: Tuple[Optional[torch.Tensor], ...] = ()
    warnings: Tuple[str, ...] = ()


def memory_formats(tensor: torch.Tensor) -> Tuple[bool, ...]:
    formats = [torch.contiguous_format] + ([CHANNELS_LAST[tensor.dim()]] if tensor.dim() in CHANNELS_LAST else [])
    return tuple(tensor.is_contiguous(memory_format=f) for f in formats)


def evaluate(case: Case, cached: bool) -> Outcome:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            output, leaves = case.run(cached)
            generator = torch.Generator().manual_seed(7)
            grad = torch.randn(output.shape, generator=generator).to(output)
            differentiable = [leaf for leaf in leaves if leaf.requires_grad]
            grads = torch.autograd.grad(output, differentiable, grad, allow_unused=True) if differentiable else ()
        except Exception as error:  # noqa: BLE001 - any exception is an outcome to compare with native's
            return Outcome(error=error, warnings=tuple(str(w.message) for w in caught))
    return Outcome(output=output.detach(), formats=memory_formats(output), grads=tuple(grads),
                   warnings=tuple(str(w.message) for w in caught))


def mismatch(native: Outcome, ours: Outcome, tolerance: float) -> Optional[str]:
    """Why ours differs from native, or None."""
    if any(AUTOGRAD_WARNING in message for message in ours.warnings):
        return f"warned: {[m for m in ours.warnings if AUTOGRAD_WARNING in m][0][:200]}"
    if native.error is not None:
        if ours.error is None:
            return f"native raised {type(native.error).__name__} ({str(native.error)[:120]}), cudnn_cache did not"
        if not isinstance(ours.error, type(native.error)):
            return (f"native raised {type(native.error).__name__}, cudnn_cache {type(ours.error).__name__}: "
                    f"{str(ours.error)[:200]}")
        return None
    if ours.error is not None:
        return f"cudnn_cache raised where native did not: {type(ours.error).__name__}: {str(ours.error)[:300]}"
    for what, expected, actual in [("output", native.output, ours.output),
                                   *[(f"grad {i}", e, a) for i, (e, a) in enumerate(zip(native.grads, ours.grads))]]:
        problem = tensor_mismatch(expected, actual, tolerance)
        if problem:
            return f"{what}: {problem}"
    if native.formats != ours.formats:
        return f"output memory format: native is_contiguous {native.formats}, cudnn_cache {ours.formats}"
    return None


def tensor_mismatch(expected, actual, tolerance: float) -> Optional[str]:
    if (expected is None) != (actual is None):
        return f"defined {expected is not None} natively, {actual is not None} through cudnn_cache"
    if expected is None:
        return None
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return f"{tuple(actual.shape)} {actual.dtype}, native {tuple(expected.shape)} {expected.dtype}"
    if expected.numel() == 0:
        return None
    scale = max(expected.abs().max().item(), 1.0)
    try:
        torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * scale, equal_nan=True)
    except AssertionError as error:
        return " ".join(str(error).split())[:300]
    return None


def native_uses_cudnn(case: Case) -> Optional[bool]:
    arguments = case.aten_arguments() if case.aten_arguments is not None else None
    if arguments is None:
        return None
    input, weight, stride, padding, dilation, transposed, output_padding, groups = arguments
    backend = torch._C._select_conv_backend(input, weight, None, stride, padding, dilation, transposed,
                                            output_padding, groups)
    return backend in (torch._C._ConvBackend.Cudnn, torch._C._ConvBackend.CudnnTranspose)


def check_case(case: Case, path: str, device: str, tolerance: float) -> Optional[str]:
    """Runs the case natively and through the path; returns what went wrong, or None."""
    if path == "intercept":
        with intercepting(False):
            native = evaluate(case, cached=False)
        calls = cache_calls()
        with intercepting(True):
            ours = evaluate(case, cached=False)
    else:
        native = evaluate(case, cached=False)
        calls = cache_calls()
        ours = evaluate(case, cached=True)
    problem = mismatch(native, ours, tolerance)
    if problem or device != "cuda" or native.error is not None:
        return problem
    taken = cache_calls() > calls
    expected = native_uses_cudnn(case)
    if expected is not None and taken != expected:
        return f"reached the cache: {taken}, but native PyTorch runs it with cuDNN: {expected}"
    if not taken and not torch.equal(native.output, ours.output):
        return "not taken by the cache, yet its output differs from native's bits"
    return None


def report(path, device, dtype_name, layout, source, run, passed):
    destination = os.environ.get("CUDNN_CACHE_CONFORMANCE_REPORT")
    if destination:
        with open(destination, "a") as out:
            out.write(json.dumps(dict(path=path, device=device, dtype=dtype_name, layout=layout, source=source,
                                      run=run, passed=passed)) + "\n")


@pytest.fixture
def conformance_state(cache_state, torch_flags):
    """An empty cache with cheap tuning: every miss is tuned (so hits run stored engine configs) but one
    candidate is enough here, where only results count."""
    with testing_ops.search_bounds(warmup=0, repetitions=1, max_candidates=1, mode_b_candidates=0, knob_variants=0,
                                   finalists=0, flush_l2=False):
        yield


def configurations():
    for device in ("cpu", "cuda"):
        marks = [pytest.mark.gpu] if device == "cuda" else []
        for path in ("convert", "intercept"):
            if path == "intercept" and device == "cpu":
                continue  # interception replaces CUDA kernels only; CPU calls are PyTorch's (test_intercept.py)
            for dtype_name in DTYPES:
                if dtype_name == "float32_tf32" and device == "cpu":
                    continue
                for layout in ("contiguous", "channels_last"):
                    yield pytest.param(path, device, dtype_name, layout, marks=marks,
                                       id=f"{path}-{device}-{dtype_name}-{layout}")


@pytest.mark.parametrize("source", ["opinfo", "moduleinfo"])
@pytest.mark.parametrize("path, device, dtype_name, layout", list(configurations()))
def test_samples_match_native(path, device, dtype_name, layout, source, conformance_state):
    dtype = DTYPES[dtype_name]
    torch.backends.cudnn.allow_tf32 = dtype_name == "float32_tf32"
    cases = opinfo_cases(device, dtype, layout) if source == "opinfo" else module_cases(device, dtype, layout)
    assert cases, "no samples: PyTorch's test material changed"
    tolerance = TOLERANCE[dtype_name]
    failures = [f"{case.name}: {problem}" for case in cases
                if (problem := check_case(case, path, device, tolerance)) is not None]
    report(path, device, dtype_name, layout, source, len(cases), len(cases) - len(failures))
    assert not failures, f"{len(failures)} of {len(cases)} samples differ from native:\n" + "\n".join(failures)


@pytest.mark.parametrize("path, device", [("convert", "cpu"), pytest.param("convert", "cuda", marks=pytest.mark.gpu),
                                          pytest.param("intercept", "cuda", marks=pytest.mark.gpu)])
def test_error_inputs_raise_as_native_does(path, device, conformance_state):
    cases = error_cases(device)
    assert cases
    failures = [f"{case.name}: {problem}" for case in cases
                if (problem := check_case(case, path, device, 0.0)) is not None]
    report(path, device, "any", "any", "error_inputs", len(cases), len(cases) - len(failures))
    assert not failures, "\n".join(failures)


# --- Transforms: higher-order and forward-mode AD, torch.func, autocast, CUDA graphs, streams, torch.compile -----

PATHS = [pytest.param("convert", "cpu", id="convert-cpu"),
         pytest.param("convert", "cuda", marks=pytest.mark.gpu, id="convert-cuda"),
         pytest.param("intercept", "cuda", marks=pytest.mark.gpu, id="intercept-cuda")]


def batched_samples(device, dtype):
    """(op name, input, weight, bias, kwargs) of each OpInfo sample with a batched input and no padding string."""
    for op in OPINFOS:
        for sample in op.sample_inputs(device, dtype, requires_grad=True):
            weight, bias = sample.args[0], sample.args[1] if len(sample.args) > 1 else None
            if sample.input.dim() == weight.dim() and not isinstance(sample.kwargs.get("padding"), str):
                yield op.name, sample.input, weight, bias, dict(sample.kwargs)


def no_autograd_warning(caught) -> None:
    messages = [str(w.message) for w in caught if AUTOGRAD_WARNING in str(w.message)]
    assert not messages, messages[0]


@pytest.mark.parametrize("path, device", PATHS)
def test_float64_samples_pass_gradcheck_and_gradgradcheck(path, device, conformance_state):
    """Numerical against analytical gradients, backward and forward mode, first and second order, batched."""
    failures, count = [], 0
    for op in OPINFOS:
        for index, sample in enumerate(op.sample_inputs(device, torch.float64, requires_grad=True)):
            tensors = [t for t in [sample.input, *sample.args] if isinstance(t, torch.Tensor)]
            conv = functional_of(op.name, uses_cache(path, True))

            def fn(*leaves, sample=sample, conv=conv):
                args = list(leaves[1:]) + list(sample.args[len(leaves) - 1:])
                return conv(leaves[0], *args, **sample.kwargs)

            count += 1
            with through(path, True), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    # As PyTorch's own OpInfo tests: cuDNN's backward algorithms may add in any order.
                    torch.autograd.gradcheck(fn, tensors, check_forward_ad=True, check_batched_grad=True,
                                             fast_mode=True, nondet_tol=op.gradcheck_nondet_tol)
                    torch.autograd.gradgradcheck(fn, tensors, fast_mode=True, nondet_tol=op.gradcheck_nondet_tol)
                    no_autograd_warning(caught)
                except Exception as error:  # noqa: BLE001 - collected, reported below
                    failures.append(f"{op.name}[{index}] {describe(sample)}: {str(error)[:300]}")
    report(path, device, "float64", "contiguous", "gradcheck+gradgradcheck", count, count - len(failures))
    assert not failures, f"{len(failures)} of {count}:\n" + "\n".join(failures)


@pytest.mark.parametrize("path, device", PATHS)
def test_func_jvp_vjp_and_vmap_match_native(path, device, conformance_state):
    """torch.func on every batched float32 sample: jvp (forward mode), vjp, and vmap over a batch of inputs and
    over a batch of weights, against native."""
    torch.backends.cudnn.allow_tf32 = False
    failures, count = [], 0
    generator = torch.Generator().manual_seed(3)

    def like(t):
        return torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device)

    for name, input, weight, bias, kwargs in batched_samples(device, torch.float32):
        count += 1
        tangents = (like(input), like(weight))
        inputs_batch, weights_batch = torch.stack([input, like(input)]), torch.stack([weight, like(weight)])
        results = []
        for cached in (False, True):
            conv = functional_of(name, uses_cache(path, cached))

            def fn(x, w, conv=conv):
                return conv(x, w, bias, **kwargs)

            with through(path, cached), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                primal, tangent = torch.func.jvp(fn, (input.detach(), weight.detach()), tangents)
                output, pullback = torch.func.vjp(fn, input.detach(), weight.detach())
                cotangents = pullback(torch.ones_like(output))
                over_inputs = torch.func.vmap(fn, in_dims=(0, None))(inputs_batch.detach(), weight.detach())
                over_weights = torch.func.vmap(fn, in_dims=(None, 0))(input.detach(), weights_batch.detach())
            if cached:
                no_autograd_warning(caught)
            results.append([primal, tangent, *cotangents, over_inputs, over_weights])
        for what, expected, actual in zip(["jvp primal", "jvp tangent", "vjp input", "vjp weight", "vmap inputs",
                                           "vmap weights"], *results):
            problem = tensor_mismatch(expected, actual, TOLERANCE["float32"])
            if problem:
                failures.append(f"{name} {tuple(input.shape)} {kwargs} {what}: {problem}")
    report(path, device, "float32", "contiguous", "func.jvp+vjp+vmap", count, count - len(failures))
    assert not failures, "\n".join(failures)


def small_model(device, dtype, cached):
    """Convolutions of every kind torch.nn has in 2-D, bias and not, strided, grouped and transposed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False),
                          nn.Tanh(), nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.Tanh(),
                          nn.Conv2d(4, 2, 1)).to(device=device, dtype=dtype)
    return cudnn_cache.convert(model) if cached else model


def gradient_penalty_grads(path, device, dtype, cached):
    """WGAN-GP: the parameters' gradients of the penalty on the input gradient's norm (create_graph=True)."""
    model = small_model(device, dtype, uses_cache(path, cached))
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    x.requires_grad_()
    with through(path, cached):
        (grad_x,) = torch.autograd.grad(model(x).square().sum(), x, create_graph=True)
        penalty = (grad_x.flatten(1).norm(dim=1) - 1).square().mean()
        return torch.autograd.grad(penalty, list(model.parameters()))


@pytest.mark.parametrize("path, device", PATHS)
def test_gradient_penalties_match_native(path, device, conformance_state):
    dtype = torch.float64
    expected = gradient_penalty_grads(path, device, dtype, cached=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = gradient_penalty_grads(path, device, dtype, cached=True)
    no_autograd_warning(caught)
    for index, (e, a) in enumerate(zip(expected, actual)):
        assert tensor_mismatch(e, a, TOLERANCE["float64"]) is None, f"parameter {index}: {tensor_mismatch(e, a, 1e-10)}"


AUTOCAST = [pytest.param("convert", "cpu", torch.bfloat16, id="convert-cpu-bfloat16"),
            *[pytest.param(path, "cuda", dtype, marks=pytest.mark.gpu, id=f"{path}-cuda-{str(dtype)[6:]}")
              for path in ("convert", "intercept") for dtype in (torch.float16, torch.bfloat16)]]


@pytest.mark.parametrize("path, device, dtype", AUTOCAST)
def test_autocast_matches_native(path, device, dtype, conformance_state):
    """Under torch.autocast, convolutions run in the autocast dtype, as natively; so do their gradients."""
    results = []
    for cached in (False, True):
        model = small_model(device, torch.float32, uses_cache(path, cached))
        x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        with through(path, cached), torch.autocast(device, dtype=dtype):
            output = model(x)
        with through(path, cached):
            grads = torch.autograd.grad(output.float().sum(), [x, *model.parameters()])
        results.append((output, grads))
    (expected, expected_grads), (actual, actual_grads) = results
    assert actual.dtype == expected.dtype == dtype
    tolerance = TOLERANCE[str(dtype)[6:]]
    for what, e, a in [("output", expected, actual), *[(f"grad {i}", e, a)
                                                       for i, (e, a) in enumerate(zip(expected_grads, actual_grads))]]:
        problem = tensor_mismatch(e, a, tolerance)
        assert problem is None, f"{what}: {problem}"


def graph_step(model, x):
    """Forward and backward as one function of x: the output and the gradients of x and the parameters."""
    output = model(x)
    return (output, *torch.autograd.grad(output.square().sum(), [x, *model.parameters()]))


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["convert", "intercept"])
@pytest.mark.parametrize("warm", [False, True], ids=["misses", "hits"])
def test_cuda_graph_capture_and_replay_match_native(path, warm, conformance_state):
    """A training step captured in a CUDA graph: on misses nothing is timed during the capture (the heuristic
    choice is captured and the keys are recorded, then tuned by the next call outside the capture); on hits the
    stored configs are captured. Replays give native's results."""
    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1)).cuda().requires_grad_()
    native = graph_step(small_model("cuda", torch.float32, False), x)
    model = small_model("cuda", torch.float32, uses_cache(path, True))
    static_x = x.detach().clone().requires_grad_()
    with through(path, True):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # CUDA graphs want warm-up runs on a side stream
            graph_step(model, static_x)
        torch.cuda.current_stream().wait_stream(side)
        if not warm:
            cudnn_cache.clear()
        before = cudnn_cache.stats()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = graph_step(model, static_x)
        during = cudnn_cache.stats()
        static_x.data.copy_(x.detach())
        graph.replay()
        torch.cuda.synchronize()
        for index, (e, a) in enumerate(zip(native, captured)):
            assert tensor_mismatch(e, a, TOLERANCE["float32"]) is None, f"tensor {index}"
        assert during["tunes"] == before["tunes"], "nothing may be tuned during a capture"
        if warm:
            assert during["misses"] == before["misses"] and during["capture_misses"] == 0
        else:
            assert during["capture_misses"] > 0 and during["capture_misses"] == during["misses"] - before["misses"]
            graph_step(model, static_x)  # outside the capture, the recorded keys are tuned
            assert cudnn_cache.stats()["tunes"] >= during["capture_misses"]


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["convert", "intercept"])
def test_a_non_default_stream_matches_native(path, conformance_state):
    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1)).cuda().requires_grad_()
    native = graph_step(small_model("cuda", torch.float32, False), x)
    stream = torch.cuda.Stream()
    model = small_model("cuda", torch.float32, uses_cache(path, True))
    with through(path, True):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ours = graph_step(model, x)
        torch.cuda.current_stream().wait_stream(stream)
    assert cudnn_cache.stats()["misses"] > 0
    for index, (e, a) in enumerate(zip(native, ours)):
        assert tensor_mismatch(e, a, TOLERANCE["float32"]) is None, f"tensor {index}: {tensor_mismatch(e, a, 1e-5)}"


COMPILE = [pytest.param("convert", "cpu", "default", id="convert-cpu-default"),
           *[pytest.param(path, "cuda", mode, marks=pytest.mark.gpu, id=f"{path}-cuda-{mode}")
             for path in ("convert", "intercept") for mode in ("default", "max-autotune-no-cudagraphs")]]


@pytest.mark.parametrize("path, device, mode", COMPILE)
def test_torch_compile_matches_native(path, device, mode, conformance_state):
    torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.reset()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
    native = graph_step(small_model(device, torch.float32, False), x)
    model = torch.compile(small_model(device, torch.float32, uses_cache(path, True)), mode=mode, fullgraph=True)
    with through(path, True):
        compiled = graph_step(model, x)
        if device == "cuda":
            assert cudnn_cache.stats()["misses"] > 0, "the compiled graph did not reach the cache"
    tolerance = TOLERANCE["float32"]
    for index, (e, a) in enumerate(zip(native, compiled)):
        assert tensor_mismatch(e, a, tolerance) is None, f"tensor {index}: {tensor_mismatch(e, a, tolerance)}"
