// Interception: PyTorch's own CUDA convolutions (nn.Conv*d, F.conv*, and what torch.compile emits for them)
// run through the cache, with no change to the model.
//
// Note [Intercepting PyTorch's convolutions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every convolution PyTorch runs passes through two operators: aten::convolution (forward; autograd records
// ConvolutionBackward0 for it) and aten::convolution_backward (what that node, and torch.compile's graphs,
// call for the gradients). set_intercept(true) registers kernels for both under the CUDA dispatch key, in a
// torch::Library owned here; set_intercept(false) destroys it, and the dispatcher goes back to PyTorch's own
// kernels. Because the dispatcher is below autograd, functionalization and Inductor, eager code and compiled
// graphs both reach these kernels, and autograd keeps its native graph.
//
// A call is taken when PyTorch itself would run it with cuDNN (Note [Which convolutions the cache runs]);
// everything else (CPU tensors never reach a CUDA kernel; complex dtypes, depthwise convolutions PyTorch gives
// its own kernels, transposed convolutions with output_padding >= stride, cuDNN disabled, empty batches, ...)
// is handed to PyTorch's own kernels, at::native::convolution and at::native::convolution_backward,
// unchanged. A taken call runs the cached ops (cached_convolution and Note [Gradients of the cached ops], what
// cudnn_cache.convert() uses too), so lookup, tuning, miss policy and fallback are the cache's
// (Note [Running a cached convolution]).
//
// aten::convolution_backward has a CUDA kernel of PyTorch's already: registering ours overrides it (and
// destroying the library restores it). The dispatcher warns about overrides; that one is expected, so it is
// silenced for the registration only. The same library overrides PyTorch's cuDNN attention kernels (Note
// [Intercepting PyTorch's cuDNN attention] in attention.cpp).

#include <ATen/ATen.h>
#include <ATen/ops/convolution_backward_native.h>
#include <ATen/ops/convolution_native.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <mutex>

#include "../attention.h"
#include "../convolution.h"
#include "../routing.h"

namespace cudnn_cache::torch_ops {
namespace {

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, std::int64_t groups) {
  if (!runs_through_cache(input, weight, stride, padding, dilation, transposed, output_padding, groups)) {
    return at::native::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                   groups);
  }
  return cached_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    bool transposed, at::IntArrayRef output_padding, std::int64_t groups, std::array<bool, 3> output_mask) {
  if (grad_output.numel() == 0 ||
      !runs_through_cache(input, weight, stride, padding, dilation, transposed, output_padding, groups)) {
    return at::native::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                            transposed, output_padding, groups, output_mask);
  }
  // The convolution is forward(input, weight); the transposed one is backward_data(input, weight).
  auto [grad_input, grad_weight] =
      cached_gradients(transposed ? Direction::backward_data : Direction::forward, cudnn_input(input), weight,
                       grad_output, stride, padding, dilation, groups, {output_mask[0], output_mask[1]});
  return {grad_input, grad_weight, output_mask[2] ? bias_gradient(grad_output) : at::Tensor()};
}

std::mutex mutex;
std::unique_ptr<torch::Library> library;  // guarded by mutex; set while intercepting

// Drops the dispatcher's warning about overriding PyTorch's CUDA kernel of aten::convolution_backward.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

void set_intercept(bool enabled) {
  std::lock_guard lock(mutex);
  if (!enabled) {
    library.reset();
    return;
  }
  if (library) return;
  SilentWarnings silent;
  const c10::WarningUtils::WarningHandlerGuard guard(&silent);
  auto registering = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA,
                                                      __FILE__, __LINE__);
  registering->impl("convolution", TORCH_FN(convolution));
  registering->impl("convolution_backward", TORCH_FN(convolution_backward));
  register_attention(*registering);  // Note [Intercepting PyTorch's cuDNN attention] in attention.cpp
  library = std::move(registering);
}

bool get_intercept() {
  std::lock_guard lock(mutex);
  return library != nullptr;
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("set_intercept", &set_intercept);
  m.impl("get_intercept", &get_intercept);
}

}  // namespace cudnn_cache::torch_ops
