// search_engine_configs: Note [Engine configs] in cudnn_cache/graph.h.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cudnn_cache/cudnn.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/graph.h"
#include "elapsed.h"
#include "graph_internal.h"
#include "handle_pool.h"
#include "paired_timing.h"
#include "search_bounds.h"

namespace cudnn_cache {
namespace {

using namespace graph_internal;

// Note [Parallel candidate builds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Building a plan is CPU work: about a millisecond for most engines, an NVRTC compilation of 50-250 ms for those
// cuDNN compiles at run time (depthwise and inverted-bottleneck networks' keys are full of them). Timing is GPU
// work and stays on the calling thread, one candidate at a time. So step 1's runtime-compiled candidates
// (heuristics mode A and the fallback list are the bulk of a search) are built ahead: `build_threads - 1` workers,
// each on a cuDNN handle of the HandlePool, claim them in cuDNN's order and build them while the calling thread
// times what is built, in that same order. The first candidate, heuristics' first and native's pick, the calling
// thread builds at once, even where cuDNN compiles it (each depthwise forward key of a bf16 channels-last
// MobileNetV2 on the H200: 400-440 ms, then 50-170 ms to time nine precompiled candidates): compiled on a worker
// thread while the calling thread timed the others, it took 450-700 ms, which lost more than the overlap saved
// (2026-12-04). The calling thread builds every other candidate, and any compiled one no worker has
// claimed yet, itself: with no worker, or no compiled candidate after the first, the search is the serial one,
// and otherwise it waits only for builds already under way. Workers build only what step 1 will take: a
// position below its reach, the position after the calling thread's last one plus the candidates it still needs
// (a candidate that does not build or run moves the reach one further). Past it lie candidates that step 1
// takes only if some before them fail; a worker that started one anyway compiled for nothing, and the search
// waited for it at its end (on the H200, 60 of a cold MobileNetV2's 90 searches, whose first ten candidates are
// precompiled, each waited 350-540 ms for a compilation past them: 25 s of a 48 s first step). Once enough
// candidates are timed the workers stop after the build they are in, while steps 2-4 time.
//
// cuDNN's runtime compilations serialize inside one process (12 depthwise keys on an H200: 0.84x the serial
// time on worker threads, 0.36x in 4 processes). Processes are the parallelism offered at the top, where the keys
// are known ahead and no training step runs beside the searches: `python -m cudnn_cache tune FILE --jobs N`
// tunes a file's pending keys in N worker processes (Note [Tuning in worker processes] in
// torch_ops/cudnn_cache/_tune_jobs.py).
//
// Precompiled engines stay on the calling thread because a worker's build costs more than its own: a worker
// builds each candidate in a graph of its own, made for it as the calling thread's was (heuristic_graph: the
// same query, the same filters, a millisecond or two) and handed over with the plan, so no graph is ever used by
// two threads (a build writes its graph's plan list). Measured on the H200 with every candidate farmed out, a
// search of 8 precompiled configs took 26 ms against 10.8 ms serially. What is timed does not change: where a
// worker's graph has another plan at that position (cuDNN's heuristics are deterministic; this is a safeguard),
// or it could not make one, the calling thread builds the candidate in its own graph. Plans built on pool
// handles run on the caller's, as prepare()'s do. Mode B's picks (queried on the calling thread in step 2), knob
// variants and substitutes are few and are built on the calling thread.

// A plan of some graph of the search: the graph and the plan's index in it.
struct BuiltPlan {
  BuiltPlan() = default;
  BuiltPlan(std::shared_ptr<Graph> built_in, std::int64_t at) : graph(std::move(built_in)), index(at) {}

