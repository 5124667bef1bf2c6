// The public convolution ops, written once for every backend as composites (CompositeImplicitAutograd): they
// take unbatched input as torch.nn does, decide whether the cache runs the call (Note [Which convolutions the
// cache runs]), and express a taken call with the three cached ops, which interception runs too.

#include "convolution.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "cudnn_cache/runtime.h"
#include "problem.h"
#include "routing.h"

namespace cudnn_cache::torch_ops {

at::Tensor call_cached(Direction op, const at::Tensor& a, const at::Tensor& b, at::IntArrayRef size,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                       const std::optional<at::Tensor>& bias) {
  switch (op) {
    case Direction::forward: return call_forward(a, b, stride, padding, dilation, groups, bias);
    case Direction::backward_data: return call_backward_input(a, b, size, stride, padding, dilation, groups, bias);
    case Direction::backward_filter:
      TORCH_CHECK(!bias || !bias->defined(), "cudnn_cache: _convolution_backward_weight takes no bias");
      return call_backward_weight(a, b, size, stride, padding, dilation, groups);
  }
  TORCH_CHECK(false, "cudnn_cache: unknown direction ", static_cast<int>(op));
}

std::pair<at::Tensor, at::Tensor> cached_gradients(Direction op, const at::Tensor& a, const at::Tensor& b,
                                                   const at::Tensor& grad, at::IntArrayRef stride,
                                                   at::IntArrayRef padding, at::IntArrayRef dilation,
                                                   std::int64_t groups, std::array<bool, 2> needed) {
  // Native PyTorch hands cuDNN grad_output in the forward's memory format; so do we, and the keys of the
  // three directions agree on the layout.
  const at::Tensor g = contiguous_in(grad, convolution_memory_format(a, b));
  const auto call = [&](Direction direction, const at::Tensor& first, const at::Tensor& second, at::IntArrayRef size) {
    return call_cached(direction, first, second, size, stride, padding, dilation, groups);
  };
  at::Tensor grad_a, grad_b;
  switch (op) {
    case Direction::forward:  // y = forward(x, w)
      if (needed[0] && needed[1]) {  // one call (Note [Gradients of the cached ops])
        std::tie(grad_a, grad_b) = call_backward(g, a, b, stride, padding, dilation, groups);
        break;
      }
      if (needed[0]) grad_a = call(Direction::backward_data, g, b, a.sizes());
      if (needed[1]) grad_b = call(Direction::backward_filter, g, a, b.sizes());
      break;
    case Direction::backward_data:  // dx = backward_input(dy, w)
      if (needed[0]) grad_a = call(Direction::forward, g, b, {});
      if (needed[1]) grad_b = call(Direction::backward_filter, a, g, b.sizes());
      break;
    case Direction::backward_filter:  // dw = backward_weight(dy, x)
      if (needed[0]) grad_a = call(Direction::forward, b, g, {});
      if (needed[1]) grad_b = call(Direction::backward_data, a, g, b.sizes());
      break;
  }
  return {grad_a, grad_b};
}

std::tuple<at::Tensor, at::Tensor> backward_by_directions(const at::Tensor& grad_output, const at::Tensor& input,
                                                          const at::Tensor& weight, at::IntArrayRef stride,
                                                          at::IntArrayRef padding, at::IntArrayRef dilation,
                                                          std::int64_t groups) {
  return {call_backward_input(grad_output, weight, input.sizes(), stride, padding, dilation, groups),
          call_backward_weight(grad_output, input, weight.sizes(), stride, padding, dilation, groups)};
}

at::Tensor bias_gradient(const at::Tensor& grad) {
  Sizes reduced{0};
  for (std::int64_t d = 2; d < grad.dim(); ++d) reduced.push_back(d);
  return grad.sum(reduced);
}

at::Tensor broadcast_bias(const at::Tensor& bias, std::int64_t dims) {
  Sizes shape(dims, 1);
  shape[1] = -1;
  return bias.view(shape);
}

void add_bias(const char* op, at::Tensor& result, const std::optional<at::Tensor>& bias) {
  if (!bias || !bias->defined()) return;
  check_bias(op, result, result.size(1), bias);
  result.add_(broadcast_bias(*bias, result.dim()));
}

at::Tensor cudnn_input(const at::Tensor& input) { return input.dim() == 3 ? input.contiguous() : input; }

at::Tensor cached_convolution(const at::Tensor& given_input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
                              std::int64_t groups) {
  const char* op = transposed ? "convolution_transpose" : "convolution";
  const at::Tensor input = cudnn_input(given_input);
  // The cached op adds the bias (Note [Gradients of the cached ops]) and checks it too, but it is checked here
  // first so that the error names the op the caller called.
  if (transposed) {  // the backward-data of the convolution from its output to its input
    check_tensors(op, input, weight);
    const ConvolutionParams params = check_params(op, input, weight, stride, padding, dilation, groups, true);
    check_bias(op, input, weight.size(1) * groups, bias);
    const auto extra = per_spatial_dim(op, "output_padding", output_padding, params.stride.size());
    return call_backward_input(input, weight, transposed_output_size(input.sizes(), weight.sizes(), params, extra),
                               params.stride, params.padding, params.dilation, groups, bias);
  }
  check_bias(op, input, weight.size(0), bias);  // weight has input's rank here, so at least one dimension
  return call_forward(input, weight, stride, padding, dilation, groups, bias);
}

namespace {

// The convolution as torch.nn.functional.conv*d and conv_transpose*d run it: what a call the cache does not
// take runs, with PyTorch's checks, kernels and autograd.
at::Tensor native_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                              bool transposed, at::IntArrayRef output_padding, std::int64_t groups) {
  switch (weight.dim()) {
    case 3:
      return transposed ? at::conv_transpose1d(input, weight, bias, stride, padding, output_padding, groups, dilation)
                        : at::conv1d(input, weight, bias, stride, padding, dilation, groups);
    case 4:
      return transposed ? at::conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
                        : at::conv2d(input, weight, bias, stride, padding, dilation, groups);
    case 5:
      return transposed ? at::conv_transpose3d(input, weight, bias, stride, padding, output_padding, groups, dilation)
                        : at::conv3d(input, weight, bias, stride, padding, dilation, groups);
    default:  // PyTorch's error
      return at::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
  }
}

// The public ops: cudnn_cache.functional.conv*d, conv_transpose*d and the converted modules call them. Input
// (C, *spatial) is unbatched, a batch of one, as torch.nn takes it.
at::Tensor convolution_any(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                           at::IntArrayRef output_padding, std::int64_t groups) {
  const bool unbatched = input.dim() + 1 == weight.dim();
  const at::Tensor batched = unbatched ? input.unsqueeze(0) : input;
  if (batched.dim() != weight.dim() ||
      !runs_through_cache(batched, weight, stride, padding, dilation, transposed, output_padding, groups)) {
    return native_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
  }
  at::Tensor output =
      cached_convolution(batched, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
  return unbatched ? output.squeeze(0) : output;
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups) {
  static constexpr std::int64_t kNoOutputPadding = 0;
  return convolution_any(input, weight, bias, stride, padding, dilation, false, kNoOutputPadding, groups);
}

at::Tensor convolution_transpose(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef output_padding, at::IntArrayRef dilation, std::int64_t groups) {
  return convolution_any(input, weight, bias, stride, padding, dilation, true, output_padding, groups);
}

// Under torch.autocast PyTorch runs convolutions in the autocast dtype (float16 or bfloat16; double stays
// double), and so do the public ops: their tensors are cast as ATen's autocast casts conv2d's, then the
// composite runs below autocast.
template <c10::DeviceType Device>
at::Tensor convolution_any_autocast(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                                    at::IntArrayRef output_padding, std::int64_t groups) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(Device));
  const at::ScalarType type = at::autocast::get_lower_precision_fp_from_device_type(Device);
  const auto cast = [&](const auto& tensor) { return at::autocast::cached_cast(type, tensor, Device); };
  return convolution_any(cast(input), cast(weight), cast(bias), stride, padding, dilation, transposed,
                         output_padding, groups);
}

