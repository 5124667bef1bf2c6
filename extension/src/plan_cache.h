#pragma once

// Note [Plan cache]
// ~~~~~~~~~~~~~~~~~
// Building an execution plan costs far more than running it, so the plan of each (device, key, engine
// config) is made once (restored from a stored plan, Note [Stored plans], or built) and kept; so is cuDNN's
// refusal to build one, so a stored config this cuDNN does not know costs one attempt per process, not one
// per call. The cache is shared by all threads (cuDNN plans may
// run concurrently), so prepare() can fill it from other threads while training runs: a lookup takes a
// shared lock, a build happens outside any lock, and the first result stored wins. Entries are never
// removed: a plan is tied to its device and cuDNN, not to a file, so loading or clearing the caches does not
// touch it, and references to entries stay valid.

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "cudnn_cache/graph.h"
#include "cudnn_cache/plan_store.h"
#include "cudnn_cache/runtime.h"

namespace cudnn_cache {

class PlanCache {
 public:
  explicit PlanCache(Runtime& runtime) : runtime_(runtime) {}

  struct Entry {
    std::shared_ptr<const GraphPlan> plan;  // null when cuDNN refused the config
    std::string refusal;                    // why it did
  };

  // The entry of `config` for `key` on `device`, made on first use: from the plan `stored` holds for the key
  // when it is one of this config and this cuDNN, else built (Note [Stored plans]). When `best` (the config
  // leads its ranking) and cuDNN compiled it at run time, the plan built is serialized into `stored`.
  const Entry& get(cudnnHandle_t handle, int device, const ConvolutionKey& key, const EngineCandidate& config,
                   PlanStore& stored, bool best);

  // Keeps `plan`, which a search built for `config`, as if get() had built it (and stores it, as get() would).
  void adopt(int device, const ConvolutionKey& key, const EngineCandidate& config,
             std::shared_ptr<const GraphPlan> plan, PlanStore& stored);

  std::atomic<std::uint64_t> plans_built{0}, build_us{0}, plans_deserialized{0}, plan_rebuilds{0};

 private:
  Entry restore(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
                const PlanStore& stored);
  Entry build(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config, PlanStore& stored,
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

  std::shared_mutex mutex_;
  std::unordered_map<Slot, Entry, SlotHash> entries_;
};

}  // namespace cudnn_cache
