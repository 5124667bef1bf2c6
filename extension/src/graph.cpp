#include "cudnn_cache/graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "cudnn_cache/error.h"

namespace cudnn_cache {
namespace {

namespace fe = cudnn_frontend;
using fe::graph::Graph;

static_assert(EngineCandidate::kRuntimeCompiled == 1 << static_cast<int>(fe::BehaviorNote_t::RUNTIME_COMPILATION));
using fe::graph::Tensor_attributes;

// Fixed uids: the variant pack does not depend on the direction.
constexpr std::int64_t kUidX = 1, kUidW = 2, kUidY = 3;
constexpr std::int64_t kAlignment = 16;

// error_t's getters are not const, hence the copies.
[[noreturn]] void throw_graph_error(fe::error_t status, const char* what, const ConvolutionKey& key) {
  const cudnnStatus_t cudnn_status = status.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED
                                         ? CUDNN_STATUS_NOT_SUPPORTED
                                         : CUDNN_STATUS_EXECUTION_FAILED;
  throw Error(detail::concat("cuDNN graph API: ", what, " failed (", status.get_message(), ") for ", key),
              cudnn_status);
}

void check_status(fe::error_t status, const char* what, const ConvolutionKey& key) {
  if (status.is_bad()) throw_graph_error(status, what, key);
}

fe::DataType_t frontend_type(std::int32_t type) {
  switch (type) {
    case CUDNN_DATA_HALF: return fe::DataType_t::HALF;
    case CUDNN_DATA_BFLOAT16: return fe::DataType_t::BFLOAT16;
    case CUDNN_DATA_DOUBLE: return fe::DataType_t::DOUBLE;
    default: return fe::DataType_t::FLOAT;
  }
}

std::vector<std::int64_t> first(const std::array<std::int32_t, kMaxTensorDims>& values, int count) {
  return std::vector<std::int64_t>(values.begin(), values.begin() + count);
}

// A filter has no strides in the legacy API, only a format; the graph API wants the packed strides.
std::vector<std::int64_t> filter_strides(const FilterKey& w) {
  std::vector<std::int64_t> strides(w.nb_dims);
  std::int64_t extent = 1;
  auto pack = [&](int d) {
    strides[d] = extent;
    extent *= w.dims[d];
  };
  const bool nhwc = w.format == CUDNN_TENSOR_NHWC;
  if (nhwc) pack(1);
  for (int d = w.nb_dims - 1; d >= 2; --d) pack(d);
  if (!nhwc) pack(1);
  pack(0);
  return strides;
}

struct Operand {
  std::int64_t uid;
  std::vector<std::int64_t> dims, strides;
};

Operand input_operand(const ConvolutionKey& key) {
  return {kUidX, first(key.input.dims, key.input.nb_dims), first(key.input.strides, key.input.nb_dims)};
}
Operand weight_operand(const ConvolutionKey& key) {
  return {kUidW, first(key.weight.dims, key.weight.nb_dims), filter_strides(key.weight)};
}
Operand output_operand(const ConvolutionKey& key) {
  return {kUidY, first(key.output.dims, key.output.nb_dims), first(key.output.strides, key.output.nb_dims)};
}

std::shared_ptr<Tensor_attributes> tensor(Graph& graph, const char* name, const Operand& operand,
                                          fe::DataType_t type) {
  return graph.tensor(Tensor_attributes()
                          .set_name(name)
                          .set_uid(operand.uid)
                          .set_dim(operand.dims)
                          .set_stride(operand.strides)
                          .set_data_type(type)
                          .set_alignment(kAlignment));
}

void mark_output(const std::shared_ptr<Tensor_attributes>& result, const Operand& operand, fe::DataType_t type) {
  result->set_output(true).set_uid(operand.uid).set_dim(operand.dims).set_stride(operand.strides);
  result->set_data_type(type).set_alignment(kAlignment);
}

// Padding, stride, dilation, compute type and mode, shared by the three operations' attribute types.
template <typename Attributes>
Attributes convolution_attributes(const ConvolutionDescriptorKey& c, fe::DataType_t compute_type) {
  const auto spatial = [&](const std::array<std::int32_t, kMaxSpatialDims>& values) {
    return std::vector<std::int64_t>(values.begin(), values.begin() + c.nb_spatial_dims);
  };
  Attributes attributes;
  attributes.set_pre_padding(spatial(c.padding))
      .set_post_padding(spatial(c.padding))
      .set_stride(spatial(c.stride))
      .set_dilation(spatial(c.dilation))
      .set_compute_data_type(compute_type);
  attributes.set_convolution_mode(c.mode == CUDNN_CONVOLUTION ? fe::ConvolutionMode_t::CONVOLUTION
                                                              : fe::ConvolutionMode_t::CROSS_CORRELATION);
  return attributes;
}

// The graph of one direction of the key. Groups are implied by the channel counts of x and w.
std::shared_ptr<Graph> make_graph(const ConvolutionKey& key) {
  auto graph = std::make_shared<Graph>();
  const fe::DataType_t type = frontend_type(key.input.data_type);
  const fe::DataType_t compute = frontend_type(key.convolution.compute_type);
  graph->set_io_data_type(type).set_intermediate_data_type(compute).set_compute_data_type(compute);
  const Operand x = input_operand(key), w = weight_operand(key), y = output_operand(key);
  switch (static_cast<Direction>(key.direction)) {
    case Direction::forward:
      mark_output(graph->conv_fprop(tensor(*graph, "x", x, type), tensor(*graph, "w", w, type),
                                    convolution_attributes<fe::graph::Conv_fprop_attributes>(key.convolution, compute)),
                  y, type);
      break;
    case Direction::backward_data:
      mark_output(graph->conv_dgrad(tensor(*graph, "dy", y, type), tensor(*graph, "w", w, type),
                                    convolution_attributes<fe::graph::Conv_dgrad_attributes>(key.convolution, compute)),
                  x, type);
      break;
    case Direction::backward_filter:
      mark_output(graph->conv_wgrad(tensor(*graph, "dy", y, type), tensor(*graph, "x", x, type),
                                    convolution_attributes<fe::graph::Conv_wgrad_attributes>(key.convolution, compute)),
                  w, type);
      break;
  }
  return graph;
}

// Built and ready to plan: validated and lowered to a cuDNN operation graph.
std::shared_ptr<Graph> operation_graph(cudnnHandle_t handle, const ConvolutionKey& key) {
  auto graph = make_graph(key);
  check_status(graph->validate(), "validate", key);
  check_status(graph->build_operation_graph(handle), "build_operation_graph", key);
  return graph;
}

std::unordered_map<std::int64_t, void*> variant_pack(const ConvolutionBuffers& buffers) {
  return {{kUidX, buffers.x}, {kUidW, buffers.w}, {kUidY, buffers.y}};
}

// Median time of one built plan, per Note [Engine configs]; negative if it failed to run.
float time_plan(const Graph& graph, cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack,
                void* workspace, std::int64_t index, const GraphSearchOptions& options) {
  cudaStream_t stream = nullptr;
  cudnnGetStream(handle, &stream);
  for (int i = 0; i < options.warmup; ++i) {
    if (graph.execute_plan_at_index(handle, pack, workspace, index).is_bad()) return -1.0f;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < options.repetitions; ++i) {
    cudaEventRecord(start, stream);
    const bool ran = graph.execute_plan_at_index(handle, pack, workspace, index).is_good();
    cudaEventRecord(stop, stream);
    float elapsed = 0.0f;
    if (!ran || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&elapsed, start, stop) != cudaSuccess) {
      times.clear();
      break;
    }
    times.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (times.empty()) return -1.0f;
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

bool aligned(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % kAlignment == 0; }

}  // namespace

std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t handle, const ConvolutionKey& key,
                                                const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                                const GraphSearchOptions& options,
                                                std::shared_ptr<const GraphPlan>* best_plan) {
  CUDNN_CACHE_REQUIRE(aligned(buffers.x) && aligned(buffers.w) && aligned(buffers.y),
                      "cuDNN graph API: buffers must be 16-byte aligned for ", key);
  auto graph = operation_graph(handle, key);
  check_status(graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
               "create_execution_plans", key);
  graph->deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  if (key.input.data_type == CUDNN_DATA_FLOAT && key.convolution.math_type == CUDNN_FMA_MATH) {
    graph->deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  }
  if (options.deterministic) graph->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});

  auto pack = variant_pack(buffers);
  std::set<std::string> timed;  // heuristics A and the fallback list overlap: time each plan name once
  std::vector<EngineCandidate> configs;
  std::vector<std::int64_t> indices;  // of configs[i]'s plan in the graph
  const std::int64_t count = graph->get_execution_plan_count();
  for (std::int64_t index = 0; index < count && static_cast<int>(configs.size()) < options.max_candidates; ++index) {
    std::string name;
    if (graph->get_plan_name_at_index(index, name).is_bad() || !timed.insert(name).second) continue;
    if (graph->build_plan_at_index(index).is_bad()) continue;  // not supported, or filtered out
    EngineCandidate config;
    std::int64_t workspace_bytes = 0;
    std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
    if (graph->get_workspace_size_plan_at_index(index, workspace_bytes).is_bad() ||
        graph->get_engine_and_knobs_at_index(index, config.engine_id, knobs).is_bad() || knobs.size() > kMaxKnobs) {
      continue;
    }
    // A knob this cudnn-frontend cannot name comes back as NOT_SET and cannot be replayed: such a config
    // could never be rebuilt from the cache, so it is not offered.
    if (knobs.count(fe::KnobType_t::NOT_SET) > 0) continue;
    for (const auto& [type, value] : knobs) {
      config.knobs[config.knob_count++] = {static_cast<std::int64_t>(type), value};
    }
    std::sort(config.knobs.begin(), config.knobs.begin() + config.knob_count);
    config.workspace_bytes = static_cast<std::uint64_t>(workspace_bytes);
    std::vector<fe::BehaviorNote_t> notes;
    if (graph->get_behavior_notes_for_plan_at_index(index, notes).is_good()) {
      for (fe::BehaviorNote_t note : notes) config.behavior_notes |= 1 << static_cast<int>(note);
    }
    std::unique_ptr<Workspace> workspace;
    if (workspace_bytes > 0 && !(workspace = allocate(config.workspace_bytes))) continue;  // out of memory
    config.time_ms = time_plan(*graph, handle, pack, workspace ? workspace->data() : nullptr, index, options);
    if (config.time_ms >= 0.0f) {
      configs.push_back(config);
      indices.push_back(index);
    }
  }
  CUDNN_CACHE_REQUIRE(!configs.empty(), "cuDNN graph API: no engine config runs ", key);
  std::vector<std::size_t> order(configs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return ranks_before<GraphForwardTraits>(configs[a], configs[b]); });
  std::vector<EngineCandidate> ranked;
  for (std::size_t i : order) ranked.push_back(configs[i]);
  // Building a built plan again only selects it, for execute() and serialize().
  if (best_plan && graph->build_plan_at_index(indices[order.front()]).is_good()) {
    *best_plan = std::shared_ptr<const GraphPlan>(
        new GraphPlan(static_cast<Direction>(key.direction), std::move(graph), ranked.front().workspace_bytes));
  }
  return ranked;
}

