#include "routing.h"

#include <ATen/native/ConvUtils.h>

#include <limits>

#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

bool cudnn_data_type(at::ScalarType type) {
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kDouble;
}

// Whether the convolution has an output (a transposed one may have none) and, on CUDA, whether input, weight
// and output each have at most 2^31 - 1 elements, so that the cache's keys hold them whole. PyTorch has checked
// the arguments by now.
bool has_keyable_output(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                        at::IntArrayRef output_padding, std::int64_t groups) {
  const auto spatial_dims = static_cast<std::size_t>(input.dim() - 2);
  const ConvolutionParams params{per_spatial_dim("convolution", "stride", stride, spatial_dims),
                                 per_spatial_dim("convolution", "padding", padding, spatial_dims),
                                 per_spatial_dim("convolution", "dilation", dilation, spatial_dims), groups};
  const SizesOf<c10::SymInt> output = output_size<c10::SymInt>(
      input.sym_sizes(), weight.sym_sizes(), params, transposed,
      transposed ? per_spatial_dim("convolution", "output_padding", output_padding, spatial_dims)
                 : SpatialValues(spatial_dims, 0));
  c10::SymInt elements = 1;
  for (std::size_t d = 0; d < output.size(); ++d) {
    if (d >= 2 && output[d] < 1) return false;
    elements = elements * output[d];
  }
  return !input.is_cuda() ||
         (input.sym_numel() <= kInt32Max && weight.sym_numel() <= kInt32Max && elements <= kInt32Max);
}

}  // namespace

bool output_padding_exceeds_stride(at::IntArrayRef output_padding, at::IntArrayRef stride) {
  for (std::size_t i = 0; i < output_padding.size(); ++i) {
    const std::int64_t s = stride.size() == 1 ? stride[0] : i < stride.size() ? stride[i] : 1;
    if (output_padding[i] >= s) return true;
  }
  return false;
}

bool runs_through_cache(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                        at::IntArrayRef output_padding, std::int64_t groups) {
  // What the cached ops can express at all: a dense convolution of tensors of one cuDNN data type, on one
  // device, with something to compute. The rest (PyTorch may take it, or raise) goes to PyTorch.
  const at::ScalarType type = input.scalar_type();
  if (!cudnn_data_type(type) || weight.scalar_type() != type || weight.device() != input.device() ||
      input.layout() != at::kStrided || weight.layout() != at::kStrided || input.sym_numel() == 0 ||
      weight.sym_numel() == 0 || (transposed && output_padding_exceeds_stride(output_padding, stride))) {
    return false;
  }
  if (input.is_meta()) return true;  // shapes only
  const at::native::ConvBackend backend = at::native::select_conv_backend(
      input, weight, std::nullopt, c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding),
      c10::fromIntArrayRefSlow(dilation), transposed, c10::fromIntArrayRefSlow(output_padding), groups, std::nullopt);
  const bool taken =
      input.is_cuda() ? backend == at::native::ConvBackend::Cudnn || backend == at::native::ConvBackend::CudnnTranspose
                      // Elsewhere ATen's kernels compute the ops, whose outputs take one memory format on every device
                      // (the meta kernels' too); where ATen's own would take another, the call is aten::convolution's.
                      : at::native::_determine_backend_memory_format(input, weight, backend) ==
                            convolution_memory_format(input, weight);
  return taken && has_keyable_output(input, weight, stride, padding, dilation, transposed, output_padding, groups);
}

}  // namespace cudnn_cache::torch_ops
