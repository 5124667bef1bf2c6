#pragma once

// Note [One run path]
// ~~~~~~~~~~~~~~~~~~~
// Runtime::run and Runtime::tune are written once (runtime.cpp): look the key up, apply the miss policy, walk
// the ranking with fallback, count. What differs between cuDNN's two APIs is only what a candidate is, how a
// search finds candidates and how one candidate runs, and that is a backend, chosen by the cache's traits
// (BackendOf): LegacyBackend for cudnnConvolution*Algo_t, GraphBackend for graph-API engine configs. Both
// have the same shape:
//   kind                    what a candidate is called in logs and errors
//   backend                 the Backend it is (for recorded misses)
//   search(buffers, alloc, options, bounds)  times every candidate now and returns them ranked
//   Ready                   what a candidate needs made before it runs (the graph API: its plan)
//   ready(c, best)          makes candidate c ready
//   refusal(ready)          why the candidate cannot run at all, or null (a fallback)
//   run(ready, c, buffers, alloc)  runs candidate c made ready; "" when it ran, else why it could not (a
//                           fallback). A Ready may run again, on later calls (Note [Each thread's own hits])
//   borrow(ranking)         what of another key's ranking this key may run (the nearest miss policy)
// The graph backend also gives native heuristics' own choice, what an untuned miss runs (native_choice()), and
// the legacy backend cuDNN's heuristic order, the last resort of both (heuristics()).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cudnn_cache/algorithms.h"
#include "cudnn_cache/cache_store.h"
#include "cudnn_cache/descriptors.h"
#include "cudnn_cache/graph.h"
#include "cudnn_cache/runtime.h"
#include "elapsed.h"
#include "plan_cache.h"
#include "search_bounds.h"

namespace cudnn_cache {

// Why a candidate did not run when its workspace could not be had: a fallback, not an error.
inline std::string out_of_memory(const std::string& candidate, std::size_t bytes) {
  return detail::concat(candidate, ": out of memory for a ", bytes, "-byte workspace");
}

// The legacy API: a candidate is an algorithm and the math type it was measured with.
template <typename Traits>
class LegacyBackend {
 public:
  static constexpr const char* kind = "algorithm";
  static constexpr Backend backend = Backend::legacy;

  LegacyBackend(cudnnHandle_t handle, const ConvolutionKey& key) : handle_(handle), key_(key), descriptors_(key) {}

  // cudnnFind*AlgorithmEx, with the largest workspace the allocator can give, at most options'
  // max_workspace_bytes (algorithms that need more then report an allocation failure, and are never run). Its
  // other options, and the bounds, are the graph API's.
  Ranking<Traits> search(const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                         const GraphSearchOptions& options, const graph_internal::SearchBounds& /*bounds*/) {
    auto [workspace, bytes] = search_workspace(allocate, options.max_workspace_bytes);
    std::array<typename Traits::Perf, Traits::algorithm_count> perfs{};
    int returned = 0;
    CUDNN_CACHE_CHECK(Algorithms<Traits>::find(handle_, descriptors_, buffers, Traits::algorithm_count, &returned,
                                               perfs.data(), workspace.data(), bytes),
                      key_);
    const Ranking<Traits> ranking = Ranking<Traits>::of_perfs(perfs.data(), returned);
    CUDNN_CACHE_REQUIRE(!ranking.empty() && ranking.front().succeeded(), "cuDNN found no algorithm that runs ", key_,
                        within_workspace_limit(options.max_workspace_bytes));
    return ranking;
  }

  // An algorithm runs as it is: nothing to make, and never refused.
  struct Ready {};
  Ready ready(const Candidate<Traits>& /*candidate*/, bool /*best*/) { return {}; }
  static const std::string* refusal(const Ready& /*ready*/) { return nullptr; }