GraphPlan::GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config)
    : direction_(static_cast<Direction>(key.direction)), graph_(operation_graph(handle, key)) {
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  for (const Knob* knob = config.knobs_begin(); knob != config.knobs_end(); ++knob) {
    knobs[static_cast<fe::KnobType_t>(knob->type)] = knob->value;
  }
  check_status(graph_->create_execution_plan(config.engine_id, knobs), "create_execution_plan", key);
  check_status(graph_->build_plan_at_index(graph_->get_execution_plan_count() - 1), "build_plan", key);
  std::int64_t bytes = 0;
  check_status(graph_->get_workspace_size(bytes), "get_workspace_size", key);
  workspace_bytes_ = static_cast<std::uint64_t>(bytes);
}

GraphPlan::GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const std::vector<std::uint8_t>& serialized)
    : direction_(static_cast<Direction>(key.direction)), graph_(std::make_shared<Graph>()) {
  try {
    // No warm-up: it would capture a throw-away CUDA graph on the caller's device for every plan.
    check_status(graph_->deserialize(handle, serialized, /*enforce_precompiled=*/false, /*run_warmup=*/false),
                 "deserialize", key);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the JSON parser throws on bytes that are not UBJSON
    throw Error(detail::concat("cuDNN graph API: deserialize failed (", e.what(), ") for ", key),
                CUDNN_STATUS_BAD_PARAM);
  }
  std::int64_t bytes = 0;
  check_status(graph_->get_workspace_size(bytes), "get_workspace_size", key);
  workspace_bytes_ = static_cast<std::uint64_t>(bytes);
}

