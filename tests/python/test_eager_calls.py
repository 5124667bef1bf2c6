"""cudnn_cache._eager (Note [Eager calls] in torch_ops/csrc/python/eager_calls.cpp): the cached ops called from eager
Python with PyTorch's own argument parser. On the CPU kernels: the build's module is the one converted modules
call; its results and gradients are the overload's, bit for bit, positional or by keyword; a tensor subclass or a
torch function mode with __torch_function__ sees the op's overload, as it did through torch.ops; bad arguments get
PyTorch's message naming the function; torch.compile traces the overload (tests/python/test_compile.py compiles
converted models with fullgraph=True)."""

import pytest
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

import cudnn_cache
from cudnn_cache import _library, functional

CALLS = {  # name -> (the eager module's function name, the overload)
    "convolution": functional.convolution_op,
    "convolution_transpose": functional.convolution_transpose_op,
}


def randn(*sizes, seed: int, requires_grad: bool = False) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sizes, dtype=torch.float64, generator=generator).requires_grad_(requires_grad)


def arguments(name: str, spatial: int, requires_grad: bool = False) -> tuple:
    """Arguments of op `name` in `spatial` dimensions, with a bias and groups 2: (input, weight, bias, *rest)."""
    ones = [1] * spatial
    x = randn(2, 4, *[5] * spatial, seed=1, requires_grad=requires_grad)
    if name == "convolution":
        w = randn(6, 2, *[3] * spatial, seed=2, requires_grad=requires_grad)
        return x, w, randn(6, seed=3, requires_grad=requires_grad), [2] * spatial, ones, ones, 2
    w = randn(4, 3, *[3] * spatial, seed=2, requires_grad=requires_grad)
    return x, w, randn(6, seed=3, requires_grad=requires_grad), [2] * spatial, ones, ones, ones, 2


def test_the_build_made_the_module_converted_modules_call(build_dir):
    built = list((build_dir / "torch_ops").glob("_eager.*.so"))
    module = _library.eager_calls()
    if not built:  # CMake found no Python headers or libtorch_python: the overloads serve
        assert module is None and functional.convolution_call is functional.convolution_op
        return
    assert module is not None and module.__file__ == str(built[0])
    for name, overload in CALLS.items():
        call = getattr(functional, f"{name}_call")
        assert call is not overload and call.__name__ == "call", name


@pytest.fixture
def eager():
    module = _library.eager_calls()
    if module is None:
        pytest.fail("cudnn_cache._eager was not built: CMake found no Python headers or libtorch_python")
    return module


@pytest.mark.parametrize("spatial", [1, 2, 3])
@pytest.mark.parametrize("name", list(CALLS))
def test_results_and_gradients_are_the_overloads(eager, name, spatial):
    results = []
    for call in (CALLS[name], getattr(eager, name)):
        args = arguments(name, spatial, requires_grad=True)
        out = call(*args)
        out.backward(randn(*out.shape, seed=4))
        results.append((out.detach(), *(a.grad for a in args[:3])))
    for mine, theirs in zip(*results):
        assert torch.equal(mine, theirs)


def test_keywords_as_the_schema_names_them(eager):
    x, w, b, stride, padding, dilation, groups = arguments("convolution", 2)
    by_name = eager.convolution(input=x, weight=w, bias=b, stride=stride, padding=padding, dilation=dilation,
                                groups=groups)
    assert torch.equal(by_name, functional.convolution_op(x, w, b, stride, padding, dilation, groups))
    assert torch.equal(eager.convolution(x, w, None, stride, padding, dilation, groups),
                       functional.convolution_op(x, w, None, stride, padding, dilation, groups))


class Recorded(Tensor):
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("name", list(CALLS))
def test_a_subclass_sees_the_overload(eager, name):
    args = arguments(name, 2)
    Recorded.seen = []
    out = getattr(eager, name)(args[0].as_subclass(Recorded), *args[1:])
    assert type(out) is Recorded and Recorded.seen[0] is CALLS[name]
    assert torch.equal(out.as_subclass(Tensor), CALLS[name](*args))


def test_a_torch_function_mode_sees_the_overload(eager):
    seen = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    args = arguments("convolution", 2)
    with Mode():
        out = eager.convolution(*args)
    assert seen == [functional.convolution_op]
    assert torch.equal(out, functional.convolution_op(*args))


def test_bad_arguments_name_the_function(eager):
    x, w, b, stride, padding, dilation, groups = arguments("convolution", 2)
    with pytest.raises(TypeError, match=r"convolution\(\): argument 'stride' \(position 4\) must be tuple of ints"):
        eager.convolution(x, w, b, "2", padding, dilation, groups)
    # Values the parser accepts are the op's to check, with its own message.
    with pytest.raises(RuntimeError, match="stride"):
        eager.convolution(x, w, b, [2, 2, 2], padding, dilation, groups)


def test_converted_modules_match_torch_through_it(eager):
    torch.manual_seed(0)
    native = torch.nn.Sequential(torch.nn.Conv2d(4, 6, 3, padding=1), torch.nn.ConvTranspose2d(6, 4, 3, stride=2))
    cached = cudnn_cache.convert(native)
    x = randn(2, 4, 7, 7, seed=5).float()
    assert torch.allclose(cached(x), native(x), atol=1e-5)


def test_tracers_record_the_op(eager):
    model = cudnn_cache.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()))
    x = randn(1, 3, 8, 8, seed=6).float()
    # torch.fx's Proxy has __torch_function__: the graph calls the overload, as it did through torch.ops.
    graph = torch.fx.symbolic_trace(model)
    assert [n.target for n in graph.graph.nodes if n.op == "call_function"] == [functional.convolution_op]
    assert torch.equal(graph(x), model(x))
    # torch.jit.trace records below Python, at the dispatcher, which the eager call goes through.
    traced = torch.jit.trace(model, x)
    assert "cudnn_cache::convolution" in str(traced.inlined_graph)
    assert torch.equal(traced(x), model(x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, memory_format", [(torch.float32, torch.contiguous_format),
                                                  (torch.float16, torch.channels_last)])
@pytest.mark.parametrize("name", list(CALLS))
def test_on_the_gpu_it_runs_the_cached_kernels_as_the_overload_does(eager, cache_state, name, dtype, memory_format):
    # Both calls reach the same CUDA kernels and the same stored config: the eager call's first call tunes the key,
    # the overload's runs what it stored; the same kernel on the same operands gives the same forward, bit for bit.
    # The gradients are compared within rounding: the weight's and the bias's are reductions whose kernels may add
    # in any order.
    cudnn_cache.set_miss_policy("tune")
    results = []
    for call in (getattr(eager, name), CALLS[name]):
        x, w, b, *rest = (a.to("cuda", dtype) if isinstance(a, Tensor) else a for a in arguments(name, 2))
        x, w = x.contiguous(memory_format=memory_format), w.contiguous(memory_format=memory_format)
        for tensor in (x, w, b):
            tensor.requires_grad_(True)
        out = call(x, w, b, *rest)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), x.grad, w.grad, b.grad))
    assert cudnn_cache.stats()["tunes"] == 3  # the eager call's forward and its backward's two keys, once
    eager_out, overload_out = results[0][0], results[1][0]
    assert eager_out.is_contiguous(memory_format=memory_format) and torch.equal(eager_out, overload_out)
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.float16 else {"atol": 1e-5, "rtol": 1e-5}
    for mine, theirs in zip(results[0][1:], results[1][1:]):
        torch.testing.assert_close(mine, theirs, **tolerance)
