#pragma once

// The process-wide cache and the one operation built on it: run a convolution with its cached algorithm.
//
// Note [Running a cached convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// For a call, the runtime looks the key up in the caches of the call's device (its Origin: the GPU identity
// and this cuDNN's major.minor). On a hit it walks the ranking as Note [Selection, merge and fallback
// policy] says. On a miss the miss policy decides:
//   * tune: time every algorithm now on the call's own buffers (cudnnFind*AlgorithmEx), store the ranking,
//     then run the best;
//   * heuristic: run native heuristics' own choice (Note [Native heuristics' choice]); nothing is stored,
//     since nothing was measured;
//   * error: throw an Error that names the key, so CI can prove a cache file covers a model;
//   * record: run native heuristics' choice, like heuristic, and remember the key (with its origin and
//     backend) as a recorded miss, so that it can be tuned later, elsewhere or by another rank
//     (cudnn_cache.distributed.sync; Note [Sharing tuning between processes]). A key carries every size,
//     stride, data type and convolution parameter, so it is enough to re-create the tensors to time it on.
//   * nearest: run the choice stored for the nearest key of the same family (the same problem at another
//     batch or spatial size, Note [Nearest key]) if it runs for this key, else native heuristics' choice, and
//     remember the key as pending, like record. Nothing is timed: a borrowed engine config cuDNN compiles at
//     run time is passed over. What a key borrows is worked out on its first miss and kept (not saved;
//     PerfCache::kMaxLent keys at most) until the key is tuned (stats().lent counts the keys); a borrowed
//     candidate that does not build or run for the key passes to the next, and to native heuristics' choice,
//     without a fallback being counted, since nothing was cached for the key.
// A miss under the tune policy while the call's stream is capturing a CUDA graph is run as a record miss:
// timing would synchronise the stream and end the capture, so native heuristics' choice is captured (one that
// cuDNN compiles at run time is passed over: loading a module is not allowed during a capture), the key is
// recorded (stats().capture_misses counts it), and the next call of the key outside a capture tunes it. A
// captured graph keeps the heuristic choice it captured; capture again after that to replay the tuned one.
// Tuning explicitly (tune()) during a capture throws an Error.
// A call that cannot run its best cached candidate (out of memory for the workspace, NOT_SUPPORTED, ...)
// counts one fallback and warns once per process; if no cached candidate runs, cuDNN's legacy heuristics do (a
// heuristic candidate that cannot run passes over nothing cached, so it is no fallback). So
// does a miss whose key the cache holds for another origin only (a file tuned on another GPU, or with
// another cuDNN): such entries are never used, and the warning says why this process tunes anyway.
//
// Note [Native heuristics' choice]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A key nothing was tuned for (a miss under the heuristic, record or nearest policy, or under tune during a
// capture) runs what PyTorch runs with cudnn.benchmark off: through the graph API, the first config of
// heuristics mode A, then the fallback list, that builds (heuristic_choice, graph.h). On Hopper cuDNN's legacy
// algorithms do not reach the graph API's fastest engines (Note [Engine configs]), so running the legacy
// heuristics there made every call of an untuned key slower than native until the key was tuned
// (benchmarks/real_workloads.py measures the nearest policy against native heuristics). The choice
// and its plan are made once, on the key's first miss, and lent to the key like a nearest key's candidates
// (PerfCache::lent): later calls run that plan without asking the heuristics again, until the key is tuned.
// Only when no config of the list builds (or the graph API cannot express the key) do the legacy heuristics
// run, the last resort of every call.
//
// Both backends take this one path (Note [One run path]). The graph API's candidates are engine configs, each
// run through an execution plan built once per key and config and kept in the plan cache (Note [Plan
// cache]); a config cuDNN refuses to build (another release, NOT_SUPPORTED) is a fallback like any other.
// The last resort of both is the legacy heuristics.
//
// Note [Deterministic calls]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// With torch.use_deterministic_algorithms(True) or cudnn.deterministic, a call may run only what cuDNN reports
// deterministic: legacy algorithms carry cuDNN's determinism, and engine configs cuDNN's numerical notes of their
// engine (EngineCandidate::numerical_notes; NONDETERMINISTIC marks split reductions that accumulate with atomics). A
// deterministic call walks the same ranking as any other, passing over the rest, so it runs at the graph path's host
// cost (cuDNN 9's legacy calls cost about 4x the host time: `python3 -m benchmarks host-cost`). A search therefore
// always times native's deterministic pick too (heuristics' first deterministic config, what PyTorch runs when
// deterministic), so that a key tuned without determinism holds one. Where a graph ranking holds no config known to be
// deterministic (a file of format 4 or older, whose configs recorded no notes, or a nearest key's borrowed configs),
// the call takes the legacy path, lookup and miss policy included, as every deterministic call did before format 5; no
// fallback is counted, since nothing cached for it was passed over.
//
// Note [Workspace limit]
// ~~~~~~~~~~~~~~~~~~~~~~
// A user who must keep a convolution's scratch memory down (a model near the GPU's capacity, several processes
// sharing one GPU) sets a workspace limit (set_workspace_limit, CUDNN_CACHE_WORKSPACE_LIMIT). A ranking holds
// every candidate's workspace, so no re-tuning is needed: a call walks its ranking as always, passing over the
// candidates whose workspace is over the limit as it passes over non-deterministic ones for a deterministic
// call (no fallback is counted for them), and runs the fastest within it; cuDNN's heuristics, the last resort,
// are held to it too. Its allocator refuses more than the limit as well, so no call exceeds it even where a
// plan rebuilt from a stored config asks for more than the config recorded. A search times only configs within
// the limit (the L2 flush before each timed run is not workspace, and is not bounded), so a ranking tuned under
// a limit holds nothing over it; prepare() builds the plan of each key's first candidate within it.
//
// Which path a convolution takes is the runtime's backend: graph by default, since on Hopper only the graph
// API reaches the fastest engines (Note [Engine configs]); legacy on request, or where this cuDNN
// has no graph API for convolutions (before 8.9).

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cudnn_cache/algorithms.h"
#include "cudnn_cache/cache_store.h"
#include "cudnn_cache/vocabulary.h"

