// The cache as ops: descriptor round trips, keys, queries, tuning on demand, size, save and load, statistics,
// the miss policy, the plan cache's and the workspace's limits, the backend and plan preparation. They read or
// change process state, not tensors, so one kernel serves every backend.

#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/descriptors.h"
#include "cudnn_cache/runtime.h"
#include "attention.h"
#include "cuda/context.h"
#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

template <typename Int, std::size_t N>
std::vector<std::int64_t> to_list(const std::array<Int, N>& values, int count) {
  return std::vector<std::int64_t>(values.begin(), values.begin() + count);
}

std::tuple<std::string, std::vector<std::int64_t>, std::vector<std::int64_t>> describe_tensor(const at::Tensor& input) {
  const cudnnDataType_t type = cudnn_data_type(input.scalar_type(), "input");
  return rethrow([&] {
    TensorDescriptor descriptor;
    descriptor.set(type, IntSpan(input.sizes().data(), input.dim()), IntSpan(input.strides().data(), input.dim()));
    const TensorKey key = descriptor.key();
    return std::make_tuple(data_type_name(key.data_type), to_list(key.dims, key.nb_dims),
                           to_list(key.strides, key.nb_dims));
  });
}

std::tuple<std::string, std::string, std::vector<std::int64_t>> describe_filter(const at::Tensor& weight) {
  const cudnnDataType_t type = cudnn_data_type(weight.scalar_type(), "weight");
  const Layout format =
      convolution_memory_format(weight, weight) == at::MemoryFormat::Contiguous ? Layout::nchw : Layout::nhwc;
  return rethrow([&] {
    FilterDescriptor descriptor;
    descriptor.set(type, IntSpan(weight.sizes().data(), weight.dim()), format);
    const FilterKey key = descriptor.key();
    return std::make_tuple(data_type_name(key.data_type), layout_name(key), to_list(key.dims, key.nb_dims));
  });
}

std::tuple<std::vector<std::int64_t>, std::vector<std::int64_t>, std::vector<std::int64_t>, std::int64_t, std::string,
           std::string, std::string>
describe_convolution(at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                     at::ScalarType dtype) {
  const cudnnDataType_t type = cudnn_data_type(dtype, "dtype");
  return rethrow([&] {
    ConvolutionDescriptor descriptor;
    descriptor.set(IntSpan(padding.data(), padding.size()), IntSpan(stride.data(), stride.size()),
                   IntSpan(dilation.data(), dilation.size()), groups, CUDNN_CROSS_CORRELATION,
                   default_compute_type(type), cudnn_math_type(dtype));
    const ConvolutionDescriptorKey key = descriptor.key();
    return std::make_tuple(to_list(key.padding, key.nb_spatial_dims), to_list(key.stride, key.nb_spatial_dims),
                           to_list(key.dilation, key.nb_spatial_dims), static_cast<std::int64_t>(key.groups),
                           std::string(convolution_mode_name(key.mode)), data_type_name(key.compute_type),
                           std::string(math_type_name(key.math_type)));
  });
}

// The key the convolution ops use for this call, as its int32 words (a plain, hashable value in Python).
std::vector<std::int64_t> conv_key(const std::string& direction, const at::Tensor& input, const at::Tensor& weight,
                                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                   std::int64_t groups, bool transposed, at::IntArrayRef output_padding) {
  const Direction chosen = direction_from_string(direction);
  const char* op = "conv_key";
  check_tensors(op, input, weight);
  const ConvolutionParams params = check_params(op, input, weight, stride, padding, dilation, groups, transposed);
  // Stand-ins with the sizes and strides the kernels give cuDNN, without touching any data.
  const at::MemoryFormat format = convolution_memory_format(input, weight);
  const auto options = input.options().device(at::kMeta);
  const auto like = [&](at::IntArrayRef sizes) { return empty_in(sizes, options, format); };
  at::Tensor x, y;
  if (transposed) {
    const auto extra = per_spatial_dim(op, "output_padding", output_padding, params.stride.size());
    x = like(transposed_output_size(input.sizes(), weight.sizes(), params, extra));
    y = like(input.sizes());
  } else {
    x = like(input.sizes());
    y = like(convolution_output_size(input.sizes(), weight.sizes(), params));
  }
  return key_to_list(make_problem(x, like(weight.sizes()), y, params, format).key_for(chosen));
}