  std::shared_ptr<Graph> graph;
  std::int64_t index = -1;
};

// The plan at `index` of a heuristic_graph of its own, built (its index is -1 where it does not build); no graph
// where the plan at that index is not named `name`, or the graph cannot be made. What a worker builds.
BuiltPlan build_listed(cudnnHandle_t handle, const ConvolutionKey& key, bool deterministic, std::int64_t index,
                       const std::string& name) {
  std::shared_ptr<Graph> graph;
  try {
    graph = heuristic_graph(handle, key, deterministic);
  } catch (const std::exception&) {
    return {};
  }
  std::string listed;
  if (graph->get_plan_name_at_index(index, listed).is_bad() || listed != name) return {};
  const std::int64_t built = build_at(*graph, index);
  return {std::move(graph), built};
}

// Step 1's candidates: plans of the calling thread's graph, each name once, in cuDNN's order, and whether
// cuDNN compiles each at run time.
struct HeuristicPlans {
  std::vector<std::int64_t> indices;
  std::vector<std::string> names;
  std::vector<bool> compiled;
};

// The plans of step 1 in a heuristic_graph: what a search times first.
HeuristicPlans heuristic_plans(Graph& graph) {
  HeuristicPlans plans;
  std::set<std::string> seen;
  for (std::int64_t index = 0; index < graph.get_execution_plan_count(); ++index) {
    std::string name;
    if (graph.get_plan_name_at_index(index, name).is_bad() || !seen.insert(name).second) continue;
    plans.indices.push_back(index);
    plans.names.push_back(std::move(name));
    plans.compiled.push_back(runtime_compiled_at(graph, index).value_or(false));
  }
  return plans;
}

// Builds step 1's runtime-compiled candidates ahead of the timing (Note [Parallel candidate builds]), in the
// order the calling thread takes the candidates with take().
class AheadBuilder {
 public:
  // At most `workers` worker threads. Step 1 times `needed` candidates: its first reach.
  AheadBuilder(std::shared_ptr<Graph> graph, const ConvolutionKey& key, bool deterministic,
               const HeuristicPlans& plans, std::size_t needed, int workers)
      : graph_(std::move(graph)), key_(key), deterministic_(deterministic), plans_(plans),
        claimed_(new std::atomic<bool>[plans.indices.size()]()), reach_(std::min(needed, size())),
        slots_(plans.indices.size()), used_(plans.indices.size()) {
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) return;
    // The calling thread builds the first candidate at once: a worker helps with the compiled ones after it
    // within the reach.
    std::int64_t ahead = 0;
    for (std::size_t position = 1; position < reach_; ++position) ahead += plans.compiled[position];
    workers = std::min<int>(workers, static_cast<int>(ahead));
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this, device] { work(device); });
  }

  ~AheadBuilder() { finish(); }

  AheadBuilder(const AheadBuilder&) = delete;
  AheadBuilder& operator=(const AheadBuilder&) = delete;

  std::size_t size() const { return plans_.indices.size(); }

  // The plan at `position`, built; its index is -1 where it does not build. Built by a worker, or now in the
  // calling thread's graph where no worker claimed it or a worker could not make it. Positions are taken in
  // order, each once, on the calling thread.
  BuiltPlan take(std::size_t position) {
    const auto started = std::chrono::steady_clock::now();
    used_[position] = true;
    if (!claim(position)) {
      std::unique_lock lock(mutex_);
      built_.wait(lock, [&] { return slots_[position].done; });
      taken_.waiting_us += microseconds_since(started);
      if (slots_[position].plan.graph) {
        ++taken_.by_workers;
        return std::move(slots_[position].plan);
      }
    }
    const auto building = std::chrono::steady_clock::now();
    BuiltPlan plan{graph_, build_at(*graph_, plans_.indices[position])};
    ++(plans_.compiled[position] ? taken_.compiled_here : taken_.precompiled_here);
    taken_.building_us += microseconds_since(building);
    return plan;
  }

  // Step 1 takes positions up to `reach` (exclusive) at least: workers may build them. It only grows.
  void extend(std::size_t reach) {
    {
      std::lock_guard lock(mutex_);
      if (reach <= reach_) return;
      reach_ = std::min(reach, size());
    }
    reached_.notify_all();
  }

  // Where the candidates take() returned came from, what the calling thread spent on them, and what workers
  // built that it never took: what the debug log's search profile reports (SearchProfile). Complete after
  // finish().
  struct Taken {
    int by_workers = 0, compiled_here = 0, precompiled_here = 0, built_unused = 0;
    std::uint64_t waiting_us = 0, building_us = 0;
  };
  const Taken& taken() const { return taken_; }

  // No more claims; workers finish the build they are in.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    reached_.notify_all();
  }

  // Stops the workers and waits for them; counts what they built that was not taken.
  void finish() {
    stop();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
    taken_.built_unused = 0;
    for (std::size_t position = 0; position < size(); ++position) {
      if (slots_[position].done && slots_[position].plan.index >= 0 && !used_[position]) ++taken_.built_unused;
    }
  }

 private:
  struct Slot {
    bool done = false;
    BuiltPlan plan;  // no graph: the worker could not make one
  };

  bool claim(std::size_t position) {
    bool expected = false;
    return claimed_[position].compare_exchange_strong(expected, true);
  }

  // Workers claim runtime-compiled candidates only, in order; each is built in a graph made for it and handed
  // over with it: a graph is never used by two threads at once (a build writes its graph's plan list).
  void work(int device) {
    std::optional<HandlePool::Lease> lease;
    try {
      lease.emplace(device);
    } catch (const std::exception&) {
      return;  // claims nothing: the calling thread builds
    }
    for (;;) {
      std::size_t position = 0;
      {
        std::unique_lock lock(mutex_);
        reached_.wait(lock, [&] { return stopped_ || cursor_ >= size() || cursor_ < reach_; });
        if (stopped_ || cursor_ >= size()) break;
        position = cursor_++;
      }
      if (!plans_.compiled[position] || !claim(position)) continue;
      BuiltPlan plan = build_listed(lease->get(), key_, deterministic_, plans_.indices[position],
                                    plans_.names[position]);
      std::lock_guard lock(mutex_);
      slots_[position] = {true, std::move(plan)};
      built_.notify_all();
    }
  }

  std::shared_ptr<Graph> graph_;
  const ConvolutionKey& key_;
  bool deterministic_;
  const HeuristicPlans& plans_;
  std::unique_ptr<std::atomic<bool>[]> claimed_;  // per position: taken by a worker or the calling thread
  std::mutex mutex_;
  bool stopped_ = false;    // guarded by mutex_
  std::size_t cursor_ = 0;  // guarded by mutex_: the next position a worker looks at
  std::size_t reach_;       // guarded by mutex_: workers claim positions below it (extend)
  std::condition_variable reached_;  // reach_ grew, or stopped_ was set
  std::condition_variable built_;
  std::vector<Slot> slots_;  // guarded by mutex_
  std::vector<bool> used_;   // the calling thread's: the positions it took
  std::vector<std::thread> threads_;
  Taken taken_;  // the calling thread's
};