namespace cudnn_cache {

// What happens when a convolution's key is not in the cache; see Note [Running a cached convolution].
enum class MissPolicy { tune, heuristic, error, record, nearest };

// "tune", "heuristic", "error", "record" or "nearest".
const char* to_string(MissPolicy policy);
// The policy of that name; throws Error naming the valid names otherwise.
MissPolicy miss_policy_from_string(const std::string& name);

// The cuDNN API convolutions run through; see Note [Running a cached convolution].
enum class Backend { graph, legacy };

// "graph" or "legacy".
const char* to_string(Backend backend);
// The backend of that name; throws Error naming the valid names otherwise.
Backend backend_from_string(const std::string& name);
// Whether this process's cuDNN runs convolutions through the graph API (8.9 and later).
bool graph_backend_available();

// A key that missed under the record miss policy: what to tune, for which origin and through which backend.
struct RecordedMiss {
  Origin origin;
  Backend backend = Backend::graph;
  ConvolutionKey key;
};

// How much the runtime reports as it works: nothing; prepare() and other once-per-process events (info); or
// also every hit, miss, tune and plan built or restored (debug). The CUDNN_CACHE_LOG environment variable
// ("off", "info" or "debug") sets it when the runtime starts.
enum class LogLevel { off = 0, info = 1, debug = 2 };

// "off", "info" or "debug".
const char* to_string(LogLevel level);
// The level of that name; throws Error naming the valid names otherwise.
LogLevel log_level_from_string(const std::string& name);

// Counters since the process started (or since reset_stats).
struct Stats {
  std::uint64_t hits = 0;           // calls whose key was cached
  std::uint64_t misses = 0;         // calls whose key was not
  std::uint64_t tunes = 0;          // searches run (by misses under the tune policy, and by tune())
  std::uint64_t fallbacks = 0;      // calls that could not run their best cached candidate, or whose key is
                                    // cached only for another GPU or cuDNN
  std::uint64_t tune_us = 0;        // time spent in those searches, in microseconds
  std::uint64_t plans_built = 0;    // graph-API execution plans built (by calls and by prepare; the plan a
                                    // search keeps is part of its tune_us, Note [The plan a search keeps])
  std::uint64_t plan_build_us = 0;  // time spent building them, in microseconds
  std::uint64_t plans_deserialized = 0;  // plans restored from a stored plan instead (Note [Stored plans])
  std::uint64_t plan_rebuilds = 0;       // stored plans this process could not load, so built from the config
  std::uint64_t plan_evictions = 0;      // plans (or refusals) evicted from the plan cache by its limit
  std::uint64_t capture_misses = 0;      // misses under the tune policy while capturing a CUDA graph: run on
                                         // heuristics and recorded, tuned by the next call outside a capture
  std::uint64_t tune_waits = 0;  // misses that waited for another thread's search of their key instead of
                                 // searching it again (Note [One search per key])
  std::uint64_t lent = 0;        // keys the nearest miss policy lent another key's choice (Note [Nearest key])
  std::uint64_t plans = 0;       // entries in the plan cache now (plans and refusals; bounded by its limit; not
                                 // a counter, so reset_stats leaves it)
};

// What Runtime::prepare did.
struct PrepareReport {
  std::size_t entries = 0;  // graph-API entries of the device
  std::size_t plans = 0;    // of them, with a plan ready in the plan cache
  double seconds = 0.0;     // wall time
};

// The legacy traits of direction D.
template <Direction D>
using LegacyTraits = std::tuple_element_t<static_cast<std::size_t>(D),
                                          std::tuple<ForwardTraits, BackwardDataTraits, BackwardFilterTraits>>;

// prepare()'s threads by default for `entries` entries: one per 16 entries, up to usable_cores() and at most 8
// (Note [Prepare's threads] in runtime.cpp).
int default_prepare_threads(std::size_t entries);

class PlanCache;
class InFlight;

// A count that many threads add to without sharing a cache line (Note [Each thread's own hits] in
// call_memo.h): each thread adds to one of kShards slots, each on a line of its own; a read sums them.
class SpreadCounter {
 public:
  void add(std::uint64_t n) { shards_[shard()].value.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t load() const {
    std::uint64_t sum = 0;
    for (const Shard& s : shards_) sum += s.value.load(std::memory_order_relaxed);
    return sum;
  }
  void reset() {
    for (Shard& s : shards_) s.value.store(0, std::memory_order_relaxed);
  }

 private:
  static constexpr std::size_t kShards = 16;
  struct alignas(64) Shard {
    std::atomic<std::uint64_t> value{0};
  };
  // The calling thread's slot: threads take them in turn as they first count.
  static std::size_t shard();

  std::array<Shard, kShards> shards_{};
};

class Runtime {
 public:
  // The process-wide runtime.
  static Runtime& instance();

