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
// A call is taken when cuDNN would serve it natively: CUDA tensors of float, half, bfloat16 or double, 1-D to
// 3-D (3- to 5-dimensional tensors), not empty, with cuDNN enabled (torch.backends.cudnn.enabled). Everything
// else (CPU tensors, complex or quantized dtypes, cuDNN disabled, empty batches) is handed to PyTorch's own
// kernels, at::native::convolution and at::native::convolution_backward, unchanged. A taken call runs the
// cudnn_cache ops (the same kernels cudnn_cache.convert() uses), so lookup, tuning, miss policy and fallback
// are the cache's (Note [Running a cached convolution]).
//
// aten::convolution_backward has a CUDA kernel of PyTorch's already: registering ours overrides it (and
// destroying the library restores it). The dispatcher warns about overrides; that one is expected, so it is
// silenced for the registration only.

#include <ATen/ATen.h>
#include <ATen/ops/convolution_backward_native.h>
#include <ATen/ops/convolution_native.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <mutex>

#include "../convolution.h"

namespace cudnn_cache::torch_ops {
namespace {

bool taken(const at::Tensor& input, const at::Tensor& weight) {
  const at::ScalarType type = input.scalar_type();
  return input.is_cuda() && weight.is_cuda() && input.layout() == at::kStrided && weight.layout() == at::kStrided &&
         (type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kDouble) &&
         weight.scalar_type() == type && input.dim() >= 3 && input.dim() <= 5 && weight.dim() == input.dim() &&
         input.numel() > 0 && weight.numel() > 0 && at::globalContext().userEnabledCuDNN();
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, std::int64_t groups) {
  if (!taken(input, weight)) {
    return at::native::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                                   groups);
  }
  if (!transposed) return call_convolution(input, weight, bias, stride, padding, dilation, groups);
  return call_convolution_transpose(input, weight, bias, stride, padding, output_padding, dilation, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    bool transposed, at::IntArrayRef output_padding, std::int64_t groups, std::array<bool, 3> output_mask) {
  if (!taken(input, weight) || grad_output.numel() == 0) {
    return at::native::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                            transposed, output_padding, groups, output_mask);
  }
  at::Tensor grad_input, grad_weight, grad_bias;
  if (!transposed) {
    if (output_mask[0]) {
      grad_input = call_backward_input(grad_output, weight, input.sizes(), stride, padding, dilation, groups);
    }
    if (output_mask[1]) {
      grad_weight = call_backward_weight(grad_output, input, weight.sizes(), stride, padding, dilation, groups);
    }
  } else {  // the transposed convolution is the backward-data of the convolution from its output to its input
    if (output_mask[0]) {
      grad_input = call_convolution(grad_output, weight, std::nullopt, stride, padding, dilation, groups);
    }
    if (output_mask[1]) {
      grad_weight = call_backward_weight(input, grad_output, weight.sizes(), stride, padding, dilation, groups);
    }
  }
  if (output_mask[2]) {
    std::vector<std::int64_t> reduced{0};
    for (std::int64_t d = 2; d < grad_output.dim(); ++d) reduced.push_back(d);
    grad_bias = grad_output.sum(reduced);
  }
  return {grad_input, grad_weight, grad_bias};
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
