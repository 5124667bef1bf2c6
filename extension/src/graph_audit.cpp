// audit_engine_choice: a stored engine config measured against the configs PyTorch's two modes would run.

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
#include "search_bounds.h"

namespace cudnn_cache {

using namespace graph_internal;

namespace {

// audit_engine_choice with `rounds` rounds; it times the way a search does (Note [Search bounds]).
ChoiceAudit audit_in_rounds(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                            const WorkspaceAllocator& allocate, const EngineCandidate& stored,
                            const GraphSearchOptions& options, int rounds) {
  constexpr SearchBounds bounds;
  CUDNN_CACHE_REQUIRE(aligned(buffers),
                      "cuDNN graph API: buffers must be ", kGraphAlignment, "-byte aligned for ", key);
  auto graph = heuristic_graph(handle, key, options.deterministic);
  auto pack = variant_pack(buffers);
  ChoiceAudit audit;
  std::int64_t heuristic_index = -1, benchmark_index = -1;
  float benchmark_sample = std::numeric_limits<float>::infinity();
  std::set<std::string> names;
  // PyTorch's two modes over the same list: benchmark=False runs the first plan that builds and runs;
  // benchmark=True times the first cudnn.benchmark_limit (10) that build, once each after one warm-up run, from an
  // idle stream and without flushing L2 (Note [Timing the whole call]).
  const std::int64_t count = graph->get_execution_plan_count();
  for (std::int64_t index = 0; index < count && static_cast<int>(names.size()) < bounds.max_candidates; ++index) {
    std::string name;
    if (graph->get_plan_name_at_index(index, name).is_bad() || graph->build_plan_at_index(index).is_bad() ||
        !names.insert(name).second) {
      continue;
    }
    // Native runs this very plan, whatever its knobs: described by its position where they cannot all be named.
    std::optional<EngineCandidate> config = describe_plan(*graph, index, count);
    if (!config) continue;
    const std::optional<Workspace> workspace = workspace_for(allocate, config->workspace_bytes);
    if (!workspace) continue;
    const std::vector<float> sample = time_plan(*graph, handle, pack, workspace->data(), index, Timing{1, 1});
    if (sample.empty()) continue;
    if (heuristic_index < 0) {
      heuristic_index = index;
      audit.heuristic.config = *config;
    }
    if (sample.front() < benchmark_sample) {
      benchmark_sample = sample.front();
      benchmark_index = index;
      audit.benchmark.config = *config;
    }
  }
  CUDNN_CACHE_REQUIRE(heuristic_index >= 0, "cuDNN graph API: no engine config runs ", key);
  const std::int64_t stored_index = add_plan(*graph, stored);
  CUDNN_CACHE_REQUIRE(stored_index >= 0 && graph->build_plan_at_index(stored_index).is_good(),
                      "cuDNN graph API: the stored ", to_string(stored), " does not build for ", key);
  audit.stored.config = describe_plan(*graph, stored_index, count).value_or(stored);

  // Then each distinct config the same way, in rounds, so drift in clocks or temperature affects each alike;
  // the stored one twice, for the audit's resolution, each round in a fresh order.
  L2Flush flush(allocate, bounds.flush_l2);
  struct Contender {
    std::int64_t index;
    const EngineCandidate* config;
    Workspace workspace;
    std::vector<float> times;
  };
  std::vector<Contender> contenders;
  const auto contend = [&](std::int64_t index, const EngineCandidate& config) {
    std::optional<Workspace> workspace = workspace_for(allocate, config.workspace_bytes);
    CUDNN_CACHE_REQUIRE(workspace, "out of memory for a ", config.workspace_bytes, "-byte workspace while auditing ",
                        key);
    contenders.push_back(Contender{index, &config, std::move(*workspace), {}});
    return contenders.size() - 1;
  };
  const std::size_t stored_at = contend(stored_index, audit.stored.config);
  const std::size_t again_at = contend(stored_index, audit.stored.config);
  const auto native_at = [&](std::int64_t index, const ChoiceAudit::Choice& choice) {
    return choice.config.same_choice(audit.stored.config) ? stored_at : contend(index, choice.config);
  };
  const std::size_t heuristic_at = native_at(heuristic_index, audit.heuristic);
  const std::size_t benchmark_at =
      benchmark_index == heuristic_index ? heuristic_at : native_at(benchmark_index, audit.benchmark);
  for (int round = 0; round < rounds; ++round) {
    for (const std::size_t at : round_order(round, contenders.size())) {  // Note [Paired rounds in a fresh order]
      Contender& contender = contenders[at];
      void* workspace = contender.workspace.data();
      const std::vector<float> times = time_plan(*graph, handle, pack, workspace, contender.index,
                                                 round_timing(round, bounds.warmup, flush));
      CUDNN_CACHE_REQUIRE(!times.empty(), "cuDNN graph API: ", to_string(*contender.config),
                          " failed to run while auditing ", key);
      contender.times.push_back(times.front());
    }
  }
  for (auto [choice, at] : {std::pair{&audit.stored, stored_at}, std::pair{&audit.heuristic, heuristic_at},
                            std::pair{&audit.benchmark, benchmark_at}}) {
    choice->round_ms = contenders[at].times;
    choice->time_ms = median(choice->round_ms);
    choice->config.time_ms = choice->time_ms;
  }
  audit.stored_again_ms = median(contenders[again_at].times);
  return audit;
}

}  // namespace

ChoiceAudit audit_engine_choice(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                                const WorkspaceAllocator& allocate, const EngineCandidate& stored,
                                const GraphSearchOptions& options) {
  return audit_in_rounds(handle, key, buffers, allocate, stored, options, SearchBounds{}.repetitions);
}

SettledChoice settle_engine_choice(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                                   const WorkspaceAllocator& allocate, const std::vector<EngineCandidate>& ranked,
                                   const GraphSearchOptions& options) {
  CUDNN_CACHE_REQUIRE(!ranked.empty(), "settle: no stored config for ", key);
  SettledChoice settled;
  settled.audit =
      audit_in_rounds(handle, key, buffers, allocate, ranked.front(), options, 3 * SearchBounds{}.repetitions);
  settled.configs = settle_by_audit(ranked, settled.audit);
  return settled;
}

}  // namespace cudnn_cache
