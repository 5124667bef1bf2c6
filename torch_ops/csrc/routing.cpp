#include "routing.h"

#include <ATen/native/ConvUtils.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/hash.h>

#include <array>
#include <cstring>
#include <limits>

#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

bool cudnn_data_type(at::ScalarType type) {
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kDouble;
}

// Whether the convolution has an output (a transposed one may have none) and, on CUDA, whether input, weight
// and output each have at most 2^31 - 1 elements, so that the cache's keys hold them whole. PyTorch has checked
// the arguments by now.
bool has_keyable_output(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                        at::IntArrayRef output_padding, std::int64_t groups) {
  const auto spatial_dims = static_cast<std::size_t>(input.dim() - 2);
  const ConvolutionParams params{per_spatial_dim("convolution", "stride", stride, spatial_dims),
                                 per_spatial_dim("convolution", "padding", padding, spatial_dims),
                                 per_spatial_dim("convolution", "dilation", dilation, spatial_dims), groups};
  const SizesOf<c10::SymInt> output = output_size<c10::SymInt>(
      input.sym_sizes(), weight.sym_sizes(), params, transposed,
      transposed ? per_spatial_dim("convolution", "output_padding", output_padding, spatial_dims)
                 : SpatialValues(spatial_dims, 0));
  c10::SymInt elements = 1;
  for (std::size_t d = 0; d < output.size(); ++d) {
    if (d >= 2 && output[d] < 1) return false;
    elements = elements * output[d];
  }
  return !input.is_cuda() ||
         (input.sym_numel() <= kInt32Max && weight.sym_numel() <= kInt32Max && elements <= kInt32Max);
}

// Note [A thread's routing answers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA call's answer comes from PyTorch's select_conv_backend, which builds its parameters as vectors of
// SymInts and checks the shapes again on every call: 1-2 us, that interception pays twice per training iteration
// (its forward and its backward kernel) on top of the cache's own path, where native pays it inside calls the
// cache's path is cheaper than (`python3 -m benchmarks host-cost`). For CUDA tensors the answer depends on
// nothing but what a Question holds: both tensors' sizes, strides, dtype, device and dispatch keys (which say
// mkldnn, xpu, nested, ...), the parameters as given, whether autograd records the call, the current CUDA
// device (PyTorch asks its properties for bf16 and depthwise support), and the global flags select_conv_backend
// reads (cuDNN enabled; benchmark, deterministic: carried into its parameters; TF32 is carried too but no rule
// for a CUDA tensor reads it, and asking for it costs a call). What else it reads is fixed for the process
// (cuDNN's version, how PyTorch was built, environment variables read once). So each thread
// keeps the answers to the questions it asked last, kAnswers of them by their hash, and asks PyTorch a
// question only once while the answer holds; a change of any flag is a new question. Tensors with symbolic
// sizes, and questions longer than a Question holds, are asked every time.
constexpr std::size_t kQuestionWords = 64;  // a 3-D convolution's question takes 50
constexpr std::size_t kAnswers = 64;

struct Question {
  std::array<std::int64_t, kQuestionWords> words;
  std::size_t size = 0;

  bool add(std::int64_t value) {
    if (size == words.size()) return false;
    words[size++] = value;
    return true;
  }
  bool add(at::IntArrayRef values) {
    if (!add(static_cast<std::int64_t>(values.size())) || words.size() - size < values.size()) return false;
    std::copy(values.begin(), values.end(), words.begin() + static_cast<std::ptrdiff_t>(size));
    size += values.size();
    return true;
  }
  bool add(const at::Tensor& tensor) {
    return add(tensor.sizes()) && add(tensor.strides()) && add(static_cast<std::int64_t>(tensor.scalar_type())) &&
           add(tensor.get_device()) && add(static_cast<std::int64_t>(tensor.key_set().raw_repr())) &&
           add(tensor.requires_grad());
  }
  bool operator==(const Question& other) const {
    return size == other.size && std::memcmp(words.data(), other.words.data(), size * sizeof(std::int64_t)) == 0;
  }
  std::size_t hash() const {
    std::size_t seed = size;
    for (std::size_t i = 0; i < size; ++i) seed = c10::hash_combine(seed, static_cast<std::size_t>(words[i]));
    return seed;
  }
};