DirectionCaches& current_device_caches(const char* op) {
  TORCH_CHECK(at::cuda::is_available(), "cudnn_cache.", op, ": no CUDA device; cache entries belong to a GPU");
  return rethrow([] { return std::ref(Runtime::instance().caches_for_device(at::cuda::current_device())); });
}

using CandidateDict = c10::Dict<std::string, c10::IValue>;
using CandidateList = c10::List<CandidateDict>;

CandidateDict candidate_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

template <typename Traits>
CandidateDict describe_candidate(const Candidate<Traits>& candidate) {
  CandidateDict entry = candidate_dict();
  entry.insert("algorithm", Traits::algorithm_name(candidate.algorithm));
  entry.insert("status", std::string(cudnnGetErrorString(candidate.status)));
  entry.insert("time_ms", static_cast<double>(candidate.time_ms));
  entry.insert("workspace_bytes", static_cast<std::int64_t>(candidate.workspace_bytes));
  entry.insert("deterministic", candidate.determinism == CUDNN_DETERMINISTIC);
  entry.insert("math_type", std::string(math_type_name(candidate.math_type)));
  return entry;
}

CandidateDict describe_candidate(const EngineCandidate& candidate) {
  CandidateDict entry = candidate_dict();
  entry.insert("engine", to_string(candidate));
  entry.insert("engine_id", candidate.engine_id);
  std::vector<std::int64_t> knobs;  // type, value, type, value, ...
  for (const Knob* knob = candidate.knobs_begin(); knob != candidate.knobs_end(); ++knob) {
    knobs.insert(knobs.end(), {knob->type, knob->value});
  }
  entry.insert("knobs", knobs);
  entry.insert("time_ms", static_cast<double>(candidate.time_ms));
  entry.insert("workspace_bytes", static_cast<std::int64_t>(candidate.workspace_bytes));
  entry.insert("runtime_compiled", (candidate.behavior_notes & EngineCandidate::kRuntimeCompiled) != 0);
  // None for a config of a file older than format 5, which recorded no numerical notes.
  entry.insert("deterministic", candidate.numerical_notes == EngineCandidate::kNotesUnknown
                                    ? c10::IValue()
                                    : c10::IValue(candidate.deterministic()));
  return entry;
}

// The ranking stored for the key on the current device by the backend (default: the runtime's), best
// first; None on a miss.
std::optional<CandidateList> query(const std::string& direction, at::IntArrayRef words,
                                   const std::optional<std::string>& backend_name) {
  const Direction chosen = direction_from_string(direction);
  const Backend backend =
      backend_name ? rethrow([&] { return backend_from_string(*backend_name); }) : Runtime::instance().backend();
  const ConvolutionKey key = key_from_list(words);
  TORCH_CHECK(key.direction == static_cast<std::int32_t>(chosen), "cudnn_cache.query: the key is a ",
              to_string(static_cast<Direction>(key.direction)), " key but direction is '", direction, "'");
  DirectionCaches& caches = current_device_caches("query");
  std::optional<CandidateList> result;
  const auto describe = [&](auto traits) {
    using Traits = decltype(traits);
    if (Traits::direction != chosen) return;
    const auto ranking = caches.get<Traits>().find(key);
    if (!ranking) return;
    CandidateList list;
    for (const auto& candidate : *ranking) list.push_back(describe_candidate(candidate));
    result = std::move(list);
  };
  if (backend == Backend::graph) {
    for_each_graph_direction(describe);
  } else {
    for_each_direction(describe);
  }
  return result;
}

std::int64_t fill_cpu(const at::Tensor&, const at::Tensor&, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                      std::int64_t, bool, at::IntArrayRef) {
  TORCH_CHECK(false, "cudnn_cache.fill tunes on the GPU: pass CUDA tensors (input.cuda(), weight.cuda())");
}

std::int64_t size() { return static_cast<std::int64_t>(Runtime::instance().store().size()); }

void clear() { Runtime::instance().store().clear(); }

// Saves under the file's lock, merged with what it holds unless `merge` is false (Note [Shared cache files]);
// returns the entries the file holds now. A file system without locks is a warning, not an error.
std::int64_t save(const std::string& path, bool merge, double lock_timeout) {
  SaveOptions options;
  options.merge = merge;
  options.lock_timeout_seconds = lock_timeout;
  options.warn = [](const std::string& message) { TORCH_WARN(message); };
  return static_cast<std::int64_t>(
      rethrow([&] { return cudnn_cache::save(Runtime::instance().store(), path, options); }).entries);
}

