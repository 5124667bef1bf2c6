#include "problem.h"

#include <ATen/Context.h>
#include <ATen/cuda/EmptyTensor.h>

#include <array>
#include <cstring>

namespace cudnn_cache::torch_ops {

SpatialValues per_spatial_dim(const char* op, const char* name, at::IntArrayRef values, std::size_t spatial_dims) {
  TORCH_CHECK(values.size() == 1 || values.size() == spatial_dims, op, ": ", name, " has ", values.size(),
              " values but the input has ", spatial_dims, " spatial dimensions; give 1 or ", spatial_dims, " values");
  return values.size() == 1 ? SpatialValues(spatial_dims, values[0]) : SpatialValues(values.begin(), values.end());
}

namespace {

void check_channels(const char* op, std::int64_t input_channels, at::IntArrayRef weight_size, std::int64_t groups,
                    bool transposed) {
  const std::int64_t out_channels = transposed ? weight_size[1] * groups : weight_size[0];
  const std::int64_t per_group = transposed ? weight_size[0] / groups : weight_size[1];
  TORCH_CHECK(weight_size[0] % groups == 0, op, ": weight's first dimension (", weight_size[0],
              ") must be divisible by groups (", groups, ")");
  TORCH_CHECK(input_channels == (transposed ? weight_size[0] : weight_size[1] * groups), op, ": input has ",
              input_channels, " channels but weight of sizes ", weight_size, " with groups=", groups, " expects ",
              transposed ? weight_size[0] : weight_size[1] * groups, "; check in_channels and groups");
  TORCH_CHECK(out_channels > 0 && per_group > 0, op, ": weight of sizes ", weight_size, " is empty");
}

// The ranks every other check relies on: sizes are indexed by dimension after this.
void check_ranks(const char* op, const at::Tensor& input, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() >= 3 && weight.dim() <= 5, op, ": weight must be 3-D, 4-D or 5-D (out_channels, ",
              "in_channels / groups, *kernel) for a 1-D, 2-D or 3-D convolution, got sizes ", weight.sizes());
  TORCH_CHECK(input.dim() == weight.dim(), op, ": the input of a ", weight.dim() - 2, "-D convolution must be ",
              weight.dim(), "-D (N, C, *spatial), got ", input.dim(), "-D with sizes ", input.sizes());
}

}  // namespace

void check_sizes(const char* op, const char* name, at::IntArrayRef sizes, const at::Tensor& grad_output) {
  TORCH_CHECK(static_cast<std::int64_t>(sizes.size()) == grad_output.dim(), op, ": ", name, " has ", sizes.size(),
              " values but grad_output has ", grad_output.dim(), " dimensions (sizes ", grad_output.sizes(),
              "); give one size per dimension");
  for (const std::int64_t size : sizes) {
    TORCH_CHECK(size >= 0, op, ": ", name, " ", sizes, " has a negative size; give the sizes of the forward call");
  }
}

void check_tensors(const char* op, const at::Tensor& input, const at::Tensor& weight) {
  check_ranks(op, input, weight);
  TORCH_CHECK(input.device() == weight.device(), op, ": input is on ", input.device(), " but weight is on ",
              weight.device(), "; move both to one device");
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), op, ": input is ", input.scalar_type(), " but weight is ",
              weight.scalar_type(), "; convert one with .to(dtype)");
  cudnn_data_type(input.scalar_type(), "input");
}

void check_bias(const char* op, const at::Tensor& input, std::int64_t channels,
                const std::optional<at::Tensor>& bias) {
  if (!bias || !bias->defined()) return;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == channels, op, ": bias must be 1-D with one value per output ",
              "channel (", channels, "), got sizes ", bias->sizes(), "; pass a bias of ", channels, " values");
  TORCH_CHECK(bias->device() == input.device() && bias->scalar_type() == input.scalar_type(), op,
              ": bias must match input's device and dtype (", input.device(), ", ", input.scalar_type(), "), got ",
              bias->device(), ", ", bias->scalar_type(), "; move it with .to(input)");
}