struct Answer {
  Question question;
  bool taken = false;
};

// The question of a CUDA call, if it can be put (false: ask PyTorch).
bool ask(Question& question, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
         at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
         std::int64_t groups) {
  if (input.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      weight.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  const at::Context& context = at::globalContext();
  const std::int64_t flags = (context.userEnabledCuDNN() ? 1 : 0) | (context.benchmarkCuDNN() ? 2 : 0) |
                             (context.deterministicCuDNN() ? 4 : 0) | (context.deterministicAlgorithms() ? 8 : 0) |
                             (c10::GradMode::is_enabled() ? 16 : 0) | (transposed ? 32 : 0);
  return question.add(input) && question.add(weight) && question.add(stride) && question.add(padding) &&
         question.add(dilation) && question.add(output_padding) && question.add(groups) && question.add(flags) &&
         question.add(c10::cuda::current_device());
}

// runs_through_cache's answer past the checks that need no backend: what PyTorch's own choice of backend
// makes of the call.
bool taken_by_cache(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding,
                    std::int64_t groups) {
  const at::native::ConvBackend backend = at::native::select_conv_backend(
      input, weight, std::nullopt, c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding),
      c10::fromIntArrayRefSlow(dilation), transposed, c10::fromIntArrayRefSlow(output_padding), groups, std::nullopt);
  const bool taken =
      input.is_cuda() ? backend == at::native::ConvBackend::Cudnn || backend == at::native::ConvBackend::CudnnTranspose
                      // Elsewhere ATen's kernels compute the ops, whose outputs take one memory format on every device
                      // (the meta kernels' too); where ATen's own would take another, the call is aten::convolution's.
                      : at::native::_determine_backend_memory_format(input, weight, backend) ==
                            convolution_memory_format(input, weight);
  return taken && has_keyable_output(input, weight, stride, padding, dilation, transposed, output_padding, groups);
}

}  // namespace

bool output_padding_exceeds_stride(at::IntArrayRef output_padding, at::IntArrayRef stride) {
  for (std::size_t i = 0; i < output_padding.size(); ++i) {
    const std::int64_t s = stride.size() == 1 ? stride[0] : i < stride.size() ? stride[i] : 1;
    if (output_padding[i] >= s) return true;
  }
  return false;
}

bool runs_through_cache(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                        at::IntArrayRef output_padding, std::int64_t groups) {
  // What the cached ops can express at all: a dense convolution of tensors of one cuDNN data type, on one
  // device, with something to compute. The rest (PyTorch may take it, or raise) goes to PyTorch.
  const at::ScalarType type = input.scalar_type();
  if (!cudnn_data_type(type) || weight.scalar_type() != type || weight.device() != input.device() ||
      input.layout() != at::kStrided || weight.layout() != at::kStrided || input.sym_numel() == 0 ||
      weight.sym_numel() == 0 || (transposed && output_padding_exceeds_stride(output_padding, stride))) {
    return false;
  }
  if (input.is_meta()) return true;  // shapes only
  Question question;
  if (!input.is_cuda() ||
      !ask(question, input, weight, stride, padding, dilation, transposed, output_padding, groups)) {
    return taken_by_cache(input, weight, stride, padding, dilation, transposed, output_padding, groups);
  }
  thread_local std::array<Answer, kAnswers> answers;  // Note [A thread's routing answers]
  Answer& answer = answers[question.hash() % kAnswers];
  if (!(answer.question == question)) {
    // Answered before the slot is written: a call PyTorch rejects (it raises) leaves no answer behind.
    answer.taken = taken_by_cache(input, weight, stride, padding, dilation, transposed, output_padding, groups);
    answer.question = question;
  }
  return answer.taken;
}

}  // namespace cudnn_cache::torch_ops
