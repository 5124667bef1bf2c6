#pragma once

// Which convolutions run through the cache, and which run as PyTorch runs them.
//
// Note [Which convolutions the cache runs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cudnn_cache replaces cuDNN's autotuning, not PyTorch's choice of kernel. A CUDA convolution runs through
// the cache exactly when PyTorch would run it with cuDNN: when at::native::select_conv_backend, the function
// aten::convolution itself asks, picks Cudnn or CudnnTranspose for it. Every other CUDA convolution runs
// PyTorch's own kernels, as it would without cudnn_cache. In torch 2.11 those include:
//   * transposed convolutions with output_padding >= stride (legal while it is < dilation): cuDNN has no such
//     problem, PyTorch runs its slow_conv_transpose kernels;
//   * depthwise convolutions in NCHW, which PyTorch gives its own depthwise kernels (but for some fp16
//     shapes; channels-last depthwise convolutions go to cuDNN), and dilated NCHW convolutions in
//     deterministic mode;
//   * inputs or outputs whose single sample has more than 2^31 - 1 elements (no 32-bit indexing);
//   * empty batches or channels, transposed convolutions whose output is empty, cuDNN disabled
//     (torch.backends.cudnn.enabled = False).
// One more rule is the cache's own: a call whose input or output has more than 2^31 - 1 elements in all
// (PyTorch splits those by batch for cuDNN) runs PyTorch's kernels too, since the cache keys cuDNN's 32-bit
// descriptors.
//
// This applies to both ways in: interception (the aten kernels) and the cudnn_cache ops (converted modules,
// cudnn_cache.functional, TorchScript). A call not taken runs aten::convolution with PyTorch's own autograd,
// so its gradients of every order, forward-mode AD and vmap are native by construction.
//
// On the CPU the ops run their own autograd over ATen's CPU kernels (so the tests without a GPU exercise the
// autograd the GPU uses), for the calls that the cached ops can express: tensors of float32, float16,
// bfloat16 or float64, not empty, on one device, and no transposed convolution with output_padding >= stride
// (the ops express a transposed convolution as the backward-data of a convolution, which that one is not).
// Everything else, on any device, is aten::convolution's: integer and complex dtypes PyTorch computes,
// empty inputs, arguments it rejects with its own errors, and, on the CPU, calls whose output ATen would give
// another memory format than the ops give on every device (cuDNN's rule: channels-last when input or weight
// is, never for float64; ATen's CPU kernels keep some of those contiguous, and some float64 ones channels-last).

#include <ATen/ATen.h>

#include <cstdint>

namespace cudnn_cache::torch_ops {

// Whether the convolution (transposed: the transposed convolution) of `input` by `weight` runs through the
// cache rather than as PyTorch runs it; see Note [Which convolutions the cache runs]. Arguments as
// aten::convolution takes them. A thread keeps its answers for CUDA tensors (Note [A thread's routing answers]).
bool runs_through_cache(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                        at::IntArrayRef output_padding, std::int64_t groups);

// Whether some output_padding is not smaller than its stride (a single stride value stands for every
// dimension). Such a transposed convolution is no backward-data of a convolution.
bool output_padding_exceeds_stride(at::IntArrayRef output_padding, at::IntArrayRef stride);

}  // namespace cudnn_cache::torch_ops
