"""PyTorch's CUDA convolution tests (test/nn/test_convolution.py, TestConvolutionNN and TestConvolutionNNDeviceType)
that reach cuDNN, run with cudnn_cache's interception.

Every test runs the same code twice through run_both(): natively (interception off), then with
cudnn_cache.intercept(True). It checks that
  * the results are equal: tensors within their dtype's tolerance (TOLERANCE), with the same shape, dtype and
    memory format (gradients as backward() leaves them in .grad, as PyTorch's tests read them); everything else
    exactly;
  * where native raises, cudnn_cache raises the same exception type;
  * each aten.convolution and aten.convolution_backward call (autograd's, double backward's and forward AD's
    included) went through the cache (its hits + misses grew) exactly when native PyTorch would have run it
    with cuDNN (torch._C._select_conv_backend), and through PyTorch's own kernels otherwise.
float32 is compared with TF32 off (strictly); the tests PyTorch runs with tf32_on_and_off also run with TF32
on, compared with PyTorch's TF32 tolerance. Each test names the PyTorch test it ports in a comment.

Deliberately different from PyTorch's versions:
  * PyTorch compares CUDA against the CPU or against float64; here the reference is native PyTorch on the
    same GPU. The CPU references of test_conv_large_batch_1, test_conv3d_64bit_indexing and
    test_depthwise_conv_64bit_indexing (4 to 8 GiB tensors convolved on the CPU, up to 64 GB of host memory)
    are therefore not computed.
  * gradcheck and gradgradcheck run in fast mode (a few random directions): slow mode would take minutes
    for the 3-D cases, and cudnn_cache's gradients are compared with native's element by element anyway.
  * Long loops over shapes (test_conv1d_same_padding, test_ConvTranspose2d_output_size_downsample_upsample,
    run_grad_conv_test, test_functional_grad_conv2d, test_permute_conv2d_issue_120211) run on a subset:
    every new shape is a new key to tune.
  * test_conv_backend also runs the depthwise cases with cuDNN enabled (PyTorch still runs those with its own
    kernels), and cudnn3d_transposed, which PyTorch comments out for an out-of-memory error long gone.

Left out:
  * CPU, oneDNN or NNPACK only, never CUDA: test_Conv2d_1x1, test_Conv2d_OneDNN, test_conv_contiguous_for_oneDNN,
    test_conv_ic1_channels_last_for_oneDNN, test_nnpack_conv, test_conv2d_no_grad, test_Conv3d_groups_nobias,
    test_Conv3d_groups_wbias, test_conv3d_overflow_values (aten.slow_conv3d), test_conv2d_discontiguous_weight,
    and the mkldnn / miopen cases of test_conv_backend.
  * No convolution kernel involved: test_conv_invalid_groups, test_conv_padding_mode, test_Conv2d_missing_argument
    and the constructor checks of test_Conv{1,2,3}d_module_same_padding (argument checks in Python);
    test_conv_backcompat (unpickles a CPU module downloaded from the network); test_conv_tbc (aten.conv_tbc is
    matrix products, not aten.convolution).
  * test_conv{1,2,3}d_vs_scipy: they check the definition of convolution against SciPy on the CPU; on the GPU
    the same padding modes are covered by the same/valid padding ports below.
  * test_Conv2d_inconsistent_types (CPU) is covered by its two CUDA variants.
"""

import contextlib
import copy
import itertools
from typing import Any, Callable, Optional

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode

import cudnn_cache
import testing_ops
from conftest import cache_calls, intercepting

pytestmark = pytest.mark.gpu

DEVICE = "cuda"

# --- Tolerances -------------------------------------------------------------------------------------------------

# (rtol, atol) per dtype: torch.testing.assert_close's defaults, but atol at least rtol, and atol applied relative to
# the largest magnitude of native's tensor (at least 1). The two runs may use different cuDNN algorithms, which sum in
# different orders; and a convolution's result is rounded to its dtype before the bias is added (or the next layer
# runs), so an element near zero may carry a rounding of the largest magnitudes, not of its own: for float16 and
# bfloat16 that is a unit in the last place of the largest values.
TOLERANCE = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}
# With TF32 on (PyTorch's default for cuDNN), float32 convolutions round their inputs to 10 mantissa bits; PyTorch's
# tests of these convolutions use tf32_on_and_off(0.005).
TF32_TOLERANCE = {**TOLERANCE, torch.float32: (5e-3, 5e-3), torch.complex64: (5e-3, 5e-3)}
# PyTorch's dtype2prec_DONTUSE: the atol its tests use to compare two ways of computing one convolution (a grouped
# convolution against its groups run one by one, say). Copied, not imported: importing
# torch.testing._internal.common_utils disables setting the torch.backends flags for the whole session.
PYTORCH_PRECISION = {torch.float32: 1e-5, torch.float64: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-1,
                     torch.complex64: 1e-5, torch.complex128: 1e-5}
# PyTorch's GRADCHECK_NONDET_TOL: cuDNN's algorithms need not be bitwise reproducible.
GRADCHECK_NONDET_TOL = 1e-12


def tolerance_for(tf32: bool) -> dict:
    return TF32_TOLERANCE if tf32 else TOLERANCE


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- Fixtures ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def module_cache():
    """One cache for the whole module, tuned quickly (short searches: testing_ops.search_bounds). Unlike conftest's
    cache_state, entries are not cleared between tests: many tests share keys, and tuning each again would
    multiply the module's run time. The miss policy and backend found are restored, and the cache cleared, at the
    end."""
    policy, backend = cudnn_cache.miss_policy(), cudnn_cache.backend()
    cudnn_cache.clear()
    cudnn_cache.reset_stats()
    cudnn_cache.set_miss_policy("tune")
    with testing_ops.search_bounds(warmup=1, repetitions=2, max_candidates=4, mode_b_candidates=0, knob_variants=0,
                                   finalists=0):
        yield
    cudnn_cache.set_miss_policy(policy)
    cudnn_cache.set_backend(backend)
    cudnn_cache.clear()
    cudnn_cache.reset_stats()


@pytest.fixture(autouse=True)
def strict_float32(torch_flags):
    """TF32 off unless a test turns it on, and the same module initialisations in every run; torch_flags
    restores the cuDNN flags afterwards."""
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    yield


@contextlib.contextmanager
def cudnn_flags(**flags):
    """Sets the named torch.backends.cudnn flags (enabled, benchmark, deterministic, allow_tf32) for the block and
    leaves the others alone; torch.backends.cudnn.flags() would also set every flag it is not given (TF32 on)."""
    saved = {name: getattr(torch.backends.cudnn, name) for name in flags}
    for name, value in flags.items():
        setattr(torch.backends.cudnn, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.backends.cudnn, name, value)


# --- Which calls the cache must run -----------------------------------------------------------------------------

CUDNN_BACKENDS = (torch._C._ConvBackend.Cudnn, torch._C._ConvBackend.CudnnTranspose)
INT32_MAX = 2**31 - 1
CONVOLUTION = torch.ops.aten.convolution.default
CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward.default


def cache_should_run(input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                     output) -> Optional[bool]:
    """Whether cudnn_cache must run this aten.convolution(_backward) call: when native PyTorch runs it with cuDNN
    (its backend selection reads the cuDNN flags in force now), and input, weight and output each hold at most
    2^31 - 1 elements: PyTorch splits larger ones by batch for cuDNN, and cudnn_cache leaves those to PyTorch
    (Note [Which convolutions the cache runs]). None where PyTorch's selection rejects the call."""
    try:
        backend = torch._C._select_conv_backend(input, weight, None, list(stride), list(padding), list(dilation),
                                                transposed, list(output_padding), groups, bias_sizes)
    except RuntimeError:
        return None
    fits = max(input.numel(), weight.numel(), output.numel()) <= INT32_MAX
    return backend in CUDNN_BACKENDS and fits


class ConvolutionCalls(TorchDispatchMode):
    """Records each aten.convolution and aten.convolution_backward call made under it, on any thread autograd
    runs: what it was, whether cudnn_cache should have run it, and whether the cache was looked up."""

    def __init__(self):
        super().__init__()
        self.calls = []  # (description, should run through the cache (None: not judged), looked up)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not CONVOLUTION and func is not CONVOLUTION_BACKWARD:
            return func(*args, **kwargs)
        before = cache_calls()
        result = func(*args, **kwargs)
        looked_up = cache_calls() > before
        if func is CONVOLUTION:
            input, weight, bias, stride, padding, dilation, transposed, output_padding, groups = args
            output, bias_sizes = result, None if bias is None else list(bias.shape)
        else:
            output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups = args[:10]
        expected = cache_should_run(input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                                    groups, output)
        description = (f"{func}(input {tuple(input.shape)} {dtype_id(input.dtype)} strides {input.stride()}, "
                       f"weight {tuple(weight.shape)}, stride {list(stride)}, padding {list(padding)}, dilation "
                       f"{list(dilation)}, transposed {transposed}, output_padding {list(output_padding)}, groups "
                       f"{groups}, cudnn {torch.backends.cudnn.enabled}, deterministic "
                       f"{torch.backends.cudnn.deterministic})")
        self.calls.append((description, expected, looked_up))
        return result


# --- Comparing native with cudnn_cache ----------------------------------------------------------------------------

def memory_formats(tensor: torch.Tensor) -> tuple:
    """The memory formats `tensor` is dense in: contiguous, channels-last (for a 3-D tensor: (N, L, C) order), both
    (size-1 dimensions make a layout ambiguous) or neither."""
    formats = ["contiguous"] if tensor.is_contiguous() else []
    if tensor.dim() == 3 and tensor.transpose(1, 2).is_contiguous():
        formats.append("channels_last")
    channels_last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
    if channels_last is not None and tensor.is_contiguous(memory_format=channels_last):
        formats.append("channels_last")
    return tuple(formats)


