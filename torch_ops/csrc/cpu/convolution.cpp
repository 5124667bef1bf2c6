// CPU kernels: native at::convolution, so models that use the ops run (and the tests pass) without a GPU. Their
// outputs take the memory format the Meta and CUDA kernels give, so traced strides hold on every device.

#include <torch/library.h>

#include "../convolution.h"
#include "../problem.h"

namespace cudnn_cache::torch_ops {
namespace {

std::vector<std::int64_t> zeros(std::size_t count) { return std::vector<std::int64_t>(count, 0); }

at::Tensor forward_cpu(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                       const std::optional<at::Tensor>& bias) {
  check_tensors("_convolution_forward", input, weight);
  const ConvolutionParams params =
      check_params("_convolution_forward", input, weight, stride, padding, dilation, groups);
  convolution_output_size(input.sizes(), weight.sizes(), params);  // checks the kernel fits
  at::Tensor output = contiguous_in(at::convolution(input, weight, std::nullopt, params.stride, params.padding,
                                                    params.dilation, false, zeros(params.stride.size()), groups),
                                    convolution_memory_format(input, weight));
  add_bias("_convolution_forward", output, bias);
  return output;
}

// at::convolution_backward needs the tensors whose gradient is not asked for only for their sizes.
at::Tensor backward_input_cpu(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                              std::int64_t groups, const std::optional<at::Tensor>& bias) {
  check_sizes("_convolution_backward_input", "input_size", input_size, grad_output);
  const at::Tensor input = at::empty(input_size, grad_output.options());
  const ConvolutionParams params = check_params("_convolution_backward_input", input, weight, stride, padding,
                                                dilation, groups);
  at::Tensor grad_input = contiguous_in(
      std::get<0>(at::convolution_backward(grad_output, input, weight, std::nullopt, params.stride, params.padding,
                                           params.dilation, false, zeros(params.stride.size()), groups,
                                           {true, false, false})),
      convolution_memory_format(grad_output, weight));
  add_bias("_convolution_backward_input", grad_input, bias);
  return grad_input;
}

at::Tensor backward_weight_cpu(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups) {
  check_sizes("_convolution_backward_weight", "weight_size", weight_size, grad_output);
  const at::Tensor weight = at::empty(weight_size, grad_output.options());
  const ConvolutionParams params = check_params("_convolution_backward_weight", input, weight, stride, padding,
                                                dilation, groups);
  return contiguous_in(std::get<1>(at::convolution_backward(grad_output, input, weight, std::nullopt, params.stride,
                                                            params.padding, params.dilation, false,
                                                            zeros(params.stride.size()), groups, {false, true, false})),
                       convolution_memory_format(input, grad_output));
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CPU, m) {
  m.impl("_convolution_forward", &forward_cpu);
  m.impl("_convolution_backward_input", &backward_input_cpu);
  m.impl("_convolution_backward_weight", &backward_weight_cpu);
}

}  // namespace cudnn_cache::torch_ops
