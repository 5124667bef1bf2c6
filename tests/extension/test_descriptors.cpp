// Tests of the RAII cuDNN descriptors and of the reverse lookup: a key decoded from descriptors must equal the
// key built from plain values (Note [Keys are values], Note [Canonical keys] in key.h). No GPU is needed:
// creating, setting and reading descriptors never touches the device.

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cudnn_cache/descriptors.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"

using namespace cudnn_cache;

namespace {

using Sizes = std::vector<std::int64_t>;

// One convolution problem, described with plain values. Spatial sizes are taken from the front of the arrays.
struct Problem {
  Direction direction = Direction::forward;
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;
  Layout layout = Layout::nchw;
  int spatial_dims = 2;
  std::int64_t batch = 2;
  std::int64_t in_channels = 4;
  std::int64_t out_channels = 8;  // divisible by every groups value used below
  std::int64_t groups = 1;
  std::int64_t padding = 0;
  std::int64_t stride = 1;
  std::int64_t dilation = 1;
  cudnnMathType_t math_type = CUDNN_DEFAULT_MATH;
  // Different per dimension so that a mixed-up dimension changes the key.
  std::array<std::int64_t, 3> input_spatial{9, 8, 7};
  std::array<std::int64_t, 3> kernel_spatial{3, 2, 3};
};

std::string describe(const Problem& p) {
  std::ostringstream out;
  out << p.direction << ' ' << data_type_name(p.data_type) << ' ' << (p.layout == Layout::nhwc ? "nhwc" : "nchw")
      << ' ' << p.spatial_dims << "-D batch " << p.batch << " channels " << p.in_channels << "->" << p.out_channels
      << " groups " << p.groups << " padding " << p.padding << " stride " << p.stride << " dilation " << p.dilation
      << " math " << p.math_type;
  return out.str();
}

// The textbook convolution output size, written independently of key.cpp.
std::int64_t convolution_output_size(std::int64_t input, std::int64_t kernel, const Problem& p) {
  const std::int64_t dilated_kernel = p.dilation * (kernel - 1) + 1;
  return (input + 2 * p.padding - dilated_kernel) / p.stride + 1;
}

struct Shapes {
  Sizes input, weight, output;  // rank spatial_dims + 2, before any 1-D -> 2-D rewriting
};

Shapes shapes_of(const Problem& p) {
  Shapes s{{p.batch, p.in_channels}, {p.out_channels, p.in_channels / p.groups}, {p.batch, p.out_channels}};
  for (int d = 0; d < p.spatial_dims; ++d) {
    s.input.push_back(p.input_spatial[d]);
    s.weight.push_back(p.kernel_spatial[d]);
    s.output.push_back(convolution_output_size(p.input_spatial[d], p.kernel_spatial[d], p));
  }
  return s;
}

// Element strides of a packed tensor: NCHW is row-major; NHWC puts channels innermost, then the spatial
// dimensions from the last, then the batch.
Sizes packed_strides(const Sizes& sizes, Layout layout) {
  const int rank = static_cast<int>(sizes.size());
  std::vector<int> innermost_first;
  if (layout == Layout::nhwc) innermost_first.push_back(1);
  for (int d = rank - 1; d >= 2; --d) innermost_first.push_back(d);
  if (layout == Layout::nchw) innermost_first.push_back(1);
  innermost_first.push_back(0);
  Sizes strides(sizes.size());
  std::int64_t extent = 1;
  for (int d : innermost_first) {
    strides[d] = extent;
    extent *= sizes[d];
  }
  return strides;
}

Sizes repeated(std::int64_t value, int count) { return Sizes(static_cast<std::size_t>(count), value); }

ConvolutionDescriptorKey convolution_descriptor_key_of(const Problem& p) {
  return make_convolution_descriptor_key(repeated(p.padding, p.spatial_dims), repeated(p.stride, p.spatial_dims),
                                         repeated(p.dilation, p.spatial_dims), p.groups, CUDNN_CROSS_CORRELATION,
                                         default_compute_type(p.data_type), p.math_type);
}

// The fast path: the key from plain values.
ConvolutionKey key_from_values(const Problem& p) {
  const Shapes s = shapes_of(p);
  return make_convolution_key(p.direction, make_tensor_key(p.data_type, s.input, p.layout, "input"),
                              make_filter_key(p.data_type, s.weight, p.layout),
                              make_tensor_key(p.data_type, s.output, p.layout, "output"),
                              convolution_descriptor_key_of(p));
}

std::string expected_layout_name(Layout layout, int nb_dims) {
  if (layout == Layout::nhwc) return nb_dims == 5 ? "NDHWC" : "NHWC";
  return nb_dims == 5 ? "NCDHW" : "NCHW";
}

// Overwrites a tensor descriptor with the sizes of `key` but other strides, as code outside this project might.
void set_raw_strides(TensorDescriptor& descriptor, const TensorKey& key, std::array<int, kMaxTensorDims> strides) {
  REQUIRE(cudnnSetTensorNdDescriptor(descriptor.get(), static_cast<cudnnDataType_t>(key.data_type), key.nb_dims,
                                     key.dims.data(), strides.data()) == CUDNN_STATUS_SUCCESS);
}

template <typename Function>
void require_error_mentioning(Function&& function, const std::string& text) {
  try {
    function();
    FAIL("no cudnn_cache::Error thrown; expected one mentioning " << text);
  } catch (const Error& e) {
    CHECK(e.status() != CUDNN_STATUS_SUCCESS);
    CHECK_THAT(e.what(), Catch::Contains(text));
  }
}

}  // namespace