  Runtime();
  ~Runtime();

  CacheStore& store() { return store_; }

  void set_miss_policy(MissPolicy policy) { miss_policy_.store(policy); }
  MissPolicy miss_policy() const { return miss_policy_.load(); }

  // Throws Error when asked for the graph backend where graph_backend_available() is false.
  void set_backend(Backend backend);
  Backend backend() const { return backend_.load(); }

  // How later graph-API searches time candidates. Throws Error naming a field out of range.
  void set_search_options(const GraphSearchOptions& options);
  GraphSearchOptions search_options() const;

  // At most how many execution plans the plan cache keeps (0: no bound), evicting the least recently used
  // (Note [Plan cache]); 10000 by default, or the CUDNN_CACHE_PLAN_CACHE_LIMIT environment variable's value
  // when the runtime starts. A lower limit evicts down to 90% of it at once.
  void set_plan_cache_limit(std::size_t limit);
  std::size_t plan_cache_limit() const;

  // At most how many bytes of workspace a convolution may use (Note [Workspace limit]): calls run the fastest
  // cached candidate within it, searches time only configs within it, prepare builds the plans calls will use.
  // kNoWorkspaceLimit (the default, or CUDNN_CACHE_WORKSPACE_LIMIT's value when the runtime starts) bounds
  // nothing.
  static constexpr std::uint64_t kNoWorkspaceLimit = std::numeric_limits<std::uint64_t>::max();
  void set_workspace_limit(std::uint64_t bytes) { workspace_limit_.store(bytes, std::memory_order_relaxed); }
  std::uint64_t workspace_limit() const { return workspace_limit_.load(std::memory_order_relaxed); }

