"""The cudnn_cache ops and package without a GPU: descriptor round trips, keys, numerics and gradients of the
CPU kernels against torch, the cached modules and convert(), TorchScript, opcheck, meta tensors, argument
errors, and the cache-file API (with files written by cudnn_cache_tool, since nothing is tuned on a CPU)."""

import json
import subprocess
import sys
from typing import List

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode

import cudnn_cache

ops = torch.ops.cudnn_cache

CL, CL3D = torch.channels_last, torch.channels_last_3d


def randn(*sizes, dtype=torch.float64, memory_format=torch.contiguous_format, seed=0) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sizes, dtype=dtype, generator=generator).contiguous(memory_format=memory_format)


# --- Descriptor round trips -----------------------------------------------------------------------------------
# Expected values by hand: strides in elements; 1-D tensors are carried as (N, C, 1, L) with the size-1
# dimension's stride set to what a packed tensor would have (Note [Canonical keys]).

@pytest.mark.parametrize("tensor, expected", [
    pytest.param(torch.empty(2, 4, 8, 8), ("float", (2, 4, 8, 8), (256, 64, 8, 1)), id="contiguous"),
    pytest.param(torch.empty(2, 4, 8, 8, memory_format=CL), ("float", (2, 4, 8, 8), (256, 1, 32, 4)),
                 id="channels_last"),
    pytest.param(torch.empty(2, 4, 10), ("float", (2, 4, 1, 10), (40, 10, 10, 1)), id="1d_as_nc1l"),
    pytest.param(torch.empty(2, 4, 5, 6, 7), ("float", (2, 4, 5, 6, 7), (840, 210, 42, 7, 1)), id="5d"),
    pytest.param(torch.empty(2, 4, 5, 6, 7, memory_format=CL3D), ("float", (2, 4, 5, 6, 7), (840, 1, 168, 28, 4)),
                 id="channels_last_3d"),
    pytest.param(torch.empty(2, 4, 8, 8, dtype=torch.half), ("half", (2, 4, 8, 8), (256, 64, 8, 1)), id="half"),
    pytest.param(torch.empty(2, 4, 8, 8, dtype=torch.bfloat16), ("bfloat16", (2, 4, 8, 8), (256, 64, 8, 1)),
                 id="bfloat16"),
    pytest.param(torch.empty(2, 4, 8, 8, dtype=torch.double), ("double", (2, 4, 8, 8), (256, 64, 8, 1)),
                 id="double"),
    pytest.param(torch.empty(2, 4, 8, 8)[:, :, ::2], ("float", (2, 4, 4, 8), (256, 64, 16, 1)), id="strided_slice"),
    # One channel: the layout is ambiguous, so it is keyed as NCHW (C's stride becomes H * W).
    pytest.param(torch.empty(2, 1, 8, 8, memory_format=CL), ("float", (2, 1, 8, 8), (64, 64, 8, 1)),
                 id="one_channel_channels_last"),
])
def test_describe_tensor(tensor, expected):
    assert cudnn_cache.describe_tensor(tensor) == expected


@pytest.mark.parametrize("weight, expected", [
    pytest.param(torch.empty(6, 4, 3, 3), ("float", "NCHW", (6, 4, 3, 3)), id="contiguous"),
    pytest.param(torch.empty(6, 4, 3, 3, memory_format=CL), ("float", "NHWC", (6, 4, 3, 3)), id="channels_last"),
    pytest.param(torch.empty(6, 4, 3), ("float", "NCHW", (6, 4, 1, 3)), id="1d_as_nc1l"),
    pytest.param(torch.empty(6, 4, 3, 2, 1), ("float", "NCDHW", (6, 4, 3, 2, 1)), id="5d"),
    pytest.param(torch.empty(6, 4, 3, 2, 2, memory_format=CL3D), ("float", "NDHWC", (6, 4, 3, 2, 2)),
                 id="channels_last_3d"),
    pytest.param(torch.empty(6, 4, 3, 3, dtype=torch.half), ("half", "NCHW", (6, 4, 3, 3)), id="half"),
    pytest.param(torch.empty(6, 4, 3, 3, dtype=torch.bfloat16, memory_format=CL), ("bfloat16", "NHWC", (6, 4, 3, 3)),
                 id="bfloat16_channels_last"),
    pytest.param(torch.empty(6, 4, 3, 3, dtype=torch.double), ("double", "NCHW", (6, 4, 3, 3)), id="double"),
    # cuDNN has no NHWC algorithms for double: float64 stays NCHW, as in PyTorch.
    pytest.param(torch.empty(6, 4, 3, 3, dtype=torch.double, memory_format=CL), ("double", "NCHW", (6, 4, 3, 3)),
                 id="double_channels_last"),
])
def test_describe_filter(weight, expected):
    assert cudnn_cache.describe_filter(weight) == expected


@pytest.mark.parametrize("args, tf32, expected", [
    pytest.param(([1, 2], [0, 1], [1, 1], 1, torch.float32), False,
                 ((0, 1), (1, 2), (1, 1), 1, "cross-correlation", "float", "fma"), id="float32_fma"),
    pytest.param(([1, 2], [0, 1], [1, 1], 1, torch.float32), True,
                 ((0, 1), (1, 2), (1, 1), 1, "cross-correlation", "float", "tensor-op"), id="float32_tf32"),
    # 1-D: padding, stride and dilation (0, p), (1, s), (1, d).
    pytest.param(([2], [1], [3], 2, torch.float32), False,
                 ((0, 1), (1, 2), (1, 3), 2, "cross-correlation", "float", "fma"), id="1d_groups"),
    pytest.param(([1, 2, 3], [0, 1, 2], [1, 1, 2], 4, torch.float64), True,
                 ((0, 1, 2), (1, 2, 3), (1, 1, 2), 4, "cross-correlation", "double", "default"), id="3d_double"),
    # Half and bfloat16 compute in float and always use tensor ops, whatever allow_tf32 says.
    pytest.param(([1, 1], [1, 1], [2, 2], 1, torch.float16), False,
                 ((1, 1), (1, 1), (2, 2), 1, "cross-correlation", "float", "tensor-op"), id="half"),
    pytest.param(([1, 1], [1, 1], [1, 1], 8, torch.bfloat16), False,
                 ((1, 1), (1, 1), (1, 1), 8, "cross-correlation", "float", "tensor-op"), id="bfloat16"),
])
def test_describe_convolution(args, tf32, expected, torch_flags):
    torch.backends.cudnn.allow_tf32 = tf32
    assert cudnn_cache.describe_convolution(*args) == expected