TEST_CASE("keys from values equal keys decoded from descriptors for every combination", "[descriptors]") {
  const cudnnDataType_t data_types[] = {CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16, CUDNN_DATA_DOUBLE};
  const Layout layouts[] = {Layout::nchw, Layout::nhwc};
  const int spatial_dims[] = {1, 2, 3};
  enum class Groups { one, two, depthwise };
  const Groups group_kinds[] = {Groups::one, Groups::two, Groups::depthwise};
  const std::int64_t dilations[] = {1, 2};
  const std::int64_t strides[] = {1, 2};
  const std::int64_t paddings[] = {0, 1};
  const cudnnMathType_t math_types[] = {CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH};
  const Direction directions[] = {Direction::forward, Direction::backward_data, Direction::backward_filter};

  std::size_t combinations = 0;
  std::unordered_set<ConvolutionKey> distinct_keys;
  Problem p;
  for (auto data_type : data_types)
    for (auto layout : layouts)
      for (int dims : spatial_dims)
        for (auto group_kind : group_kinds)
          for (auto dilation : dilations)
            for (auto stride : strides)
              for (auto padding : paddings)
                for (auto math_type : math_types)
                  for (auto direction : directions) {
                    p.data_type = data_type;
                    p.layout = layout;
                    p.spatial_dims = dims;
                    p.groups = group_kind == Groups::one ? 1 : group_kind == Groups::two ? 2 : p.in_channels;
                    p.dilation = dilation;
                    p.stride = stride;
                    p.padding = padding;
                    p.math_type = math_type;
                    p.direction = direction;
                    INFO(describe(p));
                    ++combinations;

                    const Shapes shapes = shapes_of(p);
                    const ConvolutionKey key = key_from_values(p);
                    REQUIRE(check_key(key).empty());
                    REQUIRE(layout_name(key.input) == expected_layout_name(p.layout, key.input.nb_dims));
                    distinct_keys.insert(key);

                    const ConvolutionDescriptors descriptors(key);
                    REQUIRE(descriptors.input.key() == key.input);
                    REQUIRE(descriptors.weight.key() == key.weight);
                    REQUIRE(descriptors.output.key() == key.output);
                    REQUIRE(descriptors.convolution.key() == key.convolution);
                    REQUIRE(decode_convolution_key(p.direction, descriptors) == key);

                    // The strided path: explicit strides of a packed tensor in the layout give the same key.
                    REQUIRE(make_tensor_key(p.data_type, shapes.input, packed_strides(shapes.input, p.layout),
                                            "input") == key.input);
                    REQUIRE(make_tensor_key(p.data_type, shapes.output, packed_strides(shapes.output, p.layout),
                                            "output") == key.output);
                  }
  REQUIRE(combinations == 4 * 2 * 3 * 3 * 2 * 2 * 2 * 3 * 3);
  // Every parameter above reaches the key: no two combinations collapse into one key.
  REQUIRE(distinct_keys.size() == combinations);
}

