#pragma once

// The legacy cuDNN convolution calls of each direction, behind one interface so that search and execution
// are written once (runtime.cpp) for all three directions.

#include <cstddef>

#include "cudnn_cache/cudnn.h"
#include "cudnn_cache/descriptors.h"
#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache {

// Device pointers of one call. Each direction reads two of them and writes the third:
// forward writes y, backward-data writes x (dx from dy), backward-filter writes w (dw from x and dy).
struct ConvolutionBuffers {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
};

// The cuDNN entry points of the direction Traits describes.
template <typename Traits>
struct Algorithms {
  using Algorithm = typename Traits::Algorithm;
  using Perf = typename Traits::Perf;

  // cudnnFind*AlgorithmEx: runs and times every algorithm on the buffers, fastest first.
  static cudnnStatus_t find(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors,
                            const ConvolutionBuffers& buffers, int requested, int* returned, Perf* results,
                            void* workspace, std::size_t workspace_bytes);

  // cudnnGet*Algorithm_v7: cuDNN's heuristic order, without running anything.
  static cudnnStatus_t heuristics(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors, int requested,
                                  int* returned, Perf* results);

  // cudnnGet*WorkspaceSize for one algorithm.
  static cudnnStatus_t workspace_size(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors,
                                      Algorithm algorithm, std::size_t* bytes);

  // cudnnConvolutionForward / BackwardData / BackwardFilter with alpha = 1 and beta = 0.
  static cudnnStatus_t execute(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors, Algorithm algorithm,
                               const ConvolutionBuffers& buffers, void* workspace, std::size_t workspace_bytes);
};

}  // namespace cudnn_cache
