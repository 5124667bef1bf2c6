#include "cudnn_cache/graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
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

std::unordered_map<std::int64_t, void*> variant_pack(const ConvolutionBuffers& buffers) {
  return {{kUidX, buffers.x}, {kUidW, buffers.w}, {kUidY, buffers.y}};
}

// Scratch memory written before each timed run, so every candidate starts with its operands out of L2 (Note
// [Engine configs]): back-to-back runs on L2-resident buffers favour configs that lose inside a network.
class L2Flush {
 public:
  L2Flush(const WorkspaceAllocator& allocate, bool enabled) {
    int device = 0, l2_bytes = 0;
    if (!enabled || cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2_bytes <= 0) {
      return;
    }
    bytes_ = 2 * static_cast<std::size_t>(l2_bytes);
    buffer_ = allocate(bytes_);  // without memory for it, timing goes on unflushed
  }
  void operator()(cudaStream_t stream) const {
    if (buffer_) cudaMemsetAsync(buffer_.data(), 0, bytes_, stream);
  }

 private:
  std::size_t bytes_ = 0;
  Workspace buffer_;
};

// How one built plan is timed.
struct Timing {
  int warmup = 0;
  int repetitions = 1;
  const L2Flush* flush = nullptr;  // null: not flushed (PyTorch's way)
  float give_up_ms = std::numeric_limits<float>::infinity();
};

