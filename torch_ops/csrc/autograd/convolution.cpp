// Autograd of the cached ops, in C++ on the Autograd key, so TorchScript models (from Python or LibTorch)
// train without Python. One backward Node serves the three one-direction ops (Note [Gradients of the cached
// ops]), bias included, so a biased convolution records one node, as natively; it calls the ops again, so
// gradients of every order work. Forward-mode AD is the bilinear rule plus the bias's tangent, applied here.
// _convolution_backward, both gradients in one call, records no node: where its result needs gradients, it
// is the two one-direction ops.
//
// The kernel is written as ATen's generated autograd kernels are (a Node of its own, saved variables, the
// result's history set by hand), not as a torch::autograd::Function: torch.func's transforms (grad, vjp, vmap
// of a backward) refuse C++ Functions, and treat a kernel like this one as they treat aten's.

#include "../convolution.h"
#include "../problem.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

namespace cudnn_cache::torch_ops {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Forward AD in PyTorch has one level, 0 (torch.autograd.forward_ad and torch.func.jvp alike).
constexpr std::uint64_t kForwardLevel = 0;

// The backward of `result = op(a, b) + bias`: the gradients of a, b and bias (its edge is an empty one when
// there is none), by Note [Gradients of the cached ops].
struct CachedConvolutionBackward : public torch::autograd::Node {
  Direction op = Direction::forward;
  SpatialValues stride, padding, dilation;
  std::int64_t groups = 1;
  SavedVariable a, b;

  std::string name() const override { return "CachedConvolutionBackward"; }

  void release_variables() override {
    a.reset_data();
    b.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto [grad_a, grad_b] = cached_gradients(op, a.unpack(), b.unpack(), grads[0], stride, padding, dilation, groups,
                                             {task_should_compute_output(0), task_should_compute_output(1)});
    return {grad_a, grad_b, task_should_compute_output(2) ? bias_gradient(grads[0]) : at::Tensor()};
  }
};

// The Autograd kernel of the cached op `op` on (a, b), bias added (none for backward_filter).
at::Tensor cached_autograd(Direction op, const at::Tensor& a, const at::Tensor& b,
                           const std::optional<at::Tensor>& bias, at::IntArrayRef size, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups) {
  std::shared_ptr<CachedConvolutionBackward> node;
  if (torch::autograd::compute_requires_grad(a, b, bias)) {
    node = std::shared_ptr<CachedConvolutionBackward>(new CachedConvolutionBackward(), torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(a, b, bias));
    node->op = op;
    node->stride.assign(stride.begin(), stride.end());
    node->padding.assign(padding.begin(), padding.end());
    node->dilation.assign(dilation.begin(), dilation.end());
    node->groups = groups;
    node->a = SavedVariable(a, false);
    node->b = SavedVariable(b, false);
  }
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = call_cached(op, a, b, size, stride, padding, dilation, groups, bias);
  }
  if (node) torch::autograd::set_history(result, node);
  const at::Tensor& tangent_a = a._fw_grad(kForwardLevel);
  const at::Tensor& tangent_b = b._fw_grad(kForwardLevel);
  const at::Tensor tangent_bias = bias && bias->defined() ? bias->_fw_grad(kForwardLevel) : at::Tensor();
  // op is bilinear in (a, b) and adds the bias: its tangent is op(da, b) + op(a, db) + dbias.
  if (tangent_a.defined() || tangent_b.defined() || tangent_bias.defined()) {
    at::Tensor tangent;
    if (tangent_a.defined()) {
      tangent = call_cached(op, tangent_a, b._fw_primal(kForwardLevel), size, stride, padding, dilation, groups);
    }
    if (tangent_b.defined()) {
      at::Tensor term =
          call_cached(op, a._fw_primal(kForwardLevel), tangent_b, size, stride, padding, dilation, groups);
      tangent = tangent.defined() ? tangent + term : term;
    }
    if (tangent_bias.defined()) {
      const at::Tensor term = broadcast_bias(tangent_bias, result.dim());
      tangent = tangent.defined() ? tangent + term : term.expand(result.sizes());
    }
    result._set_fw_grad(tangent, kForwardLevel, /*is_inplace_op=*/false);
  }
  return result;
}

at::Tensor forward_autograd(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                            const std::optional<at::Tensor>& bias) {
  return cached_autograd(Direction::forward, input, weight, bias, {}, stride, padding, dilation, groups);
}

at::Tensor backward_input_autograd(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                   std::int64_t groups, const std::optional<at::Tensor>& bias) {
  return cached_autograd(Direction::backward_data, grad_output, weight, bias, input_size, stride, padding, dilation,
                         groups);
}

at::Tensor backward_weight_autograd(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                    std::int64_t groups) {
  return cached_autograd(Direction::backward_filter, grad_output, input, std::nullopt, weight_size, stride, padding,
                         dilation, groups);
}

// The Autograd kernel of _convolution_backward: the one-call kernels when its result needs no gradient (a
// backward pass without create_graph), else the two cached ops, which record their own nodes.
std::tuple<at::Tensor, at::Tensor> backward_autograd(const at::Tensor& grad_output, const at::Tensor& input,
                                                     const at::Tensor& weight, at::IntArrayRef stride,
                                                     at::IntArrayRef padding, at::IntArrayRef dilation,
                                                     std::int64_t groups) {
  const auto has_tangent = [](const at::Tensor& tensor) { return tensor._fw_grad(kForwardLevel).defined(); };
  if (torch::autograd::compute_requires_grad(grad_output, input, weight) || has_tangent(grad_output) ||
      has_tangent(input) || has_tangent(weight)) {
    return backward_by_directions(grad_output, input, weight, stride, padding, dilation, groups);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return call_backward(grad_output, input, weight, stride, padding, dilation, groups);
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, Autograd, m) {
  m.impl("_convolution_backward", &backward_autograd);
  m.impl("_convolution_forward", &forward_autograd);
  m.impl("_convolution_backward_input", &backward_input_autograd);
  m.impl("_convolution_backward_weight", &backward_weight_autograd);
}

}  // namespace cudnn_cache::torch_ops
