#include "cudnn_cache/algorithms.h"

namespace cudnn_cache {
namespace {

// cuDNN scales with alpha and beta of the compute type: double for double convolutions, float otherwise.
struct Scaling {
  explicit Scaling(const ConvolutionDescriptors& descriptors)
      : is_double(descriptors.compute_type == CUDNN_DATA_DOUBLE) {}
  const void* one() const { return is_double ? static_cast<const void*>(&one_double) : &one_float; }
  const void* zero() const { return is_double ? static_cast<const void*>(&zero_double) : &zero_float; }

  bool is_double;
  double one_double = 1.0, zero_double = 0.0;
  float one_float = 1.0f, zero_float = 0.0f;
};

}  // namespace

// Forward: y = conv(x, w).
template <>
cudnnStatus_t Algorithms<ForwardTraits>::find(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                              const ConvolutionBuffers& b, int requested, int* returned,
                                              Perf* results, void* workspace, std::size_t workspace_bytes) {
  return cudnnFindConvolutionForwardAlgorithmEx(handle, d.input.get(), b.x, d.weight.get(), b.w, d.convolution.get(),
                                                d.output.get(), b.y, requested, returned, results, workspace,
                                                workspace_bytes);
}
template <>
cudnnStatus_t Algorithms<ForwardTraits>::heuristics(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                    int requested, int* returned, Perf* results) {
  return cudnnGetConvolutionForwardAlgorithm_v7(handle, d.input.get(), d.weight.get(), d.convolution.get(),
                                                d.output.get(), requested, returned, results);
}
template <>
cudnnStatus_t Algorithms<ForwardTraits>::workspace_size(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                        Algorithm algorithm, std::size_t* bytes) {
  return cudnnGetConvolutionForwardWorkspaceSize(handle, d.input.get(), d.weight.get(), d.convolution.get(),
                                                 d.output.get(), algorithm, bytes);
}
template <>
cudnnStatus_t Algorithms<ForwardTraits>::execute(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                 Algorithm algorithm, const ConvolutionBuffers& b, void* workspace,
                                                 std::size_t workspace_bytes) {
  const Scaling scaling(d);
  return cudnnConvolutionForward(handle, scaling.one(), d.input.get(), b.x, d.weight.get(), b.w, d.convolution.get(),
                                 algorithm, workspace, workspace_bytes, scaling.zero(), d.output.get(), b.y);
}

// Backward data: dx = conv_backward_data(dy, w).
template <>
cudnnStatus_t Algorithms<BackwardDataTraits>::find(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                   const ConvolutionBuffers& b, int requested, int* returned,
                                                   Perf* results, void* workspace, std::size_t workspace_bytes) {
  return cudnnFindConvolutionBackwardDataAlgorithmEx(handle, d.weight.get(), b.w, d.output.get(), b.y,
                                                     d.convolution.get(), d.input.get(), b.x, requested, returned,
                                                     results, workspace, workspace_bytes);
}
template <>
cudnnStatus_t Algorithms<BackwardDataTraits>::heuristics(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                         int requested, int* returned, Perf* results) {
  return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.weight.get(), d.output.get(), d.convolution.get(),
                                                     d.input.get(), requested, returned, results);
}
template <>
cudnnStatus_t Algorithms<BackwardDataTraits>::workspace_size(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                             Algorithm algorithm, std::size_t* bytes) {
  return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.weight.get(), d.output.get(), d.convolution.get(),
                                                      d.input.get(), algorithm, bytes);
}
template <>
cudnnStatus_t Algorithms<BackwardDataTraits>::execute(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                      Algorithm algorithm, const ConvolutionBuffers& b, void* workspace,
                                                      std::size_t workspace_bytes) {
  const Scaling scaling(d);
  return cudnnConvolutionBackwardData(handle, scaling.one(), d.weight.get(), b.w, d.output.get(), b.y,
                                      d.convolution.get(), algorithm, workspace, workspace_bytes, scaling.zero(),
                                      d.input.get(), b.x);
}

// Backward filter: dw = conv_backward_filter(x, dy).
template <>
cudnnStatus_t Algorithms<BackwardFilterTraits>::find(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                     const ConvolutionBuffers& b, int requested, int* returned,
                                                     Perf* results, void* workspace, std::size_t workspace_bytes) {
  return cudnnFindConvolutionBackwardFilterAlgorithmEx(handle, d.input.get(), b.x, d.output.get(), b.y,
                                                       d.convolution.get(), d.weight.get(), b.w, requested, returned,
                                                       results, workspace, workspace_bytes);
}
template <>
cudnnStatus_t Algorithms<BackwardFilterTraits>::heuristics(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                           int requested, int* returned, Perf* results) {
  return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.input.get(), d.output.get(), d.convolution.get(),
                                                       d.weight.get(), requested, returned, results);
}
template <>
cudnnStatus_t Algorithms<BackwardFilterTraits>::workspace_size(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                               Algorithm algorithm, std::size_t* bytes) {
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.input.get(), d.output.get(), d.convolution.get(),
                                                        d.weight.get(), algorithm, bytes);
}
template <>
cudnnStatus_t Algorithms<BackwardFilterTraits>::execute(cudnnHandle_t handle, const ConvolutionDescriptors& d,
                                                        Algorithm algorithm, const ConvolutionBuffers& b,
                                                        void* workspace, std::size_t workspace_bytes) {
  const Scaling scaling(d);
  return cudnnConvolutionBackwardFilter(handle, scaling.one(), d.input.get(), b.x, d.output.get(), b.y,
                                        d.convolution.get(), algorithm, workspace, workspace_bytes, scaling.zero(),
                                        d.weight.get(), b.w);
}

}  // namespace cudnn_cache
