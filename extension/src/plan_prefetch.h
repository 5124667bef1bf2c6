#pragma once

// Prefetched builds: a key's runtime-compiled candidates built by builder processes before its search starts
// (Note [Prefetched builds]).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cudnn_cache/cudnn.h"
#include "cudnn_cache/key.h"
#include "cudnn_cache/plan_store.h"
#include "cudnn_cache/runtime.h"
#include "plan_builders.h"

namespace cudnn_cache {

// Note [Prefetched builds]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A layer's three keys are searched one after another as training reaches them: the forward key in the forward
// pass, backward-data and backward-filter in the backward pass, much later. A depthwise layer's forward and
// backward-data keys have one runtime-compiled candidate each (an NVRTC compilation of 50-250 ms), which one
// search cannot split among builder processes (Note [Builder processes]), so each layer paid three compilations
// one after another. When a forward key misses and a backward pass is expected (Runtime, Note [Backward
// expected] in runtime.h), the backward keys are known already: the runtime asks the prefetcher to build their
// runtime-compiled candidates, heuristics' list positions computed as their searches will compute them
// (heuristic_graph, then the same list of step 1), in builder processes, while the forward search runs. When the
// backward pass searches those keys, a search asks the prefetcher for each compiled candidate before building
// it (Note [Parallel candidate builds] in graph_search.cpp) and restores what it gets, in milliseconds; what is
// timed, and how, is unchanged. Tuning known keys one after another (tune_pending(), distributed.sync(): the
// warm start's offline tuning) queues the builds of each key and of the next few before searching it
// (Runtime::prefetch, distributed.prefetched_in_turn), so that the builders compile ahead of the searches.
//
// Bounds. At most `processes` jobs of a device are in flight at once, each on a background thread holding one
// builder of PlanBuilders' pool; a thread takes a job only once its builder is ready, so that a job in flight
// is a compilation under way, never a builder's start. It gives its builder back when its device has nothing
// queued, and ends (the pool's reaper closes the idle child later). Finished jobs (plans, and failures) are
// kept for at most `capacity` (512) jobs, the oldest dropped first; a queue of `capacity` jobs takes no more.
// Only the positions a search reaches (its first max_candidates) are queued.
//
// Never a second compilation of one config: a search that asks for a job in flight waits for it (at most the
// build timeout), and one that asks for a queued job takes it out of the queue and builds it itself. A search
// starts no builder process for candidates built or being built ahead (AheadBuilder counts only the others).
//
// Failures only make a search slower. Without builders (no tool, the device's builders off after failures,
// processes 0) prefetch does nothing. A builder that fails in a build marks that job failed, and one that
// cannot start marks none; either is given back (closed and counted as a failure of its device, as for a
// search) and the thread takes another, until the device's builders are off, when its queued jobs fail. A job
// whose builder says it cannot build it is failed too. A search that asks for a failed job gets nothing and
// builds the candidate as it would have without prefetching.
//
// The process's prefetcher is never destroyed, as PlanBuilders' pool is not: at exit its threads end with the
// process. A prefetcher that is destroyed (tests) cancels what is queued and joins its threads, which finish
// the build they are in.

// What a prefetched build is of: a plan of heuristic_graph(key, deterministic) on a device, at `index` of
// heuristics' list, named `name` (a builder_protocol::BuildRequest, and the device).
struct PrefetchJob {
  int device = 0;
  builder_protocol::BuildRequest request;
};

class PlanPrefetcher {
 public:
  struct Settings {
    PlanBuilders* builders = nullptr;  // where builders come from; the process's pool by default
    std::size_t capacity = 512;        // finished jobs kept, and queued jobs at most
  };

  // The process's prefetcher, on PlanBuilders::instance(). Never destroyed (Note [Prefetched builds]).
  static PlanPrefetcher& instance();

  explicit PlanPrefetcher(Settings settings);
  // Cancels queued jobs and joins the threads, which finish the build they are in.
  ~PlanPrefetcher();
  PlanPrefetcher(const PlanPrefetcher&) = delete;
  PlanPrefetcher& operator=(const PlanPrefetcher&) = delete;

  // Queues the jobs not queued, in flight or finished already, and starts threads for them, at most
  // `processes` for a device. Nothing when `processes` is 0 or the device's builders are unavailable
  // (PlanBuilders::available). Returns whether it queued any.
  bool enqueue(const std::vector<PrefetchJob>& jobs, int processes);

  // The plan a prefetched build made for `job`, removed; waits up to `timeout` for a job in flight. Nothing when
  // the job failed, is unknown, or is only queued (then it is cancelled: the caller builds it).
  std::shared_ptr<const StoredPlan> take(const PrefetchJob& job, std::chrono::milliseconds timeout);

  // Whether a take(job) would find a plan made or being made (a search builds no builders for those).
  bool expected(const PrefetchJob& job) const;

  // Plans handed to searches by take(), since the process started.
  std::uint64_t plans_taken() const;

  // Jobs queued, in flight and finished, for tests.
  struct Counts {
    std::size_t queued = 0, in_flight = 0, finished = 0;
  };
  Counts counts() const;

 private:
  using Id = std::tuple<int, ConvolutionKey, bool, std::int64_t, std::string>;
  enum class State { queued, in_flight, done, failed };
  struct Job {
    State state = State::queued;
    std::shared_ptr<const StoredPlan> plan;  // when done
    std::list<Id>::iterator finished;        // its place in finished_, when done or failed
  };

  static Id id_of(const PrefetchJob& job);
  void work(int device);  // a background thread: one builder, the device's queue until it is empty
  // The device's next queued job, now in flight; under mutex_.
  std::optional<Id> next_queued(int device);
  // Fails the device's queued jobs (no builder for them); under mutex_.
  void fail_queued(int device);
  // Records a job's end, evicting the oldest finished job beyond capacity; under mutex_.
  void finish(const Id& id, std::shared_ptr<const StoredPlan> plan);
  // Joins threads that have ended; under no lock.
  void join_ended();

  Settings settings_;
  mutable std::mutex mutex_;
  std::condition_variable finished_changed_;  // a job finished, or the prefetcher stops
  bool stopping_ = false;
  std::atomic<bool> stopped_{false};  // stopping_, for PlanBuilder::ready
  std::map<Id, Job> jobs_;
  std::map<int, std::deque<Id>> queues_;  // by device; ids no longer queued are skipped
  std::list<Id> finished_;                // oldest first
  std::size_t queued_ = 0, in_flight_ = 0;
  std::map<int, int> threads_of_;  // running, by device
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> ended_;  // threads that returned, to join
  std::uint64_t plans_taken_ = 0;
};

// Queues builds of the runtime-compiled candidates of `key`'s step 1 that a search with `options` reaches (its
// first max_candidates positions) in at most options.build_processes builder processes (Note [Prefetched
// builds]): heuristics' list as search_engine_configs makes it, on the current device. Returns at once; never
// throws: a key whose list cannot be made is not prefetched. Returns whether it queued any. In graph_search.cpp.
bool prefetch_compiled_plans(cudnnHandle_t handle, const ConvolutionKey& key, const GraphSearchOptions& options);

}  // namespace cudnn_cache