std::int64_t load(const std::string& path) {
  // Entries of another GPU or cuDNN are kept quietly: one file serves a mixed fleet. A call that needs one
  // of them is a fallback, warned about once (Note [Running a cached convolution]).
  return static_cast<std::int64_t>(
      rethrow([&] { return cudnn_cache::load(Runtime::instance().store(), path); }).entries);
}

c10::Dict<std::string, std::int64_t> stats() {
  const Stats s = Runtime::instance().stats();
  c10::Dict<std::string, std::int64_t> result;
  result.insert("hits", static_cast<std::int64_t>(s.hits));
  result.insert("misses", static_cast<std::int64_t>(s.misses));
  result.insert("tunes", static_cast<std::int64_t>(s.tunes));
  result.insert("fallbacks", static_cast<std::int64_t>(s.fallbacks));
  result.insert("tune_us", static_cast<std::int64_t>(s.tune_us));
  result.insert("plans_built", static_cast<std::int64_t>(s.plans_built));
  result.insert("plan_build_us", static_cast<std::int64_t>(s.plan_build_us));
  result.insert("plans_deserialized", static_cast<std::int64_t>(s.plans_deserialized));
  result.insert("plan_rebuilds", static_cast<std::int64_t>(s.plan_rebuilds));
  result.insert("plan_evictions", static_cast<std::int64_t>(s.plan_evictions));
  result.insert("capture_misses", static_cast<std::int64_t>(s.capture_misses));
  result.insert("tune_waits", static_cast<std::int64_t>(s.tune_waits));
  result.insert("lent", static_cast<std::int64_t>(s.lent));
  result.insert("plans", static_cast<std::int64_t>(s.plans));
  const AttentionCounters& attention = attention_counters();  // Note [Persisted attention plans]
  result.insert("attention_plans_built", static_cast<std::int64_t>(attention.built.load()));
  result.insert("attention_plans_restored", static_cast<std::int64_t>(attention.restored.load()));
  result.insert("attention_plan_rebuilds", static_cast<std::int64_t>(attention.rebuilds.load()));
  result.insert("attention_build_us", static_cast<std::int64_t>(attention.build_us.load()));
  std::int64_t attention_plans = 0;  // stored, over every origin: not a counter
  for (const auto& [origin, caches] : Runtime::instance().store().origins()) {
    attention_plans += static_cast<std::int64_t>(caches->attention.size());
  }
  result.insert("attention_plans", attention_plans);
  result.insert("entries", size());
  return result;
}

void reset_stats() {
  Runtime::instance().reset_stats();
  attention_counters().reset();
}

std::int64_t format_version() { return kFormatVersion; }

void set_miss_policy(const std::string& policy) {
  Runtime::instance().set_miss_policy(rethrow([&] { return miss_policy_from_string(policy); }));
}

std::string get_miss_policy() { return to_string(Runtime::instance().miss_policy()); }

void set_plan_cache_limit(std::int64_t limit) {
  TORCH_CHECK(limit >= 0, "cudnn_cache.set_plan_cache_limit: limit must be a non-negative integer (the most "
              "execution plans kept; 0: no bound), got ", limit, "; the limit stays ",
              Runtime::instance().plan_cache_limit());
  Runtime::instance().set_plan_cache_limit(static_cast<std::size_t>(limit));
}

std::int64_t get_plan_cache_limit() {
  const std::size_t limit = Runtime::instance().plan_cache_limit();
  // A limit beyond int64 (set from C++ or the environment) bounds nothing either.
  return static_cast<std::int64_t>(std::min<std::size_t>(limit, std::numeric_limits<std::int64_t>::max()));
}

void set_workspace_limit(std::optional<std::int64_t> bytes) {
  TORCH_CHECK(!bytes || *bytes >= 0, "cudnn_cache.set_workspace_limit: bytes must be a non-negative integer (the "
              "most bytes of workspace a convolution may use) or None (no limit), got ", *bytes,
              "; the limit stays as it was");
  Runtime::instance().set_workspace_limit(bytes ? static_cast<std::uint64_t>(*bytes) : Runtime::kNoWorkspaceLimit);
}

