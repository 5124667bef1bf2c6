// PyTorch's cuDNN attention through persisted plans: See Note [Persisted attention plans] in attention.h.
//
// Note [Intercepting PyTorch's cuDNN attention]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// F.scaled_dot_product_attention's cuDNN backend runs aten::_scaled_dot_product_cudnn_attention, whose CUDA
// kernel calls aten::_cudnn_attention_forward; autograd's backward calls aten::_cudnn_attention_backward through
// _scaled_dot_product_cudnn_attention_backward. Intercepting (Note [Intercepting PyTorch's convolutions])
// registers kernels of those two under the CUDA dispatch key, so eager code and compiled graphs reach them,
// autograd keeps its native graph, and which calls reach cuDNN attention at all stays PyTorch's choice.
//
// A call is taken when it is dense (no cumulative sequence lengths: nested and variable-length batches stay
// native), fp16 or bf16, 4-d, on one CUDA device, not under deterministic algorithms (where PyTorch warns), and
// not while the stream captures a CUDA graph (PyTorch reads the Philox state of a capture on the device). A taken
// call does what PyTorch's kernel does: the same outputs in the same layouts (the output in the query's dimension
// order, the stats as float (b, h, s_q, 1), the Philox seed and offset as int64 scalars on the device, drawn
// from the default CUDA generator with the same offset increment), the bias broadcast to (b, h or 1, s_q, s_kv),
// and a grad_output whose last stride is not 1 made dense in the output's order; only where the plan comes from
// differs. Everything else runs PyTorch's own kernel, unchanged.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/_cudnn_attention_backward_native.h>
#include <ATen/ops/_cudnn_attention_forward_native.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "../attention.h"
#include "../problem.h"
#include "context.h"
#include "cudnn_cache/attention.h"
#include "cudnn_cache/runtime.h"

namespace cudnn_cache::torch_ops {

AttentionCounters& attention_counters() {
  static AttentionCounters counters;
  return counters;
}

namespace {

AttentionOperand operand_of(const at::Tensor& t) {
  AttentionOperand operand;
  for (int d = 0; d < 4; ++d) {
    operand.dims[d] = t.size(d);
    // A size-1 dimension's stride means nothing; cuDNN wants it as if packed (as PyTorch's MHA.cpp sets it).
    std::int64_t stride = t.stride(d);
    if (t.size(d) == 1 && stride == 0) {
      stride = 1;
      for (int inner = d + 1; inner < 4; ++inner) stride *= t.stride(inner);
    }
    operand.strides[d] = stride;
  }
  return operand;
}

bool takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& cum_q) {
  if (cum_q.has_value() && cum_q->defined()) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || !q.is_cuda()) return false;
  if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16) return false;
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return false;
  if (k.device() != q.device() || v.device() != q.device()) return false;
  if (at::globalContext().deterministicAlgorithms()) return false;
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
}

// The bias as cuDNN takes it, broadcast to (b, h or 1, s_q, s_kv); nullopt where the call cannot be taken.
std::optional<at::Tensor> broadcast_bias(const at::Tensor& bias, const at::Tensor& q, std::int64_t s_q,
                                         std::int64_t s_kv) {
  if (bias.scalar_type() != q.scalar_type() || bias.device() != q.device()) return std::nullopt;
  const std::int64_t b = q.size(0);
  if (bias.dim() == 2 || bias.dim() == 3) return bias.expand({b, 1, s_q, s_kv});
  if (bias.dim() == 4) return bias.expand({b, bias.size(1), s_q, s_kv});
  return std::nullopt;
}

// A tensor of `shape` whose dimensions are laid out in the order of q's strides (PyTorch's
// alloc_with_matching_layout).
at::Tensor empty_like_layout(const at::Tensor& q, const std::vector<std::int64_t>& shape) {
  if (q.sizes().equals(shape)) return at::empty_like(q);
  std::vector<int> order(4);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return q.stride(a) < q.stride(b); });
  std::vector<std::int64_t> strides(4);
  std::int64_t extent = 1;
  for (const int d : order) {
    strides[d] = extent;
    extent *= shape[d];
  }
  return at::empty_strided(shape, strides, q.options());
}