// Where one search's time went, logged at debug level after it (CUDNN_CACHE_LOG=debug), so that a cold start can
// be profiled per key and per step: the step times are the calling thread's wall time, step 1's split into
// waiting for workers' builds and building here (the rest of it is timing), and what workers built that step 1
// never took (Note [Parallel candidate builds]).
class SearchProfile {
 public:
  explicit SearchProfile(const LogSink& log) : log_(log) {}

  // Ends the current step, named `step`: its time is since the previous lap (or the profile's start).
  void lap(const char* step) {
    if (!log_) return;
    const auto now = std::chrono::steady_clock::now();
    steps_ += detail::concat(steps_.empty() ? "" : ", ", step, " ", milliseconds(now - last_));
    last_ = now;
  }

  void log(const ConvolutionKey& key, const HeuristicPlans& plans, const AheadBuilder::Taken& taken,
           std::size_t timed) const {
    if (!log_) return;
    log_(detail::concat("search profile: ", steps_, " ms; step 1's list held ", plans.indices.size(), " plans, ",
                        std::count(plans.compiled.begin(), plans.compiled.end(), true), " runtime-compiled; it took ",
                        taken.by_workers, " plans from workers (", taken.waiting_us / 1000, " ms waiting), built ",
                        taken.compiled_here, " compiled and ", taken.precompiled_here, " precompiled here (",
                        taken.building_us / 1000, " ms); ", taken.built_unused, " built ahead and not taken; ", timed,
                        " configs timed; for ", key));
  }

