#include "plan_cache.h"

#include <chrono>
#include <mutex>
#include <string>
#include <utility>

#include "cudnn_cache/error.h"
#include "elapsed.h"

namespace cudnn_cache {
namespace {

// Serializes the plan into `stored` when cuDNN compiled its engine at run time (Note [Stored plans]); returns
// what it stored, null if nothing.
std::shared_ptr<const StoredPlan> keep_serialized(const ConvolutionKey& key, const EngineCandidate& config,
                                                  const GraphPlan& plan, PlanStore& stored) {
  if ((config.behavior_notes & EngineCandidate::kRuntimeCompiled) == 0) return nullptr;
  try {
    stored.insert(key, {config, static_cast<std::uint32_t>(cudnnGetVersion()), plan.serialize()});
  } catch (const Error&) {
    return nullptr;  // not serializable here: later processes rebuild it, as without a stored plan
  }
  return stored.find(key);
}

}  // namespace

PlanCache::Shared PlanCache::get(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                                 const EngineCandidate& config, PlanStore& stored, bool best) {
  const Slot slot{device, key, config};
  {
    std::shared_lock lock(mutex_);
    if (const auto found = entries_.find(slot); found != entries_.end()) {
      found->second->use();
      return found->second;
    }
  }
  Shared made = restore(handle, key, config, stored);
  if (!made) made = build(handle, key, config, stored, best);
  return insert(slot, std::move(made));
}

void PlanCache::adopt(cudnnHandle_t handle, int device, const ConvolutionKey& key, const EngineCandidate& config,
                      std::shared_ptr<const GraphPlan> searched, PlanStore& stored) {
  // Note [The plan a search keeps]: the plan a warm process would make, not the search's, which holds the
  // search's whole graph and every candidate built in it.
  std::shared_ptr<const GraphPlan> remade;
  try {
    if ((config.behavior_notes & EngineCandidate::kRuntimeCompiled) != 0) {
      if (const std::shared_ptr<const StoredPlan> kept = keep_serialized(key, config, *searched, stored)) {
        remade = std::make_shared<const GraphPlan>(handle, key, kept->bytes);
      }
    } else {
      remade = std::make_shared<const GraphPlan>(handle, key, config);
    }
  } catch (const Error& e) {
    debug("kept the search's own plan of ", to_string(config), " for ", key, ": ", e.what());
  }
  insert(Slot{device, key, config},
         std::make_shared<const Entry>(remade ? std::move(remade) : std::move(searched), ""));
}

PlanCache::Shared PlanCache::keep(int device, const ConvolutionKey& key, const EngineCandidate& config,
                                  std::shared_ptr<const GraphPlan> built, std::uint64_t us) {
  ++plans_built;
  build_us += us;
  debug("plan built in ", us / 1000.0, " ms from heuristics' list: ", to_string(config), " for ", key);
  return insert(Slot{device, key, config}, std::make_shared<const Entry>(std::move(built), ""));
}

void PlanCache::set_limit(std::size_t limit) {
  std::vector<Shared> evicted;  // declared first: let go of after the lock is released
  std::unique_lock lock(mutex_);
  limit_.store(limit, std::memory_order_relaxed);
  sweep(entries_.end(), evicted);
}

std::size_t PlanCache::size() const {
  std::shared_lock lock(mutex_);
  return entries_.size();
}

bool PlanCache::contains(int device, const ConvolutionKey& key, const EngineCandidate& config) const {
  std::shared_lock lock(mutex_);
  return entries_.count(Slot{device, key, config}) != 0;
}

PlanCache::Shared PlanCache::insert(const Slot& slot, Shared made) {
  std::vector<Shared> evicted;  // declared first: let go of after the lock is released
  std::unique_lock lock(mutex_);
  const auto [kept, inserted] = entries_.try_emplace(slot, std::move(made));
  if (inserted) sweep(kept, evicted);
  return kept->second;
}

void PlanCache::sweep(Entries::const_iterator inserted, std::vector<Shared>& evicted) {
  const std::size_t limit = limit_.load(std::memory_order_relaxed);
  if (limit == 0 || entries_.size() <= limit) return;
  const std::size_t target = limit - limit / 10;  // at least 1, so `inserted` can always stay
  // The first pass gives every entry used since the last sweep its second chance, and goes on past the target
  // to clear every flag, so that a flag set at the next sweep means a use since this one. The second, if
  // needed, evicts among entries that have all had theirs.
  for (int pass = 0; pass < 2 && entries_.size() > target; ++pass) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      const bool spared = it == inserted || it->second->used.exchange(false, std::memory_order_relaxed) ||
                          entries_.size() <= target;
      if (spared) {
        ++it;
        continue;
      }
      evicted.push_back(std::move(it->second));
      it = entries_.erase(it);
      ++plan_evictions;
    }
  }
  if (!evicted.empty()) version_.store(next_cache_version(), std::memory_order_release);
}

// The plan `stored` holds for this config, if this cuDNN can load it; a stored plan it cannot load is counted
// as a rebuild.
PlanCache::Shared PlanCache::restore(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
                                     const PlanStore& stored) {
  const std::shared_ptr<const StoredPlan> plan = stored.find(key);
  if (!plan || !plan->config.same_choice(config)) return nullptr;
  if (plan->cudnn_version == static_cast<std::uint32_t>(cudnnGetVersion())) {
    try {
      Shared restored = std::make_shared<const Entry>(std::make_shared<const GraphPlan>(handle, key, plan->bytes), "");
      ++plans_deserialized;
      debug("plan restored: ", to_string(config), " for ", key);
      return restored;
    } catch (const Error& e) {
      debug("stored plan rejected (", e.what(), "): rebuilding ", to_string(config), " for ", key);
    }
  } else {
    debug("stored plan is of cuDNN ", plan->cudnn_version, ": rebuilding ", to_string(config), " for ", key);
  }
  ++plan_rebuilds;
  return nullptr;
}

PlanCache::Shared PlanCache::build(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
                                   PlanStore& stored, bool best) {
  const auto started = std::chrono::steady_clock::now();
  std::shared_ptr<const GraphPlan> plan;
  try {
    plan = std::make_shared<const GraphPlan>(handle, key, config);
  } catch (const Error& e) {
    debug("plan refused: ", to_string(config), " for ", key, ": ", e.what());
    return std::make_shared<const Entry>(nullptr, e.what());
  }
  ++plans_built;
  const std::uint64_t us = microseconds_since(started);
  build_us += us;
  const std::string listing = plan->heuristics_us() > 0
                                  ? detail::concat(" (", plan->heuristics_us() / 1000.0, " ms of it heuristics' list)")
                                  : "";
  debug("plan built in ", us / 1000.0, " ms", listing, ": ", to_string(config), " for ", key);
  if (best) keep_serialized(key, config, *plan, stored);
  return std::make_shared<const Entry>(std::move(plan), "");
}

template <typename... Args>
void PlanCache::debug(const Args&... args) {
  if (runtime_.logs(LogLevel::debug)) runtime_.log(LogLevel::debug, detail::concat(args...));
}

std::size_t PlanCache::SlotHash::operator()(const Slot& slot) const {
  std::size_t hash = KeyHash{}(slot.key) ^ (static_cast<std::size_t>(slot.device) << 48);
  hash = hash * 1099511628211u ^ static_cast<std::size_t>(slot.config.engine_id);
  for (const Knob* knob = slot.config.knobs_begin(); knob != slot.config.knobs_end(); ++knob) {
    hash = hash * 1099511628211u ^ static_cast<std::size_t>(knob->type << 32 ^ knob->value);
  }
  return hash;
}

}  // namespace cudnn_cache