template <c10::DeviceType Device>
at::Tensor convolution_autocast(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                                at::IntArrayRef dilation, std::int64_t groups) {
  static constexpr std::int64_t kNoOutputPadding = 0;
  return convolution_any_autocast<Device>(input, weight, bias, stride, padding, dilation, false, kNoOutputPadding,
                                          groups);
}

template <c10::DeviceType Device>
at::Tensor convolution_transpose_autocast(const at::Tensor& input, const at::Tensor& weight,
                                          const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                          at::IntArrayRef padding, at::IntArrayRef output_padding,
                                          at::IntArrayRef dilation, std::int64_t groups) {
  return convolution_any_autocast<Device>(input, weight, bias, stride, padding, dilation, true, output_padding, groups);
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeExplicitAutograd, m) {
  m.impl("_convolution_backward", &backward_by_directions);  // CUDA has a kernel of its own (cuda/)
}

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("convolution", &convolution);
  m.impl("convolution_transpose", &convolution_transpose);
}

TORCH_LIBRARY_IMPL(cudnn_cache, AutocastCUDA, m) {
  m.impl("convolution", &convolution_autocast<c10::DeviceType::CUDA>);
  m.impl("convolution_transpose", &convolution_transpose_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(cudnn_cache, AutocastCPU, m) {
  m.impl("convolution", &convolution_autocast<c10::DeviceType::CPU>);
  m.impl("convolution_transpose", &convolution_transpose_autocast<c10::DeviceType::CPU>);
}

}  // namespace cudnn_cache::torch_ops