 private:
  static std::int64_t milliseconds(std::chrono::steady_clock::duration elapsed) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
  }

  const LogSink& log_;  // the search's options', which outlive it; empty: no debug log
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::string steps_;
};

// Note [Exhaustive search]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The default search stops where native benchmark mode does (the first 10 heuristic configs that build) and
// adds a little (mode B's first 3 picks, 4 knob variants), because its cost is paid in a training process. An
// offline warm start (scripts/warm_start.py --exhaustive, tuning option exhaustive=True) pays it once for every
// later process, so it times everything cuDNN offers: every config of heuristics mode A, the fallback list and
// mode B, the best one's knob variants up to 4 steps away (at most 32; runtime-compiled engines too), and at
// least 5 finalists against native's pick. That is where a stored choice can beat both native modes. The
// ranking keeps the fastest kMaxEngineConfigs, native's pick always among them (only the challengers shown
// faster in the paired rounds, at most the finalists, rank before it).

// How many candidates each step of a search times.
struct Bounds {
  int heuristic, mode_b, knob_variants, knob_distance, finalists;
};

Bounds bounds_of(const GraphSearchOptions& options, const SearchBounds& bounds) {
  constexpr int kAll = std::numeric_limits<int>::max();
  if (options.exhaustive) return {kAll, kAll, 32, 4, std::max(bounds.finalists, 5)};
  return {bounds.max_candidates, bounds.mode_b_candidates, bounds.knob_variants, 2, bounds.finalists};
}

// A search's state: the graph whose plans are timed, and what has been timed so far.
class EngineSearch {
 public:
  EngineSearch(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
               const WorkspaceAllocator& allocate, const GraphSearchOptions& options, const SearchBounds& bounds)
      : handle_(handle),
        key_(key),
        allocate_(allocate),
        options_(options),
        bounds_(bounds),
        graph_(heuristic_graph(handle, key, options.deterministic)),
        listed_(graph_->get_execution_plan_count()),
        pack_(variant_pack(buffers)),
        flush_(allocate, bounds.flush_l2) {}

  Graph& graph() { return *graph_; }

  // Builds and times the plan at `index` of the search's graph unless a plan of that name was timed already;
  // returns whether it was timed and ran.
  bool time(std::int64_t index) {
    std::string name;
    if (graph_->get_plan_name_at_index(index, name).is_bad() || !names_.insert(name).second) return false;
    if (graph_->build_plan_at_index(index).is_bad()) return false;  // not supported, or filtered out
    return time_built({graph_, index});
  }

  // Step 1: heuristics mode A, then the fallback list, in cuDNN's order, until `max_candidates` are timed;
  // each plan name once (the lists overlap). The plans are built by `builder` (Note [Parallel candidate
  // builds]), whose reach follows what is still needed, and which the caller stops afterwards.
  void time_heuristics(AheadBuilder& builder, const HeuristicPlans& plans, int max_candidates) {
    const auto needed = static_cast<std::size_t>(std::max(max_candidates, 0));
    for (std::size_t position = 0; position < builder.size() && timed() < needed; ++position) {
      const BuiltPlan plan = builder.take(position);
      // A substitute timed meanwhile may have had this name.
      if (plan.index >= 0 && names_.insert(plans.names[position]).second) time_built(plan);
      builder.extend(position + 1 + (needed - std::min(needed, timed())));
    }
    // Native benchmark=True times the first cudnn.benchmark_limit (bounds_.max_candidates, 10) of these and
    // runs the fastest: the first pass's fastest of them stands for its pick.
    const std::size_t native_ten = std::min<std::size_t>(timed(), static_cast<std::size_t>(
                                                                      std::max(bounds_.max_candidates, 1)));
    std::vector<float> first_pass(native_ten);
    for (std::size_t i = 0; i < native_ten; ++i) {
      first_pass[i] = configs_[i].time_ms;
      if (configs_[i].time_ms < configs_[benchmark_pick_].time_ms) benchmark_pick_ = i;
    }
    // It might as well have picked one of these (Note [Never slower than native's pick]).
    benchmark_near_ties_ = benchmark_near_ties(first_pass, kBenchmarkNearTie, kBenchmarkNearTies);
  }

