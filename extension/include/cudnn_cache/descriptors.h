#pragma once

// RAII owners of the cuDNN descriptors a convolution needs, set from keys (or plain values) and decoded back
// into keys with the cuDNN getters. None of this needs a GPU: only cudnnCreate does.

#include <utility>

#include "cudnn_cache/cudnn.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"

namespace cudnn_cache {

// Owns one cuDNN descriptor: created in the constructor, destroyed in the destructor, movable, not copyable.
template <typename Handle, cudnnStatus_t (*create)(Handle*), cudnnStatus_t (*destroy)(Handle)>
class Descriptor {
 public:
  Descriptor();
  ~Descriptor() { reset(); }
  Descriptor(Descriptor&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  // The raw handle, for cuDNN calls; null only after a move.
  Handle get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_ != nullptr) destroy(handle_);  // cannot fail for a handle we created; nothing to report
    handle_ = nullptr;
  }

  Handle handle_ = nullptr;
};

// An activation tensor: x or y of a convolution.
class TensorDescriptor
    : public Descriptor<cudnnTensorDescriptor_t, &cudnnCreateTensorDescriptor, &cudnnDestroyTensorDescriptor> {
 public:
  // Sets the descriptor to exactly the key's contents.
  void set(const TensorKey& key);
  // Sets it from sizes and element strides; see make_tensor_key.
  void set(cudnnDataType_t data_type, IntSpan sizes, IntSpan strides) {
    set(make_tensor_key(data_type, sizes, strides));
  }
  // Sets it to a packed tensor in the given layout.
  void set(cudnnDataType_t data_type, IntSpan sizes, Layout layout) { set(make_tensor_key(data_type, sizes, layout)); }
  // Decodes the descriptor with cudnnGetTensorNdDescriptor.
  TensorKey key() const;
};

// A convolution's weights w.
class FilterDescriptor
    : public Descriptor<cudnnFilterDescriptor_t, &cudnnCreateFilterDescriptor, &cudnnDestroyFilterDescriptor> {
 public:
  void set(const FilterKey& key);
  void set(cudnnDataType_t data_type, IntSpan sizes, Layout format) { set(make_filter_key(data_type, sizes, format)); }
  // Decodes the descriptor with cudnnGetFilterNdDescriptor.
  FilterKey key() const;
};

// Padding, stride, dilation, groups, mode, compute type and math type of a convolution.
class ConvolutionDescriptor : public Descriptor<cudnnConvolutionDescriptor_t, &cudnnCreateConvolutionDescriptor,
                                                &cudnnDestroyConvolutionDescriptor> {
 public:
  void set(const ConvolutionDescriptorKey& key);
  void set(IntSpan padding, IntSpan stride, IntSpan dilation, std::int64_t groups, cudnnConvolutionMode_t mode,
           cudnnDataType_t compute_type, cudnnMathType_t math_type) {
    set(make_convolution_descriptor_key(padding, stride, dilation, groups, mode, compute_type, math_type));
  }
  // Decodes the descriptor with cudnnGetConvolutionNdDescriptor, cudnnGetConvolutionGroupCount and
  // cudnnGetConvolutionMathType.
  ConvolutionDescriptorKey key() const;
};

// The four descriptors of one convolution problem, as the legacy cuDNN convolution calls take them.
struct ConvolutionDescriptors {
  explicit ConvolutionDescriptors(const ConvolutionKey& key);

  TensorDescriptor input;
  FilterDescriptor weight;
  TensorDescriptor output;
  ConvolutionDescriptor convolution;
  cudnnDataType_t compute_type;  // of the convolution: says whether alpha and beta are double or float
};

// The seed's reverse lookup: the key of a problem, decoded from its descriptors with the cuDNN getters,
// canonicalised and checked like a key made from values.
ConvolutionKey decode_convolution_key(Direction direction, const TensorDescriptor& input,
                                      const FilterDescriptor& weight, const TensorDescriptor& output,
                                      const ConvolutionDescriptor& convolution);

inline ConvolutionKey decode_convolution_key(Direction direction, const ConvolutionDescriptors& descriptors) {
  return decode_convolution_key(direction, descriptors.input, descriptors.weight, descriptors.output,
                                descriptors.convolution);
}

template <typename Handle, cudnnStatus_t (*create)(Handle*), cudnnStatus_t (*destroy)(Handle)>
Descriptor<Handle, create, destroy>::Descriptor() {
  CUDNN_CACHE_CHECK(create(&handle_));
}

}  // namespace cudnn_cache
