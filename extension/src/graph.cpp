#include "cudnn_cache/graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>

#include "cudnn_cache/error.h"
#include "elapsed.h"
#include "graph_internal.h"

namespace cudnn_cache {
namespace graph_internal {

static_assert(EngineCandidate::kRuntimeCompiled == 1 << static_cast<int>(fe::BehaviorNote_t::RUNTIME_COMPILATION));
static_assert(EngineCandidate::kNondeterministic == 1 << static_cast<int>(fe::NumericalNote_t::NONDETERMINISTIC));
static_assert(static_cast<int>(fe::NumericalNote_t::STRICT_NAN_PROP) < 31, "numerical notes are bits of an int32");
using fe::graph::Tensor_attributes;

// Fixed uids: the variant pack does not depend on the direction.
constexpr std::int64_t kUidX = 1, kUidW = 2, kUidY = 3;

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
                          .set_alignment(static_cast<std::int64_t>(kGraphAlignment)));
}

void mark_output(const std::shared_ptr<Tensor_attributes>& result, const Operand& operand, fe::DataType_t type) {
  result->set_output(true).set_uid(operand.uid).set_dim(operand.dims).set_stride(operand.strides);
  result->set_data_type(type).set_alignment(static_cast<std::int64_t>(kGraphAlignment));
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

VariantPack variant_pack(const ConvolutionBuffers& buffers) {
  static_assert(kUidX < kUidW && kUidW < kUidY, "the pack lists the buffers in the order of their uids");
  return {buffers.x, buffers.w, buffers.y};
}

// Note [Giving up on a slow plan]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A search times each candidate after a warm-up (3 runs), then up to `repetitions` runs; once one candidate is
// timed, a candidate whose first 3 timed runs are all slower than give_up_ratio x the best median cannot win
// and stops there. The slow candidates are where a search's time goes: a depthwise key's precompiled engines run
// for milliseconds where its best runs for tens of microseconds, and 6 runs of each (3 of warm-up, 3 timed) took
// 200-800 ms per key, 9 s of a cold MobileNetV2's 19 s first step on the H200. So the warm-up's second run is
// timed too (the first may load the kernel's module, CUDA loading modules lazily): a plan whose second run took
// more than probe_ratio x give_up_ms (3x the best, by default) and more than probe_floor_ms gives up after 2 runs
// in all, with that run as its time. The floor keeps short kernels, whose runs vary most in relative terms and
// cost little to time, on the 3-run rule. What is given up on is ranked by what was timed; it is never a
// finalist's time, which the paired rounds measure again.

// A pair of CUDA events timing one run on a stream.
class RunTimer {
 public:
  RunTimer() {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~RunTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  RunTimer(const RunTimer&) = delete;
  RunTimer& operator=(const RunTimer&) = delete;

  // Runs `run` between the two events and waits for it: its time in ms, or nothing if it failed.
  template <typename Run>
  std::optional<float> time(cudaStream_t stream, Run&& run) {
    cudaEventRecord(start_, stream);
    const bool ran = run();
    cudaEventRecord(stop_, stream);
    float elapsed = 0.0f;
    if (!ran || cudaEventSynchronize(stop_) != cudaSuccess ||
        cudaEventElapsedTime(&elapsed, start_, stop_) != cudaSuccess) {
      return std::nullopt;
    }
    return elapsed;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

std::vector<float> time_plan(const Graph& graph, cudnnHandle_t handle, VariantPack& pack,
                             void* workspace, std::int64_t index, const Timing& timing) {
  cudaStream_t stream = nullptr;
  cudnnGetStream(handle, &stream);
  const auto run = [&] {
    return graph.execute_plan_at_index(handle, pack.data(), static_cast<int>(pack.size()), workspace, index).is_good();
  };
  RunTimer timer;
  const bool probe = std::isfinite(timing.give_up_ms);
  for (int i = 0; i < timing.warmup; ++i) {
    if (i != 1 || !probe) {
      if (!run()) return {};
      continue;
    }
    const std::optional<float> elapsed = timer.time(stream, run);
    if (!elapsed) return {};
    if (*elapsed > timing.probe_ratio * timing.give_up_ms && *elapsed > timing.probe_floor_ms) return {*elapsed};
  }
  std::vector<float> times;
  for (int i = 0; i < timing.repetitions; ++i) {
    if (timing.flush) (*timing.flush)(stream);
    if (cudaStreamSynchronize(stream) != cudaSuccess) return {};  // Note [Timing the whole call]
    const std::optional<float> elapsed = timer.time(stream, run);
    if (!elapsed) return {};
    times.push_back(*elapsed);
    if (times.size() == 3 && *std::min_element(times.begin(), times.end()) > timing.give_up_ms) break;
  }
  return times;
}

float median(std::vector<float> times) {
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

bool aligned(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % kGraphAlignment == 0; }
bool aligned(const ConvolutionBuffers& buffers) {
  return aligned(buffers.x) && aligned(buffers.w) && aligned(buffers.y);
}

// The engine and knobs of the graph's plan at `index`, built or not; nullopt if cuDNN cannot say, or it has more
// knobs than a key stores. Knobs of a type this cudnn-frontend cannot name (cuDNN's deprecated ones, which older
// engines such as the TF32 NHWC implicit GEMMs still use: Note [Engine configs]) come back as NOT_SET and are
// left out; a plan of heuristics' own list (index < listed) that has any is named by its position as well.
std::optional<EngineCandidate> choice_at(Graph& graph, std::int64_t index, std::int64_t listed) {
  EngineCandidate config;
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  if (graph.get_engine_and_knobs_at_index(index, config.engine_id, knobs).is_bad()) return std::nullopt;
  // get_engine_and_knobs_at_index maps every unnamed type to NOT_SET, so one key stands for all of them.
  const bool named = knobs.erase(fe::KnobType_t::NOT_SET) == 0;
  if (!named && index < listed) config.heuristic_index = static_cast<std::int32_t>(index);
  if (knobs.size() > kMaxKnobs) return std::nullopt;
  for (const auto& [type, value] : knobs) {
    config.knobs[config.knob_count++] = {static_cast<std::int64_t>(type), value};
  }
  std::sort(config.knobs.begin(), config.knobs.begin() + config.knob_count);
  return config;
}

std::optional<EngineCandidate> describe_plan(Graph& graph, std::int64_t index, std::int64_t listed) {
  std::optional<EngineCandidate> config = choice_at(graph, index, listed);
  std::int64_t workspace_bytes = 0;
  if (!config || graph.get_workspace_size_plan_at_index(index, workspace_bytes).is_bad()) return std::nullopt;
  config->workspace_bytes = static_cast<std::uint64_t>(workspace_bytes);
  std::vector<fe::BehaviorNote_t> notes;
  if (graph.get_behavior_notes_for_plan_at_index(index, notes).is_good()) {
    for (fe::BehaviorNote_t note : notes) config->behavior_notes |= 1 << static_cast<int>(note);
  }
  config->numerical_notes = graph.numerical_notes_at(index);
  return config;
}

std::unordered_map<fe::KnobType_t, std::int64_t> knob_map(const EngineCandidate& config) {
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  for (const Knob* knob = config.knobs_begin(); knob != config.knobs_end(); ++knob) {
    knobs[static_cast<fe::KnobType_t>(knob->type)] = knob->value;
  }
  return knobs;
}

std::int64_t add_plan(Graph& graph, const EngineCandidate& config) {
  if (config.heuristic_index != EngineCandidate::kNotListed) {
    const std::int64_t index = config.heuristic_index;
    if (index >= graph.get_execution_plan_count()) return -1;
    const std::optional<EngineCandidate> listed = choice_at(graph, index, index + 1);
    return listed && listed->same_choice(config) ? index : -1;
  }
  if (graph.create_execution_plan(config.engine_id, knob_map(config)).is_bad()) return -1;
  return graph.get_execution_plan_count() - 1;
}

// The operation graph with the configs of heuristics mode A and (with `fallback`) the fallback list, in that
// order, after the numeric filters of Note [Engine configs].
std::shared_ptr<Graph> heuristic_graph(cudnnHandle_t handle, const ConvolutionKey& key, bool deterministic,
                                       bool fallback) {
  auto graph = operation_graph(handle, key);
  const std::vector<fe::HeurMode_t> modes =
      fallback ? std::vector<fe::HeurMode_t>{fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}
               : std::vector<fe::HeurMode_t>{fe::HeurMode_t::A};
  check_status(graph->create_execution_plans(modes), "create_execution_plans", key);
  graph->deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  if (key.input.data_type == CUDNN_DATA_FLOAT && key.convolution.math_type == CUDNN_FMA_MATH) {
    graph->deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  }
  if (deterministic) graph->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  return graph;
}

std::int64_t build_at(Graph& graph, std::int64_t index) {
  try {
    return graph.build_plan_at_index(index).is_good() ? index : -1;
  } catch (const std::exception&) {  // cudnn-frontend lets some cuDNN failures escape as exceptions
    return -1;
  }
}

std::optional<bool> runtime_compiled_at(Graph& graph, std::int64_t index) {
  std::vector<fe::BehaviorNote_t> notes;
  if (graph.get_behavior_notes_for_plan_at_index(index, notes).is_bad()) return std::nullopt;
  return std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) != notes.end();
}

// The first `count` configs of heuristics mode B that mode A ranks differently. Mode B costs more CPU time
// per query, so it only adds candidates; an error (mode B does not support every graph) adds none.
std::vector<EngineCandidate> mode_b_configs(cudnnHandle_t handle, const ConvolutionKey& key, int count) {
  std::vector<EngineCandidate> configs;
  if (count <= 0) return configs;
  try {
    auto graph = operation_graph(handle, key);
    if (graph->create_execution_plans({fe::HeurMode_t::B}).is_bad()) return configs;
    for (std::int64_t i = 0; i < graph->get_execution_plan_count() && static_cast<int>(configs.size()) < count; ++i) {
      if (auto config = describe_plan(*graph, i)) configs.push_back(*config);
    }
  } catch (const Error&) {
  }
  return configs;
}

// Variants of `best` that change one knob by at most `distance` steps to a value cuDNN allows (Note [Engine
// configs]), at most `count` of them, nearest values first.
std::vector<EngineCandidate> knob_variants(Graph& graph, const EngineCandidate& best, int count, int distance) {
  std::vector<EngineCandidate> variants;
  std::vector<fe::Knob> ranges;
  if (count <= 0 || graph.get_knobs_for_engine(best.engine_id, ranges).is_bad()) return variants;
  for (int steps = 1; steps <= distance; ++steps) {
    for (const fe::Knob& range : ranges) {
      const Knob* knob = std::find_if(best.knobs_begin(), best.knobs_end(), [&](const Knob& k) {
        return k.type == static_cast<std::int64_t>(range.type);
      });
      if (knob == best.knobs_end() || range.stride <= 0) continue;
      for (const int sign : {1, -1}) {
        const std::int64_t value = knob->value + sign * steps * range.stride;
        if (value < range.minValue || value > range.maxValue) continue;
        EngineCandidate changed = best;
        changed.knobs[knob - best.knobs_begin()].value = value;
        changed.heuristic_index = EngineCandidate::kNotListed;  // a new plan: cuDNN chooses the unnamed knobs
        variants.push_back(changed);
        if (static_cast<int>(variants.size()) == count) return variants;
      }
    }
  }
  return variants;
}
}  // namespace graph_internal

using namespace graph_internal;

GraphPlan::GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config)
    : direction_(static_cast<Direction>(key.direction)) {
  std::int64_t index = -1;
  if (config.heuristic_index == EngineCandidate::kNotListed) {
    graph_ = operation_graph(handle, key);
    check_status(graph_->create_execution_plan(config.engine_id, knob_map(config)), "create_execution_plan", key);
    index = graph_->get_execution_plan_count() - 1;
  } else {
    const auto asked = std::chrono::steady_clock::now();
    graph_ = heuristic_graph(handle, key, false);
    heuristics_us_ = microseconds_since(asked);
    if ((index = add_plan(*graph_, config)) < 0) {
      throw Error(detail::concat("cuDNN graph API: heuristics' config #", config.heuristic_index, " for ", key,
                                 " is not ", to_string(config), " here (another cuDNN or GPU made the entry)"),
                  CUDNN_STATUS_NOT_SUPPORTED);
    }
  }
  check_status(graph_->build_plan_at_index(index), "build_plan", key);  // selects it for execute and serialize
  std::int64_t bytes = 0;
  check_status(graph_->get_workspace_size(bytes), "get_workspace_size", key);
  workspace_bytes_ = static_cast<std::uint64_t>(bytes);
}

GraphPlan::GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const std::vector<std::uint8_t>& serialized)
    : direction_(static_cast<Direction>(key.direction)), graph_(restored_graph(handle, key, serialized)) {
  std::int64_t bytes = 0;
  check_status(graph_->get_workspace_size(bytes), "get_workspace_size", key);
  workspace_bytes_ = static_cast<std::uint64_t>(bytes);
}

std::vector<std::uint8_t> GraphPlan::serialize() const {
  return serialize_selected(*graph_, detail::concat("a ", to_string(direction_), " plan"));
}

void GraphPlan::execute(cudnnHandle_t handle, const ConvolutionBuffers& buffers, void* workspace) const {
  CUDNN_CACHE_REQUIRE(aligned(buffers),
                      "cuDNN graph API: buffers must be ", kGraphAlignment, "-byte aligned (", to_string(direction_), ")");
  VariantPack pack = variant_pack(buffers);
  fe::error_t status = graph_->execute(handle, pack.data(), static_cast<int>(pack.size()), workspace);
  CUDNN_CACHE_REQUIRE(status.is_good(), "cuDNN graph API: execute failed (", status.get_message(), ") for a ",
                      to_string(direction_), " plan");
}

std::optional<HeuristicChoice> heuristic_choice(cudnnHandle_t handle, const ConvolutionKey& key, bool deterministic,
                                                bool compile, std::uint64_t max_workspace_bytes) {
  // Mode A's list first, the fallback list only when none of it builds, as Conv_v8.cpp asks them: the fallback
  // query checks every engine against the graph, CPU time each untuned key would otherwise pay on its first
  // call (Note [Native heuristics' choice] in runtime.h). Mode A's positions are the same in both graphs.
  std::int64_t tried = 0;
  for (const bool fallback : {false, true}) {
    std::shared_ptr<Graph> graph;
    try {
      graph = heuristic_graph(handle, key, deterministic, fallback);
    } catch (const Error&) {
      if (fallback) return std::nullopt;
      continue;  // mode A may not take a graph the fallback list does
    }
    const std::int64_t listed = graph->get_execution_plan_count();
    for (std::int64_t index = tried; index < listed; ++index) {
      if (!compile && runtime_compiled_at(*graph, index).value_or(true)) continue;  // unknown: may compile
      if (build_at(*graph, index) < 0) continue;
      std::optional<EngineCandidate> config = describe_plan(*graph, index, listed);
      if (!config || config->workspace_bytes > max_workspace_bytes) continue;
      const auto direction = static_cast<Direction>(key.direction);
      // The graph keeps heuristics' list, of which only this plan is built: the list is what a config stored
      // by its position is made again from, and costs descriptors, not device memory.
      auto plan = std::shared_ptr<const GraphPlan>(new GraphPlan(direction, graph, config->workspace_bytes));
      return HeuristicChoice{*config, std::move(plan)};
    }
    tried = listed;
  }
  return std::nullopt;
}

std::string check_graph(const ConvolutionKey& key) {
  fe::error_t status = make_graph(key)->validate();
  return status.is_good() ? std::string() : status.get_message();
}

}  // namespace cudnn_cache
