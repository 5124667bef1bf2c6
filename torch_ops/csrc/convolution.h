#pragma once

// The convolution ops' kernels, one set per dispatch key (cpu/, cuda/, meta/, autograd/), and typed calls of
// the ops through the dispatcher for code that must not bypass it (autograd, composites).

#include <ATen/ATen.h>

#include <optional>

namespace cudnn_cache::torch_ops {

// cudnn_cache::convolution, convolution_transpose and the backward ops, through the dispatcher.
at::Tensor call_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                            std::int64_t groups);
at::Tensor call_convolution_transpose(const at::Tensor& input, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                      at::IntArrayRef padding, at::IntArrayRef output_padding,
                                      at::IntArrayRef dilation, std::int64_t groups);
at::Tensor call_backward_input(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups);
at::Tensor call_backward_weight(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                std::int64_t groups);

// Adds bias (C) to output (N, C, *spatial) in place.
void add_bias(at::Tensor& output, const std::optional<at::Tensor>& bias);

}  // namespace cudnn_cache::torch_ops