  // Times native's deterministic pick, heuristics' first deterministic config that builds, unless it was tried
  // in step 1 (Note [Deterministic calls] in runtime.h), so that a deterministic call finds a deterministic
  // config at least as fast as native's in every ranking. Then notes native's two deterministic picks among the
  // configs timed so far: heuristics' first deterministic one (the first timed, as they are timed in heuristics'
  // order) and the fastest deterministic one, standing for benchmark mode's (Note [Never slower than native's
  // pick]).
  void time_deterministic_pick(const HeuristicPlans& plans) {
    for (std::size_t position = 0; position < plans.indices.size(); ++position) {
      if (!EngineCandidate::deterministic_notes(graph_->numerical_notes_at(plans.indices[position]))) continue;
      if (names_.count(plans.names[position]) != 0 || time(plans.indices[position])) break;
    }
    for (std::size_t i = 0; i < configs_.size(); ++i) {
      if (!configs_[i].deterministic()) continue;
      if (!deterministic_picks_) deterministic_picks_ = {i, i};
      if (configs_[i].time_ms < configs_[deterministic_picks_->second].time_ms) deterministic_picks_->second = i;
    }
  }

  // The plans of step 1 in the search's graph.
  HeuristicPlans heuristic_plans() const { return cudnn_cache::heuristic_plans(*graph_); }

  std::shared_ptr<Graph> shared_graph() const { return graph_; }

  // Times a built plan of any of the search's graphs (a worker's graph lists heuristics' plans as the search's
  // does). A plan of heuristics' list is described by its
  // position where its knobs cannot all be named, so what is timed is what a replay runs: native's own plan,
  // knobs and all.
  bool time_built(const BuiltPlan& plan) {
    std::optional<EngineCandidate> config = describe_plan(*plan.graph, plan.index, listed_);
    if (!config || config->workspace_bytes > options_.max_workspace_bytes) return false;
    const std::optional<Workspace> workspace = workspace_for(allocate_, config->workspace_bytes);
    if (!workspace) return false;  // out of memory: not a candidate here
    Timing timing{bounds_.warmup, bounds_.repetitions, &flush_};
    if (best_ms_ < std::numeric_limits<float>::infinity()) timing.give_up_ms = best_ms_ * bounds_.give_up_ratio;
    const std::vector<float> times = time_plan(*plan.graph, handle_, pack_, workspace->data(), plan.index, timing);
    if (times.empty()) return false;
    config->time_ms = median(times);
    best_ms_ = std::min(best_ms_, config->time_ms);
    configs_.push_back(*config);
    plans_.push_back(plan);
    return true;
  }

