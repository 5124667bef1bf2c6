// Meta kernels: shapes, dtypes and memory formats only, for torch.compile's fake tensors and shape inference.

#include <torch/library.h>

#include "../convolution.h"
#include "../problem.h"

namespace cudnn_cache::torch_ops {
namespace {

at::Tensor forward_meta(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                        const std::optional<at::Tensor>& bias) {
  check_tensors("_convolution_forward", input, weight);
  const ConvolutionParams params =
      check_params("_convolution_forward", input, weight, stride, padding, dilation, groups);
  at::Tensor output = empty_in(convolution_output_size(input.sizes(), weight.sizes(), params), input.options(),
                               convolution_memory_format(input, weight));
  add_bias("_convolution_forward", output, bias);
  return output;
}

at::Tensor backward_input_meta(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                               at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, std::int64_t,
                               const std::optional<at::Tensor>& bias) {
  check_sizes("_convolution_backward_input", "input_size", input_size, grad_output);
  at::Tensor grad_input = empty_in(input_size, grad_output.options(), convolution_memory_format(grad_output, weight));
  add_bias("_convolution_backward_input", grad_input, bias);
  return grad_input;
}

at::Tensor backward_weight_meta(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, std::int64_t) {
  check_sizes("_convolution_backward_weight", "weight_size", weight_size, grad_output);
  return empty_in(weight_size, input.options(), convolution_memory_format(input, grad_output));
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, Meta, m) {
  m.impl("_convolution_forward", &forward_meta);
  m.impl("_convolution_backward_input", &backward_input_meta);
  m.impl("_convolution_backward_weight", &backward_weight_meta);
}

}  // namespace cudnn_cache::torch_ops
