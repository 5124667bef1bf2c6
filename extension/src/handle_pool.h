#pragma once

#include <map>
#include <mutex>
#include <vector>

#include "cudnn_cache/cudnn.h"

namespace cudnn_cache {

// cuDNN handles for the threads of prepare() and of a search (its workers, mode B's query), one per thread at a
// time. They are made once and never destroyed: the plans built with them live in the plan cache for the rest
// of the process.
class HandlePool {
 public:
  static HandlePool& instance();

  // A handle of the pool for CUDA device `device`, which becomes the calling thread's current device, held
  // until the lease ends, however its holder leaves (a cuDNN error included): a handle not given back would be
  // lost to the pool, and the next thread would make another (10-20 ms each).
  class Lease {
   public:
    explicit Lease(int device) : device_(device), handle_(instance().take(device)) {}
    ~Lease() { instance().give_back(device_, handle_); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    cudnnHandle_t get() const { return handle_; }

   private:
    int device_;
    cudnnHandle_t handle_;
  };

 private:
  cudnnHandle_t take(int device);
  void give_back(int device, cudnnHandle_t handle);

  std::mutex mutex_;
  std::map<int, std::vector<cudnnHandle_t>> free_;
};

}  // namespace cudnn_cache