  // Times the fastest `count` configs, native's two picks (the first one timed, which benchmark=False runs, and
  // benchmark mode's) and benchmark mode's near-ties again, together: `repetitions` interleaved rounds, so drift in
  // clocks or temperature affects each alike, and as many again (up to three times in all) while a challenger is faster
  // in the median than the faster of native's picks but not yet shown faster. A config that wins the first pass by less
  // than the noise of one measurement won it by luck as often as not; the paired rounds decide, and a challenger leads
  // native's picks only where they show it faster (Note [Never slower than native's pick]). Without memory for the
  // largest workspace, or if a finalist fails to run now, the first timings stand.
  void confirm(int count) {
    const std::vector<std::size_t> ranked = order();
    std::vector<std::size_t> finalists = ranked;
    finalists.resize(std::min<std::size_t>(finalists.size(), static_cast<std::size_t>(std::max(count, 0))));
    std::vector<std::size_t> joining{0, benchmark_pick_};  // native's picks, then challengers
    const bool deterministic = deterministic_picks_ && options_.rank_deterministic;
    if (deterministic) {  // and the fastest deterministic config, their challenger
      joining.insert(joining.end(), {deterministic_picks_->first, deterministic_picks_->second});
      joining.push_back(*std::find_if(ranked.begin(), ranked.end(),
                                      [&](std::size_t i) { return configs_[i].deterministic(); }));
    }
    joining.insert(joining.end(), benchmark_near_ties_.begin(), benchmark_near_ties_.end());
    for (std::size_t config : joining) {
      if (!finalists.empty() && std::find(finalists.begin(), finalists.end(), config) == finalists.end()) {
        finalists.push_back(config);
      }
    }
    if (finalists.size() < 2) return;
    std::uint64_t bytes = 0;
    for (std::size_t i : finalists) bytes = std::max(bytes, configs_[i].workspace_bytes);
    const std::optional<Workspace> workspace = workspace_for(allocate_, bytes);
    if (!workspace) return;
    const auto position = [&](std::size_t config) {
      return static_cast<std::size_t>(std::find(finalists.begin(), finalists.end(), config) - finalists.begin());
    };
    const std::size_t heuristic = position(0), benchmark = position(benchmark_pick_);
    const int per_pass = std::max(bounds_.repetitions, 1);
    std::vector<std::vector<float>> times(finalists.size());
    for (int round = 0; round < 3 * per_pass; ++round) {
      if (round > 0 && round % per_pass == 0 &&
          !challenger_undecided(times, native_reference(times, heuristic, benchmark))) {
        break;
      }
      for (const std::size_t f : round_order(round, finalists.size())) {  // Note [Paired rounds in a fresh order]
        const BuiltPlan& plan = plans_[finalists[f]];
        const std::vector<float> run = time_plan(*plan.graph, handle_, pack_, workspace->data(), plan.index,
                                                 round_timing(round, bounds_.warmup, flush_));
        if (run.empty()) return;  // it ran before; if it fails now, keep what was measured then
        times[f].push_back(run.front());
      }
    }
    const std::size_t reference = native_reference(times, heuristic, benchmark);
    if (options_.debug_log) {
      std::vector<EngineCandidate> timed;
      for (std::size_t i : finalists) timed.push_back(configs_[i]);
      options_.debug_log(detail::concat("search rounds: ",
                                        describe_rounds(timed, times, heuristic, benchmark, reference), "; for ", key_));
    }
    settle_against_native(configs_, finalists[reference], finalists, times);
    if (deterministic) {
      settle_deterministic(configs_,
                           native_reference(times, position(deterministic_picks_->first),
                                            position(deterministic_picks_->second)),
                           finalists, times);
    }
  }

  // The timed configs, fastest first (Note [Selection, merge and fallback policy]), and the plan of each.
  std::pair<std::vector<EngineCandidate>, std::vector<BuiltPlan>> ranked() const {
    std::pair<std::vector<EngineCandidate>, std::vector<BuiltPlan>> result;
    for (std::size_t i : order()) {
      result.first.push_back(configs_[i]);
      result.second.push_back(plans_[i]);
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
  const ConvolutionKey& key_;
  const WorkspaceAllocator& allocate_;
  GraphSearchOptions options_;
  SearchBounds bounds_;
  std::shared_ptr<Graph> graph_;
  std::int64_t listed_;  // graph_'s first plans, heuristics' list; later ones are appended
  VariantPack pack_;
  L2Flush flush_;
  std::set<std::string> names_;  // of the plans timed: the heuristic lists overlap
  std::vector<EngineCandidate> configs_;
  std::vector<BuiltPlan> plans_;  // of configs_
  std::size_t benchmark_pick_ = 0;  // in configs_: native benchmark mode's pick (time_heuristics)
  std::vector<std::size_t> benchmark_near_ties_;  // in configs_: the configs it might have picked as well
  // In configs_: native's deterministic picks, heuristics' and benchmark mode's (time_deterministic_pick); none
  // when no deterministic config was timed.
  std::optional<std::pair<std::size_t, std::size_t>> deterministic_picks_;
  float best_ms_ = std::numeric_limits<float>::infinity();
};

}  // namespace

std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t handle, const ConvolutionKey& key,
                                                const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                                const GraphSearchOptions& options,
                                                std::shared_ptr<const GraphPlan>* best_plan) {
  return search_engine_configs(handle, key, buffers, allocate, options, SearchBounds{}, best_plan);
}

