#pragma once

// What the core needs from PyTorch to run cuDNN on the GPU: a handle on the current stream, and workspace
// from the caching allocator.

#include <cudnn.h>

#include <cstddef>
#include <memory>

#include "cudnn_cache/runtime.h"

namespace cudnn_cache::torch_ops {

// Workspace from PyTorch's caching allocator; null when the device is out of memory, so the core moves on.
std::unique_ptr<Workspace> allocate_workspace(std::size_t bytes);

// PyTorch's cuDNN handle for the current device, set to the current CUDA stream.
cudnnHandle_t current_handle();

}  // namespace cudnn_cache::torch_ops
