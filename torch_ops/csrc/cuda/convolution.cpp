// CUDA kernels: cuDNN with the cached algorithms. The core does the lookup, tuning and fallback
// (Note [Running a cached convolution]); this file hands it tensors' memory, a cuDNN handle on the current
// stream, and workspace from PyTorch's caching allocator.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../convolution.h"
#include "../problem.h"
#include "context.h"
#include "cudnn_cache/graph.h"
#include "cudnn_cache/runtime.h"

namespace cudnn_cache::torch_ops {
namespace {

void check_cuda(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.is_cuda() && b.device() == a.device(), op, ": tensors must be on one CUDA device, got ", a.device(),
              " and ", b.device());
}

// The graph API describes tensors as kGraphAlignment-byte aligned (Note [Engine configs]). Memory from the
// caching allocator is; a view that starts inside it may not be, and is copied.
at::Tensor aligned(const at::Tensor& tensor, at::MemoryFormat format) {
  const at::Tensor dense = contiguous_in(tensor, format);
  if (reinterpret_cast<std::uintptr_t>(dense.data_ptr()) % kGraphAlignment == 0) return dense;
  return dense.clone(at::MemoryFormat::Preserve);  // dense: the copy keeps its strides
}

// Direction D of the problem on the operands: x, w and y are the input, weight and output of the forward
// convolution, whichever the direction writes.
template <Direction D>
void run(const Problem& problem, const at::Tensor& x, const at::Tensor& w, const at::Tensor& y) {
  const ConvolutionBuffers buffers{x.data_ptr(), w.data_ptr(), y.data_ptr()};
  const int device = x.get_device();
  rethrow([&] {
    Runtime::instance().convolve<D>(current_handle(), device, problem.key_for(D), buffers, allocate_workspace,
                                    deterministic_requested());
  });
}

// Checks that grad_output has the size the convolution of x by w gives (the backward ops get sizes, not tensors).
void check_grad_output(const char* op, const at::Tensor& x, const at::Tensor& w, const at::Tensor& dy,
                       const ConvolutionParams& params) {
  const auto expected = convolution_output_size(x.sizes(), w.sizes(), params);
  TORCH_CHECK(dy.sizes() == at::IntArrayRef(expected), op, ": grad_output has sizes ", dy.sizes(),
              " but the convolution of input sizes ", x.sizes(), " by weight sizes ", w.sizes(), " gives sizes ",
              at::IntArrayRef(expected));
}

at::Tensor forward_cuda(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                        const std::optional<at::Tensor>& bias) {
  check_tensors("_convolution_forward", input, weight);
  check_cuda("_convolution_forward", input, weight);
  const ConvolutionParams params =
      check_params("_convolution_forward", input, weight, stride, padding, dilation, groups);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = convolution_memory_format(input, weight);
  const at::Tensor x = aligned(input, format);
  const at::Tensor w = aligned(weight, format);
  at::Tensor y = empty_in(convolution_output_size(x.sizes(), w.sizes(), params), x.options(), format);
  if (x.numel() > 0) run<Direction::forward>(make_problem(x, w, y, params, format), x, w, y);
  add_bias("_convolution_forward", y, bias);
  return y;
}

at::Tensor backward_input_cuda(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups, const std::optional<at::Tensor>& bias) {
  check_cuda("_convolution_backward_input", grad_output, weight);
  check_sizes("_convolution_backward_input", "input_size", input_size, grad_output);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::MemoryFormat format = convolution_memory_format(grad_output, weight);
  const at::Tensor dy = aligned(grad_output, format);
  const at::Tensor w = aligned(weight, format);
  at::Tensor dx = empty_in(input_size, dy.options(), format);
  const ConvolutionParams params =
      check_params("_convolution_backward_input", dx, w, stride, padding, dilation, groups);
  check_grad_output("_convolution_backward_input", dx, w, dy, params);
  if (dx.numel() > 0) run<Direction::backward_data>(make_problem(dx, w, dy, params, format), dx, w, dy);
  add_bias("_convolution_backward_input", dx, bias);
  return dx;
}

at::Tensor backward_weight_cuda(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                std::int64_t groups) {
  check_cuda("_convolution_backward_weight", grad_output, input);
  check_sizes("_convolution_backward_weight", "weight_size", weight_size, grad_output);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::MemoryFormat format = convolution_memory_format(input, grad_output);
  const at::Tensor x = aligned(input, format);
  const at::Tensor dy = aligned(grad_output, format);
  at::Tensor dw = empty_in(weight_size, x.options(), format);
  const ConvolutionParams params =
      check_params("_convolution_backward_weight", x, dw, stride, padding, dilation, groups);
  check_grad_output("_convolution_backward_weight", x, dw, dy, params);
  if (x.numel() == 0) return dw.zero_();  // an empty batch contributes no gradient
  run<Direction::backward_filter>(make_problem(x, dw, dy, params, format), x, dw, dy);
  return dw;
}

// Tunes the three directions of one convolution now, with the runtime's backend, on tensors shaped like the
// call's.
std::int64_t fill_cuda(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups, bool transposed,
                       at::IntArrayRef output_padding) {
  check_tensors("fill", input, weight);
  check_cuda("fill", input, weight);
  const ConvolutionParams params = check_params("fill", input, weight, stride, padding, dilation, groups, transposed);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = convolution_memory_format(input, weight);
  const auto options = input.options();
  const at::Tensor w = aligned(weight, format);
  at::Tensor x, y;
  if (transposed) {
    const auto extra = per_spatial_dim("fill", "output_padding", output_padding, params.stride.size());
    x = empty_in(transposed_output_size(input.sizes(), weight.sizes(), params, extra), options, format);
    y = aligned(input, format);
  } else {
    x = aligned(input, format);
    y = empty_in(convolution_output_size(input.sizes(), weight.sizes(), params), options, format);
  }
  if (x.numel() == 0 || y.numel() == 0) return 0;
  // Tuning writes the output of each direction: it gets scratch memory, never a tensor of the caller's.
  const at::Tensor scratch_x = at::empty_like(x);
  const at::Tensor scratch_y = at::empty_like(y);
  const at::Tensor scratch_w = at::empty_like(w);
  const Problem problem = make_problem(x, w, y, params, format);
  const int device = input.get_device();
  const cudnnHandle_t handle = current_handle();
  rethrow([&] {
    Runtime& runtime = Runtime::instance();
    const Backend backend = runtime.backend();
    runtime.tune_direction<Direction::forward>(backend, handle, device, problem.key_for(Direction::forward),
                                               {x.data_ptr(), w.data_ptr(), scratch_y.data_ptr()}, allocate_workspace);
    runtime.tune_direction<Direction::backward_data>(backend, handle, device, problem.key_for(Direction::backward_data),
                                                     {scratch_x.data_ptr(), w.data_ptr(), y.data_ptr()},
                                                     allocate_workspace);
    runtime.tune_direction<Direction::backward_filter>(backend, handle, device,
                                                       problem.key_for(Direction::backward_filter),
                                                       {x.data_ptr(), scratch_w.data_ptr(), y.data_ptr()},
                                                       allocate_workspace);
  });
  return 3;
}

// Tunes the key through the backend on CUDA device `device` (default: the current one), on tensors made
// from the key alone: it holds every size, stride and dtype, so any process with a GPU of the key's origin
// can tune a problem another process met (cudnn_cache.distributed.sync). Returns the directions tuned (1).
std::int64_t tune_key(at::IntArrayRef words, const std::string& backend_name,
                      const std::optional<std::int64_t>& device) {
  const int device_index = cuda_device("tune_key", device, "tuning times cuDNN on a GPU");
  const ConvolutionKey key = key_from_list(words);
  const Backend backend = rethrow([&] { return backend_from_string(backend_name); });
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  const KeyOperands operands = operands_for("tune_key", key, device_index);
  const ConvolutionBuffers buffers = operands.buffers();
  const cudnnHandle_t handle = current_handle();
  rethrow([&] {
    Runtime& runtime = Runtime::instance();
    switch (static_cast<Direction>(key.direction)) {
      case Direction::forward:
        return runtime.tune_direction<Direction::forward>(backend, handle, device_index, key, buffers,
                                                          allocate_workspace);
      case Direction::backward_data:
        return runtime.tune_direction<Direction::backward_data>(backend, handle, device_index, key, buffers,
                                                                allocate_workspace);
      case Direction::backward_filter:
        return runtime.tune_direction<Direction::backward_filter>(backend, handle, device_index, key, buffers,
                                                                  allocate_workspace);
    }
  });
  return 1;
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) { m.impl("tune_key", &tune_key); }

TORCH_LIBRARY_IMPL(cudnn_cache, CUDA, m) {
  m.impl("_convolution_forward", &forward_cuda);
  m.impl("_convolution_backward_input", &backward_input_cuda);
  m.impl("_convolution_backward_weight", &backward_weight_cuda);
  m.impl("fill", &fill_cuda);
}

}  // namespace cudnn_cache::torch_ops