// grad_output dense in the output's dimension order (PyTorch's permute_to_matching_layout).
at::Tensor matching_layout(const at::Tensor& out, const at::Tensor& grad) {
  std::vector<std::int64_t> outer_to_inner(4);
  std::iota(outer_to_inner.begin(), outer_to_inner.end(), 0);
  std::stable_sort(outer_to_inner.begin(), outer_to_inner.end(),
                   [&](std::int64_t a, std::int64_t b) { return out.stride(a) > out.stride(b); });
  std::vector<std::int64_t> inverse(4);
  for (int d = 0; d < 4; ++d) inverse[outer_to_inner[d]] = d;
  return grad.permute(outer_to_inner).contiguous().permute(inverse);
}

float softmax_scale(const at::Tensor& q, std::optional<double> scale) {
  return static_cast<float>(scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))));
}

// The key and buffers of what both directions have: q, k, v, the output, the stats, the bias, dropout's seed and
// offset (where there is dropout), the scale.
std::pair<AttentionKey, AttentionBuffers> common_call(AttentionDirection direction, const at::Tensor& q,
                                                      const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                      const at::Tensor& stats, const std::optional<at::Tensor>& bias,
                                                      const at::Tensor& seed, const at::Tensor& offset,
                                                      double dropout_p, bool is_causal, std::optional<double> scale) {
  AttentionKey key;
  key.direction = static_cast<std::int64_t>(direction);
  key.data_type = q.scalar_type() == at::kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  key.is_causal = is_causal;
  key.stats = stats.defined();
  key.set_dropout_probability(static_cast<float>(dropout_p));
  key.q = operand_of(q);
  key.k = operand_of(k);
  key.v = operand_of(v);
  key.o = operand_of(out);
  if (bias) key.bias = operand_of(*bias);
  AttentionBuffers buffers;
  buffers.q = q.data_ptr();
  buffers.k = k.data_ptr();
  buffers.v = v.data_ptr();
  buffers.o = out.data_ptr();
  buffers.stats = stats.defined() ? stats.data_ptr() : nullptr;
  buffers.bias = bias ? bias->data_ptr() : nullptr;
  buffers.seed = key.dropout_bits != 0 ? seed.data_ptr() : nullptr;
  buffers.offset = key.dropout_bits != 0 ? offset.data_ptr() : nullptr;
  buffers.scale = softmax_scale(q, scale);
  return {key, buffers};
}

