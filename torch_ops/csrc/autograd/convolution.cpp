// Autograd in C++, on the Autograd key, so TorchScript models (from Python or LibTorch) train without Python.

#include <torch/autograd.h>
#include <torch/library.h>

#include "../convolution.h"
#include "../problem.h"

namespace cudnn_cache::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Keeps what backward needs of the integer arguments, as one list (one saved_data entry, not five: this runs
// on every training call): the spatial rank n, then n strides, n paddings, n dilations, groups and has_bias.
void save_params(AutogradContext* ctx, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                 std::int64_t groups, bool has_bias) {
  std::vector<std::int64_t> packed;
  packed.reserve(3 + 3 * stride.size());
  packed.push_back(static_cast<std::int64_t>(stride.size()));
  packed.insert(packed.end(), stride.begin(), stride.end());
  packed.insert(packed.end(), padding.begin(), padding.end());
  packed.insert(packed.end(), dilation.begin(), dilation.end());
  packed.push_back(groups);
  packed.push_back(has_bias);
  ctx->saved_data["params"] = std::move(packed);
}

struct SavedParams {
  std::vector<std::int64_t> stride, padding, dilation;
  std::int64_t groups;
  bool has_bias;

  explicit SavedParams(AutogradContext* ctx) {
    const std::vector<std::int64_t> packed = ctx->saved_data["params"].toIntVector();
    const auto n = static_cast<std::ptrdiff_t>(packed[0]);
    const auto begin = packed.begin() + 1;
    stride.assign(begin, begin + n);
    padding.assign(begin + n, begin + 2 * n);
    dilation.assign(begin + 2 * n, begin + 3 * n);
    groups = packed[1 + 3 * n];
    has_bias = packed[2 + 3 * n] != 0;
  }
};

// Whether the call records a graph for backward. Without one (inference, torch.no_grad) the autograd
// Function is skipped: it would make a node and save tensors no one uses, on every call.
bool records_gradient(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return at::GradMode::is_enabled() &&
         (input.requires_grad() || weight.requires_grad() || (bias && bias->defined() && bias->requires_grad()));
}

// What both backward passes start from: the saved tensors and arguments, and grad_output in the forward's
// layout, so cuDNN sees one layout in every direction and the three keys agree on it.
struct Backward {
  Backward(AutogradContext* ctx, const tensor_list& grads)
      : saved(ctx->get_saved_variables()),
        input(saved[0]),
        weight(saved[1]),
        params(ctx),
        grad(grads[0].contiguous(convolution_memory_format(input, weight))) {}

  torch::autograd::variable_list saved;
  const at::Tensor& input;
  const at::Tensor& weight;
  SavedParams params;
  at::Tensor grad;
};

// The bias gradient: grad_output summed over every dimension but the channels.
at::Tensor bias_gradient(const at::Tensor& grad_output) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < grad_output.dim(); ++d) dims.push_back(d);
  return grad_output.sum(dims);
}

class Convolution : public torch::autograd::Function<Convolution> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                            at::IntArrayRef dilation, std::int64_t groups) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({input, weight});
    save_params(ctx, stride, padding, dilation, groups, bias && bias->defined());
    return call_convolution(input, weight, bias, stride, padding, dilation, groups);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const Backward b(ctx, grads);
    const SavedParams& p = b.params;
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = call_backward_input(b.grad, b.weight, b.input.sizes(), p.stride, p.padding, p.dilation, p.groups);
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight =
          call_backward_weight(b.grad, b.input, b.weight.sizes(), p.stride, p.padding, p.dilation, p.groups);
    }
    if (p.has_bias && ctx->needs_input_grad(2)) grad_bias = bias_gradient(b.grad);
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// y = convolution_transpose(x, w) is dx of the convolution y -> x, so its gradients are that convolution's
// forward (for x) and its backward-filter with the roles of input and grad_output swapped (for w).
class ConvolutionTranspose : public torch::autograd::Function<ConvolutionTranspose> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                            at::IntArrayRef output_padding, at::IntArrayRef dilation, std::int64_t groups) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({input, weight});
    save_params(ctx, stride, padding, dilation, groups, bias && bias->defined());
    return call_transpose(input, weight, bias, stride, padding, output_padding, dilation, groups);
  }

  static at::Tensor call_transpose(const at::Tensor& input, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef output_padding, at::IntArrayRef dilation,
                                   std::int64_t groups) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("cudnn_cache::convolution_transpose", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                                 at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                 std::int64_t)>();
    return op.call(input, weight, bias, stride, padding, output_padding, dilation, groups);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const Backward b(ctx, grads);
    const SavedParams& p = b.params;
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = call_convolution(b.grad, b.weight, std::nullopt, p.stride, p.padding, p.dilation, p.groups);
    }
    if (ctx->needs_input_grad(1)) {
      grad_weight =
          call_backward_weight(b.input, b.grad, b.weight.sizes(), p.stride, p.padding, p.dilation, p.groups);
    }
    if (p.has_bias && ctx->needs_input_grad(2)) grad_bias = bias_gradient(b.grad);
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(),  at::Tensor()};
  }
};

at::Tensor convolution_autograd(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                                at::IntArrayRef dilation, std::int64_t groups) {
  if (!records_gradient(input, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_convolution(input, weight, bias, stride, padding, dilation, groups);
  }
  return Convolution::apply(input, weight, bias, stride, padding, dilation, groups);
}

at::Tensor convolution_transpose_autograd(const at::Tensor& input, const at::Tensor& weight,
                                          const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                          at::IntArrayRef padding, at::IntArrayRef output_padding,
                                          at::IntArrayRef dilation, std::int64_t groups) {
  if (!records_gradient(input, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return ConvolutionTranspose::call_transpose(input, weight, bias, stride, padding, output_padding, dilation, groups);
  }
  return ConvolutionTranspose::apply(input, weight, bias, stride, padding, output_padding, dilation, groups);
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, Autograd, m) {
  m.impl("convolution", &convolution_autograd);
  m.impl("convolution_transpose", &convolution_transpose_autograd);
}

}  // namespace cudnn_cache::torch_ops