# --- Keys -----------------------------------------------------------------------------------------------------

def make_key(direction="forward", input_size=(2, 4, 8, 8), weight_size=(6, 4, 3, 3), dtype=torch.float32,
             memory_format=torch.contiguous_format, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1,
             device="cpu"):
    x = torch.randn(input_size, dtype=dtype, device=device).contiguous(memory_format=memory_format)
    w = torch.randn(weight_size, dtype=dtype, device=device).contiguous(memory_format=memory_format)
    return cudnn_cache.conv_key(direction, x, w, list(stride), list(padding), list(dilation), groups)


def test_conv_key_is_a_hashable_tuple_of_47_ints():
    key = make_key()
    assert isinstance(key, tuple) and len(key) == 47
    assert all(type(word) is int for word in key)
    assert {key: "found"}[make_key()] == "found"


def test_conv_key_is_equal_for_equal_problems():
    key = make_key()
    assert make_key() == key  # other tensor values, same problem
    assert make_key(device="meta") == key
    # The kernels hand cuDNN a packed copy of a non-contiguous input, so it has the packed input's key.
    sliced = torch.randn(2, 4, 16, 8)[:, :, ::2]
    assert cudnn_cache.conv_key("forward", sliced, torch.randn(6, 4, 3, 3), [1, 1], [1, 1], [1, 1]) == key


@pytest.mark.parametrize("tf32", [False, True])
def test_conv_key_differs_by_every_part_of_the_problem(tf32, torch_flags):
    torch.backends.cudnn.allow_tf32 = tf32
    variants = {
        "base": {}, "backward_data": dict(direction="backward_data"),
        "backward_filter": dict(direction="backward_filter"), "half": dict(dtype=torch.half),
        "double": dict(dtype=torch.double), "channels_last": dict(memory_format=CL), "stride": dict(stride=(2, 1)),
        "padding": dict(padding=(0, 1)), "dilation": dict(dilation=(1, 2)), "batch": dict(input_size=(3, 4, 8, 8)),
        "groups": dict(weight_size=(6, 2, 3, 3), groups=2), "kernel": dict(weight_size=(6, 4, 3, 1)),
    }
    keys = {name: make_key(**kwargs) for name, kwargs in variants.items()}
    assert len(set(keys.values())) == len(keys), keys
    for index, direction in enumerate(["forward", "backward_data", "backward_filter"]):
        assert keys.get(direction, keys["base"])[0] == index


def test_conv_key_depends_on_tf32_for_float32_only(torch_flags):
    keys = {}
    for tf32 in (False, True):
        torch.backends.cudnn.allow_tf32 = tf32
        keys[tf32] = make_key(), make_key(dtype=torch.half)
    assert keys[False][0] != keys[True][0]
    assert keys[False][1] == keys[True][1]


def test_conv_key_of_1d_is_the_2d_key_with_unit_height():
    x, w = torch.randn(2, 4, 10), torch.randn(6, 4, 3)
    key = cudnn_cache.conv_key("forward", x, w, [2], [1], [3])
    assert key == cudnn_cache.conv_key("forward", x.unsqueeze(2), w.unsqueeze(2), [1, 2], [0, 1], [1, 3])


def test_transposed_key_is_the_backward_data_key_of_the_matching_convolution():
    # conv_transpose2d of (2, 6, 4, 4) by (6, 4, 3, 3), stride 2, padding 1, output_padding 1 gives (2, 4, 8, 8):
    # the backward-data of the convolution (2, 4, 8, 8) -> (2, 6, 4, 4).
    weight = torch.randn(6, 4, 3, 3)
    transposed = cudnn_cache.conv_key("backward_data", torch.randn(2, 6, 4, 4), weight, [2, 2], [1, 1], [1, 1],
                                      transposed=True, output_padding=[1, 1])
    assert transposed == cudnn_cache.conv_key("backward_data", torch.randn(2, 4, 8, 8), weight, [2, 2], [1, 1],
                                              [1, 1])


KEY_SCRIPT = """
import json, torch, cudnn_cache
torch.backends.cudnn.allow_tf32 = {tf32}
x, w = torch.randn({input_size}), torch.randn({weight_size})
print(json.dumps(cudnn_cache.conv_key("{direction}", x, w, {stride}, {padding}, {dilation}, {groups})))
"""


@pytest.mark.parametrize("problem", [
    dict(direction="forward", input_size=(2, 4, 8, 8), weight_size=(6, 4, 3, 3), stride=[1, 1], padding=[1, 1],
         dilation=[1, 1], groups=1),
    dict(direction="backward_filter", input_size=(1, 4, 5, 6, 7), weight_size=(8, 2, 3, 3, 3), stride=[2, 1, 1],
         padding=[0, 1, 1], dilation=[1, 1, 2], groups=2),
], ids=["2d", "3d"])
def test_conv_key_is_the_same_in_another_process(problem, child_env, torch_flags):
    torch.backends.cudnn.allow_tf32 = False
    script = KEY_SCRIPT.format(tf32=False, **problem)
    result = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    here = cudnn_cache.conv_key(problem["direction"], torch.randn(problem["input_size"]),
                                torch.randn(problem["weight_size"]), problem["stride"], problem["padding"],
                                problem["dilation"], problem["groups"])
    assert tuple(json.loads(result.stdout)) == here


# --- Numerics of the CPU kernels against torch.nn.functional --------------------------------------------------
# float64, so the comparison is tight; every case checks the output and the input, weight and bias gradients.

