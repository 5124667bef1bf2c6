#include "context.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "../problem.h"

#include <vector>

namespace cudnn_cache::torch_ops {

Workspace allocate_workspace(std::size_t bytes) {
  try {
    c10::DataPtr memory = c10::cuda::CUDACachingAllocator::get()->allocate(bytes);
    void* data = memory.get();
    const c10::DeleterFnPtr release = memory.get_deleter();
    return Workspace(data, memory.release_context(), release);
  } catch (const c10::OutOfMemoryError&) {
    return Workspace();
  }
}

int cuda_device(const char* op, const std::optional<std::int64_t>& device, const char* why) {
  TORCH_CHECK(at::cuda::is_available(), "cudnn_cache.", op, ": no CUDA device; ", why);
  const std::int64_t index = device.value_or(at::cuda::current_device());
  TORCH_CHECK(index >= 0 && index < at::cuda::device_count(), "cudnn_cache.", op, ": device ", index,
              " does not exist; this process sees ", at::cuda::device_count(), " CUDA devices");
  return static_cast<int>(index);
}

namespace {

at::ScalarType scalar_type_of(const char* op, std::int32_t data_type) {
  switch (static_cast<cudnnDataType_t>(data_type)) {
    case CUDNN_DATA_FLOAT: return at::kFloat;
    case CUDNN_DATA_HALF: return at::kHalf;
    case CUDNN_DATA_BFLOAT16: return at::kBFloat16;
    case CUDNN_DATA_DOUBLE: return at::kDouble;
    default: TORCH_CHECK(false, "cudnn_cache.", op, ": the key's data type ", data_type, " has no PyTorch dtype");
  }
}

at::Tensor buffer_for(const TensorKey& tensor, const at::TensorOptions& options) {
  const std::vector<std::int64_t> sizes(tensor.dims.begin(), tensor.dims.begin() + tensor.nb_dims);
  const std::vector<std::int64_t> strides(tensor.strides.begin(), tensor.strides.begin() + tensor.nb_dims);
  return at::empty_strided(sizes, strides, options).normal_();
}

}  // namespace

KeyOperands operands_for(const char* op, const ConvolutionKey& key, int device) {
  const auto options = at::TensorOptions()
                           .device(at::kCUDA, static_cast<c10::DeviceIndex>(device))
                           .dtype(scalar_type_of(op, key.input.data_type));
  std::int64_t weight_elements = 1;
  for (int d = 0; d < key.weight.nb_dims; ++d) weight_elements *= key.weight.dims[d];
  return {buffer_for(key.input, options), at::empty({weight_elements}, options).normal_(),
          buffer_for(key.output, options)};
}

// getCudnnHandle() sets its handle's stream to the current CUDA stream on every call (ATen/cudnn/Handle.cpp), as
// PyTorch's own convolutions rely on: setting it again here cost a cuDNN call per direction run.
cudnnHandle_t current_handle() { return at::native::getCudnnHandle(); }

}  // namespace cudnn_cache::torch_ops