def assert_same(ours: Any, native: Any, tolerance: dict, where: str = "result") -> None:
    """ours equals native: tensors in shape, dtype, device and memory format, and in value within `tolerance`
    (atol relative to native's largest magnitude); sequences and dicts item by item; anything else exactly."""
    if isinstance(native, torch.Tensor):
        assert isinstance(ours, torch.Tensor), f"{where}: native gave a tensor, cudnn_cache {ours!r}"
        assert (ours.shape, ours.dtype, ours.device) == (native.shape, native.dtype, native.device), (
            f"{where}: cudnn_cache {tuple(ours.shape)} {ours.dtype} {ours.device}, "
            f"native {tuple(native.shape)} {native.dtype} {native.device}")
        assert memory_formats(ours) == memory_formats(native), (
            f"{where}: cudnn_cache is dense in {memory_formats(ours)} (strides {ours.stride()}), native in "
            f"{memory_formats(native)} (strides {native.stride()})")
        ours, native = ours.detach(), native.detach()
        if native.is_floating_point() or native.is_complex():
            rtol, atol = tolerance[native.dtype]
            scale = max(native.abs().max().item(), 1.0) if native.numel() > 0 else 1.0
            torch.testing.assert_close(ours, native, rtol=rtol, atol=atol * scale,
                                       msg=lambda message: f"{where}: {message}")
        else:
            assert torch.equal(ours, native), f"{where}: cudnn_cache {ours}, native {native}"
    elif isinstance(native, (list, tuple)):
        assert isinstance(ours, (list, tuple)) and len(ours) == len(native), f"{where}: {ours!r} vs {native!r}"
        for index, (a, b) in enumerate(zip(ours, native)):
            assert_same(a, b, tolerance, f"{where}[{index}]")
    elif isinstance(native, dict):
        assert isinstance(ours, dict) and ours.keys() == native.keys(), f"{where}: {ours!r} vs {native!r}"
        for key in native:
            assert_same(ours[key], native[key], tolerance, f"{where}[{key!r}]")
    else:
        assert ours == native, f"{where}: cudnn_cache {ours!r}, native {native!r}"


def run_both(fn: Callable, *args, raises: Optional[type] = None, tolerance: Optional[dict] = None,
             compare: bool = True):
    """Runs fn(*args) natively (interception off), then through cudnn_cache (interception on), restores the
    interception state found, and returns (native, ours).

    raises=None: neither run may raise; fn must make at least one convolution call; native must not touch the
    cache, and with interception every call must go through the cache exactly when cache_should_run says; the
    results must be equal (assert_same, within `tolerance`, by default TOLERANCE), unless compare=False.
    raises=SomeError: native must raise SomeError, and cudnn_cache the very same exception type; the exceptions
    are returned."""
    outcomes = []
    for cached in (False, True):
        calls = ConvolutionCalls()
        try:
            with intercepting(cached), calls:
                result = fn(*args)
            torch.cuda.synchronize()
        except Exception as error:  # judged below, against the other run
            result = error
        outcomes.append((result, calls.calls))
    (native, native_calls), (ours, our_calls) = outcomes

    if raises is not None:
        assert isinstance(native, raises), f"native PyTorch should raise {raises.__name__}, gave {native!r}"
        assert type(ours) is type(native), f"native raised {native!r}; with cudnn_cache: {ours!r}"
        return native, ours
    if isinstance(native, Exception):
        raise native  # the test itself is wrong: native PyTorch must run it
    if isinstance(ours, Exception):
        raise AssertionError(f"native PyTorch ran it, cudnn_cache raised {ours!r}") from ours

    assert native_calls, "fn made no aten.convolution call: the test checks nothing of cudnn_cache"
    touched = [description for description, _, looked_up in native_calls if looked_up]
    assert not touched, f"native PyTorch (interception off) looked the cache up for: {touched}"
    wrong = [f"{description}: cache {'used' if looked_up else 'not used'}, should be {'used' if expected else 'not'}"
             for description, expected, looked_up in our_calls if expected is not None and looked_up != expected]
    assert not wrong, "with interception, calls that went the wrong way:\n" + "\n".join(wrong)
    if compare:
        assert_same(ours, native, tolerance or TOLERANCE)
    return native, ours


# --- Inputs and gradients -----------------------------------------------------------------------------------------

def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(*sizes, dtype=torch.float32, memory_format=torch.contiguous_format, seed=0) -> torch.Tensor:
    """Normal values on the GPU, the same for the same seed."""
    values = torch.randn(sizes, dtype=dtype, device=DEVICE, generator=generator(seed))
    return values.to(memory_format=memory_format)


def small_integers(*sizes, dtype=torch.float32, memory_format=torch.contiguous_format, low=-3, high=3,
                   seed=0) -> torch.Tensor:
    """Integers in [low, high) as `dtype`, as PyTorch's memory-format tests use: their products and short sums are
    exact in every dtype, so layout mistakes show as whole-number differences."""
    values = torch.randint(low, high, sizes, device=DEVICE, generator=generator(seed))
    return values.to(dtype, memory_format=memory_format)


def random_like(tensor: torch.Tensor, seed: int) -> torch.Tensor:
    """Normal values with the shape, dtype and strides of `tensor`, the same for the same seed."""
    values = torch.randn(tensor.shape, dtype=tensor.dtype, device=tensor.device, generator=generator(seed))
    return torch.empty_like(tensor).copy_(values)


def in_format(tensor: torch.Tensor, memory_format) -> torch.Tensor:
    """A copy in `memory_format`, with the strides of size-1 dimensions set as that format has them (what
    PyTorch's tests do with resize_), so ambiguous shapes really are in the format."""
    copied = tensor.detach().clone().contiguous(memory_format=memory_format)
    return copied.resize_(copied.shape, memory_format=memory_format)


def with_grads(fn: Callable, *tensors, grad_output: Optional[torch.Tensor] = None, seed: int = 99):
    """(output, grads): fn(*tensors), and the gradients of its output with respect to each floating-point or complex
    tensor among `tensors`, as backward() leaves them in .grad (laid out like the tensor, as PyTorch's tests read
    them). The tensors are taken as new leaves that share their storage, so views keep their strides and the
    caller's tensors are untouched. The gradient flowing in is `grad_output`, or normal values laid out like the
    output."""
    leaves = [t.detach().requires_grad_() if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
              else t for t in tensors]
    output = fn(*leaves)
    output.backward(random_like(output, seed) if grad_output is None else grad_output)
    return output.detach(), tuple(leaf.grad for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.requires_grad)


def module_call(module: nn.Module, **kwargs) -> Callable:
    """A function of (input, *parameters) that runs `module` with those parameters in place of its own."""
    names = [name for name, _ in module.named_parameters()]

    def call(input, *parameters):
        return functional_call(module, dict(zip(names, parameters)), (input,), kwargs)

    return call


def spatial(value, dims: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value] * dims


# ==================================================================================================================
# Backend selection
# ==================================================================================================================

# name: (input shape, transposed, dilated, groups, cuDNN enabled), as PyTorch's test_conv_backend has them for CUDA
# (disablecuDNN: cuDNN disabled).
BACKEND_CASES = {
    "slow1d": ((2, 6, 7), False, False, 3, False),
    "slow1d_transposed": ((2, 6, 7), True, False, 3, False),
    "slow1d_dilated": ((2, 6, 7), False, True, 3, False),
    "slow1d_dilated_transposed": ((2, 6, 7), True, True, 3, False),
    "slow2d": ((2, 6, 7, 8), False, False, 3, False),
    "slow2d_transposed": ((2, 6, 7, 8), True, False, 3, False),
    "slow2d_dilated": ((2, 6, 7, 8), False, True, 3, False),
    "slow2d_dilated_transposed": ((2, 6, 7, 8), True, True, 3, False),
    "slow3d_cuda": ((2, 6, 7, 8, 9), False, False, 3, False),
    "slow3d_dilated": ((2, 6, 7, 8, 9), False, True, 3, False),
    **{f"empty_{name}{len(shape) - 2}d": (shape, False, False, 3, True)
       for spatial_size in [(7,), (7, 8), (7, 8, 9)]
       for name, shape in [("batch", (0, 6, *spatial_size)), ("channel", (2, 0, *spatial_size)),
                           ("batch_channel", (0, 0, *spatial_size))]},
    "cuda_depthwise1d": ((2, 6, 7), False, False, 6, False),
    "cuda_depthwise2d": ((2, 6, 7, 8), False, False, 6, False),
    "cuda_depthwise3d": ((2, 6, 7, 8, 9), False, False, 6, False),
    "cudnn1d": ((2, 6, 7), False, False, 3, True),
    "cudnn2d": ((2, 6, 7, 8), False, False, 3, True),
    "cudnn3d": ((2, 6, 7, 8, 9), False, False, 3, True),
    "cudnn1d_transposed": ((2, 6, 7), True, False, 3, True),
    "cudnn2d_transposed": ((2, 6, 7, 8), True, False, 3, True),
    "cudnn3d_transposed": ((2, 6, 7, 8, 9), True, False, 3, True),
    # Not in PyTorch's list: depthwise convolutions with cuDNN enabled, which PyTorch still gives its own kernels.
    "depthwise1d_cudnn_enabled": ((2, 6, 7), False, False, 6, True),
    "depthwise2d_cudnn_enabled": ((2, 6, 7, 8), False, False, 6, True),
    "depthwise3d_cudnn_enabled": ((2, 6, 7, 8, 9), False, False, 6, True),
}


