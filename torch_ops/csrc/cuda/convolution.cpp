// CUDA kernels: cuDNN with the cached algorithms. The core does the lookup, tuning and fallback
// (Note [Running a cached convolution]); this file hands it tensors' memory, a cuDNN handle on the current
// stream, and workspace from PyTorch's caching allocator.

#include <ATen/record_function.h>
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
// convolution, whichever the direction writes. torch.profiler shows it as cudnn_cache::convolve (the cache's
// lookup and cuDNN's call), apart from the op's own work around it (checks, the key, output and layout).
template <Direction D>
void run(const Problem& problem, const at::Tensor& x, const at::Tensor& w, const at::Tensor& y) {
  RECORD_FUNCTION("cudnn_cache::convolve", c10::ArrayRef<const c10::IValue>{});
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

// What the backward kernels share: grad_output in the convolution's memory format, checked against the
// convolution of x by w, and the problem. x or w is the kernel's output where the op gets only its sizes.
struct Backward {
  at::Tensor dy;
  Problem problem;
};

Backward backward_problem(const char* op, const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& w,
                          at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                          std::int64_t groups, at::MemoryFormat format) {
  const ConvolutionParams params = check_params(op, x, w, stride, padding, dilation, groups);
  at::Tensor dy = aligned(grad_output, format);
  check_grad_output(op, x, w, dy, params);
  const Problem problem = make_problem(x, w, dy, params, format);
  return {std::move(dy), problem};
}

// The two backward directions, each into its output where that is defined.
void run_backward(const Backward& backward, const at::Tensor& x, const at::Tensor& w, const at::Tensor& dx,
                  const at::Tensor& dw) {
  if (dx.defined() && dx.numel() > 0) run<Direction::backward_data>(backward.problem, dx, w, backward.dy);
  if (!dw.defined()) return;
  if (x.numel() == 0) {
    dw.zero_();  // an empty batch contributes no gradient
  } else {
    run<Direction::backward_filter>(backward.problem, x, dw, backward.dy);
  }
}

at::Tensor backward_input_cuda(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups, const std::optional<at::Tensor>& bias) {
  const char* op = "_convolution_backward_input";
  check_cuda(op, grad_output, weight);
  check_sizes(op, "input_size", input_size, grad_output);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::MemoryFormat format = convolution_memory_format(grad_output, weight);
  const at::Tensor w = aligned(weight, format);
  at::Tensor dx = empty_in(input_size, grad_output.options(), format);
  run_backward(backward_problem(op, grad_output, dx, w, stride, padding, dilation, groups, format), dx, w, dx, {});
  add_bias(op, dx, bias);
  return dx;
}

at::Tensor backward_weight_cuda(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                std::int64_t groups) {
  const char* op = "_convolution_backward_weight";
  check_cuda(op, grad_output, input);
  check_sizes(op, "weight_size", weight_size, grad_output);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::MemoryFormat format = convolution_memory_format(input, grad_output);
  const at::Tensor x = aligned(input, format);
  const at::Tensor dw = empty_in(weight_size, x.options(), format);
  run_backward(backward_problem(op, grad_output, x, dw, stride, padding, dilation, groups, format), x, dw, {}, dw);
  return dw;
}

// Both directions with one set of checks and one problem, as aten::convolution_backward runs them.
std::tuple<at::Tensor, at::Tensor> backward_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& weight, at::IntArrayRef stride,
                                                 at::IntArrayRef padding, at::IntArrayRef dilation,
                                                 std::int64_t groups) {
  const char* op = "_convolution_backward";
  check_tensors(op, input, weight);
  check_cuda(op, input, weight);
  check_cuda(op, grad_output, input);
  TORCH_CHECK(grad_output.scalar_type() == input.scalar_type(), op, ": grad_output is ", grad_output.scalar_type(),
              " but input is ", input.scalar_type(), "; pass the gradient of the convolution's output");
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = convolution_memory_format(input, weight);
  const at::Tensor x = aligned(input, format);
  const at::Tensor w = aligned(weight, format);
  const Backward backward = backward_problem(op, grad_output, x, w, stride, padding, dilation, groups, format);
  at::Tensor dx = empty_in(x.sizes(), x.options(), format);
  at::Tensor dw = empty_in(w.sizes(), w.options(), format);
  run_backward(backward, x, w, dx, dw);
  return {std::move(dx), std::move(dw)};
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

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("tune_key", &tune_key);
}

TORCH_LIBRARY_IMPL(cudnn_cache, CUDA, m) {
  m.impl("_convolution_forward", &forward_cuda);
  m.impl("_convolution_backward_input", &backward_input_cuda);
  m.impl("_convolution_backward_weight", &backward_weight_cuda);
  m.impl("_convolution_backward", &backward_cuda);
  m.impl("fill", &fill_cuda);
}

}  // namespace cudnn_cache::torch_ops
