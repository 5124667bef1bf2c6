#pragma once

#include <map>
#include <mutex>
#include <vector>

#include "cudnn_cache/cudnn.h"

namespace cudnn_cache {

// cuDNN handles for prepare's threads, one per thread at a time. They are made once and never destroyed:
// the plans built with them live in the plan cache for the rest of the process.
class HandlePool {
 public:
  static HandlePool& instance();

  // A handle for CUDA device `device`, which becomes the calling thread's current device.
  cudnnHandle_t take(int device);
  void give_back(int device, cudnnHandle_t handle);

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudnnHandle_t>> free_;
};

}  // namespace cudnn_cache
