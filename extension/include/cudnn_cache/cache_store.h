#pragma once

// All perf caches of a process, by origin (device identity + cuDNN major.minor).

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "cudnn_cache/device.h"
#include "cudnn_cache/perf_cache.h"
#include "cudnn_cache/plan_store.h"

namespace cudnn_cache {

// Note [Pending keys]
// ~~~~~~~~~~~~~~~~~~~
// A key the process met and did not tune is pending: a miss under the record policy (or under tune while the
// stream captured a CUDA graph), per backend. It is kept with its origin's caches, saved in the file (format 4)
// and merged like entries, and tuned later, off the training path: by cudnn_cache.tune_pending() (between
// epochs), `python -m cudnn_cache tune FILE` (offline, on a GPU of the origin) or distributed.sync() (split
// between ranks). A key carries every size, stride and parameter, so it is enough to time it on. A pending key
// that is cached by now (tuned here, or in a file merged since) is no longer pending: it is not listed nor saved.
class PendingKeys {
 public:
  // Remembers the key as pending for the graph API's caches (`graph`) or the legacy ones; a repeat is kept once.
  void insert(bool graph, const ConvolutionKey& key) {
    std::lock_guard lock(mutex_);
    (graph ? graph_ : legacy_).insert(key);
  }
  // The keys pending for that backend, sorted.
  std::vector<ConvolutionKey> keys(bool graph) const {
    std::lock_guard lock(mutex_);
    const std::set<ConvolutionKey>& keys = graph ? graph_ : legacy_;
    return {keys.begin(), keys.end()};
  }
  void clear() {
    std::lock_guard lock(mutex_);
    graph_.clear();
    legacy_.clear();
  }

 private:
  mutable std::mutex mutex_;
  std::set<ConvolutionKey> graph_, legacy_;
};

// The perf caches of one origin: the legacy algorithms' and the graph API's engine configs, per direction;
// the serialized plans of runtime-compiled engine configs (Note [Stored plans]) and of attention graphs.
struct DirectionCaches {
  PerfCache<ForwardTraits> forward;
  PerfCache<BackwardDataTraits> backward_data;
  PerfCache<BackwardFilterTraits> backward_filter;
  PerfCache<GraphForwardTraits> graph_forward;
  PerfCache<GraphBackwardDataTraits> graph_backward_data;
  PerfCache<GraphBackwardFilterTraits> graph_backward_filter;
  PlanStore plans;
  PendingKeys pending;  // Note [Pending keys]
  AttentionPlanStore attention;  // Note [Persisted attention plans] in attention.h

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

  // Whether the graph API's caches (`graph`) or the legacy ones hold the key, in its direction's cache.
  bool holds(bool graph, const ConvolutionKey& key) const;

  // The keys pending for that backend that are not cached by now, sorted (Note [Pending keys]).
  std::vector<ConvolutionKey> pending_keys(bool graph) const {
    std::vector<ConvolutionKey> keys = pending.keys(graph);
    keys.erase(std::remove_if(keys.begin(), keys.end(), [&](const ConvolutionKey& key) { return holds(graph, key); }),
               keys.end());
    return keys;
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
    pending.clear();
    attention.clear();
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

inline bool DirectionCaches::holds(bool graph, const ConvolutionKey& key) const {
  bool held = false;
  for_each_cache([&](auto traits) {
    using Traits = decltype(traits);
    if (is_graph<Traits> == graph && static_cast<std::int32_t>(Traits::direction) == key.direction) {
      held = get<Traits>().find(key) != nullptr;
    }
  });
  return held;
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

// Calls f(origin, Traits{}, key, ranking) for every ranking a cache of the store holds by replace() (Note [A
// settled key replaces the file's] in perf_cache.h), by origin, then cache, then key; the ranking is f's to keep.
template <typename F>
void for_each_replaced(const CacheStore& store, F&& f) {
  for (const auto& [origin, caches] : store.origins()) {
    for_each_cache([&, origin = origin, caches = caches](auto traits) {
      for (auto& [key, ranking] : caches->template get<decltype(traits)>().replaced_entries()) {
        f(origin, traits, key, std::move(ranking));
      }
    });
  }
}

}  // namespace cudnn_cache