  std::string run(const Ready& /*ready*/, const Candidate<Traits>& candidate, const ConvolutionBuffers& buffers,
                  const WorkspaceAllocator& allocate) {
    std::optional<Workspace> workspace = workspace_for(allocate, candidate.workspace_bytes);
    if (!workspace) return out_of_memory(Traits::algorithm_name(candidate.algorithm), candidate.workspace_bytes);
    // The candidate was measured with its own math type; run it with that one, as cuDNN reported it.
    CUDNN_CACHE_CHECK(cudnnSetConvolutionMathType(descriptors_.convolution.get(), candidate.math_type));
    const cudnnStatus_t status =
        Algorithms<Traits>::execute(handle_, descriptors_, candidate.algorithm, buffers,
                                    workspace->data(), candidate.workspace_bytes);
    if (status == CUDNN_STATUS_SUCCESS) return {};
    return detail::concat(Traits::algorithm_name(candidate.algorithm), ": ", cudnnGetErrorString(status));
  }

  // The neighbour's candidates that cuDNN supports for this key, each with the workspace it needs here, in the
  // neighbour's order: what the nearest miss policy runs (Note [Nearest key]).
  Ranking<Traits> borrow(const Ranking<Traits>& neighbour) {
    std::vector<Candidate<Traits>> kept;
    for (Candidate<Traits> candidate : neighbour) {
      if (!candidate.succeeded()) continue;
      CUDNN_CACHE_CHECK(cudnnSetConvolutionMathType(descriptors_.convolution.get(), candidate.math_type));
      std::size_t bytes = 0;
      if (Algorithms<Traits>::workspace_size(handle_, descriptors_, candidate.algorithm, &bytes) !=
          CUDNN_STATUS_SUCCESS) {
        continue;
      }
      candidate.workspace_bytes = bytes;
      kept.push_back(candidate);
    }
    return Ranking<Traits>::of(kept.begin(), kept.end());
  }

  // cuDNN's heuristic order for the key, as candidates (not ranked: the order is cuDNN's).
  std::vector<Candidate<Traits>> heuristics() {
    std::array<typename Traits::Perf, Traits::algorithm_count> perfs{};
    int returned = 0;
    CUDNN_CACHE_CHECK(
        Algorithms<Traits>::heuristics(handle_, descriptors_, Traits::algorithm_count, &returned, perfs.data()), key_);
    std::vector<Candidate<Traits>> candidates;
    for (int i = 0; i < returned; ++i) candidates.push_back(Candidate<Traits>::from_perf(perfs[i]));
    return candidates;
  }

 private:
  // Find needs one workspace big enough for the hungriest algorithm: ask for the most any algorithm wants (at
  // most `limit`) and halve until the allocator can give it (algorithms that need more then report an
  // allocation failure).
  std::pair<Workspace, std::size_t> search_workspace(const WorkspaceAllocator& allocate, std::uint64_t limit) {
    std::size_t bytes = 0;
    for (int algorithm = 0; algorithm < Traits::algorithm_count; ++algorithm) {
      std::size_t needed = 0;
      if (Algorithms<Traits>::workspace_size(handle_, descriptors_,
                                             static_cast<typename Traits::Algorithm>(algorithm),
                                             &needed) == CUDNN_STATUS_SUCCESS) {
        bytes = std::max(bytes, needed);
      }
    }
    bytes = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, limit));
    for (; bytes > 0; bytes /= 2) {
      if (auto workspace = allocate(bytes)) return {std::move(workspace), bytes};
    }
    return {Workspace(), 0};
  }

  cudnnHandle_t handle_;
  const ConvolutionKey& key_;
  ConvolutionDescriptors descriptors_;
};

// The graph API: a candidate is an engine config, run through the execution plan the plan cache keeps for it.
template <Direction D>
class GraphBackend {
 public:
  static constexpr const char* kind = "engine config";
  static constexpr Backend backend = Backend::graph;

  GraphBackend(cudnnHandle_t handle, int device, const ConvolutionKey& key, PlanCache& plans, PlanStore& stored)
      : handle_(handle), device_(device), key_(key), plans_(plans), stored_(stored) {}