TEST_CASE("descriptors set from sizes and strides decode like descriptors set from keys", "[descriptors]") {
  Problem p;
  p.layout = Layout::nhwc;
  p.spatial_dims = 3;
  p.groups = 2;
  const Shapes shapes = shapes_of(p);
  const ConvolutionKey key = key_from_values(p);

  TensorDescriptor input, output;
  FilterDescriptor weight;
  ConvolutionDescriptor convolution;
  input.set(p.data_type, shapes.input, packed_strides(shapes.input, p.layout));
  output.set(p.data_type, shapes.output, p.layout);
  weight.set(p.data_type, shapes.weight, p.layout);
  convolution.set({0, 0, 0}, {1, 1, 1}, {1, 1, 1}, p.groups, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                  CUDNN_DEFAULT_MATH);
  REQUIRE(decode_convolution_key(p.direction, input, weight, output, convolution) == key);

  // The convolution mode reaches the descriptor too (the exhaustive test only uses cross-correlation).
  convolution.set({0, 0, 0}, {1, 1, 1}, {1, 1, 1}, p.groups, CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
  const ConvolutionKey decoded = decode_convolution_key(p.direction, input, weight, output, convolution);
  CHECK(decoded.convolution.mode == CUDNN_CONVOLUTION);
  CHECK(decoded != key);
}

TEST_CASE("1-D convolutions are carried as 4-D (N, C, 1, L)", "[descriptors]") {
  const Layout layout = GENERATE(Layout::nchw, Layout::nhwc);
  Problem p;
  p.layout = layout;
  p.spatial_dims = 1;
  p.groups = 2;
  p.padding = 1;
  p.stride = 2;
  p.dilation = 2;
  const std::int32_t length = 9, kernel = 3, out_length = 4;  // (9 + 2 - 2 * 2 - 1) / 2 + 1
  REQUIRE(p.input_spatial[0] == length);
  REQUIRE(p.kernel_spatial[0] == kernel);

  const ConvolutionDescriptors descriptors(key_from_values(p));
  const ConvolutionKey decoded = decode_convolution_key(p.direction, descriptors);

  using Dims = std::array<std::int32_t, kMaxTensorDims>;
  CHECK(decoded.input.nb_dims == 4);
  CHECK(decoded.input.dims == Dims{2, 4, 1, length, 0});
  CHECK(decoded.weight.nb_dims == 4);
  CHECK(decoded.weight.dims == Dims{8, 2, 1, kernel, 0});
  CHECK(decoded.output.nb_dims == 4);
  CHECK(decoded.output.dims == Dims{2, 8, 1, out_length, 0});
  if (layout == Layout::nchw) {
    CHECK(decoded.input.strides == Dims{4 * length, length, length, 1, 0});
  } else {
    CHECK(decoded.input.strides == Dims{4 * length, 1, 4 * length, 4, 0});
  }

  using Spatial = std::array<std::int32_t, kMaxSpatialDims>;
  CHECK(decoded.convolution.nb_spatial_dims == 2);
  CHECK(decoded.convolution.padding == Spatial{0, 1, 0});
  CHECK(decoded.convolution.stride == Spatial{1, 2, 0});
  CHECK(decoded.convolution.dilation == Spatial{1, 2, 0});
  CHECK(decoded.convolution.groups == 2);
}

TEST_CASE("descriptors are move-only RAII owners", "[descriptors]") {
  static_assert(!std::is_copy_constructible_v<TensorDescriptor> && !std::is_copy_assignable_v<TensorDescriptor>);
  static_assert(!std::is_copy_constructible_v<FilterDescriptor> && !std::is_copy_assignable_v<FilterDescriptor>);
  static_assert(!std::is_copy_constructible_v<ConvolutionDescriptor> &&
                !std::is_copy_assignable_v<ConvolutionDescriptor>);
  static_assert(std::is_nothrow_move_constructible_v<TensorDescriptor> &&
                std::is_nothrow_move_assignable_v<TensorDescriptor>);
  static_assert(std::is_nothrow_move_constructible_v<FilterDescriptor> &&
                std::is_nothrow_move_assignable_v<FilterDescriptor>);
  static_assert(std::is_nothrow_move_constructible_v<ConvolutionDescriptor> &&
                std::is_nothrow_move_assignable_v<ConvolutionDescriptor>);

  const TensorKey key = make_tensor_key(CUDNN_DATA_HALF, {2, 3, 4, 5}, Layout::nhwc);
  TensorDescriptor a;
  REQUIRE(a.get() != nullptr);
  a.set(key);
  const auto handle = a.get();

  SECTION("move construction transfers the handle") {
    TensorDescriptor b(std::move(a));
    CHECK(a.get() == nullptr);
    CHECK(b.get() == handle);
    CHECK(b.key() == key);
  }
  SECTION("move assignment transfers the handle and releases the old one") {
    TensorDescriptor b;
    REQUIRE(b.get() != nullptr);
    REQUIRE(b.get() != handle);
    b = std::move(a);
    CHECK(a.get() == nullptr);
    CHECK(b.get() == handle);
    CHECK(b.key() == key);
  }
  SECTION("self move assignment keeps the handle") {
    TensorDescriptor& alias = a;
    a = std::move(alias);
    CHECK(a.get() == handle);
    CHECK(a.key() == key);
  }
  SECTION("fresh descriptors own distinct handles") {
    const TensorDescriptor b;
    const FilterDescriptor f;
    const ConvolutionDescriptor c;
    CHECK(b.get() != handle);
    CHECK(f.get() != nullptr);
    CHECK(c.get() != nullptr);
  }
}

TEST_CASE("descriptors with non-canonical strides of size-1 dimensions decode to the canonical key",
          "[descriptors]") {
  Problem p;
  p.layout = Layout::nhwc;
  std::array<int, kMaxTensorDims> input_strides{};
  std::array<int, kMaxTensorDims> output_strides{};

  SECTION("batch 1: any batch stride") {
    p.batch = 1;
    const ConvolutionKey key = key_from_values(p);
    input_strides = key.input.strides;
    output_strides = key.output.strides;
    input_strides[0] = 12345;
    output_strides[0] = 1;
  }
  SECTION("one channel given channels-last strides") {
    p.in_channels = 1;
    p.groups = 1;
    const Shapes shapes = shapes_of(p);
    const Sizes nhwc = packed_strides(shapes.input, Layout::nhwc);
    for (std::size_t d = 0; d < nhwc.size(); ++d) input_strides[d] = static_cast<int>(nhwc[d]);
    output_strides = key_from_values(p).output.strides;
  }
  SECTION("1-D: any stride for the inserted dimension") {
    p.spatial_dims = 1;
    p.batch = 1;
    const ConvolutionKey key = key_from_values(p);
    input_strides = key.input.strides;
    output_strides = key.output.strides;
    input_strides[2] = 777;
    output_strides[2] = 3;
    output_strides[0] = 2;
  }

  const ConvolutionKey key = key_from_values(p);
  INFO(describe(p));
  ConvolutionDescriptors descriptors(key);
  set_raw_strides(descriptors.input, key.input, input_strides);
  set_raw_strides(descriptors.output, key.output, output_strides);
  // The descriptors really carry other strides...
  REQUIRE(descriptors.input.key() != key.input);
  REQUIRE(descriptors.input.key().strides == input_strides);
  // ...yet describe the same problem.
  CHECK(decode_convolution_key(p.direction, descriptors) == key);
}

TEST_CASE("decoding descriptors of the wrong rank throws", "[descriptors]") {
  const std::array<int, 3> dims{2, 4, 9};
  const std::array<int, 3> strides{36, 9, 1};

  SECTION("a 3-D tensor descriptor") {
    TensorDescriptor tensor;
    REQUIRE(cudnnSetTensorNdDescriptor(tensor.get(), CUDNN_DATA_FLOAT, 3, dims.data(), strides.data()) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE_THROWS_AS(tensor.key(), Error);
    REQUIRE_THROWS_WITH(tensor.key(), Catch::Contains("3 dimensions"));

    // and through the whole decode
    Problem p;
    ConvolutionDescriptors descriptors(key_from_values(p));
    REQUIRE(cudnnSetTensorNdDescriptor(descriptors.input.get(), CUDNN_DATA_FLOAT, 3, dims.data(),
                                       strides.data()) == CUDNN_STATUS_SUCCESS);
    REQUIRE_THROWS_AS(decode_convolution_key(p.direction, descriptors), Error);
  }
  SECTION("a 3-D filter descriptor") {
    FilterDescriptor filter;
    REQUIRE(cudnnSetFilterNdDescriptor(filter.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 3, dims.data()) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE_THROWS_AS(filter.key(), Error);
    REQUIRE_THROWS_WITH(filter.key(), Catch::Contains("3 dimensions"));
  }
}

TEST_CASE("CUDNN_CACHE_CHECK reports the failing cuDNN call and its status", "[descriptors]") {
  SECTION("tensor with a negative size") {
    TensorKey bad;
    bad.data_type = CUDNN_DATA_FLOAT;
    bad.nb_dims = 4;
    bad.dims = {-1, 2, 3, 4, 0};
    bad.strides = {24, 12, 4, 1, 0};
    TensorDescriptor tensor;
    require_error_mentioning([&] { tensor.set(bad); }, "cudnnSetTensorNdDescriptor");
  }
  SECTION("filter with a zero size") {
    FilterKey bad = make_filter_key(CUDNN_DATA_FLOAT, {8, 4, 3, 3}, Layout::nchw);
    bad.dims[2] = 0;
    FilterDescriptor filter;
    require_error_mentioning([&] { filter.set(bad); }, "cudnnSetFilterNdDescriptor");
  }
  SECTION("convolution with zero groups") {
    ConvolutionDescriptorKey bad = convolution_descriptor_key_of(Problem{});
    bad.groups = 0;
    ConvolutionDescriptor convolution;
    require_error_mentioning([&] { convolution.set(bad); }, "cudnnSetConvolutionGroupCount");
  }
}
