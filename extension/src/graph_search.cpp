// search_engine_configs: Note [Engine configs] in cudnn_cache/graph.h.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "cudnn_cache/error.h"
#include "cudnn_cache/graph.h"
#include "graph_internal.h"
#include "paired_timing.h"

namespace cudnn_cache {
namespace {

using namespace graph_internal;

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
    if (!config || config->workspace_bytes > options_.max_workspace_bytes) return false;
    if (!complete && substitute) {
      names_.erase(name);  // the replayable config may well be this very plan
      const std::int64_t replayable = add_plan(*graph_, *config);
      return replayable >= 0 && time(replayable, false);
    }
    const std::optional<Workspace> workspace = workspace_for(allocate_, config->workspace_bytes);
    if (!workspace) return false;  // out of memory: not a candidate here
    Timing timing{options_.warmup, options_.repetitions, &flush_};
    if (best_ms_ < std::numeric_limits<float>::infinity()) timing.give_up_ms = best_ms_ * options_.give_up_ratio;
    const std::vector<float> times =
        time_plan(*graph_, handle_, pack_, workspace->data(), index, timing);
    if (times.empty()) return false;
    config->time_ms = median(times);
    best_ms_ = std::min(best_ms_, config->time_ms);
    configs_.push_back(*config);
    indices_.push_back(index);
    return true;
  }

  // Times the fastest `count` configs and the first one timed (heuristics' first pick, which native
  // benchmark=False runs) again, together: `repetitions` interleaved rounds, so drift in clocks or temperature
  // affects each alike. A config that wins the first pass by less than the noise of one measurement won it by
  // luck as often as not; the paired rounds decide, and a challenger leads native's pick only where they show
  // it faster (Note [Never slower than native's pick]). Without memory for the largest workspace, or if a
  // finalist fails to run now, the first timings stand.
  void confirm(int count) {
    std::vector<std::size_t> finalists = order();
    finalists.resize(std::min<std::size_t>(finalists.size(), static_cast<std::size_t>(std::max(count, 0))));
    if (!finalists.empty() && std::find(finalists.begin(), finalists.end(), 0) == finalists.end()) {
      finalists.push_back(0);
    }
    if (finalists.size() < 2) return;
    std::uint64_t bytes = 0;
    for (std::size_t i : finalists) bytes = std::max(bytes, configs_[i].workspace_bytes);
    const std::optional<Workspace> workspace = workspace_for(allocate_, bytes);
    if (!workspace) return;
    std::vector<std::vector<float>> times(finalists.size());
    for (int round = 0; round < options_.repetitions; ++round) {
      for (std::size_t f = 0; f < finalists.size(); ++f) {
        const std::vector<float> run = time_plan(*graph_, handle_, pack_, workspace->data(),
                                                 indices_[finalists[f]],
                                                 Timing{round == 0 ? options_.warmup : 0, 1, &flush_});
        if (run.empty()) return;  // it ran before; if it fails now, keep what was measured then
        times[f].push_back(run.front());
      }
    }
    settle_against_native(configs_, 0, finalists, times);
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
  VariantPack pack_;
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
  CUDNN_CACHE_REQUIRE(search.timed() > 0, "cuDNN graph API: no engine config runs ", key,
                      within_workspace_limit(options.max_workspace_bytes));
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

}  // namespace cudnn_cache