  Stats stats() const;
  void reset_stats();

  // Where warnings go (the torch layer routes them to TORCH_WARN); stderr by default.
  void set_warning_handler(std::function<void(const std::string&)> handler);

  void set_log_level(LogLevel level) { log_level_ = level; }
  LogLevel log_level() const { return log_level_.load(); }
  // Whether messages of `level` are reported; check it before building one.
  bool logs(LogLevel level) const { return level != LogLevel::off && level <= log_level_.load(); }
  // Reports a message of `level` if logs(level): to the log handler, by default stderr as
  // "cudnn_cache [debug] ...".
  void log(LogLevel level, const std::string& message) const;
  void set_log_handler(std::function<void(LogLevel, const std::string&)> handler);

  // The caches of CUDA device `index`; its identity is read once.
  DirectionCaches& caches_for_device(int index);

  // The origin of CUDA device `index` (its identity is read once, as for caches_for_device).
  const Origin& origin_of_device(int index);

  // Remembers a miss of the backend's cache for the key (the record miss policy) as a pending key of the
  // origin's caches (Note [Pending keys] in cache_store.h); a repeat is kept once.
  void record_miss(const Origin& origin, Backend backend, const ConvolutionKey& key);
  // The pending keys that are still not cached (recorded here, or loaded from a file), in order of origin,
  // backend and key.
  std::vector<RecordedMiss> recorded_misses() const;
  // Forgets every pending key.
  void clear_recorded_misses();

  // Counts a call that could not use the best of what the cache holds for it in stats().fallbacks and, the
  // first time in the process, warns "cudnn_cache: <what>. Counted in stats()['fallbacks']; ...".
  void count_fallback(const std::string& what);

  // Runs the convolution of `key` on the buffers through the backend of Traits (LegacyTraits<D> or
  // GraphTraits<D>); see Note [Running a cached convolution]. With `deterministic`, only candidates cuDNN reports
  // as deterministic are run (Note [Deterministic calls]).
  template <typename Traits>
  void run(cudnnHandle_t handle, int device, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
           const WorkspaceAllocator& allocate, bool deterministic);

  // Times every candidate of Traits's backend for `key` now, on the buffers, and stores the ranking (merged with
  // what is there). The buffer the direction writes is overwritten. Throws Error while the stream captures.
  template <typename Traits>
  Ranking<Traits> tune(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                       const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate);

  // Direction D of the key through the runtime's backend: run<GraphTraits<D>> or run<LegacyTraits<D>>.
  template <Direction D>
  void convolve(cudnnHandle_t handle, int device, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                const WorkspaceAllocator& allocate, bool deterministic);

  // tune<GraphTraits<D>> or tune<LegacyTraits<D>>, as `backend` says.
  template <Direction D>
  void tune_direction(Backend backend, cudnnHandle_t handle, int device, const ConvolutionKey& key,
                      const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate);

  // Puts a plan for every graph-API entry of CUDA device `device` into the plan cache, so first calls build
  // nothing: the plan of the first engine config of its ranking that cuDNN builds (a refusal is remembered
  // and its call falls back at once). Builds on `threads` threads (0: default_prepare_threads), each with
  // its own cuDNN handle; the plan cache is shared, so calls may run meanwhile. Throws Error if no cuDNN
  // handle can be made for the device.
  PrepareReport prepare(int device, int threads = 0);