std::vector<EngineCandidate> search_engine_configs(cudnnHandle_t handle, const ConvolutionKey& key,
                                                const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                                const GraphSearchOptions& options,
                                                const SearchBounds& search_bounds,
                                                std::shared_ptr<const GraphPlan>* best_plan) {
  CUDNN_CACHE_REQUIRE(aligned(buffers),
                      "cuDNN graph API: buffers must be ", kGraphAlignment, "-byte aligned for ", key);
  SearchProfile profile(options.debug_log);
  const Bounds bounds = bounds_of(options, search_bounds);
  EngineSearch search(handle, key, buffers, allocate, options, search_bounds);
  Graph& graph = search.graph();
  // 1. Heuristics mode A, then the fallback list, in cuDNN's order, up to max_candidates that run (Note [Search
  //    bounds]), built on build_threads threads (Note [Parallel candidate builds]); the workers finish while
  //    steps 2-4 time.
  const HeuristicPlans plans = search.heuristic_plans();
  const int threads = options.build_threads > 0 ? options.build_threads : usable_cores();
  AheadBuilder builder(search.shared_graph(), key, options.deterministic, plans,
                       static_cast<std::size_t>(std::max(bounds.heuristic, 0)),
                       std::min(threads - 1, bounds.heuristic - 1));
  profile.lap("heuristics' list");
  search.time_heuristics(builder, plans, bounds.heuristic);
  builder.stop();
  profile.lap("step 1");
  search.time_deterministic_pick(plans);
  // 2. Mode B's first picks, where they are not among those, queried here.
  for (const EngineCandidate& config : mode_b_configs(handle, key, bounds.mode_b)) {
    const std::int64_t index = add_plan(graph, config);
    if (index >= 0) search.time(index);
  }
  profile.lap("deterministic pick and mode B");
  CUDNN_CACHE_REQUIRE(search.timed() > 0, "cuDNN graph API: no engine config runs ", key,
                      within_workspace_limit(options.max_workspace_bytes));
  // 3. The best so far with one knob moved to a neighbouring value, unless cuDNN compiles it at run time
  //    (each variant would be another compilation of 50-200 ms) and the search is not exhaustive.
  const EngineCandidate best = search.ranked().first.front();
  const bool compiled = (best.behavior_notes & EngineCandidate::kRuntimeCompiled) != 0;
  const int variants = compiled && !options.exhaustive ? 0 : bounds.knob_variants;
  for (const EngineCandidate& variant : knob_variants(graph, best, variants, bounds.knob_distance)) {
    const std::int64_t index = add_plan(graph, variant);
    if (index >= 0) search.time(index);
  }
  profile.lap("knob variants");
  // 4. The finalists, timed again side by side.
  search.confirm(bounds.finalists);
  profile.lap("confirm");
  builder.finish();
  profile.lap("workers' last builds");
  profile.log(key, plans, builder.taken(), search.timed());
  auto [ranked, built] = search.ranked();
  // Building a built plan again only selects it, for execute() and serialize().
  const BuiltPlan& best_built = built.front();
  if (best_plan && best_built.graph->build_plan_at_index(best_built.index).is_good()) {
    *best_plan = std::shared_ptr<const GraphPlan>(
        new GraphPlan(static_cast<Direction>(key.direction), best_built.graph, ranked.front().workspace_bytes));
  }
  return ranked;
}

}  // namespace cudnn_cache