def make_noncontiguous(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The same values, seen through a view that steps over every other element of the last dimension."""
    if tensor is None:
        return None
    return torch.repeat_interleave(tensor, 2, dim=-1)[..., ::2]


# Port of TestConvolutionNNDeviceType.test_conv_backend (CUDA cases).
@pytest.mark.parametrize("contiguous", [False, True], ids=["noncontiguous", "contiguous"])
@pytest.mark.parametrize("strided", [False, True], ids=["stride1", "stride2"])
@pytest.mark.parametrize("has_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("case", list(BACKEND_CASES))
def test_conv_backend(case, has_bias, strided, contiguous):
    input_shape, transposed, dilated, groups, cudnn_enabled = BACKEND_CASES[case]
    in_channels, out_channels, dims = input_shape[1], 12, len(input_shape) - 2
    weight_shape = ((in_channels, out_channels // groups) if transposed else (out_channels, in_channels // groups))
    x = randn(*input_shape, seed=1)
    weight = randn(*weight_shape, *[3] * dims, seed=2)
    bias = randn(out_channels, seed=3) if has_bias else None
    if not contiguous:
        x, weight, bias = make_noncontiguous(x), make_noncontiguous(weight), make_noncontiguous(bias)
    arguments = ([2] * dims if strided else [1] * dims, [0] * dims, [2] * dims if dilated else [1] * dims,
                 transposed, [0] * dims, groups)

    def convolution(x, weight, bias=None):
        return torch.ops.aten.convolution(x, weight, bias, *arguments)

    def run(x, weight, bias):
        with cudnn_flags(enabled=cudnn_enabled):
            tensors = [t for t in (x, weight, bias) if t is not None]
            output = convolution(*tensors)
            grad_output = random_like(output, 4)
            if not contiguous:
                grad_output = make_noncontiguous(grad_output)
            results = {"backward": with_grads(convolution, *tensors, grad_output=grad_output)}
            if x.numel() > 0:  # as PyTorch's test_conv_backend, which leaves empty inputs' forward AD out
                leaves = [t.detach().requires_grad_() for t in tensors]
                with fwAD.dual_level():
                    duals = [fwAD.make_dual(t, random_like(t, 10 + i)) for i, t in enumerate(leaves)]
                    dual_output = convolution(*duals)
                    tangent = fwAD.unpack_dual(dual_output).tangent.clone()
                    dual_grad = fwAD.make_dual(random_like(output, 20), random_like(output, 21))
                    grads = torch.autograd.grad(dual_output, leaves, dual_grad)
                    results["forward_ad"] = tangent
                    results["forward_over_reverse"] = [
                        (u.primal.clone(), None if u.tangent is None else u.tangent.clone())
                        for u in map(fwAD.unpack_dual, grads)]
            doubles = [t.detach().double().requires_grad_() for t in tensors]
            results["gradcheck"] = torch.autograd.gradcheck(convolution, doubles, nondet_tol=GRADCHECK_NONDET_TOL,
                                                            fast_mode=True)
            if has_bias:
                doubles[2].requires_grad_(False)  # double backward has no bias gradient
            results["gradgradcheck"] = torch.autograd.gradgradcheck(convolution, doubles,
                                                                    nondet_tol=GRADCHECK_NONDET_TOL, fast_mode=True)
            return results

    _, ours = run_both(run, x, weight, bias)
    assert ours["gradcheck"] and ours["gradgradcheck"]


# Port of TestConvolutionNN.test_thnn_conv_strided_padded_dilated, with cuDNN disabled (as PyTorch runs it: PyTorch's
# own kernels, which interception must leave alone) and enabled.
@pytest.mark.parametrize("cudnn_enabled", [False, True], ids=["cudnn_disabled", "cudnn_enabled"])
@pytest.mark.parametrize("stride, padding, dilation", [(2, 0, 1), (1, 1, 1), (2, 1, 1), (1, 0, 2)],
                         ids=["s2p0d1", "s1p1d1", "s2p1d1", "s1p0d2"])
@pytest.mark.parametrize("conv, dims", [(F.conv2d, 2), (F.conv_transpose2d, 2), (F.conv3d, 3), (F.conv_transpose3d, 3)],
                         ids=["conv2d", "conv_transpose2d", "conv3d", "conv_transpose3d"])
def test_thnn_conv_strided_padded_dilated(conv, dims, stride, padding, dilation, cudnn_enabled):
    kwargs = dict(stride=stride, padding=padding, dilation=dilation)
    x = randn(1, 2, *[4] * dims, dtype=torch.float64, seed=1)
    weight = randn(2, 2, *[1] * dims, dtype=torch.float64, seed=2)
    bias = randn(2, dtype=torch.float64, seed=3)

    def run(x, weight, bias):
        with cudnn_flags(enabled=cudnn_enabled):
            call = lambda *t: conv(*t, **kwargs)  # noqa: E731
            leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
            return with_grads(call, x, weight, bias), torch.autograd.gradcheck(call, leaves, fast_mode=True)

    run_both(run, x, weight, bias)


# Port of TestConvolutionNN.test_Conv2d_inconsistent_types_on_GPU_without_cudnn and
# test_Conv2d_inconsistent_types_on_GPU_with_cudnn.
@pytest.mark.parametrize("cudnn_enabled", [False, True], ids=["without_cudnn", "with_cudnn"])
def test_conv2d_inconsistent_types_on_gpu(cudnn_enabled):
    inputs = randn(4, 1, 7, 7)
    weights = randn(1, 1, 3, 3, dtype=torch.float64)
    bias = randn(1, dtype=torch.float64)

    def run(*tensors):
        with cudnn_flags(enabled=cudnn_enabled):
            return F.conv2d(*tensors)

    run_both(run, inputs, weights, raises=RuntimeError)
    run_both(run, inputs, weights.float(), bias, raises=RuntimeError)
    run_both(run, inputs, weights.float(), bias.float())


# Port of TestConvolutionNN.test_cudnn_non_contiguous.
def test_cudnn_non_contiguous():
    x = randn(192, 16, 50, seed=1).permute(0, 2, 1).contiguous().permute(0, 2, 1)
    weight, bias = randn(32, 16, 2, seed=2), randn(32, seed=3)
    assert not x.is_contiguous()
    run_both(with_grads, F.conv1d, x, weight, bias)


# Port of TestConvolutionNN.test_cudnn_not_mutate_stride (which PyTorch runs on CPU tensors; here on the GPU).
def test_cudnn_not_mutate_stride():
    weight = randn(64, 64, 1, 1, seed=2)
    x = randn(2, 64, 10, 10, memory_format=torch.channels_last, seed=1)
    weight_stride = weight.stride()

    def run(x, weight):
        def conv(input):
            return torch.convolution(input, weight, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1)
        channels_last = conv(x)
        stride_after_nhwc = weight.stride()
        contiguous = conv(x.contiguous())
        return channels_last, contiguous, stride_after_nhwc, weight.stride()

    _, (out_nhwc, out_nchw, stride_after_nhwc, stride_after_nchw) = run_both(run, x, weight)
    assert stride_after_nhwc == weight_stride and stride_after_nchw == weight_stride
    assert out_nhwc.is_contiguous(memory_format=torch.channels_last)
    assert out_nchw.is_contiguous()
    assert_same(out_nchw.contiguous(memory_format=torch.channels_last), out_nhwc, TOLERANCE, "NCHW against NHWC")


# Port of TestConvolutionNN.test_Conv2d_backward_twice (on the GPU).
def test_conv2d_backward_twice():
    x, weight, bias = randn(2, 3, 5, 5, seed=1), randn(3, 3, 3, 3, seed=2), randn(3, seed=3)

    def run(x, weight, bias):
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        output = F.conv2d(*leaves)
        output.sum().backward()
        try:
            output.sum().backward()
        except RuntimeError as error:
            second = str(error)
        else:
            second = "no error"
        return [leaf.grad for leaf in leaves], "Specify retain_graph=True" in second

    _, (_, refused) = run_both(run, x, weight, bias)
    assert refused


# Port of TestConvolutionNN.test_ConvTranspose2d_half_cublas_gemm: cuDNN disabled, so PyTorch's own kernels.
def test_conv_transpose2d_half_cublas_gemm():
    inputs = randn(1, 1, 16, 16, dtype=torch.float16, seed=1)
    weight, bias = randn(1, 1, 3, 3, dtype=torch.float16, seed=2), randn(1, dtype=torch.float16, seed=3)

    def run(*tensors):
        with cudnn_flags(enabled=False):
            return with_grads(lambda *t: F.conv_transpose2d(*t, stride=2, padding=1, output_padding=1), *tensors)

    run_both(run, inputs, weight, bias)


# ==================================================================================================================
# Groups
# ==================================================================================================================

# name: (out_channels, bias), PyTorch's test_Conv2d_groups_nobias, test_Conv2d_groups_nobias_v2 (input channels per
# group < 16 and output channels a multiple of 16) and test_Conv2d_naive_groups.
GROUP_CASES = {"groups_nobias": (4, False), "groups_nobias_v2": (16, False), "naive_groups": (4, True)}


# Port of TestConvolutionNN.test_Conv2d_groups_nobias, test_Conv2d_groups_nobias_v2 and
# TestConvolutionNNDeviceType.test_Conv2d_naive_groups (CUDA dtypes; TF32 on and off as tf32_on_and_off).
@pytest.mark.parametrize("dtype, tf32", [(torch.float32, False), (torch.float32, True), (torch.float16, False),
                                         (torch.bfloat16, False), (torch.float64, False)],
                         ids=["float32", "float32_tf32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", list(GROUP_CASES))
def test_conv2d_groups_match_their_halves(case, dtype, tf32):
    out_channels, has_bias = GROUP_CASES[case]
    torch.backends.cudnn.allow_tf32 = tf32
    half = out_channels // 2
    x = randn(2, 4, 6, 6, dtype=dtype, seed=1)
    weight = randn(out_channels, 2, 3, 3, dtype=dtype, seed=2)
    bias = randn(out_channels, dtype=dtype, seed=3) if has_bias else None
    grad_output = randn(2, out_channels, 4, 4, dtype=dtype, seed=4)

    def run(x, weight, bias, grad_output):
        with cudnn_flags(enabled=True, deterministic=True, benchmark=False):
            grouped = with_grads(lambda *t: F.conv2d(*t, groups=2), x, weight, bias, grad_output=grad_output)
            halves = []
            for i in range(2):
                inputs, outputs = slice(2 * i, 2 * i + 2), slice(half * i, half * (i + 1))
                halves.append(with_grads(F.conv2d, x[:, inputs].contiguous(), weight[outputs],
                                         None if bias is None else bias[outputs],
                                         grad_output=grad_output[:, outputs].contiguous()))
            return grouped, halves

    tolerance = tolerance_for(tf32)
    native, ours = run_both(run, x, weight, bias, grad_output, tolerance=tolerance)
    # PyTorch's own check: the grouped convolution is its two halves side by side, within its precision P. It
    # holds for native's results, as PyTorch checks them. cudnn_cache runs each of the six convolutions with the
    # algorithm it timed fastest, as benchmark=True would, which need not be heuristics' pick nor round alike,
    # and run_both checked each result against native's within `tolerance` T; so its two sides agree within
    # P + 2T (on the H200 they once differed by 2.5e-5 in float32, where P is 1e-5).
    precision = max(PYTORCH_PRECISION[dtype], 1e-3 if tf32 else 0.0)
    rtol, atol = tolerance[dtype]
    for ((output, grads), halves), sides_off_native in ((native, 0), (ours, 2)):
        for result, parts, dim, p in ((output, [h[0] for h in halves], 1, precision),
                                      (grads[0], [h[1][0] for h in halves], 1, precision),
                                      (grads[1], [h[1][1] for h in halves], 0,
                                       1e-1 if dtype == torch.float16 else precision)):
            expected = torch.cat(parts, dim)
            bound = p + sides_off_native * (atol + rtol * expected.abs().max().item())
            torch.testing.assert_close(result, expected, rtol=0, atol=bound)


# Port of TestConvolutionNN.test_grouped_conv_cudnn_nhwc_support.
def test_grouped_conv_cudnn_nhwc_support():
    x = randn(16, 16, 8, 8, dtype=torch.float16, memory_format=torch.channels_last, seed=1)
    x_transposed = randn(16, 8, 8, 8, dtype=torch.float16, memory_format=torch.channels_last, seed=2)
    weight = randn(8, 4, 3, 3, dtype=torch.float16, memory_format=torch.channels_last, seed=3)

    def run(x, x_transposed, weight):
        def conv(transposed):
            return lambda x, w: torch.convolution(x, w, None, (1, 1), (1, 1), (1, 1), transposed, (0, 0), 4)
        return with_grads(conv(False), x, weight), with_grads(conv(True), x_transposed, weight)

    run_both(run, x, x_transposed, weight)


# Port of TestConvolutionNN.test_conv_cudnn_memory_layout_dominance (an expected failure in PyTorch, whose memory
# formats are not what that test wants): cudnn_cache must give the memory formats native gives.
def test_conv_cudnn_memory_layout_dominance():
    x = small_integers(2, 8, 4, 4, low=1, high=10, seed=1)
    weight, bias = randn(4, 8, 3, 3, seed=2), randn(4, seed=3)

    def run(x, weight, bias):
        return {(x_format, w_format): with_grads(F.conv2d, in_format(x, x_format), in_format(weight, w_format), bias)
                for x_format in (torch.contiguous_format, torch.channels_last)
                for w_format in (torch.contiguous_format, torch.channels_last)}

    run_both(run, x, weight, bias)


# Port of TestConvolutionNN.test_cudnn_noncontiguous_weight.
def test_cudnn_noncontiguous_weight():
    x = torch.tensor([1, 1, 1], dtype=torch.float64, device=DEVICE).view(1, 1, 3)
    expanded = torch.tensor([1], dtype=torch.float64, device=DEVICE).expand(1, 1, 2)
    assert not expanded.is_contiguous()

    def run(x, weight):
        conv = lambda x, w: F.conv1d(x, w, bias=None, stride=2, dilation=2)  # noqa: E731
        return with_grads(conv, x, weight), with_grads(conv, x, weight.contiguous())

    _, ((output, _), (contiguous_output, _)) = run_both(run, x, expanded)
    assert_same(output, contiguous_output, TOLERANCE, "expanded against contiguous weight")


# ==================================================================================================================
# Gradients through torch.nn.grad (aten.convolution_backward with one output)
# ==================================================================================================================

# (kernel, input size, batch, stride, padding, dilation, bias): a subset of run_grad_conv_test's product and of
# test_functional_grad_conv's dilated cases.
GRAD_CASES = [(3, 6, 1, 1, 0, 1, True), (3, 7, 2, 2, 1, 1, False), (4, 9, 1, 2, 2, 1, True), (3, 6, 2, 1, 1, 2, False)]


# Port of TestConvolutionNN.test_grad_conv{1,2,3}d_{input,weight} (run_grad_conv_test) and test_functional_grad_conv,
# on the GPU: torch.nn.grad's helpers equal autograd's gradients.
@pytest.mark.parametrize("gradient", ["input", "weight"])
@pytest.mark.parametrize("dims", [1, 2, 3], ids=["1d", "2d", "3d"])
def test_grad_conv_helpers_match_autograd(dims, gradient):
    conv, helper = getattr(F, f"conv{dims}d"), getattr(torch.nn.grad, f"conv{dims}d_{gradient}")
    cases = []
    for index, (kernel, size, batch, stride, padding, dilation, has_bias) in enumerate(GRAD_CASES):
        x = randn(batch, 2, *[size] * dims, seed=3 * index)
        weight = randn(3, 2, *[kernel] * dims, seed=3 * index + 1)
        bias = randn(3, seed=3 * index + 2) if has_bias else None
        cases.append((x, weight, bias, dict(stride=stride, padding=padding, dilation=dilation)))

    def run(cases):
        results = []
        for index, (x, weight, bias, kwargs) in enumerate(cases):
            x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
            output = conv(x, weight, bias, **kwargs)
            grad_output = random_like(output, 100 + index)
            (autograd,) = torch.autograd.grad(output, x if gradient == "input" else weight, grad_output)
            if gradient == "input":
                functional = helper(x.shape, weight, grad_output, **kwargs)
            else:
                functional = helper(x, weight.shape, grad_output, **kwargs)
            results.append((autograd, functional))
        return results

    _, ours = run_both(run, cases)
    for index, (autograd, functional) in enumerate(ours):
        assert_same(functional, autograd, TOLERANCE, f"case {index}: torch.nn.grad against autograd")


# Port of TestConvolutionNN.test_functional_grad_conv2d (a subset of its strides, kernels and dilations).
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_functional_grad_conv2d(groups):
    configurations = [(1, 1, 1), (2, 3, 1), (1, 5, 2), (2, 3, 2)]  # stride, kernel, dilation
    cases = []
    for index, (stride, kernel, dilation) in enumerate(configurations):
        x = torch.empty(4, 8, 32, 32, device=DEVICE).uniform_(-8.0, 8.0, generator=generator(2 * index))
        weight = torch.empty(16, 8 // groups, kernel, kernel, device=DEVICE)
        weight.uniform_(-4.0, 4.0, generator=generator(2 * index + 1))
        cases.append((x, weight, dict(stride=stride, padding=kernel // 2, dilation=dilation, groups=groups)))

    def run(cases):
        results = []
        for index, (x, weight, kwargs) in enumerate(cases):
            x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
            output = F.conv2d(x, weight, **kwargs)
            grad_output = random_like(output, 100 + index)
            autograd = torch.autograd.grad(output, (x, weight), grad_output)
            functional = (torch.nn.grad.conv2d_input(x.shape, weight, grad_output, **kwargs),
                          torch.nn.grad.conv2d_weight(x, weight.shape, grad_output, **kwargs))
            results.append((autograd, functional))
        return results

    _, ours = run_both(run, cases)
    for index, (autograd, functional) in enumerate(ours):
        assert_same(functional, autograd, TOLERANCE, f"case {index}: torch.nn.grad against autograd")


# ==================================================================================================================
# Invalid arguments and shapes
# ==================================================================================================================

ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]


# name: (dims, input size, weight size, keyword arguments): the invalid calls of PyTorch's test_invalid_conv1d,
# test_invalid_conv2d and test_invalid_conv3d.
INVALID_CASES = {
    "conv1d_kernel_larger_than_input": (1, (1, 3, 4), (33, 3, 10), {}),
    "conv1d_negative_stride": (1, (1, 3, 4), (6, 3, 3), dict(stride=-1)),
    "conv2d_dilated_kernel_larger_than_input": (2, (1, 1, 4, 4), (1, 1, 3, 3), dict(dilation=2, stride=2)),
    "conv2d_kernel_larger_than_input": (2, (1, 3, 1, 1), (33, 3, 10, 10), {}),
    "conv2d_negative_stride": (2, (1, 3, 4, 4), (6, 3, 4, 4), dict(stride=-1)),
    "conv2d_zero_stride": (2, (1, 3, 4, 4), (6, 3, 4, 4), dict(stride=0)),
    "conv3d_dilated_kernel_larger_than_input": (3, (1, 1, 4, 4, 4), (1, 1, 3, 3, 3), dict(dilation=2, stride=2)),
    "conv3d_negative_stride": (3, (1, 1, 4, 4, 4), (1, 1, 3, 3, 3), dict(stride=-2)),
}


# Port of TestConvolutionNN.test_invalid_conv1d, test_invalid_conv2d and test_invalid_conv3d, on the GPU.
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", list(INVALID_CASES))
def test_invalid_convolutions_raise(case, dtype):
    dims, x_size, w_size, kwargs = INVALID_CASES[case]
    conv = getattr(F, f"conv{dims}d")
    x, weight = randn(*x_size, dtype=dtype, seed=1), randn(*w_size, dtype=dtype, seed=2)
    run_both(lambda *t: conv(*t, **kwargs), x, weight, raises=RuntimeError)


# name: (dims, kernel, kwargs, input size without batch, raises): PyTorch's test_conv_shapecheck.
SHAPE_CASES = {
    "conv1d_k3_input2": (1, 3, {}, (1, 2), True),
    "conv1d_k3_s2_input2": (1, 3, dict(stride=2), (1, 2), True),
    "conv1d_k2_input2": (1, 2, {}, (1, 2), False),
    "conv1d_k2_s2_input2": (1, 2, dict(stride=2), (1, 2), False),
    "conv1d_k3_s2_p1_input2": (1, 3, dict(stride=2, padding=1), (1, 2), False),
    "conv2d_k3_input2": (2, 3, {}, (1, 2, 2), True),
    "conv2d_k3_input3": (2, 3, {}, (1, 3, 3), False),
    "conv2d_k3_p1_input2": (2, 3, dict(padding=1), (1, 2, 2), False),
    "conv3d_k3_input2": (3, 3, {}, (1, 2, 2, 2), True),
    "conv3d_k3_input3": (3, 3, {}, (1, 3, 3, 3), False),
    "conv3d_k3_p1_input2": (3, 3, dict(padding=1), (1, 2, 2, 2), False),
}


# Port of TestConvolutionNN.test_conv_shapecheck, on the GPU.
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_conv_shapecheck(case, dtype):
    dims, kernel, kwargs, size, raises = SHAPE_CASES[case]
    x = randn(3, *size, dtype=dtype, seed=1)
    weight, bias = randn(1, 1, *[kernel] * dims, dtype=dtype, seed=2), randn(1, dtype=dtype, seed=3)
    conv = getattr(F, f"conv{dims}d")
    run_both(lambda *t: conv(*t, **kwargs), x, weight, bias, raises=RuntimeError if raises else None)


# Port of TestConvolutionNN.test_conv_modules_raise_error_on_incorrect_input_size, on the GPU.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.float32], ids=dtype_id)
def test_conv_modules_raise_error_on_incorrect_input_size(dtype):
    for dims, transposed in itertools.product((1, 2, 3), (False, True)):
        conv = getattr(F, f"conv_transpose{dims}d" if transposed else f"conv{dims}d")
        weight = randn(*((3, 8) if transposed else (8, 3)), *[3] * dims, dtype=dtype, seed=2)
        for wrong_dims in (dims, dims + 3):
            x = randn(*[3] * wrong_dims, dtype=dtype, seed=1)
            run_both(conv, x, weight, raises=RuntimeError)


# ==================================================================================================================
# Transposed convolutions with an output size
# ==================================================================================================================

# Port of TestConvolutionNN.test_ConvTranspose2d_output_size, on the GPU.
def test_conv_transpose2d_output_size():
    module = nn.ConvTranspose2d(3, 4, 3, 3, 0, 2).to(DEVICE)
    x = randn(2, 3, 6, 6, seed=1)
    for height, width in itertools.product(range(15, 22), range(15, 22)):
        run = module_call(module, output_size=(height, width))
        if 18 <= height <= 20 and 18 <= width <= 20:
            _, (output, _) = run_both(with_grads, run, x, *module.parameters())
            assert output.shape[2:] == (height, width)
        else:
            run_both(run, x, *module.parameters(), raises=ValueError)


# (height, width, kernel, dilation, stride, padding): a subset of test_ConvTranspose2d_output_size_downsample_upsample.
DOWN_UP_CASES = [(13, 16, k, d, s, p) for k, d, s, p in itertools.product((2, 4), (1, 3), (1, 3), (0, 2))]


# Port of TestConvolutionNN.test_ConvTranspose2d_output_size_downsample_upsample and
# test_ConvTranspose3d_correct_output_size, on the GPU.
def test_conv_transpose_output_size_downsample_upsample():
    cases = []
    for height, width, kernel, dilation, stride, padding in DOWN_UP_CASES:
        kwargs = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation)
        down, up = nn.Conv2d(3, 2, **kwargs).to(DEVICE), nn.ConvTranspose2d(2, 3, **kwargs).to(DEVICE)
        cases.append((down, up, randn(2, 3, height, width, seed=len(cases))))

    up_3d, x_3d = nn.ConvTranspose3d(2, 2, 2).to(DEVICE), randn(1, 2, 1, 1, 1, seed=len(cases))

    def run(cases):
        outputs = [up(down(x), output_size=x.shape) for down, up, x in cases]
        return outputs, up_3d(x_3d, output_size=(1, 2, 2, 2, 2)).shape

    _, (outputs, shape_3d) = run_both(run, cases)
    for output, (_, _, x) in zip(outputs, cases):
        assert output.shape[2:] == x.shape[2:]
    assert shape_3d == (1, 2, 2, 2, 2)


# Port of TestConvolutionNNDeviceType.test_conv_transpose_with_output_size_and_no_batch_dim.
@pytest.mark.parametrize("dims", [2, 3], ids=["ConvTranspose2d", "ConvTranspose3d"])
def test_conv_transpose_with_output_size_and_no_batch_dim(dims):
    x = randn(*((1, 15, 13) if dims == 2 else (1, 15, 13, 13)), seed=1)
    output_size = (1, 240, 200) if dims == 2 else (1, 240, 200, 200)
    module = getattr(nn, f"ConvTranspose{dims}d")(1, 1, kernel_size=16, stride=16, padding=7, bias=False,
                                                  device=DEVICE)
    _, (output, _) = run_both(with_grads, module_call(module, output_size=output_size), x, *module.parameters())
    assert output.shape == output_size


# ==================================================================================================================
# Determinism
# ==================================================================================================================

# Port of TestConvolutionNNDeviceType.test_Conv2d_deterministic_cudnn: with cudnn.deterministic, two runs are
# bitwise equal.
@pytest.mark.parametrize("dilation", [1, 2, 3])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_conv2d_deterministic_cudnn(dtype, dilation):
    x = randn(2, 3, 7, 7, dtype=dtype, seed=1)
    weight, bias = randn(3, 3, 3, 3, dtype=dtype, seed=2), randn(3, dtype=dtype, seed=3)

    def run(x, weight, bias):
        with cudnn_flags(enabled=True, benchmark=True, deterministic=True):
            conv = lambda *t: F.conv2d(*t, dilation=dilation)  # noqa: E731
            return with_grads(conv, x, weight, bias), with_grads(conv, x, weight, bias)

    _, ((first, first_grads), (second, second_grads)) = run_both(run, x, weight, bias)
    assert torch.equal(first, second)
    assert all(torch.equal(a, b) for a, b in zip(first_grads, second_grads))


# Port of test_Conv2d_deterministic_cudnn at a size where cuDNN's fastest backward algorithms accumulate with atomics:
# cudnn.deterministic alone (not torch.use_deterministic_algorithms) must make cudnn_cache's runs bitwise repeatable.
def test_deterministic_cudnn_weight_gradients_are_bitwise_repeatable():
    x, weight = randn(32, 32, 32, 32, seed=1), randn(64, 32, 3, 3, seed=2)

    def run(x, weight):
        with cudnn_flags(deterministic=True):
            conv = lambda *t: F.conv2d(*t, padding=1)  # noqa: E731
            return [with_grads(conv, x, weight) for _ in range(3)]

    _, ours = run_both(run, x, weight)
    (output, grads), repeats = ours[0], ours[1:]
    for repeat_output, repeat_grads in repeats:
        assert torch.equal(repeat_output, output)
        assert torch.equal(repeat_grads[0], grads[0]) and torch.equal(repeat_grads[1], grads[1])


# ==================================================================================================================
# Depthwise convolutions
# ==================================================================================================================

# Port of TestConvolutionNNDeviceType.test_Conv2d_depthwise_naive_groups and test_Conv3d_depthwise_naive_groups:
# a depthwise convolution is its channels convolved one by one (PyTorch runs the depthwise one with its own kernels,
# the others with cuDNN).
@pytest.mark.parametrize("depth_multiplier", [1, 2])
@pytest.mark.parametrize("dtype, tf32", [(torch.float32, False), (torch.float32, True), (torch.float64, False),
                                         (torch.float16, False)],
                         ids=["float32", "float32_tf32", "float64", "float16"])
@pytest.mark.parametrize("dims", [2, 3], ids=["Conv2d", "Conv3d"])
def test_depthwise_naive_groups(dims, dtype, tf32, depth_multiplier):
    torch.backends.cudnn.allow_tf32 = tf32
    out_channels = 2 * depth_multiplier
    x = randn(2, 2, *[6] * dims, dtype=dtype, seed=1) / 2
    weight = randn(out_channels, 1, *[3] * dims, dtype=dtype, seed=2)
    bias = randn(out_channels, dtype=dtype, seed=3)
    grad_output = randn(2, out_channels, *[4] * dims, dtype=dtype, seed=4) / 2
    conv = getattr(F, f"conv{dims}d")

    def run(x, weight, bias, grad_output):
        with cudnn_flags(enabled=True, deterministic=True, benchmark=False):
            grouped = with_grads(lambda *t: conv(*t, groups=2), x, weight, bias, grad_output=grad_output)
            d = depth_multiplier
            channels = [with_grads(conv, x[:, i:i + 1].contiguous(), weight[d * i:d * (i + 1)],
                                   bias[d * i:d * (i + 1)], grad_output=grad_output[:, d * i:d * (i + 1)].contiguous())
                        for i in range(2)]
            return grouped, channels

    _, ((output, grads), channels) = run_both(run, x, weight, bias, grad_output, tolerance=tolerance_for(tf32))
    precision = 1e-2 if tf32 else PYTORCH_PRECISION[dtype]
    torch.testing.assert_close(output, torch.cat([c[0] for c in channels], 1), rtol=0, atol=precision)
    for index, along in ((0, 1), (1, 0), (2, 0)):  # input (by channel), weight and bias (by output channel)
        torch.testing.assert_close(grads[index], torch.cat([c[1][index] for c in channels], along), rtol=0,
                                   atol=precision)


# Port of TestConvolutionNNDeviceType.test_Conv2d_backward_depthwise.
@pytest.mark.parametrize("cudnn_enabled", [False, True], ids=["cudnn_disabled", "cudnn_enabled"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=dtype_id)
def test_conv2d_backward_depthwise(dtype, cudnn_enabled):
    x = randn(2, 2, 4, 20, dtype=dtype, seed=1)
    weight = randn(2, 1, 3, 5, dtype=dtype, seed=2)

    def run(x, weight):
        with cudnn_flags(enabled=cudnn_enabled):
            conv = lambda x, w: F.conv2d(x, w, bias=None, stride=(1, 10), groups=2)  # noqa: E731
            leaves = [t.detach().requires_grad_() for t in (x, weight)]
            return with_grads(conv, x, weight), torch.autograd.gradcheck(conv, leaves, fast_mode=True)

    run_both(run, x, weight)


# name: (input, weight, bias, keyword arguments), the CPU regression tests of three depthwise convolutions with odd
# layouts, on the GPU (PyTorch's input sizes, but test_permute_conv2d_issue_120211's image is 256x256, not 1024x1024,
# and four of its 128 radii are run).
def depthwise_issue_cases():
    image = randn(1, 256, 256, 3, seed=1).permute(0, 3, 1, 2)
    cases = {f"issue_120211_radius{r}": (image, randn(3, 1, 1, 2 * r + 1, seed=2), None, dict(groups=3))
             for r in (0, 1, 7, 40)}
    cases["issue_120406"] = (randn(2, 3, 8, 9, 26, seed=3), randn(3, 1, 1, 1, 17, seed=4), None, dict(groups=3))
    cases["issue_120547"] = (randn(1, 1, 16, seed=5).transpose(1, 2), randn(16, 1, 32, seed=6), randn(16, seed=7),
                             dict(stride=1, padding=16, dilation=1, groups=16))
    return cases


# Port of TestConvolutionNN.test_permute_conv2d_issue_120211, test_conv3d_issue_120406 and
# test_conv1d_issue_120547, on the GPU.
@pytest.mark.parametrize("case", ["issue_120211_radius0", "issue_120211_radius1", "issue_120211_radius7",
                                  "issue_120211_radius40", "issue_120406", "issue_120547"])
def test_depthwise_odd_layouts(case):
    x, weight, bias, kwargs = depthwise_issue_cases()[case]
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    tensors = (x, weight) if bias is None else (x, weight, bias)
    run_both(with_grads, lambda *t: conv(*t, **kwargs), *tensors)


# ==================================================================================================================
# Double backward
# ==================================================================================================================

# name: (kernel, stride, padding, in channels, out channels, batch, input size, dilation, groups, deterministic):
# PyTorch's test_conv_double_backward (deterministic cuDNN), test_conv_double_backward_no_bias,
# test_conv_double_backward_groups and test_conv_double_backward_stride (CPU tests in PyTorch).
DOUBLE_BACKWARD_CASES = {
    "kernel3_dilation1": (3, 1, 2, 2, 3, 1, 5, 1, 1, True),
    "kernel3_dilation2": (3, 1, 2, 2, 3, 1, 5, 2, 1, True),
    "kernel4": (4, 1, 2, 2, 3, 1, 9, 1, 1, True),
    "no_bias": (3, 2, 1, 2, 4, 2, 5, 1, 1, False),
    "groups": (3, 1, 2, 4, 8, 2, 6, 1, 2, False),
    **{f"stride_input{size}_padding{padding}_dilation{dilation}": (3, 2, padding, 1, 2, 2, size, dilation, 1, False)
       for size, dilation in ((5, 1), (5, 2), (7, 1)) for padding in (0, 1)},
}


# Port of TestConvolutionNNDeviceType.test_conv_double_backward, test_conv_double_backward_no_bias,
# test_conv_double_backward_groups and test_conv_double_backward_stride (run_conv_double_back_test), on the GPU in
# float64. PyTorch runs the forward with cuDNN disabled for gradgradcheck's finite differences; here it runs with
# cuDNN (the calls to compare), and the second-order gradients are compared as well as checked.
@pytest.mark.parametrize("case", list(DOUBLE_BACKWARD_CASES))
def test_conv_double_backward(case):
    kernel, stride, padding, in_channels, out_channels, batch, size, dilation, groups, deterministic = \
        DOUBLE_BACKWARD_CASES[case]
    dtype = torch.float64
    x = randn(batch, in_channels, size, size, dtype=dtype, seed=1)
    weight = randn(out_channels, in_channels // groups, kernel, kernel, dtype=dtype, seed=2)
    bias = randn(out_channels, dtype=dtype, seed=3)

    def conv(x, weight, bias):
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    def run(x, weight, bias):
        with cudnn_flags(enabled=True, deterministic=deterministic):
            leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
            output = conv(*leaves)
            grad_output = random_like(output, 4).requires_grad_()
            grads = torch.autograd.grad(output, leaves, grad_output, create_graph=True)
            directions = [random_like(g, 10 + i) for i, g in enumerate(grads)]
            second = torch.autograd.grad(grads, [*leaves[:2], grad_output], directions, allow_unused=True)
            checked = torch.autograd.gradgradcheck(conv, leaves, (grad_output.detach().requires_grad_(),),
                                                   nondet_tol=GRADCHECK_NONDET_TOL, fast_mode=True)
            return output.detach(), [g.detach() for g in grads], second, checked

    _, (output, grads, second, checked) = run_both(run, x, weight, bias)
    assert checked


# Port of TestConvolutionNNDeviceType.test_conv_double_backward_strided_with_3D_input_and_weight, on the GPU.
def test_conv_double_backward_strided_with_3d_input_and_weight():
    x, weight, bias = randn(2, 3, 6, seed=1), randn(3, 3, 3, seed=2), randn(3, seed=3)
    arguments = ((2,), (1,), (1,), False, (0,), 1)

    def run(x, weight, bias):
        output = torch.ops.aten.convolution(x, weight, bias, *arguments)
        grad_grad_input, grad_grad_weight = random_like(x, 4), random_like(weight, 5)
        grad_grad_bias, grad_output = random_like(bias, 6), random_like(output, 7)
        return output, torch.ops.aten._convolution_double_backward(
            grad_grad_input, grad_grad_weight, grad_grad_bias, grad_output, weight, x, *arguments, [True, True, True])

    _, (output, (grad_grad_output, grad_input, grad_weight)) = run_both(run, x, weight, bias)
    assert grad_grad_output.shape == output.shape
    assert grad_input.shape == x.shape and grad_weight.shape == weight.shape


# ==================================================================================================================
# padding='same' and 'valid'
# ==================================================================================================================

# dims: [(input size, weight size, dilation, explicit padding, what to cut off the explicit result)], PyTorch's
# test_conv{1,2,3}d_same_padding and _same_padding_backward.
SAME_CASES = {
    1: [((1, 1, 12), (1, 1, 3), 1, 1, ()), ((1, 1, 12), (1, 1, 4), 2, 3, ()),
        ((1, 1, 12), (1, 1, 4), 3, 5, (1,)), ((1, 1, 12), (1, 1, 4), 1, 2, (1,))],
    2: [((1, 1, 10, 11), (1, 1, 4, 5), 1, (2, 2), (1, 0)), ((1, 1, 10, 11), (1, 1, 3, 4), 2, (2, 3), ()),
        ((1, 1, 10, 11), (1, 1, 4, 4), 3, 5, (1, 1)), ((1, 1, 10, 11), (1, 1, 4, 5), 2, (3, 4), ()),
        ((1, 1, 10, 11), (1, 1, 4, 4), 1, 2, (1, 1))],
    3: [((1, 1, 10, 11, 12), (1, 1, 1, 2, 5), 1, (0, 1, 2), (0, 1, 0)),
        ((1, 1, 10, 11, 12), (1, 1, 1, 2, 5), 2, (0, 1, 4), ()),
        ((1, 1, 10, 11, 12), (1, 1, 4, 4, 4), 3, 5, (1, 1, 1))],
}


# Port of TestConvolutionNNDeviceType.test_conv{1,2,3}d_same_padding and test_conv{1,2,3}d_same_padding_backward.
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=dtype_id)
@pytest.mark.parametrize("dims", [1, 2, 3], ids=["1d", "2d", "3d"])
def test_same_padding(dims, dtype):
    conv = getattr(F, f"conv{dims}d")
    cases = [(randn(*x_size, dtype=dtype, seed=2 * i), randn(*w_size, dtype=dtype, seed=2 * i + 1), dilation, padding,
              cut) for i, (x_size, w_size, dilation, padding, cut) in enumerate(SAME_CASES[dims])]

    def run(cases):
        results = []
        for x, weight, dilation, padding, cut in cases:
            def explicit(x, weight):  # contiguous, as the result of padding='same' is
                output = conv(x, weight, padding=padding, dilation=dilation)
                return output[(..., *[slice(c, None) for c in cut])].contiguous()

            same = with_grads(lambda x, w: conv(x, w, padding="same", dilation=dilation), x, weight)
            results.append((same, with_grads(explicit, x, weight)))
        if dims == 1:  # the output size of padding='same' over a range of inputs, kernels and dilations
            results.append([conv(randn(1, 1, size, dtype=dtype), randn(1, 1, kernel, dtype=dtype), padding="same",
                                 dilation=dilation).shape[2]
                            for size, kernel, dilation in itertools.product((50, 53), (1, 2, 8), (1, 3))])
        return results

    _, ours = run_both(run, cases)
    if dims == 1:
        assert ours.pop() == [size for size in (50, 53) for _ in range(6)]
    for index, (same, explicit) in enumerate(ours):
        assert_same(same, explicit, TOLERANCE, f"case {index}: padding='same' against explicit padding")


# Port of TestConvolutionNNDeviceType.test_conv{1,2,3}d_valid_padding and test_conv{1,2,3}d_valid_padding_backward.
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=dtype_id)
@pytest.mark.parametrize("dims", [1, 2, 3], ids=["1d", "2d", "3d"])
def test_valid_padding(dims, dtype):
    conv = getattr(F, f"conv{dims}d")
    x = randn(1, 1, *[1] * (dims - 1), 10, dtype=dtype, seed=1)
    weight = randn(1, 1, *[1] * (dims - 1), 4, dtype=dtype, seed=2)

    def run(x, weight):
        return (with_grads(lambda x, w: conv(x, w, padding="valid"), x, weight),
                with_grads(lambda x, w: conv(x, w, padding=0), x, weight))

    _, (valid, unpadded) = run_both(run, x, weight)
    assert_same(valid, unpadded, TOLERANCE, "padding='valid' against no padding")


# ==================================================================================================================
# Empty inputs
# ==================================================================================================================

# name: (module, input size, an input with a channel where the module expects none): PyTorch's
# test_conv_empty_channel, test_group_conv_empty, test_group_convTranspose_empty and test_convTranspose_empty.
EMPTY_CASES = {
    "conv1d_empty_channel": (lambda dtype: nn.Conv1d(0, 8, 2, stride=2, dtype=dtype), (2, 0, 15), (2, 1, 0)),
    "conv2d_empty_channel": (lambda dtype: nn.Conv2d(0, 33, 3, stride=2, dtype=dtype), (2, 0, 50, 100),
                             (2, 1, 40, 0)),
    "conv3d_empty_channel": (lambda dtype: nn.Conv3d(0, 33, 3, stride=2, dtype=dtype), (2, 0, 50, 20, 40),
                             (2, 1, 50, 0, 40)),
    "group_conv_empty": (lambda dtype: nn.Conv2d(4, 4, stride=2, kernel_size=3, padding=1, groups=4, dtype=dtype),
                         (0, 4, 4, 4), None),
    "group_convTranspose_empty": (lambda dtype: nn.ConvTranspose2d(4, 4, stride=2, kernel_size=3, padding=1, groups=4,
                                                                   dtype=dtype), (0, 4, 4, 4), None),
    "convTranspose_empty": (lambda dtype: nn.ConvTranspose2d(4, 4, stride=2, kernel_size=3, padding=1, dtype=dtype),
                            (0, 4, 4, 4), None),
}


# Port of TestConvolutionNNDeviceType.test_conv_empty_channel, test_group_conv_empty, test_group_convTranspose_empty and
# test_convTranspose_empty (_test_module_empty_input): empty inputs run, and every gradient is zero.
@pytest.mark.parametrize("cudnn_enabled", [True, False], ids=["cudnn_enabled", "cudnn_disabled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=dtype_id)
@pytest.mark.parametrize("case", list(EMPTY_CASES))
def test_empty_input(case, dtype, cudnn_enabled):
    make_module, size, wrong_size = EMPTY_CASES[case]
    module = make_module(dtype).to(DEVICE)
    x = randn(*size, dtype=dtype, seed=1)

    def run(x, *parameters):
        with cudnn_flags(enabled=cudnn_enabled):
            return with_grads(module_call(module), x, *parameters)

    _, (_, grads) = run_both(run, x, *module.parameters())
    for grad in grads:
        assert torch.equal(grad, torch.zeros_like(grad))
    if wrong_size is not None:
        wrong = randn(*wrong_size, dtype=dtype, seed=2)
        native, _ = run_both(run, wrong, *module.parameters(), raises=RuntimeError)
        assert "Given groups=1, weight" in str(native)


# ==================================================================================================================
# Non-contiguous tensors and odd strides
# ==================================================================================================================

# Port of TestConvolutionNNDeviceType.test_noncontig_conv_grad.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=dtype_id)
def test_noncontig_conv_grad(dtype):
    x = randn(2, 3, 10, 10, dtype=dtype, seed=1)
    weight, bias = randn(5, 3, 3, 3, dtype=dtype, seed=2), randn(5, dtype=dtype, seed=3)
    grad = randn(2, 2, 5, 10, 10, dtype=dtype, seed=4)[:, 1]
    assert not grad.is_contiguous()

    def run(x, weight, bias, grad):
        conv = lambda *t: F.conv2d(*t, padding=1)  # noqa: E731
        return (with_grads(conv, x, weight, bias, grad_output=grad),
                with_grads(conv, x, weight, bias, grad_output=grad.contiguous()))

    _, (noncontiguous, contiguous) = run_both(run, x, weight, bias, grad)
    torch.testing.assert_close(noncontiguous[1][0], contiguous[1][0], rtol=0, atol=PYTORCH_PRECISION[dtype])


# Port of TestConvolutionNNDeviceType.test_conv_noncontig_weights: expanded (stride-0) weights.
@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_transpose"])
@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "grouped"])
@pytest.mark.parametrize("dims", [1, 2, 3], ids=["1d", "2d", "3d"])
def test_conv_noncontig_weights(dims, grouped, transposed):
    channels, groups = 3, 3 if grouped else 1
    weight = randn(*[3] * dims, seed=2).expand(channels, channels // groups, *[3] * dims)
    x = randn(1, channels, *[5] * dims, seed=1)
    conv = getattr(F, f"conv_transpose{dims}d" if transposed else f"conv{dims}d")
    run_both(with_grads, lambda x, w: conv(x, w, groups=groups), x, weight)


# Port of TestConvolutionNNDeviceType.test_conv_noncontig_weights_and_bias.
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
def test_conv_noncontig_weights_and_bias(has_bias):
    x = randn(1, 3, 224, 224, 2, seed=1)[..., 1]
    weight = randn(64, 3, 7, 7, 2, seed=2)[..., 1]
    bias = randn(64, 2, seed=3)[:, 1] if has_bias else None
    tensors = (x, weight, bias) if has_bias else (x, weight)

    def run(*tensors):
        conv = lambda *t: F.conv2d(*t, stride=2, padding=3)  # noqa: E731
        return with_grads(conv, *tensors), with_grads(conv, *[t.contiguous() for t in tensors])

    _, (noncontiguous, contiguous) = run_both(run, *tensors)
    assert_same(noncontiguous[0], contiguous[0], TOLERANCE, "non-contiguous against contiguous output")


# Port of TestConvolutionNNDeviceType.test_contig_wrong_stride_cudnn: a batch of one with an odd batch stride.
def test_contig_wrong_stride_cudnn():
    x = randn(1, 16, 5, 5, seed=1)
    stride = list(x.stride())
    stride[0] = 20
    x.set_(x.untyped_storage(), 0, x.size(), stride)
    assert x.is_contiguous()
    weight_transposed, weight = randn(16, 1, 1, 1, seed=2), randn(1, 16, 1, 1, seed=3)

    def run(x, weight_transposed, weight):
        return with_grads(F.conv_transpose2d, x, weight_transposed), with_grads(F.conv2d, x, weight)

    run_both(run, x, weight_transposed, weight)


# ==================================================================================================================
# 1x1 kernels
# ==================================================================================================================

# Port of TestConvolutionNNDeviceType.test_Conv2d_size_1_kernel, test_ConvTranspose2d_size_1_kernel and
# test_ConvTranspose3d_size_1_kernel (PyTorch compares cuDNN disabled against the CPU; here both flags run).
@pytest.mark.parametrize("cudnn_enabled", [True, False], ids=["cudnn_enabled", "cudnn_disabled"])
@pytest.mark.parametrize("layer, dtype, tf32", [("Conv2d", torch.float32, False), ("Conv2d", torch.float32, True),
                                                ("ConvTranspose2d", torch.float32, False),
                                                ("ConvTranspose2d", torch.float32, True),
                                                ("ConvTranspose3d", torch.float64, False)],
                         ids=["Conv2d", "Conv2d_tf32", "ConvTranspose2d", "ConvTranspose2d_tf32", "ConvTranspose3d"])
def test_size_1_kernel(layer, dtype, tf32, cudnn_enabled):
    torch.backends.cudnn.allow_tf32 = tf32
    module = getattr(nn, layer)(3, 3, kernel_size=1).to(DEVICE, dtype)
    x = randn(2, 3, *((3, 5, 5) if layer.endswith("3d") else (5, 5)), dtype=dtype, seed=1)

    def run(x, *parameters):
        with cudnn_flags(enabled=cudnn_enabled):
            return with_grads(module_call(module), x, *parameters)

    run_both(run, x, *module.parameters(), tolerance=tolerance_for(tf32))


# ==================================================================================================================
# Memory formats
# ==================================================================================================================

# name: (transposed, batch, channels, height, width, out channels, kernel, dilation, groups): the shapes of PyTorch's
# test_conv_thnn_nhwc.
NHWC_CASES = {
    "conv": (False, 2, 8, 4, 4, 4, 3, 1, 1),
    "conv_depthwise": (False, 2, 8, 4, 4, 8, 3, 1, 8),
    "conv_one_input_channel": (False, 2, 1, 10, 10, 8, 3, 1, 1),
    "conv_1x1": (False, 1, 16, 56, 56, 16, 1, 1, 1),
    "conv_1x1_depthwise": (False, 1, 16, 56, 56, 16, 1, 1, 16),
    "conv_dilated": (False, 2, 8, 11, 13, 16, 3, 2, 1),
    "conv_dilated_grouped": (False, 2, 16, 11, 13, 32, 3, 2, 16),
    "conv_transpose": (True, 2, 8, 4, 4, 4, 3, 1, 1),
    "conv_transpose_grouped": (True, 2, 8, 4, 4, 8, 3, 1, 8),
    "conv_transpose_1x1": (True, 1, 16, 56, 56, 16, 1, 1, 1),
    "conv_transpose_1x1_grouped": (True, 1, 16, 56, 56, 32, 1, 1, 16),
}


# Port of TestConvolutionNNDeviceType.test_conv_thnn_nhwc (a CPU test in PyTorch), on the GPU: every mix of
# channels-last and contiguous input and weight.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("case", list(NHWC_CASES))
def test_conv_nhwc_mixed_formats(case, dtype):
    transposed, batch, channels, height, width, out_channels, kernel, dilation, groups = NHWC_CASES[case]
    x = small_integers(batch, channels, height, width, dtype=dtype, seed=1)
    weight_size = (channels, out_channels // groups) if transposed else (out_channels, channels // groups)
    weight = small_integers(*weight_size, kernel, kernel, dtype=dtype, seed=2)
    bias = small_integers(out_channels, dtype=dtype, seed=3)
    conv = F.conv_transpose2d if transposed else F.conv2d
    formats = [(torch.channels_last, torch.channels_last), (torch.channels_last, torch.contiguous_format),
               (torch.contiguous_format, torch.channels_last)]

    def run(x, weight, bias):
        return [with_grads(lambda *t: conv(*t, dilation=dilation, groups=groups), in_format(x, x_format),
                           in_format(weight, w_format), bias)
                for x_format, w_format in formats]

    run_both(run, x, weight, bias)


# Port of TestConvolutionNNDeviceType.test_conv_cudnn_nhwc (integer values, channels-last input and module).
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.complex64], ids=dtype_id)
@pytest.mark.parametrize("batch, channels, size, out_channels, groups",
                         [(2, 8, 4, 4, 1), (2, 8, 4, 8, 8), (1, 16, 56, 16, 1), (1, 16, 56, 16, 16)],
                         ids=["small", "small_depthwise", "large", "large_depthwise"])
def test_conv_cudnn_nhwc(batch, channels, size, out_channels, groups, dtype):
    nhwc = torch.channels_last
    x = small_integers(batch, channels, size, size, dtype=dtype, memory_format=nhwc, seed=1)
    weight = small_integers(out_channels, channels // groups, 3, 3, dtype=dtype, memory_format=nhwc, seed=2)
    bias = small_integers(out_channels, dtype=dtype, seed=3)
    grad_output = small_integers(batch, out_channels, size - 2, size - 2, dtype=dtype, memory_format=nhwc, seed=4)
    run_both(lambda *t: with_grads(lambda *u: F.conv2d(*u, groups=groups), *t, grad_output=grad_output), x,
             weight, bias)


# Port of TestConvolutionNNDeviceType.test_conv_cudnn_ndhwc.
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("batch, channels, size, out_channels, groups",
                         [(2, 8, 4, 4, 1), (2, 8, 4, 8, 8), (1, 16, 18, 16, 1), (1, 16, 18, 16, 16)],
                         ids=["small", "small_depthwise", "large", "large_depthwise"])
def test_conv_cudnn_ndhwc(batch, channels, size, out_channels, groups, dtype):
    ndhwc = torch.channels_last_3d
    x = small_integers(batch, channels, size, size, size, dtype=dtype, memory_format=ndhwc, low=-2, high=2, seed=1)
    weight = small_integers(out_channels, channels // groups, 3, 3, 3, dtype=dtype, memory_format=ndhwc, low=-2,
                            high=2, seed=2)
    bias = small_integers(out_channels, dtype=dtype, low=-2, high=2, seed=3)
    grad_output = small_integers(batch, out_channels, *[size - 2] * 3, dtype=dtype, memory_format=ndhwc, low=-2,
                                 high=2, seed=4)
    run_both(lambda *t: with_grads(lambda *u: F.conv3d(*u, groups=groups), *t, grad_output=grad_output), x,
             weight, bias)


# (batch, channels, height, width, out channels, kernel): PyTorch's test_conv_cudnn_mismatch_memory_format.
MISMATCH_CASES = [(4, 2, 8, 8, 4, 2), (4, 1, 8, 8, 4, 2), (1, 1, 8, 8, 4, 2), (4, 2, 2, 8, 4, 1), (4, 2, 1, 8, 4, 1),
                  (4, 2, 8, 8, 4, 1), (4, 1, 8, 8, 4, 1)]


# Port of TestConvolutionNNDeviceType.test_conv_cudnn_mismatch_memory_format (_test_conv_cudnn_nhwc_nchw): every mix
# of weight, grad_output and input memory format, including shapes whose format is ambiguous; the output's memory
# format must be native's.
@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
@pytest.mark.parametrize("transposed", [False, True], ids=["Conv2d", "ConvTranspose2d"])
@pytest.mark.parametrize("case", MISMATCH_CASES, ids=lambda c: "x".join(map(str, c)))
def test_conv_cudnn_mismatch_memory_format(case, transposed, tf32):
    torch.backends.cudnn.allow_tf32 = tf32
    batch, channels, height, width, out_channels, kernel = case
    x = small_integers(batch, channels, height, width, low=1, high=10, seed=1)
    weight = randn(*((channels, out_channels) if transposed else (out_channels, channels)), kernel, kernel, seed=2)
    bias = randn(out_channels, seed=3)
    conv = F.conv_transpose2d if transposed else F.conv2d
    output_size = conv(x, weight).shape
    grad = small_integers(*output_size, low=1, high=10, seed=4)
    formats = (torch.contiguous_format, torch.channels_last)

    def run(x, weight, bias, grad):
        return {(str(w_format), str(g_format), str(x_format)):
                with_grads(conv, in_format(x, x_format), in_format(weight, w_format), bias,
                           grad_output=in_format(grad, g_format))
                for w_format, g_format, x_format in itertools.product(formats, formats, formats)}

    run_both(run, x, weight, bias, grad, tolerance=tolerance_for(tf32))


# Port of TestConvolutionNNDeviceType.test_conv_cudnn_nhwc_support.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=dtype_id)
def test_conv_cudnn_nhwc_support(dtype):
    x = randn(1, 16, 1, 1, dtype=dtype, seed=1)
    weight = randn(8, 16, 3, 3, dtype=dtype, memory_format=torch.channels_last, seed=2)

    def run(x, weight):
        return with_grads(lambda x, w: torch.conv2d(x, w, None, (2, 1), (1, 1), (1, 1), 1), x, weight)

    _, (output, _) = run_both(run, x, weight)
    assert output.is_contiguous(memory_format=torch.channels_last)


# Port of TestConvolutionNNDeviceType.test_convert_conv2d_weight_memory_format and
# test_convert_conv3d_weight_memory_format.
@pytest.mark.parametrize("dims", [2, 3], ids=["conv2d", "conv3d"])
def test_convert_conv_weight_memory_format(dims):
    x = small_integers(2, 8, *[4] * dims, low=1, high=10, seed=1)
    norm = getattr(nn, f"BatchNorm{dims}d")
    models = [nn.Sequential(getattr(nn, f"ConvTranspose{dims}d")(8, 4, 3), norm(4))]
    if dims == 2:
        models.insert(0, nn.Sequential(nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4)))
    models = [model.to(DEVICE) for model in models]
    channels_last = torch.channels_last if dims == 2 else torch.channels_last_3d
    convert = getattr(nn.utils, f"convert_conv{dims}d_weight_memory_format")

    def run(x):
        outputs = []
        for model in models:
            model = copy.deepcopy(model)
            for memory_format in (channels_last, torch.contiguous_format):
                model = convert(model, memory_format)
                output = model(x)
                outputs.append((output, output.is_contiguous(memory_format=memory_format)))
        return outputs

    _, ours = run_both(run, x)
    assert all(in_format for _, in_format in ours)


# ==================================================================================================================
# Dtypes and sizes
# ==================================================================================================================

# Port of TestConvolutionNNDeviceType.test_Conv2d_large_workspace: sizes whose fastest algorithms want huge
# workspaces, with cudnn.benchmark off and on.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=dtype_id)
def test_conv2d_large_workspace(dtype):
    sizes = [(1, 256, 109, 175), (1, 256, 80, 128), (1, 256, 120, 192)]
    inputs = [randn(*size, dtype=dtype, seed=i) for i, size in enumerate(sizes)]
    weight, bias = randn(256, 256, 3, 3, dtype=dtype, seed=10) / 48, randn(256, dtype=dtype, seed=11)

    def run(inputs, weight, bias):
        results = []
        for benchmark in (False, True):
            with cudnn_flags(enabled=True, benchmark=benchmark):
                for x in inputs:
                    output = F.conv2d(x, weight, bias, padding=1)
                    results.append(with_grads(lambda *t: F.conv2d(*t, padding=1), x, weight, bias,
                                              grad_output=torch.ones_like(output)))
        return results

    run_both(run, inputs, weight, bias)


# Port of TestConvolutionNNDeviceType.test_ConvTranspose2d_large_output_padding.
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
def test_conv_transpose2d_large_output_padding(dtype):
    channels = [128, 64, 32, 3]
    x = torch.rand(1, 128, 6, 6, dtype=dtype, device=DEVICE, generator=generator(1))
    parameters = []
    for i, (c_in, c_out) in enumerate(zip(channels, channels[1:])):
        parameters += [randn(c_in, c_out, 3, 3, dtype=dtype, seed=2 * i + 2) / 24, randn(c_out, dtype=dtype,
                                                                                       seed=2 * i + 3)]

    def chain(x, *parameters):
        for weight, bias in zip(parameters[0::2], parameters[1::2]):
            x = F.conv_transpose2d(x, weight, bias, stride=2, padding=1, output_padding=1)
        return x

    run_both(with_grads, chain, x, *parameters)


# Port of TestConvolutionNN.test_cudnn_convolution_relu and test_cudnn_convolution_add_relu (a subset of their
# loops): torch.cudnn_convolution_relu and _add_relu are cuDNN ops of their own, not aten.convolution, so
# interception leaves them to PyTorch; the plain convolution they are checked against goes through the cache.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_cudnn_convolution_relu_and_add_relu(dtype):
    cases = []
    for index, (batch, channels, image, kernel, memory_format) in enumerate(itertools.product(
            (1, 3), (1, 4), ((1, 1), (8, 8)), ((1, 1), (3, 3)), (torch.channels_last, torch.contiguous_format))):
        if image[0] >= kernel[0]:
            x = torch.rand(batch, channels, *image, dtype=dtype, device=DEVICE, generator=generator(3 * index))
            weight = randn(8, channels, *kernel, dtype=dtype, seed=3 * index + 1)
            cases.append((x, weight, memory_format, index))

    def run(cases):
        results = []
        for x, weight, memory_format, index in cases:
            output = torch.conv2d(x, weight, None, (1, 1), (0, 0), (1, 1), 1)
            # .to(memory_format=...), as PyTorch's test: it also lays out ambiguous shapes (one channel) channels-last
            z = random_like(output, 3 * index + 2).to(memory_format=memory_format)
            x, weight = x.to(memory_format=memory_format), weight.to(memory_format=memory_format)
            before = cache_calls()
            fused = torch.cudnn_convolution_relu(x, weight, None, (1, 1), (0, 0), (1, 1), 1)
            fused_add = torch.cudnn_convolution_add_relu(x, weight, z, 2.0, None, (1, 1), (0, 0), (1, 1), 1)
            results.append((output, fused, fused_add, z, cache_calls() == before))
        return results

    _, ours = run_both(run, cases)
    precision = {torch.float16: 2e-3, torch.float32: 1e-4}[dtype]  # PyTorch's precisionOverride
    for (output, fused, fused_add, z, untouched), (_, _, memory_format, _) in zip(ours, cases):
        assert untouched, "torch.cudnn_convolution_relu / _add_relu looked the cache up"
        assert fused.is_contiguous(memory_format=memory_format) and fused_add.is_contiguous(memory_format=memory_format)
        torch.testing.assert_close(fused, output.relu(), rtol=precision, atol=precision)
        torch.testing.assert_close(fused_add, F.relu(output + 2.0 * z), rtol=precision, atol=precision)


# ==================================================================================================================
# Large tensors (64-bit indexing, split batches): a few GiB each, up to tens of GiB held by the caching allocator,
# so marked gpu_memory: scripts/gpu_check.sh runs them after the shards, one at a time
# ==================================================================================================================

# Port of TestConvolutionNNDeviceType.test_conv_large_nosplit: a batch of one too large for 32-bit indexing.
@pytest.mark.gpu_memory
def test_conv_large_nosplit():
    x = randn(1, 2, 1024, 1024 * 1024, dtype=torch.float16, seed=1)
    weight, bias = randn(2, 2, 8, 8, dtype=torch.float16, seed=2) / 11, randn(2, dtype=torch.float16, seed=3)
    x_wide = randn(1, 1, 2048, 1024, dtype=torch.float16, seed=4)
    weight_wide, bias_wide = randn(1024, 1, 1, 1, dtype=torch.float16, seed=5), randn(1024, dtype=torch.float16, seed=6)

    def run(x, weight, bias, x_wide, weight_wide, bias_wide):
        return F.conv2d(x, weight, bias, stride=8), F.conv2d(x_wide, weight_wide, bias_wide)

    run_both(run, x, weight, bias, x_wide, weight_wide, bias_wide)


# Port of TestConvolutionNNDeviceType.test_conv_transposed_large: PyTorch splits the batch; each quarter alone gives
# the same result.
@pytest.mark.gpu_memory
def test_conv_transposed_large():
    x = randn(4096, 1, 512, 1024, dtype=torch.float16, seed=1)
    weight = randn(1, 1, 1, 1, dtype=torch.float16, seed=2)

    def run(x, weight):
        output = F.conv_transpose2d(x, weight)
        quarters = [(output.narrow(0, start, 1024) - F.conv_transpose2d(x.narrow(0, start, 1024), weight))
                    .abs().max().item() for start in range(0, 4096, 1024)]
        return output, quarters

    native, (output, quarters) = run_both(run, x, weight, compare=False)
    assert_same(output, native[0], TOLERANCE, "output")
    assert max(quarters) <= 2e-3, quarters  # PyTorch's bound: cuDNN may use FFT, which is not exact


# Port of TestConvolutionNNDeviceType.test_conv_large: forward and weight gradient of a batch split into parts.
@pytest.mark.gpu_memory
def test_conv_large():
    x = randn(4097, 2, 512, 512, dtype=torch.float16, seed=1)
    weight = randn(2, 2, 8, 8, dtype=torch.float16, seed=2) / 11
    parts = [(0, 2048), (2048, 4096), (4096, 4097)]

    def run(x, weight):
        weight = weight.detach().requires_grad_()

        def weight_grad(output):  # the max over each sample: sparse gradients, whose sums round little
            return torch.autograd.grad(output.view(output.shape[0], -1).max(dim=1).values.sum(), weight)[0]

        whole = F.conv2d(x, weight, stride=8)
        in_parts = [F.conv2d(x[start:stop], weight, stride=8) for start, stop in parts]
        grad_whole = weight_grad(whole)
        grad_parts = sum(weight_grad(part) for part in in_parts)
        return whole.detach(), [part.detach() for part in in_parts], grad_whole, grad_parts

    _, (whole, in_parts, grad_whole, grad_parts) = run_both(run, x, weight)
    assert_same(torch.cat(in_parts), whole, TOLERANCE, "parts against the whole batch")
    scale = 1 / grad_parts.abs().mean()  # gradients in the hundreds: compare at the order of one, as PyTorch does
    torch.testing.assert_close(grad_whole * scale, grad_parts * scale, atol=5e-2, rtol=5e-3)


# Port of TestConvolutionNNDeviceType.test_conv_large_batch_1 (against native on the GPU, not the CPU).
@pytest.mark.gpu_memory
def test_conv_large_batch_1():
    x = randn(1, 514, 2048, 2048, dtype=torch.float16, seed=1)
    weight, bias = randn(1, 514, 3, 3, dtype=torch.float16, seed=2) / 68, randn(1, dtype=torch.float16, seed=3)
    run_both(lambda *t: F.conv2d(*t, padding=1), x, weight, bias)


# Port of TestConvolutionNNDeviceType.test_conv3d_64bit_indexing (against native on the GPU, not the CPU).
@pytest.mark.gpu_memory
def test_conv3d_64bit_indexing():
    x = torch.rand(1, 32, 512, 512, 256, device=DEVICE, generator=generator(1))
    weight = randn(1, 32, 1, 1, 1, seed=2)
    run_both(F.conv3d, x, weight)


# Port of TestConvolutionNNDeviceType.test_depthwise_conv_64bit_indexing (against native on the GPU, not the CPU):
# a channels-last depthwise convolution of a batch of one, then of a batch PyTorch can split.
@pytest.mark.gpu_memory
@pytest.mark.parametrize("shape", [(1, 2, 32800, 32800), (100, 2, 3280, 3280)], ids=["batch1", "batch100"])
def test_depthwise_conv_64bit_indexing(shape):
    x = randn(*shape, dtype=torch.float16, memory_format=torch.channels_last, seed=1)
    weight = randn(2, 1, 3, 3, dtype=torch.float16, memory_format=torch.channels_last, seed=2) / 3
    bias = randn(2, dtype=torch.float16, seed=3)
    run_both(lambda *t: F.conv2d(*t, stride=1, padding=1, groups=2), x, weight, bias)