  // prepare() on a thread of its own; returns at once. Prepares still running in the background (an earlier
  // one's, or the first calls') are waited for first. wait_for_prepare() returns its report (or throws its
  // Error); Error if none was started, or its report was taken.
  void prepare_in_background(int device, int threads = 0);
  PrepareReport wait_for_prepare();

  // With `on`, the first graph-API call on each CUDA device starts a prepare() of that device in the background
  // (Note [Prepare at the first call]); a prepare() of the device, or `on` false, disarms it. What
  // CUDNN_CACHE_PATH's load turns on.
  void prepare_at_first_call(bool on);

 private:
  static constexpr int kMaxDevices = 64;

  // What a call of a key runs first: the ranking cached for it, or what the miss policy makes of a miss, which
  // may be another key's, lent (runtime.cpp).
  template <typename Traits>
  struct Found {
    std::shared_ptr<const Ranking<Traits>> ranking;  // null: native heuristics' choice
    bool lent = false;  // the ranking was lent: a neighbour's, or native heuristics' choice (not tuned for the key)
  };
  template <typename Traits, typename Chosen>
  Found<Traits> lookup(cudnnHandle_t handle, int device, PerfCache<Traits>& cache, const ConvolutionKey& key,
                       Chosen& backend, const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                       bool deterministic);
  // What the nearest miss policy lends a missed key, lent to it (runtime.cpp).
  template <typename Traits, typename Chosen>
  std::shared_ptr<const Ranking<Traits>> lend(PerfCache<Traits>& cache, const ConvolutionKey& key, Chosen& backend);
  // The backend's search, counted in stats() and logged; `deterministic`: a deterministic call's
  // (GraphSearchOptions::rank_deterministic).
  template <typename Traits, typename Chosen>
  Ranking<Traits> search(Chosen& backend, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                         const WorkspaceAllocator& allocate, bool deterministic);

  // The first call's prepare of a device, if armed and not started (Note [Prepare at the first call]).
  void start_first_call_prepare(int device);
  // prepare(device, threads) on a thread of its own, kept in background_; background_mutex_ held.
  void start_in_background(int device, int threads);
  // Waits for every prepare in background_ and forgets them; takes background_mutex_ (not held while waiting).
  void finish_background();

  CacheStore store_;
  std::unique_ptr<PlanCache> plans_;
  std::unique_ptr<InFlight> searching_;  // the keys being searched now (Note [One search per key])
  std::atomic<MissPolicy> miss_policy_{MissPolicy::tune};
  std::atomic<std::uint64_t> workspace_limit_{kNoWorkspaceLimit};
  std::atomic<Backend> backend_;
  GraphSearchOptions search_options_;  // guarded by mutex_
  std::atomic<LogLevel> log_level_{LogLevel::off};
  std::function<void(LogLevel, const std::string&)> log_handler_;  // guarded by mutex_
  SpreadCounter hits_;  // every hit adds to it
  std::atomic<std::uint64_t> misses_{0}, tunes_{0}, fallbacks_{0}, tune_us_{0}, capture_misses_{0},
      tune_waits_{0}, lent_{0};
  std::atomic<bool> warned_{false};
  mutable std::mutex mutex_;  // guards the handlers, search_options_ and the filling of device_caches_
  std::function<void(const std::string&)> warning_handler_;
  std::array<std::atomic<DirectionCaches*>, kMaxDevices> device_caches_{};
  std::array<Origin, kMaxDevices> device_origins_{};  // written under mutex_ before its device_caches_ slot
  std::array<std::atomic<bool>, kMaxDevices> prepare_at_first_call_{};  // armed, by device
  std::mutex background_mutex_;  // guards background_ and reported_
  // The prepares started off the calling thread, prepare_in_background's and the first calls' alike (the
  // destructor waits for them all); reported_ is prepare_in_background's, whose report wait_for_prepare returns.
  std::vector<std::future<PrepareReport>> background_;
  std::optional<std::size_t> reported_;
  std::atomic<bool> stopping_{false};  // the runtime is being destroyed: prepares stop building
};

}  // namespace cudnn_cache
