#pragma once

// The cuDNN graph-API backend: engine configs found by timing every candidate cudnn-frontend offers for a
// convolution key, and execution plans rebuilt from a stored config without heuristics.
//
// Note [Engine configs]
// ~~~~~~~~~~~~~~~~~~~~~
// Native PyTorch runs convolutions through the graph API (Conv_v8.cpp), whose engines the legacy algorithm
// list does not all reach, so the graph API is searched directly. A candidate is an engine config: cuDNN's
// global engine index plus its knob choices. That pair rebuilds the same execution plan in another process
// (Graph::create_execution_plan), and it only means something for the cuDNN release and GPU it was found on,
// which is why rankings live under an Origin.
//
// A config is stored as the knob types cudnn-frontend names. Older engines, such as the TF32 NHWC implicit
// GEMMs PyTorch runs for ResNet-50's fp32 7x7 stem, also carry knobs of types cuDNN has deprecated (LDGA, LDGC,
// KBLOCK, USE_TEX, ...), which cudnn-frontend can neither report nor set, so no engine-and-knobs pair makes
// that plan again: made from its nameable knobs, cuDNN chooses the rest, and the plan is another, slower one
// (ResNet-50's stem backward-filter: 0.418 against native's 0.283 ms). Such a config of heuristics' list is
// stored by its position in the list as well (EngineCandidate::heuristic_index) and made again from the list:
// heuristics are deterministic for a key, cuDNN release and GPU, which an entry's Origin pins, and the engine
// and nameable knobs are checked to be the same before the plan is used. So the search times, and a replay
// runs, the very plan native runs.
//
// Candidates, in the order they are timed (the search's bounds, Note [Search bounds] in
// extension/src/search_bounds.h, bound each step):
//   1. heuristics mode A, then the fallback list, after the filters PyTorch applies too: no down-converting
//      inputs; no TF32 tensor cores for float when the key's math type is FMA (allow_tf32 off); deterministic
//      engines only when asked. The lists overlap, so each plan name is timed once. The first
//      `max_candidates` that build are timed: building a plan costs milliseconds (50-200 ms for an engine
//      cuDNN compiles at run time), so building all of them made tuning slower than PyTorch's benchmark mode,
//      which stops at cudnn.benchmark_limit (10) as well. The runtime-compiled ones are built ahead on
//      `build_threads` threads while the calling thread times those built (Note [Parallel candidate builds],
//      graph_search.cpp); and,
//      unless those included it, the first deterministic config of the lists that builds, native's pick when
//      deterministic (Note [Deterministic calls] in runtime.h). Each config keeps its engine's numerical notes;
//   2. heuristics mode B's first `mode_b_candidates` picks: a second opinion, at more CPU time per query;
//   3. the best config so far with one knob moved to a neighbouring value (each knob's range and step come
//      from cuDNN; nearest values first, `knob_variants` of them). Heuristics give each engine one knob
//      setting; this bounded local search finds the tile or split a shape prefers. Runtime-compiled engines
//      are skipped: every variant would be another compilation;
//   4. the fastest `finalists` so far and native's two picks (heuristics' first, which benchmark=False runs,
//      and the fastest of step 1's first ten, standing for benchmark mode's) with that pick's near-ties among
//      the ten (configs benchmark mode might have run as well), timed again together in `repetitions`
//      interleaved rounds, and their medians replace the first ones.
//      Many configs lie within a few per cent of each other, and the fastest of a dozen medians taken one
//      after another is the luckiest as often as the best: a paired second measurement removes that bias,
//      the way audit_engine_choice measures. A challenger ranks before the faster of native's picks only where
//      the rounds show it faster (Note [Never slower than native's pick], paired_timing.h); the rest go behind it.
//
// Each candidate is timed the way training runs it: its workspace allocated first, `warmup` untimed runs, then the
// median of `repetitions` runs timed with CUDA events on the handle's stream, each after writing twice the L2 cache's
// size (flush_l2) and from an idle stream, the host's part of the call with the GPU's, as native benchmark mode times
// (Note [Timing the whole call] in graph_internal.h). In a network a layer's operands come from other layers and rarely
// sit in L2; back-to-back runs on the same buffers keep them there, and favour configs that lose inside the network
// (the models benchmark's audit shows it). A candidate whose first 3 runs are all slower than give_up_ratio x the best
// median so far stops there: it cannot win, and slow candidates are where tuning time goes.
//
// PyTorch's benchmark mode times one run per candidate from an idle stream, with no warm-up beyond one and
// operands in L2, so a single lucky or unlucky sample decides. audit_engine_choice measures a stored choice
// against the configs both native modes would pick, the same way for all three, interleaved in rounds.
//
// Tensors are described as kGraphAlignment (32) bytes aligned, the most PyTorch ever declares (getAlignment in
// Conv_v8.cpp) and what memory from its caching allocator always is. cuDNN's heuristics read the alignment: with
// cudnn-frontend's default of 16 they leave out engines that need 32, such as the TF32 NHWC kernel PyTorch runs for
// ResNet-50's 7x7 fp32 stem (`python3 -m benchmarks compare-kernels`). GraphPlan::execute refuses buffers that are less
// aligned, so the caller copies them (torch_ops) or falls back to the legacy path.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cudnn_cache/algorithms.h"
#include "cudnn_cache/key.h"
#include "cudnn_cache/vocabulary.h"

