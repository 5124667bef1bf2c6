"""nn.Conv*d and nn.ConvTranspose*d that run through the cache, and convert() to swap them into a model.

The cached modules are subclasses of torch's: same parameters, same state_dict keys, same constructor. They
script with torch.jit.script, so TorchScript models (run from Python or LibTorch) use the cache too.
"""

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .functional import convolution_call, convolution_transpose_call, same_padding


class _CachedConvolution:
    """What Conv1d/2d/3d add to torch's modules: padding resolved once into what the op takes."""

    # Declared for TorchScript, which cannot infer the type of an empty list.
    _cudnn_stride: List[int]
    _cudnn_padding: List[int]
    _cudnn_dilation: List[int]
    _cudnn_extra_padding: List[int]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # torch's module, next in the method resolution order
        self._prepare()

    def _prepare(self) -> None:
        self._cudnn_stride = list(self.stride)
        self._cudnn_dilation = list(self.dilation)
        self._cudnn_extra_padding = []  # F.pad spec applied first, for 'same' with even kernels
        if isinstance(self.padding, str):
            if self.padding == "same":
                self._cudnn_padding, extra = same_padding(self.kernel_size, self.dilation)
                self._cudnn_extra_padding = extra if any(extra) else []
            else:
                self._cudnn_padding = [0] * len(self.kernel_size)
        else:
            self._cudnn_padding = list(self.padding)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = [0] * len(self._cudnn_padding)
        else:
            padding = self._cudnn_padding
            if len(self._cudnn_extra_padding) > 0:
                input = F.pad(input, self._cudnn_extra_padding)
        if torch.jit.is_scripting():  # TorchScript cannot name an overload; eager code calls functional.py's call
            return torch.ops.cudnn_cache.convolution(input, weight, bias, self._cudnn_stride, padding,
                                                     self._cudnn_dilation, self.groups)
        return convolution_call(input, weight, bias, self._cudnn_stride, padding, self._cudnn_dilation, self.groups)


class Conv1d(_CachedConvolution, nn.Conv1d):
    """torch.nn.Conv1d through the cache."""


class Conv2d(_CachedConvolution, nn.Conv2d):
    """torch.nn.Conv2d through the cache."""


class Conv3d(_CachedConvolution, nn.Conv3d):
    """torch.nn.Conv3d through the cache."""


class _CachedConvolutionTranspose:
    """What ConvTranspose1d/2d/3d add to torch's modules."""

    _cudnn_stride: List[int]
    _cudnn_padding: List[int]
    _cudnn_dilation: List[int]
    _cudnn_kernel_size: List[int]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._prepare()

    def _prepare(self) -> None:
        if self.padding_mode != "zeros":
            raise ValueError(f"only padding_mode='zeros' is supported for {type(self).__name__}")
        self._cudnn_stride = list(self.stride)
        self._cudnn_padding = list(self.padding)
        self._cudnn_dilation = list(self.dilation)
        self._cudnn_kernel_size = list(self.kernel_size)

    def forward(self, input: Tensor, output_size: Optional[List[int]] = None) -> Tensor:
        output_padding = self._output_padding(input, output_size, self._cudnn_stride, self._cudnn_padding,
                                              self._cudnn_kernel_size, len(self._cudnn_kernel_size),
                                              self._cudnn_dilation)
        if torch.jit.is_scripting():  # as in _CachedConvolution._conv_forward
            return torch.ops.cudnn_cache.convolution_transpose(input, self.weight, self.bias, self._cudnn_stride,
                                                               self._cudnn_padding, output_padding,
                                                               self._cudnn_dilation, self.groups)
        return convolution_transpose_call(input, self.weight, self.bias, self._cudnn_stride, self._cudnn_padding,
                                          output_padding, self._cudnn_dilation, self.groups)


class ConvTranspose1d(_CachedConvolutionTranspose, nn.ConvTranspose1d):
    """torch.nn.ConvTranspose1d through the cache."""


class ConvTranspose2d(_CachedConvolutionTranspose, nn.ConvTranspose2d):
    """torch.nn.ConvTranspose2d through the cache."""


class ConvTranspose3d(_CachedConvolutionTranspose, nn.ConvTranspose3d):
    """torch.nn.ConvTranspose3d through the cache."""


_CACHED = {
    nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d,
    nn.ConvTranspose1d: ConvTranspose1d, nn.ConvTranspose2d: ConvTranspose2d, nn.ConvTranspose3d: ConvTranspose3d,
}


def convert(model: nn.Module) -> nn.Module:
    """Swaps every nn.Conv*d and nn.ConvTranspose*d in `model` (the model itself included) for its cached
    counterpart, in place, and returns the model.

    Only modules of exactly those classes are swapped (a user's subclass may override forward). The swap
    changes the class, not the module: parameters, buffers, hooks and state_dict keys stay as they are.
    """
    for module in model.modules():
        cached = _CACHED.get(type(module))
        if cached is not None:
            module.__class__ = cached
            module._prepare()
    return model
