#include "cudnn_cache/key.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <sstream>

#include "cudnn_cache/error.h"

namespace cudnn_cache {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

// The first `count` values, as "[1, 2, 3]".
template <typename Values>
void print_list(std::ostream& out, const Values& values, int count) {
  out << '[';
  for (int i = 0; i < count; ++i) out << (i ? ", " : "") << values[i];
  out << ']';
}

void check_data_type(cudnnDataType_t data_type, const char* name) {
  CUDNN_CACHE_REQUIRE(is_supported_data_type(data_type), name, ": cuDNN data type ", static_cast<int>(data_type),
                      " is not supported; use float, half, bfloat16 or double");
}

// Checks a rank-3/4/5 size list and returns it as cuDNN dims, rank 3 carried as rank 4 (Note [Canonical keys]).
int to_dims(IntSpan sizes, const char* name, std::array<std::int32_t, kMaxTensorDims>& dims) {
  const auto rank = sizes.size();
  const auto sizes_text = [&] {
    std::ostringstream text;
    print_list(text, sizes, static_cast<int>(rank));
    return text.str();
  };
  if (rank < 3 || rank > 5) {
    throw Error(detail::concat(name, " has ", rank, " dimensions ", sizes_text(),
                               "; cuDNN convolutions take 3-D (N, C, L), 4-D (N, C, H, W) or 5-D (N, C, D, H, W)"));
  }
  for (std::size_t i = 0; i < rank; ++i) {
    if (sizes[i] < 1 || sizes[i] > kInt32Max) {
      throw Error(detail::concat(name, " sizes ", sizes_text(), ": every size must be in [1, 2^31 - 1]; ",
                                 sizes[i] < 1 ? "empty tensors have no cuDNN convolution"
                                              : "split the tensor to stay within cuDNN's 32-bit sizes"));
    }
  }
  const bool carried_as_2d = rank == 3;
  int out = 0;
  for (std::size_t i = 0; i < rank; ++i) {
    if (carried_as_2d && i == 2) dims[out++] = 1;
    dims[out++] = static_cast<std::int32_t>(sizes[i]);
  }
  return out;
}

// See Note [Canonical keys]. Works in 64 bits and fails if a stride leaves cuDNN's 32-bit range.
void canonicalize_strides(TensorKey& key, std::array<std::int64_t, kMaxTensorDims>& strides, const char* name) {
  const int n = key.nb_dims;
  bool channels_last = false;
  if (key.dims[1] > 1) {
    for (int d = 2; d < n; ++d) channels_last |= key.dims[d] > 1 && strides[1] < strides[d];
  }
  std::array<int, kMaxTensorDims> innermost_first{};
  int k = 0;
  if (channels_last) innermost_first[k++] = 1;
  for (int d = n - 1; d >= 2; --d) innermost_first[k++] = d;
  if (!channels_last) innermost_first[k++] = 1;
  innermost_first[k++] = 0;

  std::int64_t extent = 1;
  std::int64_t last_element = 0;
  for (int i = 0; i < n; ++i) {
    const int d = innermost_first[i];
    if (key.dims[d] == 1) {
      strides[d] = extent;
    } else {
      CUDNN_CACHE_REQUIRE(strides[d] >= 1, name, ": stride ", strides[d], " of dimension ", d,
                          " is not supported (broadcast or negative strides); call .contiguous() first");
      extent = strides[d] * key.dims[d];
      last_element += strides[d] * (key.dims[d] - 1);
    }
    CUDNN_CACHE_REQUIRE(strides[d] <= kInt32Max && last_element <= kInt32Max, name,
                        " spans more elements than cuDNN's 32-bit indexing allows; split the batch");
    key.strides[d] = static_cast<std::int32_t>(strides[d]);
  }
}

// The output size of one spatial dimension, or 0 when the dilated kernel does not fit the padded input
// (checked before dividing: C++ division truncates toward zero and would turn a small overhang into size 1).
std::int64_t output_size(std::int64_t input, std::int64_t kernel, std::int64_t padding, std::int64_t stride,
                         std::int64_t dilation) {
  const std::int64_t room = input + 2 * padding - dilation * (kernel - 1) - 1;
  return room < 0 ? 0 : room / stride + 1;
}

std::string problem(const std::string& what, const ConvolutionKey& key) {
  return detail::concat(what, " (", key, ")");
}

}  // namespace

const char* math_type_name(std::int32_t math_type) {
  switch (math_type) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor-op-allow-conversion";
    case CUDNN_FMA_MATH: return "fma";
    default: return nullptr;
  }
}

