#include "cudnn_cache/descriptors.h"

#include "cudnn_cache/error.h"

namespace cudnn_cache {

void TensorDescriptor::set(const TensorKey& key) {
  CUDNN_CACHE_CHECK(cudnnSetTensorNdDescriptor(get(), static_cast<cudnnDataType_t>(key.data_type), key.nb_dims,
                                               key.dims.data(), key.strides.data()),
                    "tensor ", key);
}

TensorKey TensorDescriptor::key() const {
  TensorKey key;
  cudnnDataType_t data_type{};
  std::array<int, CUDNN_DIM_MAX> dims{};
  std::array<int, CUDNN_DIM_MAX> strides{};
  CUDNN_CACHE_CHECK(cudnnGetTensorNdDescriptor(get(), CUDNN_DIM_MAX, &data_type, &key.nb_dims, dims.data(),
                                               strides.data()));
  CUDNN_CACHE_REQUIRE(key.nb_dims >= 4 && key.nb_dims <= kMaxTensorDims, "tensor descriptor has ", key.nb_dims,
                      " dimensions; convolution keys hold 4 or 5");
  key.data_type = data_type;
  for (int d = 0; d < key.nb_dims; ++d) {
    key.dims[d] = dims[d];
    key.strides[d] = strides[d];
  }
  return key;
}

void FilterDescriptor::set(const FilterKey& key) {
  CUDNN_CACHE_CHECK(cudnnSetFilterNdDescriptor(get(), static_cast<cudnnDataType_t>(key.data_type),
                                               static_cast<cudnnTensorFormat_t>(key.format), key.nb_dims,
                                               key.dims.data()),
                    "filter ", key);
}

FilterKey FilterDescriptor::key() const {
  FilterKey key;
  cudnnDataType_t data_type{};
  cudnnTensorFormat_t format{};
  std::array<int, CUDNN_DIM_MAX> dims{};
  CUDNN_CACHE_CHECK(cudnnGetFilterNdDescriptor(get(), CUDNN_DIM_MAX, &data_type, &format, &key.nb_dims, dims.data()));
  CUDNN_CACHE_REQUIRE(key.nb_dims >= 4 && key.nb_dims <= kMaxTensorDims, "filter descriptor has ", key.nb_dims,
                      " dimensions; convolution keys hold 4 or 5");
  key.data_type = data_type;
  key.format = format;
  for (int d = 0; d < key.nb_dims; ++d) key.dims[d] = dims[d];
  return key;
}

void ConvolutionDescriptor::set(const ConvolutionDescriptorKey& key) {
  CUDNN_CACHE_CHECK(cudnnSetConvolutionNdDescriptor(get(), key.nb_spatial_dims, key.padding.data(), key.stride.data(),
                                                    key.dilation.data(),
                                                    static_cast<cudnnConvolutionMode_t>(key.mode),
                                                    static_cast<cudnnDataType_t>(key.compute_type)),
                    "convolution ", key);
  CUDNN_CACHE_CHECK(cudnnSetConvolutionGroupCount(get(), key.groups), "convolution ", key);
  CUDNN_CACHE_CHECK(cudnnSetConvolutionMathType(get(), static_cast<cudnnMathType_t>(key.math_type)), "convolution ",
                    key);
}

ConvolutionDescriptorKey ConvolutionDescriptor::key() const {
  ConvolutionDescriptorKey key;
  constexpr int kRequested = CUDNN_DIM_MAX - 2;
  std::array<int, kRequested> padding{}, stride{}, dilation{};
  cudnnConvolutionMode_t mode{};
  cudnnDataType_t compute_type{};
  cudnnMathType_t math_type{};
  CUDNN_CACHE_CHECK(cudnnGetConvolutionNdDescriptor(get(), kRequested, &key.nb_spatial_dims, padding.data(),
                                                    stride.data(), dilation.data(), &mode, &compute_type));
  CUDNN_CACHE_REQUIRE(key.nb_spatial_dims >= 2 && key.nb_spatial_dims <= kMaxSpatialDims,
                      "convolution descriptor has ", key.nb_spatial_dims,
                      " spatial dimensions; convolution keys hold 2 or 3");
  CUDNN_CACHE_CHECK(cudnnGetConvolutionGroupCount(get(), &key.groups));
  CUDNN_CACHE_CHECK(cudnnGetConvolutionMathType(get(), &math_type));
  for (int d = 0; d < key.nb_spatial_dims; ++d) {
    key.padding[d] = padding[d];
    key.stride[d] = stride[d];
    key.dilation[d] = dilation[d];
  }
  key.mode = mode;
  key.compute_type = compute_type;
  key.math_type = math_type;
  return key;
}

ConvolutionDescriptors::ConvolutionDescriptors(const ConvolutionKey& key)
    : compute_type(static_cast<cudnnDataType_t>(key.convolution.compute_type)) {
  input.set(key.input);
  weight.set(key.weight);
  output.set(key.output);
  convolution.set(key.convolution);
}

namespace {

// Descriptors set elsewhere (PyTorch's, a user's) may carry any stride for a size-1 dimension: rekey the
// decoded contents so they compare equal to the key built from values (Note [Canonical keys]).
TensorKey canonical(const TensorKey& raw, const char* name) {
  std::array<std::int64_t, kMaxTensorDims> sizes{}, strides{};
  for (int d = 0; d < raw.nb_dims; ++d) {
    sizes[d] = raw.dims[d];
    strides[d] = raw.strides[d];
  }
  const auto rank = static_cast<std::size_t>(raw.nb_dims);
  return make_tensor_key(static_cast<cudnnDataType_t>(raw.data_type), IntSpan(sizes.data(), rank),
                         IntSpan(strides.data(), rank), name);
}

}  // namespace

ConvolutionKey decode_convolution_key(Direction direction, const TensorDescriptor& input,
                                      const FilterDescriptor& weight, const TensorDescriptor& output,
                                      const ConvolutionDescriptor& convolution) {
  return make_convolution_key(direction, canonical(input.key(), "input"), weight.key(),
                              canonical(output.key(), "output"), convolution.key());
}

}  // namespace cudnn_cache
