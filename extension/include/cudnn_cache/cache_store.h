#pragma once

// All perf caches of a process, by origin (device identity + cuDNN major.minor).

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "cudnn_cache/device.h"
#include "cudnn_cache/perf_cache.h"
#include "cudnn_cache/plan_store.h"

namespace cudnn_cache {

// The perf caches of one origin: the legacy algorithms' and the graph API's engine configs, per direction;
// and the serialized plans of runtime-compiled engine configs (Note [Stored plans]).
struct DirectionCaches {
  PerfCache<ForwardTraits> forward;
  PerfCache<BackwardDataTraits> backward_data;
  PerfCache<BackwardFilterTraits> backward_filter;
  PerfCache<GraphForwardTraits> graph_forward;
  PerfCache<GraphBackwardDataTraits> graph_backward_data;
  PerfCache<GraphBackwardFilterTraits> graph_backward_filter;
  PlanStore plans;

  // The cache of the backend and direction Traits describes.
  template <typename Traits>
  PerfCache<Traits>& get() {
    return std::get<PerfCache<Traits>&>(std::tie(forward, backward_data, backward_filter, graph_forward,
                                                 graph_backward_data, graph_backward_filter));
  }
  template <typename Traits>
  const PerfCache<Traits>& get() const {
    return const_cast<DirectionCaches*>(this)->get<Traits>();
  }

  // Entries in all six caches (stored plans belong to entries and are not counted).
  std::size_t size() const {
    return forward.size() + backward_data.size() + backward_filter.size() + graph_forward.size() +
           graph_backward_data.size() + graph_backward_filter.size();
  }
  void clear() {
    forward.clear();
    backward_data.clear();
    backward_filter.clear();
    graph_forward.clear();
    graph_backward_data.clear();
    graph_backward_filter.clear();
    plans.clear();
  }
};

// Calls f(Traits{}) for each direction's legacy traits, in Direction order.
template <typename F>
void for_each_direction(F&& f) {
  f(ForwardTraits{});
  f(BackwardDataTraits{});
  f(BackwardFilterTraits{});
}

// Calls f(Traits{}) for each direction's graph-API traits, in Direction order.
template <typename F>
void for_each_graph_direction(F&& f) {
  f(GraphForwardTraits{});
  f(GraphBackwardDataTraits{});
  f(GraphBackwardFilterTraits{});
}

// Calls f(Traits{}) for every cache of an origin: the legacy directions, then the graph API's.
template <typename F>
void for_each_cache(F&& f) {
  for_each_direction(f);
  for_each_graph_direction(f);
}

// Every origin's caches. Safe to use from many threads at once.
class CacheStore {
 public:
  // The caches of the origin, created empty on first use. The reference stays valid as long as the store.
  DirectionCaches& caches(const Origin& origin) {
    std::lock_guard lock(mutex_);
    auto& slot = caches_[origin];
    if (!slot) slot = std::make_unique<DirectionCaches>();
    return *slot;
  }

  // The caches of the origin, or null if it has none.
  const DirectionCaches* find(const Origin& origin) const {
    std::lock_guard lock(mutex_);
    const auto found = caches_.find(origin);
    return found == caches_.end() ? nullptr : found->second.get();
  }

  // Every origin with its caches, sorted by origin.
  std::vector<std::pair<Origin, const DirectionCaches*>> origins() const {
    std::lock_guard lock(mutex_);
    std::vector<std::pair<Origin, const DirectionCaches*>> result;
    for (const auto& [origin, caches] : caches_) result.emplace_back(origin, caches.get());
    return result;
  }

  // Entries over all origins and directions.
  std::size_t size() const {
    std::size_t total = 0;
    for (const auto& [origin, caches] : origins()) total += caches->size();
    return total;
  }

  // Empties every cache. Origins stay, so references returned by caches() stay valid.
  void clear() {
    std::lock_guard lock(mutex_);
    for (auto& [origin, caches] : caches_) caches->clear();
  }

 private:
  mutable std::mutex mutex_;
  std::map<Origin, std::unique_ptr<DirectionCaches>> caches_;
};

}  // namespace cudnn_cache
