#pragma once

// Adapts PyTorch tensors and convolution arguments to the core's keys. Everything cuDNN-specific stays in
// the core; this file only reads sizes, strides, dtypes and global settings off PyTorch.

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <utility>
#include <vector>

#include "cudnn_cache/device.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"

namespace cudnn_cache::torch_ops {

// Runs f, turning the core's Error into a TORCH_CHECK failure (a RuntimeError in Python) with its message.
template <typename F>
decltype(auto) rethrow(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const cudnn_cache::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// One value per spatial dimension (at most 3), and a convolution's sizes (at most 5 dimensions): held inline,
// so that a call computes them without allocating (issue 15: no heap allocation per call on the hot path).
using SpatialValues = c10::SmallVector<std::int64_t, 3>;
template <typename Size>
using SizesOf = c10::SmallVector<Size, 5>;
using Sizes = SizesOf<std::int64_t>;

// Padding, stride and dilation with one value per spatial dimension, as the ops receive them. A single value
// is repeated for every spatial dimension, as in torch.nn.functional.
struct ConvolutionParams {
  SpatialValues stride, padding, dilation;
  std::int64_t groups = 1;
};

// Checks the arguments of a convolution (or, with `transposed`, a transposed convolution) of `input`
// (N, C, *spatial) by `weight`, including their ranks and channels against groups, and repeats single values;
// every failure names the argument and what to pass instead.
ConvolutionParams check_params(const char* op, const at::Tensor& input, const at::Tensor& weight,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups, bool transposed = false);

// One value per spatial dimension: a single value is repeated; otherwise there must be exactly spatial_dims.
SpatialValues per_spatial_dim(const char* op, const char* name, at::IntArrayRef values, std::size_t spatial_dims);

// Checks a size list a backward op receives (`name`: input_size or weight_size): one size per dimension of
// grad_output, none negative.
void check_sizes(const char* op, const char* name, at::IntArrayRef sizes, const at::Tensor& grad_output);

// Checks the tensors of a convolution: same device and dtype, a supported dtype, matching ranks.
void check_tensors(const char* op, const at::Tensor& input, const at::Tensor& weight);

// Checks a bias for the convolution of `input` with `channels` output channels: that many values, on input's
// device, of its dtype.
void check_bias(const char* op, const at::Tensor& input, std::int64_t channels, const std::optional<at::Tensor>& bias);

// The output sizes of a convolution (transposed: of a transposed convolution, with its output padding), a
// spatial size below 1 where there would be no output; unchecked. Size is std::int64_t, or c10::SymInt for
// the symbolic shapes torch.compile traces with.
template <typename Size>
SizesOf<Size> output_size(c10::ArrayRef<Size> input_size, c10::ArrayRef<Size> weight_size,
                          const ConvolutionParams& params, bool transposed, at::IntArrayRef output_padding) {
  SizesOf<Size> size{input_size[0], transposed ? weight_size[1] * params.groups : weight_size[0]};
  for (std::size_t d = 2; d < input_size.size(); ++d) {
    const auto s = d - 2;
    const Size span = (weight_size[d] - 1) * params.dilation[s] + 1;
    if (transposed) {
      size.push_back((input_size[d] - 1) * params.stride[s] - 2 * params.padding[s] + span + output_padding[s]);
    } else {
      const Size room = input_size[d] + 2 * params.padding[s] - span;
      size.push_back(room < 0 ? Size(0) : room / params.stride[s] + 1);
    }
  }
  return size;
}

// The same, checked: every failure says what to change.
Sizes convolution_output_size(at::IntArrayRef input_size, at::IntArrayRef weight_size,
                              const ConvolutionParams& params);
Sizes transposed_output_size(at::IntArrayRef input_size, at::IntArrayRef weight_size,
                             const ConvolutionParams& params, at::IntArrayRef output_padding);

// The memory format cuDNN should see: channels-last when either tensor is (never for double), as PyTorch does.
// The (N, C, L) tensors of a 1-D convolution are judged as the (N, C, 1, L) views PyTorch gives cuDNN, the
// input once made contiguous as PyTorch makes it (cudnn_input): a weight transposed from (O, K, C) is channels-last.
at::MemoryFormat convolution_memory_format(const at::Tensor& a, const at::Tensor& b);

// `tensor` dense in `format` (itself if it is); a 3-D tensor in ChannelsLast is laid out as its (N, C, 1, L)
// view is in channels-last, strides (L * C, 1, C).
at::Tensor contiguous_in(const at::Tensor& tensor, at::MemoryFormat format);

// An uninitialised tensor of `sizes` dense in `format`, 3-D ones as contiguous_in lays them out: what a
// convolution writes in full. On CUDA it is allocated as PyTorch's own cuDNN convolutions allocate their outputs
// (at::detail::empty_cuda), without the NaN fill at::empty adds under torch.use_deterministic_algorithms
// (torch.utils.deterministic.fill_uninitialized_memory): cuDNN overwrites every element, and the fill was a
// kernel per output, 40 in a ResNet-18 training step (0.2 ms, 3% of its GPU time on an H200).
at::Tensor empty_in(at::IntArrayRef sizes, const at::TensorOptions& options, at::MemoryFormat format);

// cuDNN's data type for a PyTorch dtype; fails naming the dtype for anything but float, half, bfloat16, double.
cudnnDataType_t cudnn_data_type(at::ScalarType type, const char* name);

// The math type PyTorch would use: TF32 tensor ops for float only when torch.backends.cudnn.allow_tf32.
cudnnMathType_t cudnn_math_type(at::ScalarType type);

// Whether deterministic algorithms are required (torch.use_deterministic_algorithms or cudnn.deterministic).
bool deterministic_requested();

// A convolution problem in cuDNN's terms: y = conv(x, w). A transposed convolution of input I giving output O
// is the problem x = O, y = I (it runs as backward-data).
struct Problem {
  ConvolutionKey key;  // direction forward; key_for() gives the others

  ConvolutionKey key_for(Direction direction) const {
    ConvolutionKey result = key;
    result.direction = static_cast<std::int32_t>(direction);
    return result;
  }
};

// The problem of tensors x, w and y as cuDNN will see them (their sizes, strides and dtype).
Problem make_problem(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, const ConvolutionParams& params,
                     at::MemoryFormat memory_format);

// A key as the int32 words Python sees (conv_key), and back; the second checks the words and fails saying
// what to pass.
std::vector<std::int64_t> key_to_list(const ConvolutionKey& key);
ConvolutionKey key_from_list(at::IntArrayRef words);

// The origin of a device name and 5 numbers (compute capability major, minor, SM count, cuDNN major, minor), as
// Python passes one; fails naming `op` and what an origin is.
Origin origin_from(const std::string& name, at::IntArrayRef numbers, const char* op);

// The bytes a 1-D uint8 tensor (on any device) holds, as Python passes a cache file's; fails naming `op` and
// `source` for anything else.
std::string bytes_of(const at::Tensor& data, const char* op, const std::string& source);

// The direction named "forward", "backward_data" or "backward_filter".
Direction direction_from_string(const std::string& name);

}  // namespace cudnn_cache::torch_ops