namespace cudnn_cache::graph_internal {
class Graph;          // cudnn-frontend's graph (graph_internal.h)
struct SearchBounds;  // the search's constants (Note [Search bounds] in search_bounds.h)
}

namespace cudnn_cache {

// The alignment, in bytes, that the graph API's tensors are described with and its buffers must have.
inline constexpr std::size_t kGraphAlignment = 32;

// Times the engine configs cuDNN offers for the key on the buffers, within the search's bounds (Note [Search
// bounds]), and returns them ranked (Note [Selection, merge and fallback policy]). The direction's output buffer
// is overwritten. Throws Error if cuDNN cannot express the problem as a graph or no config runs.
// With `best_plan`, also hands back the plan the search built for the best config, so that an engine cuDNN
// compiles at run time need not be compiled again (PlanCache::adopt restores its serialized bytes).
class GraphPlan;
std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t handle, const ConvolutionKey& key,
                                                const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                                const GraphSearchOptions& options = {},
                                                std::shared_ptr<const GraphPlan>* best_plan = nullptr);
// The same within other bounds: for the runtime, where tests shorten its searches, and for tests
// (search_bounds.h, which graph_internal.h includes, declares the bounds).
std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t handle, const ConvolutionKey& key,
                                                const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                                const GraphSearchOptions& options,
                                                const graph_internal::SearchBounds& bounds,
                                                std::shared_ptr<const GraphPlan>* best_plan = nullptr);

// Native heuristics' own choice for a key and its plan (Note [Native heuristics' choice] in runtime.h).
struct HeuristicChoice {
  EngineCandidate config;                 // as heuristics list it, with its workspace and notes; untimed
  std::shared_ptr<const GraphPlan> plan;  // built
};

// What PyTorch runs for the key with cudnn.benchmark off (Conv_v8.cpp): the first config of heuristics mode A,
// then the fallback list, after the filters of Note [Engine configs] (and cuDNN's nondeterministic engines left
// out when `deterministic`), that builds within `max_workspace_bytes`; engines cuDNN compiles at run time only
// with `compile`. Nullopt when none does, or cuDNN cannot express the key as a graph.
std::optional<HeuristicChoice> heuristic_choice(cudnnHandle_t handle, const ConvolutionKey& key, bool deterministic,
                                                bool compile, std::uint64_t max_workspace_bytes);

