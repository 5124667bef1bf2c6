"""Cached convolutions with the signatures of torch.nn.functional.conv* and conv_transpose*: batched (N, C,
*spatial) or unbatched (C, *spatial) input, as torch.nn.functional takes."""

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ._library import eager_calls

IntOrSequence = Union[int, Sequence[int]]

# The ops' one overload each. Called directly, an overload skips the overload packet's resolution of which one
# the arguments match, about 1 us of host time per call (`torch.ops.cudnn_cache.convolution(...)` resolves it on
# every call). TorchScript cannot name an overload: scripted code calls the packet (modules.py).
convolution_op = torch.ops.cudnn_cache.convolution.default
convolution_transpose_op = torch.ops.cudnn_cache.convolution_transpose.default


def _eager_first(name: str, overload):
    """How eager code calls the op `name`: through cudnn_cache._eager at a torch function's cost where the build
    made it (Note [Eager calls]), else its overload; under torch.compile, which traces torch.ops calls, the
    overload."""
    eager = getattr(_EAGER_CALLS, name, None)
    if eager is None:
        return overload

    def call(*args):
        return overload(*args) if torch.compiler.is_compiling() else eager(*args)
    return call


_EAGER_CALLS = eager_calls()
convolution_call = _eager_first("convolution", convolution_op)
convolution_transpose_call = _eager_first("convolution_transpose", convolution_transpose_op)


def _expand(value: IntOrSequence, spatial_dims: int) -> List[int]:
    """`value` as a list of ints; a single value (an int, or a sequence of one) is repeated for every spatial
    dimension, as PyTorch does. Any other length is passed on, for the op to reject, naming the argument."""
    if isinstance(value, int):
        return [int(value)] * spatial_dims
    values = [int(v) for v in value]
    return values * spatial_dims if len(values) == 1 else values


def same_padding(kernel_size: Sequence[int], dilation: Sequence[int]) -> Tuple[List[int], List[int]]:
    """Symmetric padding for padding='same', plus the extra right-side padding (in F.pad order, last
    dimension first) that an even dilated kernel needs, exactly as PyTorch pads for 'same'."""
    totals = [d * (k - 1) for k, d in zip(kernel_size, dilation)]
    return [total // 2 for total in totals], [side for total in reversed(totals) for side in (0, total % 2)]


def _convolution(input: Tensor, weight: Tensor, bias: Optional[Tensor], stride: IntOrSequence,
                 padding: Union[str, IntOrSequence], dilation: IntOrSequence, groups: int) -> Tensor:
    spatial_dims = weight.dim() - 2
    stride = _expand(stride, spatial_dims)
    dilation = _expand(dilation, spatial_dims)
    # PyTorch raises RuntimeError for a bad padding string, so this does too.
    if isinstance(padding, str):
        if padding == "valid":
            padding = [0] * spatial_dims
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise RuntimeError("padding='same' is not supported for strided convolutions; pass explicit padding")
            padding, extra = same_padding(weight.shape[2:], dilation)
            if any(extra):
                input = F.pad(input, extra)
        else:
            raise RuntimeError(f"padding must be 'valid', 'same' or ints, got {padding!r}")
    return convolution_call(input, weight, bias, stride, _expand(padding, spatial_dims), dilation, groups)


def conv1d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrSequence = 1,
           padding: Union[str, IntOrSequence] = 0, dilation: IntOrSequence = 1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv1d through the cache."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups)


def conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrSequence = 1,
           padding: Union[str, IntOrSequence] = 0, dilation: IntOrSequence = 1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv2d through the cache."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups)


def conv3d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrSequence = 1,
           padding: Union[str, IntOrSequence] = 0, dilation: IntOrSequence = 1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv3d through the cache."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups)


def _convolution_transpose(input: Tensor, weight: Tensor, bias: Optional[Tensor], stride: IntOrSequence,
                           padding: IntOrSequence, output_padding: IntOrSequence, groups: int,
                           dilation: IntOrSequence) -> Tensor:
    spatial_dims = weight.dim() - 2
    return convolution_transpose_call(
        input, weight, bias, _expand(stride, spatial_dims), _expand(padding, spatial_dims),
        _expand(output_padding, spatial_dims), _expand(dilation, spatial_dims), groups)


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrSequence = 1,
                     padding: IntOrSequence = 0, output_padding: IntOrSequence = 0, groups: int = 1,
                     dilation: IntOrSequence = 1) -> Tensor:
    """torch.nn.functional.conv_transpose1d through the cache."""
    return _convolution_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrSequence = 1,
                     padding: IntOrSequence = 0, output_padding: IntOrSequence = 0, groups: int = 1,
                     dilation: IntOrSequence = 1) -> Tensor:
    """torch.nn.functional.conv_transpose2d through the cache."""
    return _convolution_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrSequence = 1,
                     padding: IntOrSequence = 0, output_padding: IntOrSequence = 0, groups: int = 1,
                     dilation: IntOrSequence = 1) -> Tensor:
    """torch.nn.functional.conv_transpose3d through the cache."""
    return _convolution_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)
