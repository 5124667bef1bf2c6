// The op schemas of the cudnn_cache library, all in one place. Kernels register in cpu/, cuda/, meta/,
// autograd/ and cache_ops.cpp.

#include <torch/library.h>

#include "convolution.h"

TORCH_LIBRARY(cudnn_cache, m) {
  // Convolutions. Argument names follow ATen; backward ops have a leading underscore. The first two are what
  // models call (batched or unbatched input); the next three are the cached ops they are made of, one per
  // cuDNN direction (convolution.h), and the last runs two of them at once. The bias of the two that a convolution or transposed convolution runs as
  // comes last, so that it is optional for positional callers (Note [Gradients of the cached ops]).
  m.def("convolution(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
        "int groups) -> Tensor");
  m.def("convolution_transpose(Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
        "int[] output_padding, int[] dilation, int groups) -> Tensor");
  m.def("_convolution_forward(Tensor input, Tensor weight, int[] stride, int[] padding, int[] dilation, "
        "int groups, Tensor? bias=None) -> Tensor");
  m.def("_convolution_backward_input(Tensor grad_output, Tensor weight, int[] input_size, int[] stride, "
        "int[] padding, int[] dilation, int groups, Tensor? bias=None) -> Tensor");
  m.def("_convolution_backward_weight(Tensor grad_output, Tensor input, int[] weight_size, int[] stride, "
        "int[] padding, int[] dilation, int groups) -> Tensor");
  // Both gradients of _convolution_forward(input, weight) in one call, as aten::convolution_backward computes
  // them: what a convolution's backward runs (Note [Gradients of the cached ops]).
  m.def("_convolution_backward(Tensor grad_output, Tensor input, Tensor weight, int[] stride, int[] padding, "
        "int[] dilation, int groups) -> (Tensor grad_input, Tensor grad_weight)");

  // The seed's reverse lookup: build the real cuDNN descriptor, decode it back with the cuDNN getters.
  m.def("describe_tensor(Tensor input) -> (str data_type, int[] dims, int[] strides)");
  m.def("describe_filter(Tensor weight) -> (str data_type, str format, int[] dims)");
  m.def("describe_convolution(int[] stride, int[] padding, int[] dilation, int groups, ScalarType dtype) -> "
        "(int[] padding, int[] stride, int[] dilation, int groups, str mode, str compute_type, str math_type)");
  m.def("conv_key(str direction, Tensor input, Tensor weight, int[] stride, int[] padding, int[] dilation, "
        "int groups, bool transposed=False, int[] output_padding=[]) -> int[]");

  // The cache.
  m.def("query(str direction, int[] key, str? backend=None) -> Dict(str, Any)[]?");
  m.def("fill(Tensor input, Tensor weight, int[] stride, int[] padding, int[] dilation, int groups, "
        "bool transposed=False, int[] output_padding=[]) -> int");
  m.def("size() -> int");
  m.def("clear() -> ()");
  m.def("save(str path, bool merge=True, float lock_timeout=60.) -> int");
  m.def("load(str path) -> int");
  m.def("stats() -> Dict(str, int)");
  m.def("reset_stats() -> ()");
  m.def("format_version() -> int");
  m.def("set_miss_policy(str policy) -> ()");
  m.def("get_miss_policy() -> str");
  m.def("set_plan_cache_limit(int limit) -> ()");
  m.def("get_plan_cache_limit() -> int");
  m.def("set_workspace_limit(int? bytes) -> ()");
  m.def("get_workspace_limit() -> int?");
  m.def("set_backend(str backend) -> ()");
  m.def("get_backend() -> str");
  m.def("set_tuning_options(int? build_threads=None, bool? exhaustive=None, bool? rank_deterministic=None) -> ()");
  m.def("get_tuning_options() -> Dict(str, Any)");
  m.def("audit(int? device=None) -> Dict(str, Any)[]");
  m.def("settle(int? device=None) -> Dict(str, Any)[]");
  m.def("set_intercept(bool enabled) -> ()");
  m.def("get_intercept() -> bool");
  m.def("set_log_level(str level) -> ()");
  m.def("get_log_level() -> str");
  m.def("prepare(int? device=None, int threads=0, bool background=False) -> int");
  m.def("prepare_wait() -> int");
  m.def("prepare_at_first_call(bool on) -> ()");

  // Sharing tuning between processes (cudnn_cache.distributed). An origin is (name, 5 numbers); see
  // exchange_ops.cpp for the row layouts.
  m.def("device_origin(int? device=None) -> (str name, int[] numbers)");
  m.def("recorded_misses() -> (str[] origin_names, int[] origin_numbers, Tensor rows)");
  m.def("clear_recorded_misses() -> ()");
  m.def("inventory() -> (str[] origin_names, int[] origin_numbers, Tensor rows)");
  m.def("export_entries(int[] digests) -> Tensor");
  m.def("import_entries(Tensor data, str source, str? origin_name=None, int[] origin_numbers=[]) -> int");
  m.def("origin_tag(str name, int[] numbers) -> str");
  m.def("split_entries(Tensor data, str source) -> (str[] names, str[] origins, Tensor data, int[] ends)");
  m.def("merge_entries(Tensor data, int[] ends, str[] names, str source) -> (Tensor data, int[] refused, "
        "str[] reasons)");
  m.def("replaced_entry_names() -> str[]");
  m.def("tune_key(int[] key, str backend, int? device=None) -> int");

  // Cache files, without this process's cache (python -m cudnn_cache).
  m.def("file_summary(str path) -> str");
  m.def("file_table(str path) -> str");
  m.def("file_statistics(str path) -> str");
  m.def("file_diff(str first, str second) -> (str[] only_first, str[] only_second, str[] different_best, int same)");
  m.def("file_merge(str[] inputs, str output) -> str[]");
  m.def("file_export_json(str path) -> str");
  m.def("file_import_json(str json_path, str output) -> ()");
  m.def("file_synth(str path, int entries, int seed=1) -> int");
  m.def("file_write(str path, str content) -> ()");
  m.def("file_write_checkpoint(str path, Tensor data) -> ()");
}

namespace cudnn_cache::torch_ops {
namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace

at::Tensor call_forward(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                        at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                        const std::optional<at::Tensor>& bias) {
  static const auto handle = op<decltype(call_forward)>("cudnn_cache::_convolution_forward");
  return handle.call(input, weight, stride, padding, dilation, groups, bias);
}

at::Tensor call_backward_input(const at::Tensor& grad_output, const at::Tensor& weight, at::IntArrayRef input_size,
                               at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                               std::int64_t groups, const std::optional<at::Tensor>& bias) {
  static const auto handle = op<decltype(call_backward_input)>("cudnn_cache::_convolution_backward_input");
  return handle.call(grad_output, weight, input_size, stride, padding, dilation, groups, bias);
}

at::Tensor call_backward_weight(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef weight_size,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                std::int64_t groups) {
  static const auto handle = op<decltype(call_backward_weight)>("cudnn_cache::_convolution_backward_weight");
  return handle.call(grad_output, input, weight_size, stride, padding, dilation, groups);
}

std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& weight, at::IntArrayRef stride,
                                                 at::IntArrayRef padding, at::IntArrayRef dilation,
                                                 std::int64_t groups) {
  static const auto handle = op<decltype(call_backward)>("cudnn_cache::_convolution_backward");
  return handle.call(grad_output, input, weight, stride, padding, dilation, groups);
}

}  // namespace cudnn_cache::torch_ops
