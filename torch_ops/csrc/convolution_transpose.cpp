// The transposed convolution, written once for every backend: it is the backward-data of the convolution
// that maps its output to its input, so it runs through the same ops and the same backward-data cache.

#include <torch/library.h>

#include "convolution.h"
#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

at::Tensor convolution_transpose(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                 at::IntArrayRef padding, at::IntArrayRef output_padding, at::IntArrayRef dilation,
                                 std::int64_t groups) {
  check_tensors("convolution_transpose", input, weight, bias);
  const ConvolutionParams params =
      check_params("convolution_transpose", input, weight, stride, padding, dilation, groups, true);
  const auto extra = per_spatial_dim("convolution_transpose", "output_padding", output_padding,
                                     params.stride.size());
  const auto output_size = transposed_output_size(input.sizes(), weight.sizes(), params, extra);
  at::Tensor output =
      call_backward_input(input, weight, output_size, params.stride, params.padding, params.dilation, groups);
  add_bias(output, bias);
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeExplicitAutograd, m) {
  m.impl("convolution_transpose", &convolution_transpose);
}

}  // namespace cudnn_cache::torch_ops