std::vector<std::uint8_t> GraphPlan::serialize() const {
  std::vector<std::uint8_t> bytes;
  fe::error_t status;
  try {
    status = graph_->serialize(bytes, /*serialize_structure=*/false);
  } catch (const std::exception& e) {  // cudnn-frontend lets some cuDNN failures escape as exceptions
    throw Error(detail::concat("cuDNN graph API: serialize failed (", e.what(), ") for a ", to_string(direction_),
                               " plan"));
  }
  CUDNN_CACHE_REQUIRE(status.is_good(), "cuDNN graph API: serialize failed (", status.get_message(), ") for a ",
                      to_string(direction_), " plan");
  return bytes;
}

void GraphPlan::execute(cudnnHandle_t handle, const ConvolutionBuffers& buffers, void* workspace) const {
  CUDNN_CACHE_REQUIRE(aligned(buffers.x) && aligned(buffers.w) && aligned(buffers.y),
                      "cuDNN graph API: buffers must be 16-byte aligned (", to_string(direction_), ")");
  auto pack = variant_pack(buffers);
  fe::error_t status = graph_->execute(handle, pack, workspace);
  CUDNN_CACHE_REQUIRE(status.is_good(), "cuDNN graph API: execute failed (", status.get_message(), ") for a ",
                      to_string(direction_), " plan");
}

std::string check_graph(const ConvolutionKey& key) {
  fe::error_t status = make_graph(key)->validate();
  return status.is_good() ? std::string() : status.get_message();
}

}  // namespace cudnn_cache