// Times of one built plan's runs after the warm-up, per Note [Engine configs]; empty if it failed to run.
// Stops after 3 runs whose fastest is slower than timing.give_up_ms: such a plan cannot win.
std::vector<float> time_plan(const Graph& graph, cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack,
                             void* workspace, std::int64_t index, const Timing& timing) {
  cudaStream_t stream = nullptr;
  cudnnGetStream(handle, &stream);
  for (int i = 0; i < timing.warmup; ++i) {
    if (graph.execute_plan_at_index(handle, pack, workspace, index).is_bad()) return {};
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < timing.repetitions; ++i) {
    if (timing.flush) (*timing.flush)(stream);
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
    if (times.size() == 3 && *std::min_element(times.begin(), times.end()) > timing.give_up_ms) break;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
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

// The engine config of the graph's plan at `index`, without its time; nullopt if cuDNN cannot say, or it has
// more knobs than a key stores. Knobs of a type this cudnn-frontend cannot name (cuDNN's deprecated ones,
// which older engines such as the TF32 NHWC implicit GEMMs still use: Note [Engine configs]) come back as
// NOT_SET and are left out; `complete` says whether any were, i.e. whether the config replays this plan.
std::optional<EngineCandidate> describe_plan(Graph& graph, std::int64_t index, bool* complete = nullptr) {
  EngineCandidate config;
  std::int64_t workspace_bytes = 0;
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  if (graph.get_workspace_size_plan_at_index(index, workspace_bytes).is_bad() ||
      graph.get_engine_and_knobs_at_index(index, config.engine_id, knobs).is_bad()) {
    return std::nullopt;
  }
  // get_engine_and_knobs_at_index maps every unnamed type to NOT_SET, so one key stands for all of them.
  const bool named = knobs.erase(fe::KnobType_t::NOT_SET) == 0;
  if (complete) *complete = named;
  if (knobs.size() > kMaxKnobs) return std::nullopt;
  for (const auto& [type, value] : knobs) {
    config.knobs[config.knob_count++] = {static_cast<std::int64_t>(type), value};
  }
  std::sort(config.knobs.begin(), config.knobs.begin() + config.knob_count);
  config.workspace_bytes = static_cast<std::uint64_t>(workspace_bytes);
  std::vector<fe::BehaviorNote_t> notes;
  if (graph.get_behavior_notes_for_plan_at_index(index, notes).is_good()) {
    for (fe::BehaviorNote_t note : notes) config.behavior_notes |= 1 << static_cast<int>(note);
  }
  return config;
}

std::unordered_map<fe::KnobType_t, std::int64_t> knob_map(const EngineCandidate& config) {
  std::unordered_map<fe::KnobType_t, std::int64_t> knobs;
  for (const Knob* knob = config.knobs_begin(); knob != config.knobs_end(); ++knob) {
    knobs[static_cast<fe::KnobType_t>(knob->type)] = knob->value;
  }
  return knobs;
}

// Appends the config to the graph's plans; returns its index, or -1 if cuDNN does not take it.
std::int64_t add_plan(Graph& graph, const EngineCandidate& config) {
  if (graph.create_execution_plan(config.engine_id, knob_map(config)).is_bad()) return -1;
  return graph.get_execution_plan_count() - 1;
}

// The operation graph with the configs of heuristics mode A and the fallback list, in that order, after the
// numeric filters of Note [Engine configs].
std::shared_ptr<Graph> heuristic_graph(cudnnHandle_t handle, const ConvolutionKey& key, bool deterministic) {
  auto graph = operation_graph(handle, key);
  check_status(graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
               "create_execution_plans", key);
  graph->deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  if (key.input.data_type == CUDNN_DATA_FLOAT && key.convolution.math_type == CUDNN_FMA_MATH) {
    graph->deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  }
  if (deterministic) graph->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  return graph;
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

// Variants of `best` that change one knob to a neighbouring value cuDNN allows (Note [Engine configs]), at
// most `count` of them, nearest values first.
std::vector<EngineCandidate> knob_variants(Graph& graph, const EngineCandidate& best, int count) {
  std::vector<EngineCandidate> variants;
  std::vector<fe::Knob> ranges;
  if (count <= 0 || graph.get_knobs_for_engine(best.engine_id, ranges).is_bad()) return variants;
  for (int distance = 1; distance <= 2; ++distance) {
    for (const fe::Knob& range : ranges) {
      const Knob* knob = std::find_if(best.knobs_begin(), best.knobs_end(), [&](const Knob& k) {
        return k.type == static_cast<std::int64_t>(range.type);
      });
      if (knob == best.knobs_end() || range.stride <= 0) continue;
      for (const int sign : {1, -1}) {
        const std::int64_t value = knob->value + sign * distance * range.stride;
        if (value < range.minValue || value > range.maxValue) continue;
        EngineCandidate changed = best;
        changed.knobs[knob - best.knobs_begin()].value = value;
        variants.push_back(changed);
        if (static_cast<int>(variants.size()) == count) return variants;
      }
    }
  }
  return variants;
}

// A search's state: the graph whose plans are timed, and what has been timed so far.
class EngineSearch {
 public:
  EngineSearch(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
               const WorkspaceAllocator& allocate, const GraphSearchOptions& options)
      : handle_(handle),
        allocate_(allocate),
        options_(options),
        graph_(heuristic_graph(handle, key, options.deterministic)),
        pack_(variant_pack(buffers)),
        flush_(allocate, options.flush_l2) {}

  Graph& graph() { return *graph_; }
  std::shared_ptr<Graph> take_graph() { return std::move(graph_); }

  // Builds and times the plan at `index` unless a plan of that name was timed already; returns whether it
  // was timed and ran. A plan whose knobs cannot all be stored is replaced by its config without them
  // (`substitute`): cuDNN chooses those knobs itself then, and what is timed is what a replay runs.
  bool time(std::int64_t index, bool substitute = true) {
    std::string name;
    if (graph_->get_plan_name_at_index(index, name).is_bad() || !names_.insert(name).second) return false;
    if (graph_->build_plan_at_index(index).is_bad()) return false;  // not supported, or filtered out
    bool complete = true;
    std::optional<EngineCandidate> config = describe_plan(*graph_, index, &complete);
    if (!config) return false;
    if (!complete && substitute) {
      names_.erase(name);  // the replayable config may well be this very plan
      const std::int64_t replayable = add_plan(*graph_, *config);
      return replayable >= 0 && time(replayable, false);
    }
    Workspace workspace;
    if (config->workspace_bytes > 0 && !(workspace = allocate_(config->workspace_bytes))) return false;  // OOM
    Timing timing{options_.warmup, options_.repetitions, &flush_};
    if (best_ms_ < std::numeric_limits<float>::infinity()) timing.give_up_ms = best_ms_ * options_.give_up_ratio;
    const std::vector<float> times =
        time_plan(*graph_, handle_, pack_, workspace.data(), index, timing);
    if (times.empty()) return false;
    config->time_ms = median(times);
    best_ms_ = std::min(best_ms_, config->time_ms);
    configs_.push_back(*config);
    indices_.push_back(index);
    return true;
  }

  // Times the fastest `count` configs and the first one timed (heuristics' first pick, which native
  // benchmark=False runs) again, together: `repetitions` interleaved rounds, so drift in clocks or temperature
  // affects each alike, and their medians replace the first ones. A config that wins the first pass by less
  // than the noise of one measurement won it by luck as often as not; the second, paired measurement decides.
  // Without memory for the largest workspace, the first timings stand.
  void confirm(int count) {
    std::vector<std::size_t> finalists = order();
    finalists.resize(std::min<std::size_t>(finalists.size(), static_cast<std::size_t>(std::max(count, 0))));
    if (!finalists.empty() && std::find(finalists.begin(), finalists.end(), 0) == finalists.end()) {
      finalists.push_back(0);
    }
    if (finalists.size() < 2) return;
    std::uint64_t bytes = 0;
    for (std::size_t i : finalists) bytes = std::max(bytes, configs_[i].workspace_bytes);
    Workspace workspace;
    if (bytes > 0 && !(workspace = allocate_(bytes))) return;
    std::vector<std::vector<float>> times(finalists.size());
    for (int round = 0; round < options_.repetitions; ++round) {
      for (std::size_t f = 0; f < finalists.size(); ++f) {
        const std::vector<float> run = time_plan(*graph_, handle_, pack_, workspace.data(),
                                                 indices_[finalists[f]],
                                                 Timing{round == 0 ? options_.warmup : 0, 1, &flush_});
        if (run.empty()) return;  // it ran before; if it fails now, keep what was measured then
        times[f].push_back(run.front());
      }
    }
    for (std::size_t f = 0; f < finalists.size(); ++f) configs_[finalists[f]].time_ms = median(times[f]);
  }

  // The timed configs, fastest first (Note [Selection, merge and fallback policy]), and the graph index of
  // each.
  std::pair<std::vector<EngineCandidate>, std::vector<std::int64_t>> ranked() const {
    std::pair<std::vector<EngineCandidate>, std::vector<std::int64_t>> result;
    for (std::size_t i : order()) {
      result.first.push_back(configs_[i]);
      result.second.push_back(indices_[i]);
    }
    return result;
  }

  std::size_t timed() const { return configs_.size(); }

 private:
  // Positions in configs_, best first.
  std::vector<std::size_t> order() const {
    std::vector<std::size_t> positions(configs_.size());
    for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = i;
    std::sort(positions.begin(), positions.end(), [&](std::size_t a, std::size_t b) {
      return ranks_before<GraphForwardTraits>(configs_[a], configs_[b]);
    });
    return positions;
  }

  cudnnHandle_t handle_;
  const WorkspaceAllocator& allocate_;
  GraphSearchOptions options_;
  std::shared_ptr<Graph> graph_;
  std::unordered_map<std::int64_t, void*> pack_;
  L2Flush flush_;
  std::set<std::string> names_;  // of the plans timed: the heuristic lists overlap
  std::vector<EngineCandidate> configs_;
  std::vector<std::int64_t> indices_;
  float best_ms_ = std::numeric_limits<float>::infinity();
};

}  // namespace

std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t handle, const ConvolutionKey& key,
                                                const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                                const GraphSearchOptions& options,
                                                std::shared_ptr<const GraphPlan>* best_plan) {
  CUDNN_CACHE_REQUIRE(aligned(buffers),
                      "cuDNN graph API: buffers must be ", kGraphAlignment, "-byte aligned for ", key);
  EngineSearch search(handle, key, buffers, allocate, options);
  Graph& graph = search.graph();
  // 1. Heuristics mode A, then the fallback list, in cuDNN's order, up to max_candidates that run.
  const std::int64_t heuristic_count = graph.get_execution_plan_count();
  for (std::int64_t index = 0;
       index < heuristic_count && static_cast<int>(search.timed()) < options.max_candidates; ++index) {
    search.time(index);
  }
  // 2. Mode B's first picks, where they are not among those.
  for (const EngineCandidate& config : mode_b_configs(handle, key, options.mode_b_candidates)) {
    const std::int64_t index = add_plan(graph, config);
    if (index >= 0) search.time(index);
  }
  CUDNN_CACHE_REQUIRE(search.timed() > 0, "cuDNN graph API: no engine config runs ", key);
  // 3. The best so far with one knob moved to a neighbouring value, unless cuDNN compiles it at run time
  //    (each variant would be another compilation of 50-200 ms).
  const EngineCandidate best = search.ranked().first.front();
  const int variants = (best.behavior_notes & EngineCandidate::kRuntimeCompiled) ? 0 : options.knob_variants;
  for (const EngineCandidate& variant : knob_variants(graph, best, variants)) {
    const std::int64_t index = add_plan(graph, variant);
    if (index >= 0) search.time(index);
  }
  // 4. The finalists, timed again side by side.
  search.confirm(options.finalists);
  auto [ranked, indices] = search.ranked();
  // Building a built plan again only selects it, for execute() and serialize().
  if (best_plan && graph.build_plan_at_index(indices.front()).is_good()) {
    *best_plan = std::shared_ptr<const GraphPlan>(
        new GraphPlan(static_cast<Direction>(key.direction), search.take_graph(), ranked.front().workspace_bytes));
  }
  return ranked;
}

ChoiceAudit audit_engine_choice(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                                const WorkspaceAllocator& allocate, const EngineCandidate& stored,
                                const GraphSearchOptions& options) {
  CUDNN_CACHE_REQUIRE(aligned(buffers),
                      "cuDNN graph API: buffers must be ", kGraphAlignment, "-byte aligned for ", key);
  auto graph = heuristic_graph(handle, key, options.deterministic);
  auto pack = variant_pack(buffers);
  ChoiceAudit audit;
  std::int64_t heuristic_index = -1, benchmark_index = -1;
  float benchmark_sample = std::numeric_limits<float>::infinity();
  std::set<std::string> names;
  // PyTorch's two modes over the same list: benchmark=False runs the first plan that builds and runs;
  // benchmark=True times the first cudnn.benchmark_limit (10) that build, once each after one warm-up run.
  const std::int64_t count = graph->get_execution_plan_count();
  for (std::int64_t index = 0; index < count && static_cast<int>(names.size()) < options.max_candidates; ++index) {
    std::string name;
    if (graph->get_plan_name_at_index(index, name).is_bad() || graph->build_plan_at_index(index).is_bad() ||
        !names.insert(name).second) {
      continue;
    }
    // Native runs this very plan, whatever its knobs; a config that leaves some out only labels it.
    bool complete = true;
    std::optional<EngineCandidate> config = describe_plan(*graph, index, &complete);
    Workspace workspace;
    if (!config || (config->workspace_bytes > 0 && !(workspace = allocate(config->workspace_bytes)))) continue;
    const std::vector<float> sample =
        time_plan(*graph, handle, pack, workspace.data(), index, Timing{1, 1});
    if (sample.empty()) continue;
    if (heuristic_index < 0) {
      heuristic_index = index;
      audit.heuristic.config = *config;
      audit.heuristic.replayable = complete;
    }
    if (sample.front() < benchmark_sample) {
      benchmark_sample = sample.front();
      benchmark_index = index;
      audit.benchmark.config = *config;
      audit.benchmark.replayable = complete;
    }
  }
  CUDNN_CACHE_REQUIRE(heuristic_index >= 0, "cuDNN graph API: no engine config runs ", key);
  const std::int64_t stored_index = add_plan(*graph, stored);
  CUDNN_CACHE_REQUIRE(stored_index >= 0 && graph->build_plan_at_index(stored_index).is_good(),
                      "cuDNN graph API: the stored ", to_string(stored), " does not build for ", key);
  audit.stored.config = describe_plan(*graph, stored_index).value_or(stored);

  // Then each distinct config the same way, in rounds, so drift in clocks or temperature affects each alike;
  // the stored one twice, for the audit's resolution.
  L2Flush flush(allocate, options.flush_l2);
  struct Contender {
    std::int64_t index;
    const EngineCandidate* config;
    Workspace workspace;
    std::vector<float> times;
  };
  std::vector<Contender> contenders;
  const auto contend = [&](std::int64_t index, const EngineCandidate& config) {
    Contender contender{index, &config, Workspace(), {}};
    const std::uint64_t bytes = config.workspace_bytes;
    CUDNN_CACHE_REQUIRE(bytes == 0 || (contender.workspace = allocate(bytes)), "out of memory for a ", bytes,
                        "-byte workspace while auditing ", key);
    contenders.push_back(std::move(contender));
    return contenders.size() - 1;
  };
  const std::size_t stored_at = contend(stored_index, audit.stored.config);
  const std::size_t again_at = contend(stored_index, audit.stored.config);
  const auto native_at = [&](std::int64_t index, const ChoiceAudit::Choice& choice) {
    return choice.replayable && choice.config.same_choice(audit.stored.config) ? stored_at
                                                                                : contend(index, choice.config);
  };
  const std::size_t heuristic_at = native_at(heuristic_index, audit.heuristic);
  const std::size_t benchmark_at =
      benchmark_index == heuristic_index ? heuristic_at : native_at(benchmark_index, audit.benchmark);
  for (int round = 0; round < options.repetitions; ++round) {
    for (Contender& contender : contenders) {
      void* workspace = contender.workspace.data();
      const std::vector<float> times = time_plan(*graph, handle, pack, workspace, contender.index,
                                                 Timing{round == 0 ? options.warmup : 0, 1, &flush});
      CUDNN_CACHE_REQUIRE(!times.empty(), "cuDNN graph API: ", to_string(*contender.config),
                          " failed to run while auditing ", key);
      contender.times.push_back(times.front());
    }
  }
  for (auto [choice, at] : {std::pair{&audit.stored, stored_at}, std::pair{&audit.heuristic, heuristic_at},
                            std::pair{&audit.benchmark, benchmark_at}}) {
    choice->time_ms = median(contenders[at].times);
    choice->config.time_ms = choice->time_ms;
  }
  audit.stored_again_ms = median(contenders[again_at].times);
  return audit;
}

GraphPlan::GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config)
    : direction_(static_cast<Direction>(key.direction)), graph_(operation_graph(handle, key)) {
  check_status(graph_->create_execution_plan(config.engine_id, knob_map(config)), "create_execution_plan", key);
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
  CUDNN_CACHE_REQUIRE(aligned(buffers),
                      "cuDNN graph API: buffers must be ", kGraphAlignment, "-byte aligned (", to_string(direction_), ")");
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