ConvolutionParams check_params(const char* op, const at::Tensor& input, const at::Tensor& weight,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups, bool transposed) {
  check_ranks(op, input, weight);
  const auto spatial_dims = static_cast<std::size_t>(input.dim() - 2);
  ConvolutionParams params{per_spatial_dim(op, "stride", stride, spatial_dims),
                           per_spatial_dim(op, "padding", padding, spatial_dims),
                           per_spatial_dim(op, "dilation", dilation, spatial_dims), groups};
  for (std::size_t i = 0; i < spatial_dims; ++i) {
    TORCH_CHECK(params.stride[i] >= 1, op, ": stride must be >= 1, got ", stride);
    TORCH_CHECK(params.padding[i] >= 0, op, ": padding must be >= 0, got ", padding);
    TORCH_CHECK(params.dilation[i] >= 1, op, ": dilation must be >= 1, got ", dilation);
  }
  TORCH_CHECK(groups >= 1, op, ": groups must be >= 1, got ", groups);
  check_channels(op, input.size(1), weight.sizes(), groups, transposed);
  return params;
}

Sizes convolution_output_size(at::IntArrayRef input_size, at::IntArrayRef weight_size,
                              const ConvolutionParams& params) {
  Sizes size = output_size<std::int64_t>(input_size, weight_size, params, false, {});
  for (std::size_t d = 2; d < input_size.size(); ++d) {
    const auto s = d - 2;
    TORCH_CHECK(size[d] >= 1, "convolution: the kernel (", params.dilation[s] * (weight_size[d] - 1) + 1,
                " wide with dilation) is larger than the padded input (", input_size[d] + 2 * params.padding[s],
                ") in spatial dimension ", s, "; use a smaller kernel or dilation, or more padding");
  }
  return size;
}

Sizes transposed_output_size(at::IntArrayRef input_size, at::IntArrayRef weight_size,
                             const ConvolutionParams& params, at::IntArrayRef output_padding) {
  for (std::size_t s = 0; s + 2 < input_size.size(); ++s) {
    TORCH_CHECK(output_padding[s] >= 0 && output_padding[s] < params.stride[s],
                "convolution_transpose: output_padding ", output_padding, " is not smaller than stride ",
                at::IntArrayRef(params.stride), ". PyTorch allows that while it is smaller than dilation, and runs ",
                "such a convolution with its own kernels, not cuDNN's, so it has no cuDNN key and nothing to tune; ",
                "call the convolution itself (cudnn_cache.functional.conv_transpose*d, a converted module) and ",
                "it runs natively");
  }
  Sizes size = output_size<std::int64_t>(input_size, weight_size, params, true, output_padding);
  for (std::size_t d = 2; d < input_size.size(); ++d) {
    TORCH_CHECK(size[d] >= 1, "convolution_transpose: the output would be empty in spatial dimension ", d - 2,
                "; reduce padding");
  }
  return size;
}

at::MemoryFormat convolution_memory_format(const at::Tensor& a, const at::Tensor& b) {
  const auto dims = a.dim();
  if (dims == 3) return convolution_memory_format(a.unsqueeze(2), b.dim() == 3 ? b.unsqueeze(2) : b);
  // cuDNN has no channels-last algorithms for double; PyTorch keeps double contiguous too.
  if ((dims != 4 && dims != 5) || a.scalar_type() == at::kDouble) return at::MemoryFormat::Contiguous;
  const at::MemoryFormat channels_last = dims == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
  const bool wants_channels_last =
      a.suggest_memory_format() == channels_last || (b.dim() == dims && b.suggest_memory_format() == channels_last);
  return wants_channels_last ? channels_last : at::MemoryFormat::Contiguous;
}

at::Tensor contiguous_in(const at::Tensor& tensor, at::MemoryFormat format) {
  if (tensor.dim() == 3 && format == at::MemoryFormat::ChannelsLast) {
    return tensor.unsqueeze(2).contiguous(format).squeeze(2);
  }
  return tensor.contiguous(format);
}

at::Tensor empty_in(at::IntArrayRef sizes, const at::TensorOptions& options, at::MemoryFormat format) {
  const auto empty = [&](at::IntArrayRef shape) -> at::Tensor {
    if (options.device().is_cuda()) return at::detail::empty_cuda(shape, options.memory_format(format));
    return at::empty(shape, options.memory_format(format));
  };
  if (sizes.size() == 3 && format == at::MemoryFormat::ChannelsLast) {
    return empty({sizes[0], sizes[1], 1, sizes[2]}).squeeze(2);
  }
  return empty(sizes);
}

