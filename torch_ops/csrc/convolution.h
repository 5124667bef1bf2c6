#pragma once

// The convolution ops. Two are public: cudnn_cache::convolution and convolution_transpose (with bias, batched
// or not), composites that decide whether the cache runs the call (Note [Which convolutions the cache runs])
// and express it with the three cached ops, one per cuDNN direction, which have kernels per dispatch key
// (cpu/, cuda/, meta/, autograd/): _convolution_forward, _convolution_backward_input and
// _convolution_backward_weight; a convolution's backward runs the last two as one op, _convolution_backward.
// These are typed calls of the cached ops through the dispatcher, for code that must not bypass it (autograd,
// composites).

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <tuple>
#include <utility>

#include "cudnn_cache/key.h"

namespace cudnn_cache::torch_ops {

// y = conv(input, weight), bias (one value per output channel) added when given.
at::Tensor call_forward(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                        const std::optional<at::Tensor>& bias = std::nullopt);
// The gradient of conv(x, weight) with respect to x of sizes input_size, given grad_output; bias (one value per
// channel of x) added when given, which makes it a transposed convolution with bias.
at::Tensor call_backward_input(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups, const std::optional<at::Tensor>& bias = std::nullopt);
// The gradient of conv(input, w) with respect to w of sizes weight_size, given grad_output.
at::Tensor call_backward_weight(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                std::int64_t groups);

// Both gradients of forward(input, weight) given grad_output: backward_input and backward_weight in one call,
// which shares their checks and key (Note [Gradients of the cached ops]).
std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& weight, at::IntArrayRef stride,
                                                 at::IntArrayRef padding, at::IntArrayRef dilation,
                                                 std::int64_t groups);
// The same as two calls, backward_input and backward_weight: what _convolution_backward is wherever it does not
// run both directions in one kernel (its CPU and Meta kernels, and under autograd, where each call records its
// own node so that its gradients have gradients again).
std::tuple<at::Tensor, at::Tensor> backward_by_directions(const at::Tensor& grad_output, const at::Tensor& input,
                                                          const at::Tensor& weight, at::IntArrayRef stride,
                                                          at::IntArrayRef padding, at::IntArrayRef dilation,
                                                          std::int64_t groups);

// The cached op of direction `op` on (a, b): forward(input, weight), backward_data(grad_output, weight, size)
// or backward_filter(grad_output, input, size), where size is the result's; bias, added to the result, for the
// first two only.
at::Tensor call_cached(Direction op, const at::Tensor& a, const at::Tensor& b, at::IntArrayRef size,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                       const std::optional<at::Tensor>& bias = std::nullopt);

// Note [Gradients of the cached ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each cached op is bilinear in its two tensors, and its gradient with respect to either is one of the three
// cached ops again (g is the gradient of the op's result):
//   y  = forward(x, w):          grad x = backward_data(g, w)     grad w = backward_filter(g, x)
//   dx = backward_data(dy, w):   grad dy = forward(g, w)          grad w = backward_filter(dy, g)
//   dw = backward_filter(dy, x): grad dy = forward(x, g)          grad x = backward_data(dy, g)
// (the last two rows follow from <g, backward_data(dy, w)> = <forward(g, w), dy> and
// <g, backward_filter(dy, x)> = <dy, forward(x, g)>). The ops' autograd (autograd/) and interception's
// convolution_backward both compute gradients this way, through the dispatcher, where the ops have autograd
// again: gradients of every order. A transposed convolution is backward_data, so it needs no row of its own.
//
// The first row with both gradients wanted is what every convolution's backward asks for, and a fourth op,
// _convolution_backward, computes it in one call, as aten::convolution_backward does natively: one dispatch,
// one set of checks and one key for the two directions. It is the two ops in all but cost: where its result
// needs gradients of its own (create_graph, forward-mode AD), its autograd kernel makes the two calls instead,
// and their nodes give the gradients.
//
// forward and backward_data also take a bias, one value per channel (dimension 1) of their result, added to it
// in the kernel, so that a biased convolution is one op and one autograd node, as natively. The bias is a
// summand: it does not enter the gradients of a and b (the rules above, which call the ops with no bias), and
// its own gradient is g summed over every dimension but the channel one (bias_gradient), an ATen reduction
// with autograd of its own, so it too has gradients of every order.

// The gradients of the cached op `op` applied to (a, b), given the gradient of its result; those `needed`.
std::pair<at::Tensor, at::Tensor> cached_gradients(Direction op, const at::Tensor& a, const at::Tensor& b,
                                                   const at::Tensor& grad, at::IntArrayRef stride,
                                                   at::IntArrayRef padding, at::IntArrayRef dilation,
                                                   std::int64_t groups, std::array<bool, 2> needed);

// The gradient of a bias added to a result of the cached ops (N, C, *spatial), given the result's gradient.
at::Tensor bias_gradient(const at::Tensor& grad);

// bias (C) viewed as (1, C, 1, ...) of `dims` dimensions: one value per channel of an (N, C, *spatial) tensor.
at::Tensor broadcast_bias(const at::Tensor& bias, std::int64_t dims);

// Adds bias, checked for `op`, to `result` (N, C, *spatial) in place: what the kernels of forward and
// backward_data do to their result, below autograd.
void add_bias(const char* op, at::Tensor& result, const std::optional<at::Tensor>& bias);

// The convolution (transposed: the transposed convolution) of a batched input, bias added, through the cached
// ops: what the public ops and interception run once the cache takes the call (Note [Which convolutions the
// cache runs]).
at::Tensor cached_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                              bool transposed, at::IntArrayRef output_padding, std::int64_t groups);

// The input as cuDNN gets it: PyTorch makes a 1-D convolution's input contiguous before it views it as
// (N, C, 1, L) (`_convolution` and `convolution_backward`, "avoid accidentally going through NHWC for permuted 3d
// input"), so a transposed (N, L, C) input runs contiguous. The cache does the same, so its layouts, and with
// them its keys and outputs, are native's.
at::Tensor cudnn_input(const at::Tensor& input);

}  // namespace cudnn_cache::torch_ops
