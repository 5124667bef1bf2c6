#include "context.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "../problem.h"

namespace cudnn_cache::torch_ops {
namespace {

class CachingAllocatorWorkspace : public Workspace {
 public:
  explicit CachingAllocatorWorkspace(c10::DataPtr memory) : memory_(std::move(memory)) {}
  void* data() override { return memory_.get(); }

 private:
  c10::DataPtr memory_;
};

}  // namespace

std::unique_ptr<Workspace> allocate_workspace(std::size_t bytes) {
  try {
    return std::make_unique<CachingAllocatorWorkspace>(c10::cuda::CUDACachingAllocator::get()->allocate(bytes));
  } catch (const c10::OutOfMemoryError&) {
    return nullptr;
  }
}

cudnnHandle_t current_handle() {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  rethrow([&] { CUDNN_CACHE_CHECK(cudnnSetStream(handle, at::cuda::getCurrentCUDAStream())); });
  return handle;
}

}  // namespace cudnn_cache::torch_ops
