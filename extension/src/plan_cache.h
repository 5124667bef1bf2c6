#pragma once

// Note [Plan cache]
// ~~~~~~~~~~~~~~~~~
// Building an execution plan costs far more than running it, so the plan of each (device, key, engine
// config) is made once (restored from a stored plan, Note [Stored plans], or built) and kept; so is cuDNN's
// refusal to build one, so a stored config this cuDNN does not know costs one attempt per process, not one
// per call. The cache is shared by all threads (cuDNN plans may
// run concurrently), so prepare() can fill it from other threads while training runs: a lookup takes a
// shared lock, a build happens outside any lock, and the first result stored wins. A plan is tied to its
// device and cuDNN, not to a file, so loading or clearing the caches does not touch it.
//
// A run whose input shapes keep changing would grow the cache without bound, so it keeps at most limit()
// entries (10000 by default, as PyTorch's own cuDNN v8 plan cache; 0 keeps every entry), evicting the least
// recently used approximately, by second chance (CLOCK): each use sets its entry's `used` flag (a get() under the
// shared lock; a run from a thread's memo, Note [Each thread's own hits] in call_memo.h, with none), so the hit
// path takes no exclusive lock and writes only a flag that is usually set already. An insert
// that takes the cache over the limit sweeps it under the exclusive lock: entries not used since the last
// sweep are evicted until the cache holds 90% of the limit, and the flags of all that stay are cleared; so a
// sweep's O(n) is paid once per tenth of the limit inserted, not once per insert. Should too few entries be
// unused, a second pass evicts among the others, in no particular order. The entry just inserted is never evicted, and a new entry
// counts as used (its caller is about to run it). Entries can leave, so get() shares its entry: a plan another
// thread runs, or a memo holds, stays alive until that run ends or that memo lets it go. Evicted plans are
// destroyed after the lock is released, since destroying a plan calls into cuDNN.
//
// Note [The plan a search keeps]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A search builds 10-18 plans per key in one cudnn-frontend graph (and its workers' graphs), and the plan of
// its best config is a plan of that graph: kept as it is, it would keep every candidate the search built
// alive, runtime-compiled kernels and all, for as long as the entry lives, and run from a graph, and
// possibly a handle, that no warm process has. So the tuning process runs what a warm process runs, so that
// its steady step is the warm one's: a runtime-compiled config's plan is serialized (as it is
// for the file anyway) and restored from those bytes on the calling thread's handle, milliseconds where a
// compilation takes 50-250 ms; any other config's is built again from the config, about a millisecond. The
// search's graph is freed when the search returns. Only where neither can be made is the search's plan kept.

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cudnn_cache/graph.h"
#include "cudnn_cache/plan_store.h"
#include "cudnn_cache/runtime.h"

namespace cudnn_cache {

class PlanCache {
 public:
  // PyTorch's default for its own cuDNN v8 plan cache (TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT).
  static constexpr std::size_t kDefaultLimit = 10000;

  explicit PlanCache(Runtime& runtime) : runtime_(runtime) {}

  // A slot's plan, or cuDNN's refusal to build one, and its second-chance flag (Note [Plan cache]). Shared by
  // the cache and whoever runs it: a hit copies one shared pointer and allocates nothing.
  struct Entry {
    Entry(std::shared_ptr<const GraphPlan> made, std::string why_not)
        : plan(std::move(made)), refusal(std::move(why_not)) {}
    // Counts a run of the plan as a use: the next sweep spares it. A flag set already is read, not written, so
    // threads running one plan share its cache line.
    void use() const {
      if (!used.load(std::memory_order_relaxed)) used.store(true, std::memory_order_relaxed);
    }

    const std::shared_ptr<const GraphPlan> plan;  // null when cuDNN refused the config
    const std::string refusal;                    // why it did; empty when it built
    mutable std::atomic<bool> used{true};         // a new entry counts as used
  };
  using Shared = std::shared_ptr<const Entry>;

  // The entry of `config` for `key` on `device`, made on first use: from the plan `stored` holds for the key
  // when it is one of this config and this cuDNN, else built (Note [Stored plans]). When `best` (the config
  // leads its ranking) and cuDNN compiled it at run time, the plan built is serialized into `stored`.
  Shared get(cudnnHandle_t handle, int device, const ConvolutionKey& key, const EngineCandidate& config,
             PlanStore& stored, bool best);

  // Keeps a plan of `config`, the best config a search found, for the calls that follow: the plan a warm process
  // would run, made on `handle` from `searched` (the search's plan of that config), which is kept itself only
  // where that fails (Note [The plan a search keeps]). Stores the plan as get() would. Counted in the
  // search's time, not among the plans built or restored.
  void adopt(cudnnHandle_t handle, int device, const ConvolutionKey& key, const EngineCandidate& config,
             std::shared_ptr<const GraphPlan> searched, PlanStore& stored);

  // Keeps `built`, a plan of `config` for `key` that the caller built in `us` microseconds (native heuristics'
  // choice, built from heuristics' list: Note [Native heuristics' choice] in runtime.h), counted among the plans
  // built. Returns the entry kept (another thread's, if it stored the slot first).
  Shared keep(int device, const ConvolutionKey& key, const EngineCandidate& config,
              std::shared_ptr<const GraphPlan> built, std::uint64_t us);

  // At most how many entries are kept (0: no bound); see Note [Plan cache]. A lower limit evicts at once, as
  // an insert over it would.
  void set_limit(std::size_t limit);
  std::size_t limit() const { return limit_.load(std::memory_order_relaxed); }
  // How many entries are kept now.
  std::size_t size() const;
  // Whether the slot has an entry; unlike get(), this does not count as a use.
  bool contains(int device, const ConvolutionKey& key, const EngineCandidate& config) const;
  // The cache's version (Note [Cache versions] in perf_cache.h): a new one whenever an entry is evicted. An
  // entry, once stored, is the slot's until it is evicted, so stores leave the version as it is.
  std::uint64_t version() const { return version_.load(std::memory_order_acquire); }

  std::atomic<std::uint64_t> plans_built{0}, build_us{0}, plans_deserialized{0}, plan_rebuilds{0},
      plan_evictions{0};

 private:
  Shared restore(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
                 const PlanStore& stored);
  Shared build(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config, PlanStore& stored,
               bool best);
  template <typename... Args>
  void debug(const Args&... args);

  Runtime& runtime_;

  struct Slot {
    int device;
    ConvolutionKey key;
    EngineCandidate config;  // only its choice (engine and knobs) counts
    friend bool operator==(const Slot& a, const Slot& b) {
      return a.device == b.device && a.key == b.key && a.config.same_choice(b.config);
    }
  };
  struct SlotHash {
    std::size_t operator()(const Slot& slot) const;
  };

  using Entries = std::unordered_map<Slot, Shared, SlotHash>;

  // Stores `made` unless another thread stored the slot first, then sweeps if over the limit; the entry kept.
  Shared insert(const Slot& slot, Shared made);
  // Evicts entries down to 90% of the limit, never `inserted` (end(): any may go); the evicted entries are moved to
  // `evicted`, for the caller to let go of outside the lock. The caller holds the exclusive lock.
  void sweep(Entries::const_iterator inserted, std::vector<Shared>& evicted);

  mutable std::shared_mutex mutex_;
  Entries entries_;
  std::atomic<std::size_t> limit_{kDefaultLimit};
  std::atomic<std::uint64_t> version_{next_cache_version()};
};

}  // namespace cudnn_cache