FUNCTIONAL_CASES = [
    pytest.param("conv1d", (2, 4, 11), (6, 4, 3), dict(stride=2, padding=1), id="conv1d_stride"),
    pytest.param("conv1d", (2, 4, 11), (6, 2, 4), dict(padding="same", dilation=3, groups=2),
                 id="conv1d_same_odd_span_groups"),
    pytest.param("conv2d", (2, 4, 9, 10), (6, 2, 3, 3), dict(groups=2, dilation=2, padding=(1, 2)),
                 id="conv2d_groups_dilation"),
    pytest.param("conv2d", (2, 4, 9, 10), (4, 1, 3, 3), dict(groups=4, stride=(2, 1), padding=1),
                 id="conv2d_depthwise_stride"),
    pytest.param("conv2d", (2, 4, 9, 10), (6, 4, 4, 2), dict(padding="same"), id="conv2d_same_even_kernel"),
    pytest.param("conv2d", (2, 4, 9, 10), (6, 4, 3, 3), dict(padding="valid"), id="conv2d_valid"),
    pytest.param("conv2d", (2, 4, 9, 10, CL), (6, 4, 3, 3), dict(padding=1, stride=2), id="conv2d_channels_last"),
    pytest.param("conv3d", (2, 4, 5, 6, 7), (6, 2, 3, 2, 3), dict(groups=2, stride=(1, 2, 1), padding=(1, 0, 1)),
                 id="conv3d_groups_stride"),
    pytest.param("conv3d", (2, 4, 5, 6, 7), (6, 4, 2, 2, 2), dict(padding="same", dilation=(1, 2, 1)),
                 id="conv3d_same_even_kernel"),
    pytest.param("conv3d", (1, 4, 5, 6, 7, CL3D), (6, 4, 3, 3, 3), dict(padding=1), id="conv3d_channels_last_3d"),
    pytest.param("conv_transpose1d", (2, 4, 7), (4, 3, 3), dict(stride=2, padding=1, output_padding=1),
                 id="conv_transpose1d_output_padding"),
    pytest.param("conv_transpose2d", (2, 4, 5, 6), (4, 3, 3, 3),
                 dict(stride=2, padding=1, output_padding=1, groups=2, dilation=2), id="conv_transpose2d_groups"),
    pytest.param("conv_transpose2d", (2, 4, 5, 6, CL), (4, 1, 3, 3), dict(groups=4, stride=(1, 2)),
                 id="conv_transpose2d_depthwise_channels_last"),
    pytest.param("conv_transpose3d", (2, 4, 3, 4, 5), (4, 2, 2, 3, 2), dict(stride=(2, 1, 2), padding=(0, 1, 1)),
                 id="conv_transpose3d_stride"),
]


def bias_size(name, weight_size, kwargs):
    return weight_size[1] * kwargs.get("groups", 1) if "transpose" in name else weight_size[0]


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")  # torch's own, for F.conv
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name, input_size, weight_size, kwargs", FUNCTIONAL_CASES)
def test_functional_matches_torch(name, input_size, weight_size, kwargs, with_bias):
    memory_format = input_size[-1] if isinstance(input_size[-1], torch.memory_format) else torch.contiguous_format
    input_size = [s for s in input_size if isinstance(s, int)]
    x = randn(*input_size, memory_format=memory_format, seed=1)
    w = randn(*weight_size, seed=2)
    b = randn(bias_size(name, weight_size, kwargs), seed=3) if with_bias else None

    results = []
    for conv in (getattr(cudnn_cache.functional, name), getattr(F, name)):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, b) if t is not None]
        output = conv(*leaves, **kwargs) if with_bias else conv(*leaves, None, **kwargs)
        output.backward(randn(*output.shape, seed=4))
        results.append([output.detach()] + [leaf.grad for leaf in leaves])
    ours, theirs = results
    assert ours[0].shape == theirs[0].shape
    for actual, expected, what in zip(ours, theirs, ["output", "grad input", "grad weight", "grad bias"]):
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("op, args, native", [
    pytest.param(ops.convolution, ([2], [1], [1], 1), lambda x, w: F.conv2d(x, w, stride=2, padding=1),
                 id="convolution"),
    pytest.param(ops.convolution_transpose, ([2], [1], [1], [1], 1),
                 lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1), stride=2, padding=1, output_padding=1),
                 id="convolution_transpose"),
])
def test_single_values_are_repeated_for_every_spatial_dimension(op, args, native):
    x, w = randn(2, 4, 7, 8), randn(6, 4, 3, 3)
    weight = w if op is ops.convolution else w.transpose(0, 1).contiguous()
    torch.testing.assert_close(op(x, weight, None, *args), native(x, w))


# --- Bias: added by the cached ops, one autograd node ----------------------------------------------------------
# forward and backward_data add the bias themselves (Note [Gradients of the cached ops]): a biased convolution
# records one node, as native's ConvolutionBackward0 does, with the bias's gradient and tangent its own.

def biased_leaves():
    """x (1, 4, 5, 6), w (4, 2, 3, 2) and bias (4): every case below takes them (groups=2)."""
    return [randn(*sizes, seed=seed).requires_grad_() for seed, sizes in enumerate([(1, 4, 5, 6), (4, 2, 3, 2), (4,)])]


def native_transpose(x, w, b):
    return F.conv_transpose2d(x, w, b, (2, 1), (1, 0), (1, 0), 2, (1, 2))


def native_convolution(x, w, b):
    return F.conv2d(x, w, b, (2, 1), (1, 0), (1, 2), 2)


BIASED = [  # the call, through cudnn_cache, and what native PyTorch computes for it
    pytest.param(lambda x, w, b: ops.convolution(x, w, b, [2, 1], [1, 0], [1, 2], 2), native_convolution,
                 id="convolution"),
    pytest.param(lambda x, w, b: ops.convolution_transpose(x, w, b, [2, 1], [1, 0], [1, 0], [1, 2], 2),
                 native_transpose, id="convolution_transpose"),
    pytest.param(lambda x, w, b: ops._convolution_forward(x, w, [2, 1], [1, 0], [1, 2], 2, b), native_convolution,
                 id="_convolution_forward"),
    # The transposed convolution above, as the cached op it runs: (5, 6) -> (10, 8).
    pytest.param(lambda x, w, b: ops._convolution_backward_input(x, w, [1, 4, 10, 8], [2, 1], [1, 0], [1, 2], 2, b),
                 native_transpose, id="_convolution_backward_input"),
]


@pytest.mark.parametrize("call, native", BIASED)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_a_biased_convolution_records_one_autograd_node(call, native, with_bias):
    x, w, b = biased_leaves()
    bias = b if with_bias else None
    output = call(x, w, bias)
    torch.testing.assert_close(output, native(x, w, bias))
    node = output.grad_fn
    assert node.name() == "CachedConvolutionBackward"
    edges = [function for function, _ in node.next_functions]
    assert len(edges) == 3  # input, weight, bias: no add or view node of its own
    assert [edge.variable for edge in edges[:2]] == [x, w]
    if with_bias:
        assert edges[2].name() == "torch::autograd::AccumulateGrad" and edges[2].variable is b
    else:
        assert edges[2] is None


