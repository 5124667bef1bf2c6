#pragma once

// What the core needs from PyTorch to run cuDNN on the GPU: a handle on the current stream, workspace from
// the caching allocator, a checked device index, and operands made from a key alone.

#include <ATen/ATen.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "cudnn_cache/key.h"
#include "cudnn_cache/runtime.h"

namespace cudnn_cache::torch_ops {

// Workspace from PyTorch's caching allocator; empty when the device is out of memory, so the core moves on.
Workspace allocate_workspace(std::size_t bytes);

// PyTorch's cuDNN handle for the current device, set to the current CUDA stream.
cudnnHandle_t current_handle();

// The CUDA device `device` names (default: the current one). Fails as "cudnn_cache.<op>: no CUDA device;
// <why>" without a GPU, and names the devices there are when the index is out of range.
int cuda_device(const char* op, const std::optional<std::int64_t>& device, const char* why);

// Tensors with the sizes and strides of a key's operands on a CUDA device, holding N(0, 1) values: what a
// search or an audit times must look like real data (uninitialised memory may hold NaNs or denormals, which
// some kernels run slower on). x, w and y are the forward convolution's input, weight and output.
struct KeyOperands {
  at::Tensor x, w, y;
  ConvolutionBuffers buffers() const { return {x.data_ptr(), w.data_ptr(), y.data_ptr()}; }
};
KeyOperands operands_for(const char* op, const ConvolutionKey& key, int device);

}  // namespace cudnn_cache::torch_ops
