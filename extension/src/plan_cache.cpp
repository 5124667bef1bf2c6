#include "plan_cache.h"

#include <chrono>
#include <mutex>

#include "cudnn_cache/error.h"
#include "elapsed.h"

namespace cudnn_cache {
namespace {

// Serializes the plan into `stored` when cuDNN compiled its engine at run time (Note [Stored plans]).
void keep_serialized(const ConvolutionKey& key, const EngineCandidate& config, const GraphPlan& plan,
                     PlanStore& stored) {
  if ((config.behavior_notes & EngineCandidate::kRuntimeCompiled) == 0) return;
  try {
    stored.insert(key, {config, static_cast<std::uint32_t>(cudnnGetVersion()), plan.serialize()});
  } catch (const Error&) {
    // not serializable here: later processes rebuild it, as without a stored plan
  }
}

}  // namespace

const PlanCache::Entry& PlanCache::get(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                                       const EngineCandidate& config, PlanStore& stored, bool best) {
  const Slot slot{device, key, config};
  {
    std::shared_lock lock(mutex_);
    if (const auto found = entries_.find(slot); found != entries_.end()) return found->second;
  }
  Entry made = restore(handle, key, config, stored);
  if (!made.plan) made = build(handle, key, config, stored, best);
  std::unique_lock lock(mutex_);
  return entries_.try_emplace(slot, std::move(made)).first->second;
}

void PlanCache::adopt(int device, const ConvolutionKey& key, const EngineCandidate& config,
                      std::shared_ptr<const GraphPlan> plan, PlanStore& stored) {
  keep_serialized(key, config, *plan, stored);
  std::unique_lock lock(mutex_);
  entries_.try_emplace(Slot{device, key, config}, Entry{std::move(plan), {}});
}

// The plan `stored` holds for this config, if this cuDNN can load it; a stored plan it cannot load is counted
// as a rebuild.
PlanCache::Entry PlanCache::restore(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
                                    const PlanStore& stored) {
  const std::shared_ptr<const StoredPlan> plan = stored.find(key);
  if (!plan || !plan->config.same_choice(config)) return {};
  if (plan->cudnn_version == static_cast<std::uint32_t>(cudnnGetVersion())) {
    try {
      Entry restored{std::make_shared<const GraphPlan>(handle, key, plan->bytes), {}};
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
  return {};
}

PlanCache::Entry PlanCache::build(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
                                  PlanStore& stored, bool best) {
  const auto started = std::chrono::steady_clock::now();
  Entry built;
  try {
    built.plan = std::make_shared<const GraphPlan>(handle, key, config);
  } catch (const Error& e) {
    built.refusal = e.what();
    debug("plan refused: ", to_string(config), " for ", key, ": ", e.what());
    return built;
  }
  ++plans_built;
  const std::uint64_t us = microseconds_since(started);
  build_us += us;
  debug("plan built in ", us / 1000.0, " ms: ", to_string(config), " for ", key);
  if (best) keep_serialized(key, config, *built.plan, stored);
  return built;
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
