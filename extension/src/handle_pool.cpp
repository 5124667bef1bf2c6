#include "handle_pool.h"

#include <cuda_runtime_api.h>

#include "cudnn_cache/error.h"

namespace cudnn_cache {

HandlePool& HandlePool::instance() {
  static HandlePool* pool = new HandlePool;  // never destroyed, like the handles
  return *pool;
}

cudnnHandle_t HandlePool::take(int device) {
  CUDNN_CACHE_REQUIRE(cudaSetDevice(device) == cudaSuccess, "cannot use CUDA device ", device);
  {
    std::lock_guard lock(mutex_);
    auto& free = free_[device];
    if (!free.empty()) {
      const cudnnHandle_t handle = free.back();
      free.pop_back();
      return handle;
    }
  }
  cudnnHandle_t handle = nullptr;
  CUDNN_CACHE_CHECK(cudnnCreate(&handle));
  return handle;
}

void HandlePool::give_back(int device, cudnnHandle_t handle) {
  std::lock_guard lock(mutex_);
  free_[device].push_back(handle);
}

}  // namespace cudnn_cache