cudnnDataType_t cudnn_data_type(at::ScalarType type, const char* name) {
  switch (type) {
    case at::kFloat: return CUDNN_DATA_FLOAT;
    case at::kHalf: return CUDNN_DATA_HALF;
    case at::kBFloat16: return CUDNN_DATA_BFLOAT16;
    case at::kDouble: return CUDNN_DATA_DOUBLE;
    default:
      TORCH_CHECK(false, "cudnn_cache: ", name, " has dtype ", type,
                  "; cuDNN convolutions take float32, float16, bfloat16 or float64. Convert with .to(torch.float32)");
  }
}

cudnnMathType_t cudnn_math_type(at::ScalarType type) {
  switch (type) {
    case at::kHalf:
    case at::kBFloat16: return CUDNN_TENSOR_OP_MATH;
    case at::kFloat: return at::globalContext().allowTF32CuDNN() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}

bool deterministic_requested() {
  return at::globalContext().deterministicCuDNN() || at::globalContext().deterministicAlgorithms();
}

Problem make_problem(const at::Tensor& x, const at::Tensor& w, const at::Tensor& y, const ConvolutionParams& params,
                     at::MemoryFormat memory_format) {
  const cudnnDataType_t type = cudnn_data_type(x.scalar_type(), "input");
  const auto span = [](at::IntArrayRef values) { return IntSpan(values.data(), values.size()); };
  const Layout layout = memory_format == at::MemoryFormat::Contiguous ? Layout::nchw : Layout::nhwc;
  return rethrow([&] {
    return Problem{make_convolution_key(
        Direction::forward, make_tensor_key(type, span(x.sizes()), span(x.strides()), "input"),
        make_filter_key(type, span(w.sizes()), layout), make_tensor_key(type, span(y.sizes()), span(y.strides()), "output"),
        make_convolution_descriptor_key(span(params.padding), span(params.stride), span(params.dilation),
                                        params.groups, CUDNN_CROSS_CORRELATION, default_compute_type(type),
                                        cudnn_math_type(x.scalar_type())))};
  });
}

Direction direction_from_string(const std::string& name) {
  for (Direction direction : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
    if (name == to_string(direction)) return direction;
  }
  TORCH_CHECK(false, "cudnn_cache: unknown direction '", name, "'; use 'forward', 'backward_data' or 'backward_filter'");
}

namespace {

constexpr std::size_t kKeyWords = sizeof(ConvolutionKey) / sizeof(std::int32_t);

}  // namespace

std::vector<std::int64_t> key_to_list(const ConvolutionKey& key) {
  std::array<std::int32_t, kKeyWords> words{};
  std::memcpy(words.data(), &key, sizeof key);
  return std::vector<std::int64_t>(words.begin(), words.end());
}

ConvolutionKey key_from_list(at::IntArrayRef words) {
  TORCH_CHECK(words.size() == kKeyWords, "cudnn_cache: a key has ", kKeyWords, " values, got ", words.size(),
              "; pass what conv_key returned");
  std::array<std::int32_t, kKeyWords> narrow{};
  for (std::size_t i = 0; i < kKeyWords; ++i) narrow[i] = static_cast<std::int32_t>(words[i]);
  ConvolutionKey key;
  std::memcpy(static_cast<void*>(&key), narrow.data(), sizeof key);
  const std::string problem = check_key(key);
  TORCH_CHECK(problem.empty(), "cudnn_cache: not a valid key (", problem, "); pass what conv_key returned");
  return key;
}

std::string bytes_of(const at::Tensor& data, const char* op, const std::string& source) {
  TORCH_CHECK(data.scalar_type() == at::kByte && data.dim() == 1, "cudnn_cache.", op, ": ", source,
              ": expected a 1-D uint8 tensor of checkpoint bytes, got ", data.scalar_type(), " of ", data.dim(),
              " dimensions");
  const at::Tensor bytes = data.to(at::kCPU).contiguous();
  return {static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())};
}

Origin origin_from(const std::string& name, at::IntArrayRef numbers, const char* op) {
  TORCH_CHECK(numbers.size() == 5, "cudnn_cache.", op,
              ": an origin is a name and 5 numbers (compute capability "
              "major, minor, SM count, cuDNN major, minor), got ",
              numbers.size(), " numbers");
  TORCH_CHECK(!name.empty(), "cudnn_cache.", op, ": an origin needs a device name");
  return Origin{DeviceIdentity{name, static_cast<std::int32_t>(numbers[0]), static_cast<std::int32_t>(numbers[1]),
                               static_cast<std::int32_t>(numbers[2])},
                static_cast<std::int32_t>(numbers[3]), static_cast<std::int32_t>(numbers[4])};
}

}  // namespace cudnn_cache::torch_ops