  // search_engine_configs; the plan cache keeps a plan of the best config, made from the one the search built
  // (Note [The plan a search keeps]).
  Ranking<GraphTraits<D>> search(const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                 const GraphSearchOptions& options, const graph_internal::SearchBounds& bounds) {
    std::shared_ptr<const GraphPlan> best_plan;
    const std::vector<EngineCandidate> configs =
        search_engine_configs(handle_, key_, buffers, allocate, options, bounds, &best_plan);
    if (best_plan) plans_.adopt(handle_, device_, key_, configs.front(), std::move(best_plan), stored_);
    return Ranking<GraphTraits<D>>::of(configs.begin(), configs.end());
  }

  // The neighbour's configs but those cuDNN compiles at run time, which would compile again for this key on
  // the training path: what the nearest miss policy runs (Note [Nearest key]). Whether the others build for
  // this key shows when a call asks for their plan.
  Ranking<GraphTraits<D>> borrow(const Ranking<GraphTraits<D>>& neighbour) {
    std::vector<EngineCandidate> kept;
    for (const EngineCandidate& config : neighbour) {
      if ((config.behavior_notes & EngineCandidate::kRuntimeCompiled) == 0) kept.push_back(config);
    }
    return Ranking<GraphTraits<D>>::of(kept.begin(), kept.end());
  }

  // Native heuristics' own choice for the key, its plan kept in the plan cache: what an untuned miss runs (Note
  // [Native heuristics' choice] in runtime.h). Empty when no config of heuristics' list builds for it.
  Ranking<GraphTraits<D>> native_choice(bool deterministic, bool compile, std::uint64_t max_workspace_bytes) {
    const auto started = std::chrono::steady_clock::now();
    std::optional<HeuristicChoice> choice = heuristic_choice(handle_, key_, deterministic, compile, max_workspace_bytes);
    if (!choice) return {};
    plans_.keep(device_, key_, choice->config, std::move(choice->plan), microseconds_since(started));
    return Ranking<GraphTraits<D>>::of({choice->config});
  }

  // The config's plan, from the plan cache (made on first use), or cuDNN's refusal to build one.
  using Ready = PlanCache::Shared;
  Ready ready(const EngineCandidate& config, bool best) {
    return plans_.get(handle_, device_, key_, config, stored_, best);
  }
  static const std::string* refusal(const Ready& ready) { return ready->plan ? nullptr : &ready->refusal; }

  std::string run(const Ready& ready, const EngineCandidate& config, const ConvolutionBuffers& buffers,
                  const WorkspaceAllocator& allocate) {
    ready->use();  // a run from a thread's memo is a use too (Note [Plan cache])
    const GraphPlan& plan = *ready->plan;
    std::optional<Workspace> workspace = workspace_for(allocate, plan.workspace_bytes());
    if (!workspace) return out_of_memory(to_string(config), plan.workspace_bytes());
    try {
      plan.execute(handle_, buffers, workspace->data());
    } catch (const Error& e) {
      return detail::concat(to_string(config), ": ", e.what());
    }
    return {};
  }

 private:
  cudnnHandle_t handle_;
  int device_;
  const ConvolutionKey& key_;
  PlanCache& plans_;
  PlanStore& stored_;
};

// The backend of a cache's traits.
template <typename Traits>
struct BackendOf {
  using type = LegacyBackend<Traits>;
};
template <Direction D>
struct BackendOf<GraphTraits<D>> {
  using type = GraphBackend<D>;
};

// The backend of Traits for one call of `key`.
template <typename Traits>
typename BackendOf<Traits>::type backend_for(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                                             PlanCache& plans, DirectionCaches& caches) {
  if constexpr (is_graph<Traits>) {
    return {handle, device, key, plans, caches.plans};
  } else {
    return {handle, key};
  }
}

}  // namespace cudnn_cache