std::optional<std::int64_t> get_workspace_limit() {
  const std::uint64_t limit = Runtime::instance().workspace_limit();
  // A limit beyond int64 (set from C++ or the environment) bounds nothing a tensor could hold either.
  if (limit >= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
  return static_cast<std::int64_t>(limit);
}

void set_backend(const std::string& backend) {
  rethrow([&] { Runtime::instance().set_backend(backend_from_string(backend)); });
}

std::string get_backend() { return to_string(Runtime::instance().backend()); }

// Changes the named tuning options (Note [Search bounds]: the search's other settings are constants); the others
// keep their values.
void set_tuning_options(std::optional<std::int64_t> build_threads, std::optional<bool> exhaustive,
                        std::optional<bool> rank_deterministic) {
  Runtime& runtime = Runtime::instance();
  GraphSearchOptions options = runtime.search_options();
  if (build_threads) {
    TORCH_CHECK(*build_threads >= 0 && *build_threads <= 1000, "cudnn_cache.set_tuning_options: build_threads "
                "must be between 0 and 1000 (0: the cores this process may use), got ", *build_threads);
    options.build_threads = static_cast<int>(*build_threads);
  }
  if (exhaustive) options.exhaustive = *exhaustive;
  if (rank_deterministic) options.rank_deterministic = *rank_deterministic;
  rethrow([&] { runtime.set_search_options(options); });
}

c10::Dict<std::string, c10::IValue> get_tuning_options() {
  const GraphSearchOptions options = Runtime::instance().search_options();
  CandidateDict result = candidate_dict();
  result.insert("build_threads", static_cast<std::int64_t>(options.build_threads));
  result.insert("exhaustive", options.exhaustive);
  result.insert("rank_deterministic", options.rank_deterministic);
  return result;
}

void set_log_level(const std::string& level) {
  Runtime::instance().set_log_level(rethrow([&] { return log_level_from_string(level); }));
}

std::string get_log_level() { return to_string(Runtime::instance().log_level()); }

// Plans for every graph-API entry of the device; the number ready. In the background it returns 0 at once,
// and prepare_wait() gives the number.
std::int64_t prepare(const std::optional<std::int64_t>& device, std::int64_t threads, bool background) {
  TORCH_CHECK(threads >= 0, "cudnn_cache.prepare: threads must be >= 0 (0: one per core, at most 8), got ", threads);
  const int index = cuda_device("prepare", device, "plans are built for a GPU");
  Runtime& runtime = Runtime::instance();
  if (background) {
    runtime.prepare_in_background(index, static_cast<int>(threads));
    return 0;
  }
  return static_cast<std::int64_t>(rethrow([&] { return runtime.prepare(index, static_cast<int>(threads)); }).plans);
}

std::int64_t prepare_wait() {
  return static_cast<std::int64_t>(rethrow([] { return Runtime::instance().wait_for_prepare(); }).plans);
}

// CUDNN_CACHE_PATH's load: the first call on each GPU prepares it in the background (Note [Prepare at the first
// call] in runtime.cpp).
void prepare_at_first_call(bool on) { Runtime::instance().prepare_at_first_call(on); }

// Core warnings (fallbacks) surface as Python warnings.
const bool warnings_routed = [] {
  Runtime::instance().set_warning_handler([](const std::string& message) { TORCH_WARN(message); });
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("describe_tensor", &describe_tensor);
  m.impl("describe_filter", &describe_filter);
  m.impl("describe_convolution", &describe_convolution);
  m.impl("conv_key", &conv_key);
  m.impl("query", &query);
  m.impl("size", &size);
  m.impl("clear", &clear);
  m.impl("save", &save);
  m.impl("load", &load);
  m.impl("stats", &stats);
  m.impl("reset_stats", &reset_stats);
  m.impl("format_version", &format_version);
  m.impl("set_miss_policy", &set_miss_policy);
  m.impl("get_miss_policy", &get_miss_policy);
  m.impl("set_plan_cache_limit", &set_plan_cache_limit);
  m.impl("get_plan_cache_limit", &get_plan_cache_limit);
  m.impl("set_workspace_limit", &set_workspace_limit);
  m.impl("get_workspace_limit", &get_workspace_limit);
  m.impl("set_backend", &set_backend);
  m.impl("get_backend", &get_backend);
  m.impl("set_tuning_options", &set_tuning_options);
  m.impl("get_tuning_options", &get_tuning_options);
  m.impl("set_log_level", &set_log_level);
  m.impl("get_log_level", &get_log_level);
  m.impl("prepare", &prepare);
  m.impl("prepare_wait", &prepare_wait);
  m.impl("prepare_at_first_call", &prepare_at_first_call);
}

TORCH_LIBRARY_IMPL(cudnn_cache, CPU, m) { m.impl("fill", &fill_cpu); }

}  // namespace cudnn_cache::torch_ops
