#pragma once

// Note [Each thread's own hits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch keeps its cuDNN execution plans in thread-local caches: a call that finds its plan takes no lock and
// writes nothing another thread reads. The runtime's caches are shared by every thread (prepare() fills them from
// threads of its own; one search serves every thread), so a hit there takes the perf cache's shared lock, bumps
// the hit counter, takes the plan cache's shared lock and copies two shared pointers: writes to cache lines that
// other threads' calls write too. A training step runs its forward on the main thread and its backward on
// autograd's device thread, so those lines move between cores on every call. Measured on a 2-core VM
// (tests/bench/bench_core.cpp, `hit_lookup_*`, 2026-12-05): those lookups took 0.14 us per call on one thread
// and 0.20 us on two threads taking turns; through the memo below, 0.034 and 0.08 us.
//
// So each thread keeps a memo, per cache, of what its hits ran: the ranking, the place in it of the candidate
// that ran, and what the backend made ready for that candidate (its plan), under the key and whether the call
// asked for determinism. A call whose memo entry is current runs that candidate at once: current means that the
// versions it was made under (the perf cache's and the plan cache's, Note [Cache versions] in perf_cache.h, and
// the workspace limit) still read the same, so the full path would come to the same candidate with the same
// plan. Any other call takes the full path (lookup, miss policy, walk with fallback), which makes the entry again
// where a cached ranking's first eligible candidate ran; a call through a fallback, a lent ranking or cuDNN's
// heuristics is never memoized, so it is counted and warned about as before, and so is a memoized candidate that
// fails (it goes the full path). The hits the memo serves are counted as any hit.
//
// A memo keeps alive what it holds: a ranking replaced or a plan evicted meanwhile lives until the thread next
// meets a stale entry, which clears its whole memo of that cache type, as reaching kLimit entries does. So a
// thread holds at most kLimit rankings and plans of each cache type beyond what the caches hold.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>

#include "cudnn_cache/key.h"

namespace cudnn_cache {

template <typename Value>
class CallMemo {
 public:
  static constexpr std::size_t kLimit = 1024;

  // What an entry was made under: the versions of the caches its value came from, and the workspace limit.
  struct Versions {
    std::uint64_t cache = 0;
    std::uint64_t plans = 0;
    std::uint64_t workspace_limit = 0;
    friend bool operator==(const Versions& a, const Versions& b) {
      return a.cache == b.cache && a.plans == b.plans && a.workspace_limit == b.workspace_limit;
    }
  };

  // The value kept for the call of `key` on `cache` (deterministic or not) if it was made under `now`, else null.
  // An entry made under other versions is stale: the whole memo is cleared.
  const Value* find(const void* cache, const ConvolutionKey& key, bool deterministic, const Versions& now) {
    const auto found = entries_.find(Slot{cache, key, deterministic});
    if (found == entries_.end()) return nullptr;
    if (found->second.first == now) return &found->second.second;
    entries_.clear();
    return nullptr;
  }

  // Keeps `value` for the call, made under `made` (read before the lookup it came from).
  void insert(const void* cache, const ConvolutionKey& key, bool deterministic, const Versions& made, Value value) {
    if (entries_.size() >= kLimit) entries_.clear();
    entries_.insert_or_assign(Slot{cache, key, deterministic}, std::make_pair(made, std::move(value)));
  }

  // Forgets the call's entry, if any.
  void erase(const void* cache, const ConvolutionKey& key, bool deterministic) {
    entries_.erase(Slot{cache, key, deterministic});
  }

  std::size_t size() const { return entries_.size(); }

 private:
  struct Slot {
    const void* cache;
    ConvolutionKey key;
    bool deterministic;
    friend bool operator==(const Slot& a, const Slot& b) {
      return a.cache == b.cache && a.deterministic == b.deterministic && a.key == b.key;
    }
  };
  struct SlotHash {
    std::size_t operator()(const Slot& slot) const {
      return KeyHash{}(slot.key) ^ (std::hash<const void*>{}(slot.cache) << 1) ^ static_cast<std::size_t>(slot.deterministic);
    }
  };

  std::unordered_map<Slot, std::pair<Versions, Value>, SlotHash> entries_;
};

}  // namespace cudnn_cache