void run(const AttentionKey& key, const at::Tensor& q, AttentionBuffers buffers) {
  const int device = q.get_device();
  const cudnnHandle_t handle = current_handle();
  const AttentionPlan& plan = rethrow([&]() -> const AttentionPlan& {
    return attention_plan(handle, device, key, Runtime::instance().caches_for_device(device).attention,
                          attention_counters());
  });
  Workspace workspace = allocate_workspace(plan.workspace_bytes());
  TORCH_CHECK(plan.workspace_bytes() == 0 || workspace, "cudnn_cache: out of memory for ", plan.workspace_bytes(),
              " bytes of cuDNN attention workspace");
  rethrow([&] { plan.execute(handle, buffers, workspace.data()); });
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                                 at::Tensor, at::Tensor>;

ForwardResult attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& attn_bias, const std::optional<at::Tensor>& cum_q,
                                const std::optional<at::Tensor>& cum_k, std::int64_t max_q, std::int64_t max_k,
                                bool compute_log_sumexp, double dropout_p, bool is_causal, bool return_debug_mask,
                                std::optional<double> scale) {
  const auto native = [&] {
    return at::native::_cudnn_attention_forward(q, k, v, attn_bias, cum_q, cum_k, max_q, max_k, compute_log_sumexp,
                                                dropout_p, is_causal, return_debug_mask, scale);
  };
  if (!takes(q, k, v, cum_q)) return native();
  const c10::cuda::CUDAGuard guard(q.device());  // the dispatcher sets no device for an overriding kernel
  const std::int64_t b = q.size(0), h = q.size(1), s_q = q.size(2), s_kv = k.size(2), d_v = v.size(3);
  std::optional<at::Tensor> bias;
  if (attn_bias.has_value() && attn_bias->defined()) {
    bias = broadcast_bias(*attn_bias, q, s_q, s_kv);
    if (!bias) return native();
  }
  at::Tensor out = empty_like_layout(q, {b, h, s_q, d_v});
  at::Tensor stats = compute_log_sumexp ? at::empty({b, h, s_q, 1}, q.options().dtype(at::kFloat)) : at::Tensor();
  const auto scalar = at::TensorOptions().dtype(at::kLong).device(q.device());
  at::Tensor seed, offset;
  if (dropout_p != 0.0) {
    auto* generator = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(q.get_device()));
    std::lock_guard<std::mutex> lock(generator->mutex_);
    const at::PhiloxCudaState state = generator->philox_cuda_state(b * h * s_q * s_kv);
    seed = at::full({}, static_cast<std::int64_t>(state.seed_.val), scalar);
    offset = at::full({}, static_cast<std::int64_t>(state.offset_.val), scalar);
  } else {
    seed = at::empty({}, scalar);
    offset = at::empty({}, scalar);
  }
  if (q.numel() > 0 && k.numel() > 0 && v.numel() > 0) {
    const auto [key, buffers] = common_call(AttentionDirection::forward, q, k, v, out, stats, bias, seed, offset,
                                            dropout_p, is_causal, scale);
    run(key, q, buffers);
  }
  return {out, stats, at::Tensor(), at::Tensor(), c10::SymInt(max_q), c10::SymInt(max_k), seed, offset, at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    const at::Tensor& attn_bias, const at::Tensor& cum_q, const at::Tensor& cum_k, std::int64_t max_q,
    std::int64_t max_k, double dropout_p, bool is_causal, std::optional<double> scale) {
  const auto native = [&] {
    return at::native::_cudnn_attention_backward(grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset,
                                                 attn_bias, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, scale);
  };
  if (!takes(q, k, v, cum_q) || grad_out.dim() != 4 || out.dim() != 4 || !logsumexp.defined() ||
      grad_out.scalar_type() != q.scalar_type() || out.scalar_type() != q.scalar_type() ||
      logsumexp.scalar_type() != at::kFloat) {
    return native();
  }
  const c10::cuda::CUDAGuard guard(q.device());
  const std::int64_t s_q = q.size(2), s_kv = k.size(2);
  std::optional<at::Tensor> bias;
  if (attn_bias.defined()) {
    bias = broadcast_bias(attn_bias, q, s_q, s_kv);
    if (!bias) return native();
  }
  const at::Tensor stats = logsumexp.dim() == 3 ? logsumexp.unsqueeze(-1) : logsumexp;
  if (!stats.is_contiguous() || stats.dim() != 4) return native();
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0 || out.numel() == 0 || grad_out.numel() == 0) {
    return {dq, dk, dv};
  }
  const at::Tensor d_o = grad_out.stride(3) == 1 ? grad_out : matching_layout(out, grad_out);
  auto [key, buffers] = common_call(AttentionDirection::backward, q, k, v, out, stats, bias, philox_seed,
                                    philox_offset, dropout_p, is_causal, scale);
  key.d_o = operand_of(d_o);
  key.d_q = operand_of(dq);
  key.d_k = operand_of(dk);
  key.d_v = operand_of(dv);
  buffers.d_o = d_o.data_ptr();
  buffers.d_q = dq.data_ptr();
  buffers.d_k = dk.data_ptr();
  buffers.d_v = dv.data_ptr();
  run(key, q, buffers);
  return {dq, dk, dv};
}

}  // namespace

void register_attention(torch::Library& library) {
  library.impl("_cudnn_attention_forward", TORCH_FN(attention_forward));
  library.impl("_cudnn_attention_backward", TORCH_FN(attention_backward));
}

}  // namespace cudnn_cache::torch_ops