const char* convolution_mode_name(std::int32_t mode) {
  switch (mode) {
    case CUDNN_CONVOLUTION: return "convolution";
    case CUDNN_CROSS_CORRELATION: return "cross-correlation";
    default: return nullptr;
  }
}

const char* to_string(Direction direction) {
  switch (direction) {
    case Direction::forward: return "forward";
    case Direction::backward_data: return "backward_data";
    case Direction::backward_filter: return "backward_filter";
  }
  return "unknown-direction";
}

std::ostream& operator<<(std::ostream& out, Direction direction) { return out << to_string(direction); }

bool is_supported_data_type(std::int32_t data_type) {
  return data_type == CUDNN_DATA_FLOAT || data_type == CUDNN_DATA_HALF || data_type == CUDNN_DATA_BFLOAT16 ||
         data_type == CUDNN_DATA_DOUBLE;
}

std::string data_type_name(std::int32_t data_type) {
  switch (data_type) {
    case CUDNN_DATA_FLOAT: return "float";
    case CUDNN_DATA_HALF: return "half";
    case CUDNN_DATA_BFLOAT16: return "bfloat16";
    case CUDNN_DATA_DOUBLE: return "double";
    default: return detail::concat("data-type-", data_type);
  }
}

cudnnDataType_t default_compute_type(cudnnDataType_t data_type) {
  return data_type == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

TensorKey make_tensor_key(cudnnDataType_t data_type, IntSpan sizes, IntSpan strides, const char* name) {
  check_data_type(data_type, name);
  TensorKey key;
  key.data_type = data_type;
  key.nb_dims = to_dims(sizes, name, key.dims);
  CUDNN_CACHE_REQUIRE(strides.size() == sizes.size(), name, " has ", sizes.size(), " sizes but ", strides.size(),
                      " strides; give one stride per dimension");
  std::array<std::int64_t, kMaxTensorDims> wide{};
  for (std::size_t i = 0, out = 0; i < strides.size(); ++i) {
    if (sizes.size() == 3 && i == 2) wide[out++] = 0;  // the inserted size-1 dimension; canonicalised below
    wide[out++] = strides[i];
  }
  canonicalize_strides(key, wide, name);
  return key;
}

TensorKey make_tensor_key(cudnnDataType_t data_type, IntSpan sizes, Layout layout, const char* name) {
  check_data_type(data_type, name);
  TensorKey key;
  key.data_type = data_type;
  key.nb_dims = to_dims(sizes, name, key.dims);
  const int n = key.nb_dims;
  std::array<std::int64_t, kMaxTensorDims> strides{};
  // Saturates just past cuDNN's range, which canonicalize_strides refuses: five sizes of up to 2^31 - 1 would
  // overflow 64 bits (a fuzzed file's key did, printed in its error message).
  std::int64_t extent = 1;
  auto pack = [&](int d) {
    strides[d] = extent;
    extent = std::min(extent * key.dims[d], kInt32Max + 1);
  };
  if (layout == Layout::nhwc) pack(1);
  for (int d = n - 1; d >= 2; --d) pack(d);
  if (layout != Layout::nhwc) pack(1);
  pack(0);
  canonicalize_strides(key, strides, name);
  return key;
}

FilterKey make_filter_key(cudnnDataType_t data_type, IntSpan sizes, Layout format) {
  check_data_type(data_type, "weight");
  CUDNN_CACHE_REQUIRE(format == Layout::nchw || format == Layout::nhwc, "weight: format ",
                      static_cast<int>(format), " is not supported; use Layout::nchw or Layout::nhwc");
  FilterKey key;
  key.data_type = data_type;
  key.format = static_cast<std::int32_t>(format);
  key.nb_dims = to_dims(sizes, "weight", key.dims);
  return key;
}

ConvolutionDescriptorKey make_convolution_descriptor_key(IntSpan padding, IntSpan stride, IntSpan dilation,
                                                         std::int64_t groups, cudnnConvolutionMode_t mode,
                                                         cudnnDataType_t compute_type,
                                                         cudnnMathType_t math_type) {
  const auto n = padding.size();
  CUDNN_CACHE_REQUIRE(n >= 1 && n <= kMaxSpatialDims && stride.size() == n && dilation.size() == n,
                      "convolution: padding, stride and dilation need one value per spatial dimension (1 to 3), got ",
                      padding.size(), ", ", stride.size(), " and ", dilation.size(), " values");
  CUDNN_CACHE_REQUIRE(groups >= 1 && groups <= kInt32Max, "convolution: groups is ", groups, "; it must be >= 1");
  CUDNN_CACHE_REQUIRE(convolution_mode_name(mode) != nullptr, "convolution: mode ", static_cast<int>(mode),
                      " is not a cudnnConvolutionMode_t");
  CUDNN_CACHE_REQUIRE(is_supported_data_type(compute_type), "convolution: compute type ",
                      data_type_name(compute_type), " is not supported; use float or double");
  CUDNN_CACHE_REQUIRE(math_type_name(math_type) != nullptr, "convolution: math type ",
                      static_cast<int>(math_type), " is not a cudnnMathType_t");
  ConvolutionDescriptorKey key;
  const bool carried_as_2d = n == 1;
  key.nb_spatial_dims = static_cast<std::int32_t>(carried_as_2d ? 2 : n);
  for (std::size_t i = 0, out = 0; i < n; ++i, ++out) {
    CUDNN_CACHE_REQUIRE(padding[i] >= 0 && padding[i] <= kInt32Max, "convolution: padding ", padding[i],
                        " must be >= 0");
    CUDNN_CACHE_REQUIRE(stride[i] >= 1 && stride[i] <= kInt32Max, "convolution: stride ", stride[i], " must be >= 1");
    CUDNN_CACHE_REQUIRE(dilation[i] >= 1 && dilation[i] <= kInt32Max, "convolution: dilation ", dilation[i],
                        " must be >= 1");
    if (carried_as_2d) {
      key.padding[out] = 0;
      key.stride[out] = 1;
      key.dilation[out] = 1;
      ++out;
    }
    key.padding[out] = static_cast<std::int32_t>(padding[i]);
    key.stride[out] = static_cast<std::int32_t>(stride[i]);
    key.dilation[out] = static_cast<std::int32_t>(dilation[i]);
  }
  key.mode = mode;
  key.compute_type = compute_type;
  key.groups = static_cast<std::int32_t>(groups);
  key.math_type = math_type;
  return key;
}

ConvolutionKey make_convolution_key(Direction direction, const TensorKey& input, const FilterKey& weight,
                                    const TensorKey& output, const ConvolutionDescriptorKey& convolution) {
  ConvolutionKey key;
  key.direction = static_cast<std::int32_t>(direction);
  key.input = input;
  key.weight = weight;
  key.output = output;
  key.convolution = convolution;
  CUDNN_CACHE_REQUIRE(direction == Direction::forward || direction == Direction::backward_data ||
                          direction == Direction::backward_filter,
                      "direction ", static_cast<int>(direction), " is not a Direction");
  const int n = input.nb_dims;
  CUDNN_CACHE_REQUIRE(n >= 4 && n <= kMaxTensorDims, problem("input must have 4 or 5 dimensions", key));
  CUDNN_CACHE_REQUIRE(convolution.groups >= 1, problem("groups must be >= 1", key));
  CUDNN_CACHE_REQUIRE(weight.nb_dims == n && output.nb_dims == n && convolution.nb_spatial_dims == n - 2,
                      problem("input, weight, output and convolution disagree on the number of spatial dimensions",
                              key));
  CUDNN_CACHE_REQUIRE(weight.data_type == input.data_type && output.data_type == input.data_type,
                      problem("input, weight and output must have one data type", key));
  const std::int64_t groups = convolution.groups;
  CUDNN_CACHE_REQUIRE(weight.dims[0] % groups == 0,
                      problem(detail::concat("weight has ", weight.dims[0], " output channels, not divisible by groups ",
                                             groups),
                              key));
  CUDNN_CACHE_REQUIRE(input.dims[1] == weight.dims[1] * groups,
                      problem(detail::concat("input has ", input.dims[1], " channels but weight expects ",
                                             weight.dims[1], " x groups ", groups, " = ", weight.dims[1] * groups,
                                             "; check in_channels and groups"),
                              key));
  CUDNN_CACHE_REQUIRE(output.dims[0] == input.dims[0] && output.dims[1] == weight.dims[0],
                      problem(detail::concat("output must be (", input.dims[0], ", ", weight.dims[0],
                                             ", ...): batch of input, channels of weight"),
                              key));
  for (int d = 2; d < n; ++d) {
    const int s = d - 2;
    const std::int64_t expected = output_size(input.dims[d], weight.dims[d], convolution.padding[s],
                                              convolution.stride[s], convolution.dilation[s]);
    CUDNN_CACHE_REQUIRE(expected >= 1 && output.dims[d] == expected,
                        problem(detail::concat("output size ", output.dims[d], " of dimension ", d,
                                               " does not match the ", expected, " that input ", input.dims[d],
                                               ", kernel ", weight.dims[d], ", padding ", convolution.padding[s],
                                               ", stride ", convolution.stride[s], " and dilation ",
                                               convolution.dilation[s], " give"),
                                key));
  }
  return key;
}

namespace {

std::string check_dims(const std::array<std::int32_t, kMaxTensorDims>& values, int count, const char* what) {
  for (int i = 0; i < kMaxTensorDims; ++i) {
    const bool used = i < count;
    if (used && values[i] < 1) return detail::concat(what, " ", i, " is ", values[i]);
    if (!used && values[i] != 0) return detail::concat("unused ", what, " slot ", i, " is not zero");
  }
  return {};
}

std::string check_tensor(const TensorKey& key, const char* name) {
  if (!is_supported_data_type(key.data_type)) return detail::concat(name, ": unsupported data type ", key.data_type);
  if (key.nb_dims != 4 && key.nb_dims != 5) return detail::concat(name, ": rank ", key.nb_dims, " is not 4 or 5");
  auto error = check_dims(key.dims, key.nb_dims, "size");
  if (error.empty()) error = check_dims(key.strides, key.nb_dims, "stride");
  if (error.empty()) {
    TensorKey canonical = key;
    std::array<std::int64_t, kMaxTensorDims> strides{};
    for (int d = 0; d < key.nb_dims; ++d) strides[d] = key.strides[d];
    try {
      canonicalize_strides(canonical, strides, name);
    } catch (const Error& e) {
      return e.what();
    }
    if (canonical != key) error = "strides are not canonical";
  }
  return error.empty() ? error : detail::concat(name, ": ", error);
}

}  // namespace

std::string check_key(const ConvolutionKey& key) {
  if (key.direction < 0 || key.direction >= kDirectionCount) {
    return detail::concat("direction ", key.direction, " is not a Direction");
  }
  for (const auto& error : {check_tensor(key.input, "input"), check_tensor(key.output, "output")}) {
    if (!error.empty()) return error;
  }
  const FilterKey& w = key.weight;
  if (!is_supported_data_type(w.data_type)) return detail::concat("weight: unsupported data type ", w.data_type);
  if (w.format != CUDNN_TENSOR_NCHW && w.format != CUDNN_TENSOR_NHWC) {
    return detail::concat("weight: format ", w.format, " is not NCHW or NHWC");
  }
  if (w.nb_dims != 4 && w.nb_dims != 5) return detail::concat("weight: rank ", w.nb_dims, " is not 4 or 5");
  if (auto error = check_dims(w.dims, w.nb_dims, "weight size"); !error.empty()) return error;

  const ConvolutionDescriptorKey& c = key.convolution;
  if (c.nb_spatial_dims < 2 || c.nb_spatial_dims > kMaxSpatialDims) {
    return detail::concat("convolution: ", c.nb_spatial_dims, " spatial dimensions");
  }
  for (int i = c.nb_spatial_dims; i < kMaxSpatialDims; ++i) {
    if (c.padding[i] != 0 || c.stride[i] != 0 || c.dilation[i] != 0) return "convolution: unused slot is not zero";
  }
  for (int i = 0; i < c.nb_spatial_dims; ++i) {
    if (c.padding[i] < 0 || c.stride[i] < 1 || c.dilation[i] < 1) {
      return detail::concat("convolution: bad padding/stride/dilation in dimension ", i);
    }
  }
  if (!convolution_mode_name(c.mode)) return detail::concat("convolution: mode ", c.mode, " is not a cudnnConvolutionMode_t");
  if (!is_supported_data_type(c.compute_type)) return detail::concat("convolution: compute type ", c.compute_type);
  if (!math_type_name(c.math_type)) return detail::concat("convolution: math type ", c.math_type);
  if (c.groups < 1) return detail::concat("convolution: groups ", c.groups);
  try {
    make_convolution_key(static_cast<Direction>(key.direction), key.input, key.weight, key.output, key.convolution);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

std::string layout_name(const TensorKey& key) {
  // A key read from a file may hold any int32: only a supported type may be cast to cudnnDataType_t.
  if (!is_supported_data_type(key.data_type)) throw Error(detail::concat("unsupported data type ", key.data_type));
  const bool five_d = key.nb_dims == 5;
  const std::array<std::int64_t, kMaxTensorDims> sizes{key.dims[0], key.dims[1], key.dims[2], key.dims[3],
                                                       key.dims[4]};
  const IntSpan span(sizes.data(), static_cast<std::size_t>(key.nb_dims));
  if (make_tensor_key(static_cast<cudnnDataType_t>(key.data_type), span, Layout::nchw) == key) {
    return five_d ? "NCDHW" : "NCHW";
  }
  if (make_tensor_key(static_cast<cudnnDataType_t>(key.data_type), span, Layout::nhwc) == key) {
    return five_d ? "NDHWC" : "NHWC";
  }
  return "strided";
}

namespace {

// The output's batch times spatial volume: the GEMM extent that varies within a family (Note [Nearest key]).
double pixels(const ConvolutionKey& key) {
  double volume = key.output.dims[0];
  for (int d = 2; d < key.output.nb_dims; ++d) volume *= key.output.dims[d];
  return volume;
}

// Whether two tensors of keys with one filter and descriptor are one tensor at another batch or spatial size.
bool same_family(const TensorKey& a, const TensorKey& b) {
  if (a.data_type != b.data_type || a.nb_dims != b.nb_dims || a.dims[1] != b.dims[1]) return false;
  const std::string layout = layout_name(a);
  return layout != "strided" && layout == layout_name(b);
}

}  // namespace

bool same_family(const ConvolutionKey& a, const ConvolutionKey& b) {
  return a.direction == b.direction && a.weight == b.weight && a.convolution == b.convolution &&
         same_family(a.input, b.input) && same_family(a.output, b.output);
}

double family_distance(const ConvolutionKey& a, const ConvolutionKey& b) {
  return std::abs(std::log(pixels(a) / pixels(b)));
}

bool nearer(const ConvolutionKey& key, const ConvolutionKey& candidate, const ConvolutionKey& other) {
  const double to_candidate = family_distance(key, candidate), to_other = family_distance(key, other);
  if (to_candidate != to_other) return to_candidate < to_other;
  const bool candidate_batch = candidate.output.dims[0] == key.output.dims[0];
  const bool other_batch = other.output.dims[0] == key.output.dims[0];
  if (candidate_batch != other_batch) return candidate_batch;
  return candidate < other;
}

std::string layout_name(const FilterKey& key) {
  const bool five_d = key.nb_dims == 5;
  if (key.format == CUDNN_TENSOR_NHWC) return five_d ? "NDHWC" : "NHWC";
  if (key.format == CUDNN_TENSOR_NCHW) return five_d ? "NCDHW" : "NCHW";
  return detail::concat("format-", key.format);
}

std::ostream& operator<<(std::ostream& out, const TensorKey& key) {
  out << data_type_name(key.data_type);
  print_list(out, key.dims, key.nb_dims);
  std::string layout;
  try {
    layout = layout_name(key);
  } catch (const Error&) {
    layout = "invalid";
  }
  if (layout == "strided") {
    out << " strides ";
    print_list(out, key.strides, key.nb_dims);
  } else {
    out << ' ' << layout;
  }
  return out;
}

std::ostream& operator<<(std::ostream& out, const FilterKey& key) {
  out << data_type_name(key.data_type);
  print_list(out, key.dims, key.nb_dims);
  return out << ' ' << layout_name(key);
}

std::ostream& operator<<(std::ostream& out, const ConvolutionDescriptorKey& key) {
  out << "padding ";
  print_list(out, key.padding, key.nb_spatial_dims);
  out << " stride ";
  print_list(out, key.stride, key.nb_spatial_dims);
  out << " dilation ";
  print_list(out, key.dilation, key.nb_spatial_dims);
  const char* mode = convolution_mode_name(key.mode);
  const char* math = math_type_name(key.math_type);
  out << " groups " << key.groups << ' ' << (mode ? mode : "mode-?") << " compute "
      << data_type_name(key.compute_type) << " math " << (math ? math : "?");
  return out;
}

std::ostream& operator<<(std::ostream& out, const ConvolutionKey& key) {
  const auto direction = static_cast<Direction>(key.direction);
  return out << to_string(direction) << ": x " << key.input << ", w " << key.weight << ", y " << key.output << ", "
             << key.convolution;
}

template <typename Key, EnableIfKey<Key>>
std::string to_string(const Key& key) {
  std::ostringstream out;
  out << key;
  return out.str();
}

template std::string to_string(const TensorKey&);
template std::string to_string(const FilterKey&);
template std::string to_string(const ConvolutionDescriptorKey&);
template std::string to_string(const ConvolutionKey&);

}  // namespace cudnn_cache