@pytest.mark.parametrize("call, native", BIASED)
def test_gradients_of_every_order_with_bias(call, native):
    leaves = biased_leaves()
    assert torch.autograd.gradcheck(call, leaves, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(call, leaves, check_fwd_over_rev=True)
    x, w, b = leaves
    tx, tw, tb = (randn(*leaf.shape, seed=10 + i) for i, leaf in enumerate(leaves))
    for tangents in [(tx, tw, tb), (torch.zeros_like(x), torch.zeros_like(w), tb)]:  # all, the bias's alone
        ours, theirs = (torch.func.jvp(f, (x, w, b), tangents) for f in (call, native))
        torch.testing.assert_close(ours, theirs)
    with torch.autograd.forward_ad.dual_level():  # only the bias has a tangent: the others have none at all
        output = call(x, w, torch.autograd.forward_ad.make_dual(b, tb))
        tangent = torch.autograd.forward_ad.unpack_dual(output).tangent
    torch.testing.assert_close(tangent, tb.view(1, -1, 1, 1).expand_as(output))


def backward_calls(x, w, create_graph=False):
    """The cached ops a convolution's backward called, by name, with how often."""
    from torch.profiler import profile, ProfilerActivity

    output = ops.convolution(x, w, None, [1], [1], [1], 1)
    wanted = [leaf for leaf in (x, w) if leaf.requires_grad]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        grads = torch.autograd.grad(output, wanted, torch.ones_like(output), create_graph=create_graph)
    calls = {e.key.split("::")[1]: e.count for e in prof.key_averages() if e.key.startswith("cudnn_cache::")}
    return calls, grads


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_a_convolutions_backward_is_one_call_for_both_gradients_as_natively():
    x, w = randn(2, 4, 6, 6, seed=1).requires_grad_(), randn(5, 4, 3, 3, seed=2).requires_grad_()
    calls, grads = backward_calls(x, w)
    assert calls["_convolution_backward"] == 1  # below it, on the CPU, the two ops it is made of
    expected = torch.autograd.grad(F.conv2d(x, w, padding=1), (x, w), torch.ones(2, 5, 6, 6))
    torch.testing.assert_close(grads, expected)
    # One gradient wanted: the one op of that direction.
    calls, _ = backward_calls(x.detach(), w)
    assert "_convolution_backward" not in calls and calls["_convolution_backward_weight"] == 1
    # Gradients that need gradients (create_graph): the two ops, each recording its node.
    calls, grads = backward_calls(x, w, create_graph=True)
    assert calls["_convolution_backward"] == 1
    assert [grad.grad_fn.name() for grad in grads] == ["CachedConvolutionBackward"] * 2


def test_the_cached_ops_take_the_bias_last_and_default_to_none():
    x, w, b = (leaf.detach() for leaf in biased_leaves())
    convolution = (x, w, [2, 1], [1, 0], [1, 2], 2)
    transpose = (x, w, [1, 4, 10, 8], [2, 1], [1, 0], [1, 2], 2)
    torch.testing.assert_close(ops._convolution_forward(*convolution), native_convolution(x, w, None))
    torch.testing.assert_close(ops._convolution_forward(*convolution, bias=b), native_convolution(x, w, b))
    torch.testing.assert_close(ops._convolution_backward_input(*transpose), native_transpose(x, w, None))
    torch.testing.assert_close(ops._convolution_backward_input(*transpose, bias=b), native_transpose(x, w, b))


# --- Modules, convert() and TorchScript ------------------------------------------------------------------------

class Zoo(nn.Module):
    """One of each convolution module, each on its own input, plus a nested one."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 6, 3, padding=1, padding_mode="reflect")
        self.c2 = nn.Conv2d(4, 6, 4, padding="same", groups=2)
        self.c3 = nn.Conv3d(4, 6, 3, stride=2, padding=1)
        self.t1 = nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1)
        self.t2 = nn.ConvTranspose2d(4, 6, 3, groups=2, dilation=2, padding=1)
        self.t3 = nn.ConvTranspose3d(4, 6, 2, stride=2, bias=False)
        self.head = nn.Sequential(nn.Conv2d(6, 2, 1), nn.ReLU())

    def forward(self, x1: Tensor, x2: Tensor, x3: Tensor) -> List[Tensor]:
        return [self.c1(x1), self.head(self.c2(x2)), self.c3(x3), self.t1(x1), self.t2(x2), self.t3(x3)]


ZOO_TYPES = {  # submodule: (its class after convert(), its class before)
    "c1": (cudnn_cache.Conv1d, nn.Conv1d), "c2": (cudnn_cache.Conv2d, nn.Conv2d), "c3": (cudnn_cache.Conv3d, nn.Conv3d),
    "t1": (cudnn_cache.ConvTranspose1d, nn.ConvTranspose1d), "t2": (cudnn_cache.ConvTranspose2d, nn.ConvTranspose2d),
    "t3": (cudnn_cache.ConvTranspose3d, nn.ConvTranspose3d), "head.0": (cudnn_cache.Conv2d, nn.Conv2d),
}


def zoo_inputs():
    return randn(2, 4, 9, seed=1), randn(2, 4, 7, 8, seed=2), randn(2, 4, 5, 6, 5, seed=3)


def make_zoo():
    torch.manual_seed(0)
    return Zoo().double()


def test_convert_keeps_outputs_parameters_and_state_dict():
    model = make_zoo()
    inputs = zoo_inputs()
    with torch.no_grad():
        expected = model(*inputs)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    parameters = dict(model.named_parameters())

    assert cudnn_cache.convert(model) is model

    for name, (cached_type, torch_type) in ZOO_TYPES.items():
        module = model.get_submodule(name)
        assert type(module) is cached_type and isinstance(module, torch_type), name
    assert list(model.state_dict()) == list(state)
    for name, value in model.state_dict().items():
        assert torch.equal(value, state[name]), name
    assert dict(model.named_parameters()).keys() == parameters.keys()
    for name, parameter in model.named_parameters():
        assert parameter is parameters[name], name
    with torch.no_grad():
        actual = model(*inputs)
    for name, a, e in zip(["c1", "c2", "c3", "t1", "t2", "t3"], actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")


def test_convert_swaps_a_bare_module_and_leaves_subclasses_alone():
    class MyConv(nn.Conv2d):
        pass

    assert type(cudnn_cache.convert(nn.Conv2d(2, 2, 1))) is cudnn_cache.Conv2d
    model = cudnn_cache.convert(nn.Sequential(MyConv(2, 2, 1), nn.Conv2d(2, 2, 1)))
    assert type(model[0]) is MyConv and type(model[1]) is cudnn_cache.Conv2d


def training_step(model, inputs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    loss = sum(output.square().mean() for output in model(*inputs))
    loss.backward()
    optimizer.step()


def test_torchscript_model_saves_loads_and_trains_like_eager(tmp_path):
    eager = cudnn_cache.convert(make_zoo())
    path = tmp_path / "zoo.pt"
    torch.jit.script(eager).save(str(path))
    scripted = torch.jit.load(str(path))

    graph = str(scripted.inlined_graph)
    assert graph.count("cudnn_cache::convolution(") == 4  # c1, c2, c3, head.0
    assert graph.count("cudnn_cache::convolution_transpose(") == 3
    assert "aten::conv" not in graph and "aten::_convolution" not in graph

    inputs = zoo_inputs()
    for e, s in zip(eager(*inputs), scripted(*inputs)):
        torch.testing.assert_close(s, e, rtol=0, atol=0)

    initial = {name: p.detach().clone() for name, p in eager.named_parameters()}
    training_step(eager, inputs)
    training_step(scripted, inputs)
    scripted_parameters = dict(scripted.named_parameters())
    assert scripted_parameters.keys() == initial.keys()
    for name, parameter in eager.named_parameters():
        assert not torch.equal(parameter, initial[name]), f"{name} did not change"
        torch.testing.assert_close(scripted_parameters[name], parameter, rtol=1e-12, atol=1e-12,
                                   msg=lambda m: f"{name}: {m}")


# --- opcheck and meta tensors ----------------------------------------------------------------------------------
# opcheck's default tests all apply on the CPU: the schema (mutation and aliasing), the autograd registration,
# the fake (meta) kernels against the real ones, and AOT dispatch with dynamic shapes.

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("op, input_size, weight_size, with_bias, args", [
    pytest.param("convolution", (2, 4, 9), (6, 2, 3), True, ([2], [1], [1], 2), id="conv_1d"),
    pytest.param("convolution", (2, 4, 7, 8), (6, 4, 3, 3), False, ([1, 2], [1, 0], [2, 1], 1), id="conv_2d"),
    pytest.param("convolution", (2, 4, 7, 8, CL), (6, 4, 3, 3), True, ([1], [1], [1], 1), id="conv_channels_last"),
    pytest.param("convolution", (1, 4, 5, 6, 5), (4, 1, 2, 3, 2), True, ([1], [0], [1], 4), id="conv_3d_depthwise"),
    pytest.param("convolution_transpose", (2, 4, 5, 6), (4, 3, 3, 3), True, ([2], [1], [1], [1], 2),
                 id="transpose_2d"),
    pytest.param("convolution_transpose", (2, 4, 7), (4, 6, 3), False, ([1], [0], [0], [2], 1), id="transpose_1d"),
    pytest.param("convolution_transpose", (1, 4, 3, 4, 3), (4, 2, 2, 2, 2), True, ([2], [0], [0], [1], 1),
                 id="transpose_3d"),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(op, input_size, weight_size, with_bias, args, dtype):
    memory_format = input_size[-1] if isinstance(input_size[-1], torch.memory_format) else torch.contiguous_format
    input_size = [s for s in input_size if isinstance(s, int)]
    x = randn(*input_size, dtype=dtype, memory_format=memory_format).requires_grad_()
    w = randn(*weight_size, dtype=dtype, seed=1).requires_grad_()
    out_channels = weight_size[1] * args[-1] if op == "convolution_transpose" else weight_size[0]
    b = randn(out_channels, dtype=dtype, seed=2).requires_grad_() if with_bias else None
    torch.library.opcheck(getattr(ops, op).default, (x, w, b, *args), test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("op", ["_convolution_forward", "_convolution_backward_input"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_of_the_cached_ops_with_bias(op, dtype):
    x, w, b = (leaf.detach().to(dtype).requires_grad_() for leaf in biased_leaves())
    sizes = [[1, 4, 10, 8]] if op == "_convolution_backward_input" else []  # the transposed case of BIASED
    args = (x, w, *sizes, [2, 1], [1, 0], [1, 2], 2, b)
    torch.library.opcheck(getattr(ops, op).default, args, test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("op, input_size, weight_size, args, expected_size", [
    # (9 + 2 - 3) // 2 + 1 = 5 and (10 + 0 - 5) // 1 + 1 = 6
    pytest.param(ops.convolution, (2, 4, 9, 10), (6, 2, 3, 3), ([2, 1], [1, 0], [1, 2], 2), (2, 6, 5, 6), id="2d"),
    pytest.param(ops.convolution, (3, 4, 11), (8, 4, 3), ([2], [0], [1], 1), (3, 8, 5), id="1d"),
    pytest.param(ops.convolution, (1, 4, 5, 6, 7), (8, 1, 3, 3, 3), ([1], [1], [1], 4), (1, 8, 5, 6, 7), id="3d"),
    # (5 - 1) * 2 - 2 + 2 + 1 + 1 = 10 and (6 - 1) * 2 - 2 + 2 + 1 + 1 = 12; channels 3 * groups
    pytest.param(ops.convolution_transpose, (2, 4, 5, 6), (4, 3, 3, 3), ([2], [1], [1], [1], 2), (2, 6, 10, 12),
                 id="transpose_2d"),
])
def test_meta_tensors_give_the_output_size(op, input_size, weight_size, args, expected_size):
    x = torch.empty(input_size, device="meta")
    output = op(x, torch.empty(weight_size, device="meta"), None, *args)
    assert output.device.type == "meta"
    assert tuple(output.shape) == expected_size


def test_meta_convolution_keeps_channels_last():
    x = torch.empty(2, 4, 9, 10, device="meta", memory_format=CL)
    output = ops.convolution(x, torch.empty(6, 4, 3, 3, device="meta"), None, [1], [1], [1], 1)
    assert output.shape == (2, 6, 9, 10) and output.is_contiguous(memory_format=CL)


# The CPU kernels used to return the layout ATen's CPU convolution happened to pick (contiguous for a backward op
# whose first tensor is channels-last and whose second is not, and for float64 channels_last_3d), not the one the
# Meta kernels declare, and torch.compile failed its stride assertions. opcheck does not compare strides. The
# public ops hand the calls whose layout ATen's CPU kernels would change to aten::convolution (Note [Which
# convolutions the cache runs]), whose fake kernels follow it, so fake tensors of the real device are compared.
def stride_cases():
    for dims in (2, 3):
        spatial, kernel = (7, 8, 9)[-dims:], [3] * dims
        ops_and_sizes = {  # op: (call, size of the first tensor, size of the second)
            "convolution": (lambda a, b: ops.convolution(a, b, None, [1], [1], [1], 1), (2, 4, *spatial),
                            (6, 4, *kernel)),
            "convolution_transpose": (lambda a, b: ops.convolution_transpose(a, b, None, [2], [1], [1], [1], 1),
                                      (2, 4, *spatial), (4, 3, *kernel)),
            "_convolution_backward_input": (
                lambda a, b: ops._convolution_backward_input(a, b, [2, 4, *a.shape[2:]], [1], [1], [1], 1),
                (2, 6, *spatial), (6, 4, *kernel)),
            "_convolution_backward_weight": (
                lambda a, b: ops._convolution_backward_weight(a, b, [6, 4, *([3] * (a.dim() - 2))], [1], [1], [1], 1),
                (2, 6, *spatial), (2, 4, *spatial)),
        }
        for name, (call, a_size, b_size) in ops_and_sizes.items():
            for a_last in (False, True):
                for b_last in (False, True):
                    layout = f"{'cl' if a_last else 'contiguous'}-{'cl' if b_last else 'contiguous'}"
                    yield pytest.param(call, a_size, b_size, a_last, b_last, id=f"{name}-{dims}d-{layout}")


@pytest.mark.parametrize("call, a_size, b_size, a_last, b_last", list(stride_cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_fake_tensors_give_the_cpu_kernels_strides(call, a_size, b_size, a_last, b_last, dtype):
    """torch.compile traces with the Meta kernels and asserts that the real outputs have their strides."""
    def make(size, channels_last, device):
        format = (CL if len(size) == 4 else CL3D) if channels_last else torch.contiguous_format
        return torch.ones(size, dtype=dtype, device=device).contiguous(memory_format=format)

    real = call(make(a_size, a_last, "cpu"), make(b_size, b_last, "cpu"))
    with FakeTensorMode() as mode:  # what torch.compile traces with: tensors of the real device, no data
        fake = call(mode.from_tensor(make(a_size, a_last, "cpu")), mode.from_tensor(make(b_size, b_last, "cpu")))
    assert (fake.shape, fake.stride()) == (real.shape, real.stride())


# --- Argument errors -------------------------------------------------------------------------------------------

X, W = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)


# The public ops raise what PyTorch raises for bad tensors and arguments (test_bad_input.py); these are
# cudnn_cache's own.
@pytest.mark.parametrize("call, match", [
    pytest.param(lambda: cudnn_cache.conv_key("sideways", X, W, [1], [0], [1]), r"unknown direction 'sideways'",
                 id="direction"),
    pytest.param(lambda: cudnn_cache.fill(X, W, [1], [0], [1]), r"CUDA tensors", id="fill_on_cpu_tensors"),
])
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


def test_functional_rejects_bad_padding_strings():
    with pytest.raises(RuntimeError, match="padding must be 'valid', 'same' or ints"):
        cudnn_cache.functional.conv2d(X, W, padding="full")
    with pytest.raises(RuntimeError, match="'same' is not supported for strided"):
        cudnn_cache.functional.conv2d(X, W, padding="same", stride=2)


def test_invalid_miss_policy_is_rejected_and_the_policy_kept(cache_state):
    with pytest.raises(RuntimeError, match=r"unknown miss policy 'bogus'.*'tune', 'heuristic', 'error', 'record' or 'nearest'"):
        cudnn_cache.set_miss_policy("bogus")
    assert cudnn_cache.miss_policy() == "tune"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; test_ops_gpu.py covers query")
def test_query_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        cudnn_cache.query("forward", make_key())


# --- Cache state and files -------------------------------------------------------------------------------------

def test_stats_has_every_counter(cache_state):
    stats = cudnn_cache.stats()
    assert set(stats) == {"hits", "misses", "tunes", "fallbacks", "tune_us", "plans_built", "plan_build_us",
                          "plans_deserialized", "plan_rebuilds", "plan_evictions", "capture_misses", "tune_waits",
                          "lent", "plans", "entries", "attention_plans_built", "attention_plans_restored",
                          "attention_plan_rebuilds", "attention_build_us", "attention_plans"}
    assert all(type(value) is int and value >= 0 for value in stats.values())
    assert stats["entries"] == cudnn_cache.size() == 0 and stats["plans"] == 0 and stats["attention_plans"] == 0


def test_backend_defaults_to_graph_and_round_trips(cache_state):
    assert cudnn_cache.backend() == "graph"  # cuDNN 9 has the graph API
    for backend in ("legacy", "graph"):
        cudnn_cache.set_backend(backend)
        assert cudnn_cache.backend() == backend


def test_invalid_backend_is_rejected_and_the_backend_kept(cache_state):
    cudnn_cache.set_backend("legacy")
    with pytest.raises(RuntimeError, match="unknown backend 'cudnn'; use 'graph' or 'legacy'"):
        cudnn_cache.set_backend("cudnn")
    assert cudnn_cache.backend() == "legacy"


def test_query_names_an_invalid_backend():
    with pytest.raises(RuntimeError, match="unknown backend 'fast'"):
        cudnn_cache.query("forward", make_key(), backend="fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; test_ops_gpu.py covers prepare")
def test_prepare_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="prepare: no CUDA device"):
        cudnn_cache.prepare()
    with pytest.raises(RuntimeError, match="prepare: no CUDA device"):
        cudnn_cache.prepare(background=True)


def test_prepare_rejects_negative_threads():
    with pytest.raises(RuntimeError, match="threads must be >= 0"):
        cudnn_cache.prepare(threads=-1)


def test_tuning_options_default_round_trip_and_refuse_bad_values(cache_state):
    assert cudnn_cache.tuning_options() == {"build_threads": 0, "exhaustive": False, "rank_deterministic": False}
    cudnn_cache.set_tuning_options(build_threads=4, exhaustive=True)
    cudnn_cache.set_tuning_options(rank_deterministic=True)  # the options not named keep their values
    options = cudnn_cache.tuning_options()
    assert options == {"build_threads": 4, "exhaustive": True, "rank_deterministic": True}
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['repeats'\]; the options are "
                                        r"\['build_threads', 'exhaustive', 'rank_deterministic'\]"):
        cudnn_cache.set_tuning_options(repeats=5)
    with pytest.raises(RuntimeError, match="build_threads must be between 0 and 1000 .*, got -2"):
        cudnn_cache.set_tuning_options(build_threads=-2)
    assert cudnn_cache.tuning_options() == options  # a refused change changes nothing


# What each removed option's message says to do instead.
REMOVED_TUNING_OPTIONS = {
    **{name: ("Note [Search bounds]", "leave it out") for name in ("warmup", "repetitions", "flush_l2",
                                                                   "give_up_ratio")},
    **{name: ("Note [Search bounds]", "exhaustive=True", "python -m cudnn_cache tune FILE --jobs N")
       for name in ("max_candidates", "mode_b_candidates", "knob_variants", "finalists")},
    "build_processes": ("python -m cudnn_cache tune FILE --jobs N",),
    "prefetch_backward": ("python -m cudnn_cache tune FILE --jobs N",),
}


@pytest.mark.parametrize("option", sorted(REMOVED_TUNING_OPTIONS))
def test_the_removed_tuning_options_are_refused_with_what_to_do(cache_state, option):
    before = cudnn_cache.tuning_options()
    with pytest.raises(TypeError) as refused:
        cudnn_cache.set_tuning_options(**{option: 1}, build_threads=1)
    message = str(refused.value)
    assert message.startswith(f"set_tuning_options: {option} was removed: ") and \
        all(part in message for part in REMOVED_TUNING_OPTIONS[option]), message
    assert cudnn_cache.tuning_options() == before and option not in before  # nothing was set


def test_several_removed_tuning_options_are_named_together_and_each_reason_given_once(cache_state):
    with pytest.raises(TypeError) as refused:
        cudnn_cache.set_tuning_options(prefetch_backward=False, knob_variants=0, build_processes=0, max_candidates=1)
    message = str(refused.value)
    assert message.startswith("set_tuning_options: build_processes, knob_variants, max_candidates, prefetch_backward "
                              "were removed: "), message
    assert message.count("exhaustive=True") == 1, message


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; test_ops_gpu.py covers audit and settle")
def test_audit_and_settle_without_a_gpu_say_so():
    with pytest.raises(RuntimeError, match="audit: no CUDA device"):
        cudnn_cache.audit()
    with pytest.raises(RuntimeError, match="settle: no CUDA device"):
        cudnn_cache.settle()


def test_waiting_for_a_prepare_never_started_says_so():
    with pytest.raises(RuntimeError, match="no background prepare was started"):
        cudnn_cache.Preparation().wait()


def test_miss_policy_round_trip(cache_state):
    assert cudnn_cache.miss_policy() == "tune"
    for policy in ("heuristic", "error", "record", "nearest", "tune"):
        cudnn_cache.set_miss_policy(policy)
        assert cudnn_cache.miss_policy() == policy


def test_plan_cache_limit_round_trip_and_a_negative_one_is_refused(cache_state):
    assert cudnn_cache.plan_cache_limit() == 10000  # the default, as PyTorch's own plan cache
    for limit in (0, 1, 123, 10000):
        cudnn_cache.set_plan_cache_limit(limit)
        assert cudnn_cache.plan_cache_limit() == limit
    with pytest.raises(RuntimeError, match=r"set_plan_cache_limit: limit must be a non-negative integer .*got -1; "
                                           r"the limit stays 10000"):
        cudnn_cache.set_plan_cache_limit(-1)
    assert cudnn_cache.plan_cache_limit() == 10000
    assert cudnn_cache.stats()["plan_evictions"] == 0  # no plan is built without a GPU


# A bad value ends the process in one line (test_bad_input.py, test_a_bad_environment_variable_ends_the_process_...).
@pytest.mark.parametrize("variable, read, setting, limit", [
    ("CUDNN_CACHE_PLAN_CACHE_LIMIT", "plan_cache_limit", "0", 0),
    ("CUDNN_CACHE_PLAN_CACHE_LIMIT", "plan_cache_limit", "250", 250),
    ("CUDNN_CACHE_PLAN_CACHE_LIMIT", "plan_cache_limit", "", 10000),
    ("CUDNN_CACHE_PLAN_CACHE_LIMIT", "plan_cache_limit", None, 10000),
    ("CUDNN_CACHE_WORKSPACE_LIMIT", "workspace_limit", "0", 0),
    ("CUDNN_CACHE_WORKSPACE_LIMIT", "workspace_limit", "67108864", 67108864),
    ("CUDNN_CACHE_WORKSPACE_LIMIT", "workspace_limit", "", None),
    ("CUDNN_CACHE_WORKSPACE_LIMIT", "workspace_limit", None, None),
    ("CUDNN_CACHE_MISS_POLICY", "miss_policy", "nearest", "nearest"),
    ("CUDNN_CACHE_MISS_POLICY", "miss_policy", "record", "record"),
    ("CUDNN_CACHE_MISS_POLICY", "miss_policy", "", "tune"),
    ("CUDNN_CACHE_MISS_POLICY", "miss_policy", None, "tune"),
])
def test_a_variable_read_at_start_sets_its_setting(child_env, variable, read, setting, limit):
    env = dict(child_env)
    env.pop(variable, None)
    if setting is not None:
        env[variable] = setting
    result = subprocess.run([sys.executable, "-c", f"import cudnn_cache; print(cudnn_cache.{read}())"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(limit)
    assert result.stderr == ""


def test_the_runtime_ignores_a_bad_variable_with_one_line_each_where_python_does_not_check_it(child_env):
    """A LibTorch program loads the ops library without the Python package, which would refuse these first
    (test_bad_input.py): the C++ runtime says what it ignores and keeps its defaults."""
    from cudnn_cache import _library

    env = dict(child_env, CUDNN_CACHE_LOG="verbose", CUDNN_CACHE_MISS_POLICY="closest",
               CUDNN_CACHE_WORKSPACE_LIMIT="64MB", CUDNN_CACHE_PLAN_CACHE_LIMIT="-1")
    script = (f"import torch; torch.ops.load_library({_library.library_path()!r}); ops = torch.ops.cudnn_cache; "
              "print(ops.get_miss_policy(), ops.get_log_level(), ops.get_plan_cache_limit())")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["tune", "off", "10000"]
    lines = result.stderr.splitlines()
    assert any(line.startswith("cudnn_cache: CUDNN_CACHE_LOG: ") and line.endswith("; logging stays off")
               for line in lines), lines
    assert any(line.startswith("cudnn_cache: CUDNN_CACHE_MISS_POLICY: unknown miss policy 'closest'") and
               line.endswith("; the miss policy stays 'tune'") for line in lines), lines
    assert any("CUDNN_CACHE_WORKSPACE_LIMIT: '64MB' is not a non-negative integer" in line for line in lines), lines
    assert any("CUDNN_CACHE_PLAN_CACHE_LIMIT: '-1' is not a non-negative integer" in line for line in lines), lines
    env.update(CUDNN_CACHE_MISS_POLICY="nearest", CUDNN_CACHE_LOG="info")
    del env["CUDNN_CACHE_WORKSPACE_LIMIT"], env["CUDNN_CACHE_PLAN_CACHE_LIMIT"]
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["nearest", "info", "10000"], result.stderr


def test_workspace_limit_round_trip_and_a_negative_one_is_refused(cache_state):
    assert cudnn_cache.workspace_limit() is None  # the default: no limit
    for limit in (0, 1, 64 << 20, 2**62, None):
        cudnn_cache.set_workspace_limit(limit)
        assert cudnn_cache.workspace_limit() == limit
    cudnn_cache.set_workspace_limit(1 << 30)
    with pytest.raises(RuntimeError, match=r"set_workspace_limit: bytes must be a non-negative integer .*got -5; "
                                           r"the limit stays as it was"):
        cudnn_cache.set_workspace_limit(-5)
    assert cudnn_cache.workspace_limit() == 1 << 30




@pytest.fixture
def synth_file(tool, tmp_path):
    """A valid cache file of 50 synthetic entries, written by cudnn_cache_tool."""
    path = tmp_path / "synth.bin"
    result = tool("synth", path, "--entries", 50)
    assert result.returncode == 0, result.stderr
    return path


def test_load_save_round_trip(cache_state, synth_file, tool, tmp_path):
    assert cudnn_cache.load(synth_file) == 50
    assert cudnn_cache.size() == 50 and cudnn_cache.stats()["entries"] == 50
    assert cudnn_cache.load(str(synth_file)) == 50  # merging the same entries again adds none
    assert cudnn_cache.size() == 50

    saved = tmp_path / "saved.bin"
    cudnn_cache.save(saved)
    result = tool("validate", saved)
    assert result.returncode == 0, result.stderr
    assert "valid, 50 entries" in result.stdout
    # The header's format version (little-endian u32 after the endianness byte and the 8-byte magic).
    assert int.from_bytes(saved.read_bytes()[9:13], "little") == cudnn_cache.FORMAT_VERSION == 6

    cudnn_cache.clear()
    assert cudnn_cache.size() == 0
    assert cudnn_cache.load(saved) == 50 and cudnn_cache.size() == 50


def damaged(data):
    """Damaged copies of a valid file: garbage, truncated, one flipped bit in the middle."""
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    return {"garbage": b"not a cache file" * 8, "truncated": data[: len(data) // 2], "bit_flip": bytes(flipped)}


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "bit_flip"])
def test_failed_load_names_the_file_and_keeps_the_cache(damage, cache_state, synth_file, tmp_path):
    cudnn_cache.load(synth_file)
    path = tmp_path / f"{damage}.bin"
    if damage != "missing":
        path.write_bytes(damaged(synth_file.read_bytes())[damage])
    with pytest.raises(RuntimeError) as error:
        cudnn_cache.load(path)
    assert str(path) in str(error.value)
    reasons = {"missing": "No such file", "garbage": "wrong magic", "truncated": "truncated", "bit_flip": "corrupt"}
    assert reasons[damage] in str(error.value)
    assert cudnn_cache.size() == 50


def test_persistent_loads_on_entry_and_saves_on_exit(cache_state, synth_file, tool, tmp_path):
    path = tmp_path / "persisted.bin"
    with cudnn_cache.persistent(path):  # no file yet: nothing to load
        assert cudnn_cache.size() == 0
        cudnn_cache.load(synth_file)
    assert "valid, 50 entries" in tool("validate", path).stdout

    cudnn_cache.clear()
    with cudnn_cache.persistent(path):
        assert cudnn_cache.size() == 50


def test_persistent_saves_when_the_body_raises(cache_state, synth_file, tool, tmp_path):
    path = tmp_path / "persisted.bin"
    with pytest.raises(KeyError, match="boom"):
        with cudnn_cache.persistent(path):
            cudnn_cache.load(synth_file)
            raise KeyError("boom")
    assert "valid, 50 entries" in tool("validate", path).stdout


def test_log_level_round_trips_and_refuses_unknown_names(cache_state):
    before = cudnn_cache.log_level()
    try:
        for level in ("debug", "info", "off"):
            cudnn_cache.set_log_level(level)
            assert cudnn_cache.log_level() == level
        with pytest.raises(RuntimeError, match="unknown log level 'loud'; use 'off', 'info' or 'debug'"):
            cudnn_cache.set_log_level("loud")
        assert cudnn_cache.log_level() == "off"
    finally:
        cudnn_cache.set_log_level(before)


LOG_SCRIPT = r"""
import sys, cudnn_cache
print(cudnn_cache.log_level())
cudnn_cache.load(sys.argv[1])
"""


# A bad value ends the process in one line (test_bad_input.py, test_a_bad_environment_variable_ends_the_process_...).
@pytest.mark.parametrize("setting", ["debug", "info", "off", None])
def test_cudnn_cache_log_sets_both_loggers_at_start(child_env, synth_file, setting):
    env = dict(child_env)
    env.pop("CUDNN_CACHE_LOG", None)
    if setting is not None:
        env["CUDNN_CACHE_LOG"] = setting
    result = subprocess.run([sys.executable, "-c", LOG_SCRIPT, str(synth_file)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (setting if setting in ("debug", "info") else "off")
    shown = f"cudnn_cache [INFO] loaded 50 entries from {synth_file}" in result.stderr
    assert shown == (setting in ("debug", "info")), result.stderr
