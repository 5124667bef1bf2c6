#pragma once

// Serialized execution plans, kept next to the rankings for engines cuDNN compiles at run time.
//
// Note [Stored plans]
// ~~~~~~~~~~~~~~~~~~~
// Where a warm process's first step goes (cuDNN 9.19; the models benchmark's warm start measures it): loading the
// file takes milliseconds; rebuilding a plan of a precompiled engine takes 0.1-1 ms from its engine and knobs,
// and 1-4 ms for a config stored by its position in heuristics' list (Note [Engine configs]), most of it asking
// for that list (the debug log says how much); the builds parallelise over prepare()'s threads. A process's
// first build of a real-size config pays 60-80 ms once, inside cuDNN (H100), and
// the first launch of every kernel (lazy module loading) a few hundred milliseconds once, as it does natively.
// The exception is engines cuDNN compiles at run time (BehaviorNote_t::RUNTIME_COMPILATION, the usual winners
// for depthwise convolutions in bf16/fp16): each build runs NVRTC for 170-250 ms, concurrent builds do not
// overlap, and MobileNetV2 pays 7 s for them in every new process, with or without PyTorch's benchmark mode.
//
// So for those engines the plan cuDNN built is serialized (cudnn-frontend's Graph::serialize, which carries
// the compiled kernel: ~100 KB) and saved with the entry; restoring it takes ~12 ms. A stored plan only loads
// in the cuDNN that wrote it on the same kind of GPU: it is filed under its origin like the rankings, and
// carries the exact cuDNN version (cudnnGetVersion), since plans of 9.19.0 need not load in 9.19.1. Anywhere
// else, or if cuDNN rejects the bytes, the plan is rebuilt from the engine config, the rebuild is counted
// (Stats::plan_rebuilds), and the rebuilt plan replaces the stored one. The file's checksum rejects corrupt
// bytes before they get here.

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "cudnn_cache/attention.h"
#include "cudnn_cache/key.h"
#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache {

// The largest serialized plan a file may hold; real ones are tens of kilobytes.
inline constexpr std::size_t kMaxStoredPlanBytes = std::size_t{16} << 20;

// One engine config's serialized execution plan for one key.
struct StoredPlan {
  EngineCandidate config;          // the config the plan is of (its engine and knobs; the rest is not used)
                                   // for a convolution; an attention plan's is its engine's
  std::uint32_t cudnn_version = 0;  // cudnnGetVersion() of the process that built it
  std::vector<std::uint8_t> bytes;  // cudnn-frontend's serialization

  friend bool operator==(const StoredPlan& a, const StoredPlan& b) {
    return a.config.same_choice(b.config) && a.cudnn_version == b.cudnn_version && a.bytes == b.bytes;
  }
};

// The stored plans of one origin, at most one per key: of convolutions (PlanStore) and of attention graphs
// (AttentionPlanStore, Note [Persisted attention plans] in attention.h). Safe to use from many threads at once.
template <typename Key>
class StoredPlans {
 public:
  using Entry = std::pair<Key, std::shared_ptr<const StoredPlan>>;

  // Stores the plan for the key, replacing the one there.
  void insert(const Key& key, StoredPlan plan) {
    auto stored = std::make_shared<const StoredPlan>(std::move(plan));
    std::unique_lock lock(mutex_);
    plans_[key] = std::move(stored);
  }

  // The plan stored for the key, or null.
  std::shared_ptr<const StoredPlan> find(const Key& key) const {
    std::shared_lock lock(mutex_);
    const auto found = plans_.find(key);
    return found == plans_.end() ? nullptr : found->second;
  }

  // Every stored plan, sorted by key.
  std::vector<Entry> entries() const {
    std::shared_lock lock(mutex_);
    return {plans_.begin(), plans_.end()};
  }

  std::size_t size() const {
    std::shared_lock lock(mutex_);
    return plans_.size();
  }

  void clear() {
    std::unique_lock lock(mutex_);
    plans_.clear();
  }

 private:
  mutable std::shared_mutex mutex_;
  std::map<Key, std::shared_ptr<const StoredPlan>> plans_;
};

using PlanStore = StoredPlans<ConvolutionKey>;
using AttentionPlanStore = StoredPlans<AttentionKey>;

}  // namespace cudnn_cache