// The execution plan of one engine config for one key.
class GraphPlan {
 public:
  // Builds the plan: from the engine and knobs, or, for a config stored by its position in heuristics' list,
  // from that list, which it asks cuDNN's heuristics for (heuristics_us()). Throws Error (status
  // CUDNN_STATUS_NOT_SUPPORTED when cuDNN refuses the config, e.g. one stored by another cuDNN release).
  GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config);

  // Restores a plan serialize() wrote, without building anything (Note [Stored plans]). Throws Error if cuDNN
  // rejects the bytes (another cuDNN or GPU, or bytes that are not a plan).
  GraphPlan(cudnnHandle_t handle, const ConvolutionKey& key, const std::vector<std::uint8_t>& serialized);

  // The plan as bytes, for GraphPlan(handle, key, serialized) in another process. Throws Error if cuDNN cannot
  // serialize it.
  std::vector<std::uint8_t> serialize() const;

  std::uint64_t workspace_bytes() const { return workspace_bytes_; }

  // How long building it waited for heuristics' list (a config stored by its position), microseconds; 0 for
  // any other plan. The debug log reports it with each plan built.
  std::uint64_t heuristics_us() const { return heuristics_us_; }

  // Runs the plan; the workspace must hold workspace_bytes(). Throws Error if a buffer is not kGraphAlignment-byte aligned
  // or cuDNN fails.
  void execute(cudnnHandle_t handle, const ConvolutionBuffers& buffers, void* workspace) const;

 private:
  friend std::optional<HeuristicChoice> heuristic_choice(cudnnHandle_t, const ConvolutionKey&, bool, bool,
                                                         std::uint64_t);
  friend std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t, const ConvolutionKey&,
                                                         const ConvolutionBuffers&, const WorkspaceAllocator&,
                                                         const GraphSearchOptions&,
                                                         const graph_internal::SearchBounds&,
                                                         std::shared_ptr<const GraphPlan>*);
  GraphPlan(Direction direction, std::shared_ptr<graph_internal::Graph> graph, std::uint64_t workspace_bytes)
      : direction_(direction), graph_(std::move(graph)), workspace_bytes_(workspace_bytes) {}

  Direction direction_;
  std::shared_ptr<graph_internal::Graph> graph_;
  std::uint64_t workspace_bytes_ = 0;
  std::uint64_t heuristics_us_ = 0;
};

// What audit_engine_choice measured: a stored config against the configs PyTorch's two modes would run.
struct ChoiceAudit {
  struct Choice {
    EngineCandidate config;  // its time_ms is the audit's
    float time_ms = 0.0f;     // the median of round_ms
    std::vector<float> round_ms;  // its time in each round, in the order of the rounds
  };
  Choice stored;     // the cache's choice
  Choice heuristic;  // native cudnn.benchmark=False: the first config in heuristic order that runs
  Choice benchmark;  // native cudnn.benchmark=True: the fastest of benchmark_limit configs timed once each
  // The stored config timed a second time, as a contender of its own: how far apart the audit measures one
  // config and itself, i.e. its resolution for this key. A native pick that is the stored config shares the
  // stored one's time instead: the same config is the same kernel.
  float stored_again_ms = 0.0f;
};

// Finds the configs PyTorch's two modes would pick for the key (PyTorch's own lists, filters and single
// timing), then times them and `stored` (twice) the same way, interleaved in as many rounds as a search's timed
// runs (Note [Search bounds]), each run after an L2 flush, and keeps each one's median (Note [Engine configs]). The
// direction's output buffer is overwritten. Throws Error if the stored config does not build or nothing runs.
ChoiceAudit audit_engine_choice(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                                const WorkspaceAllocator& allocate, const EngineCandidate& stored,
                                const GraphSearchOptions& options = {});

// What settle_engine_choice did for a key: the audit it took, and the key's configs with their settled times.
struct SettledChoice {
  ChoiceAudit audit;
  std::vector<EngineCandidate> configs;  // rank them again (Ranking::of): the first is the key's choice now
};

// Decides a key's choice again in steady state (Note [Settling in steady state] in paired_timing.h): audits
// `ranked`'s first config (a key's ranking, best first) with 3 x a search's rounds per pass, as many as a
// search's rounds take where they cannot decide, and lets a native pick take its place only where those rounds
// show that pick faster. The direction's output buffer is overwritten. Throws Error as audit_engine_choice does.
SettledChoice settle_engine_choice(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                                   const WorkspaceAllocator& allocate, const std::vector<EngineCandidate>& ranked,
                                   const GraphSearchOptions& options = {});

// Checks, without a GPU, that cudnn-frontend accepts the key as a graph. Returns "" or what it rejected.
std::string check_graph(const ConvolutionKey& key);

}  // namespace cudnn_cache
