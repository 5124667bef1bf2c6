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
// So each thread keeps a memo, per cache, of what its hits ran: the ranking, the place in it of the candidate that ran,
// and what the backend made ready for that candidate (its plan), under the key, the device and whether the call asked
// for determinism (GPUs of one model share one cache, Note [Selection, merge and fallback policy], but each has plans
// of its own). The memo of a cache holds only while the versions it was made under read the same: the perf cache's and
// the plan cache's (Note [Cache versions] in perf_cache.h) and the workspace limit, so the full path would come to the
// same candidate with the same plan. Every call reads them first; where they changed, the thread's memo of that cache
// is dropped whole, so a ranking replaced or a plan evicted lives on in a thread's memo only until that thread's next
// call of the cache. A call its memo holds runs that candidate at once; any other takes the full path (lookup, miss
// policy, walk with fallback), which memoizes where a cached ranking's first eligible candidate ran. A call through a
// fallback, a lent ranking or cuDNN's heuristics is never memoized, so it is counted and warned about as before, and so
// is a memoized candidate that fails (it goes the full path). The hits the memo serves are counted as any hit.

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cudnn_cache/key.h"

namespace cudnn_cache {

template <typename Value>
class CallMemo {
 public:
  // The most calls memoized per cache (inserting past it starts afresh), and the most caches (a thread that
  // meets more, as tests making runtime after runtime do, forgets the one it met first).
  static constexpr std::size_t kLimit = 1024;
  static constexpr std::size_t kCaches = 16;

  // What a cache's memo is made under: the versions of the caches its values come from, and the workspace limit.
  struct Versions {
    std::uint64_t cache = 0;
    std::uint64_t plans = 0;
    std::uint64_t workspace_limit = 0;
    friend bool operator==(const Versions& a, const Versions& b) {
      return a.cache == b.cache && a.plans == b.plans && a.workspace_limit == b.workspace_limit;
    }
    friend bool operator!=(const Versions& a, const Versions& b) { return !(a == b); }
  };

  // The value kept for the call of `key` on `device` through `cache` (deterministic or not), or null. `now`: the
  // versions read for this call, before its lookup; where they differ from the memo's of the cache, it is dropped
  // first.
  const Value* find(const void* cache, int device, const ConvolutionKey& key, bool deterministic, const Versions& now) {
    Calls& calls = of(cache, now);
    const auto found = calls.find(Slot{key, device, deterministic});
    return found == calls.end() ? nullptr : &found->second;
  }

  // Keeps `value` for the call, made under `made` (the versions its find() was given), unless they changed since.
  void insert(const void* cache, int device, const ConvolutionKey& key, bool deterministic, const Versions& made,
              Value value) {
    Calls& calls = of(cache, made);
    if (calls.size() >= kLimit) calls.clear();
    calls.insert_or_assign(Slot{key, device, deterministic}, std::move(value));
  }

  // Forgets the call's value, if any.
  void erase(const void* cache, int device, const ConvolutionKey& key, bool deterministic) {
    for (Memo& memo : memos_) {
      if (memo.cache == cache) memo.calls.erase(Slot{key, device, deterministic});
    }
  }

  // The calls memoized for the cache.
  std::size_t size(const void* cache) const {
    for (const Memo& memo : memos_) {
      if (memo.cache == cache) return memo.calls.size();
    }
    return 0;
  }

 private:
  struct Slot {
    ConvolutionKey key;
    int device;
    bool deterministic;
    friend bool operator==(const Slot& a, const Slot& b) {
      return a.device == b.device && a.deterministic == b.deterministic && a.key == b.key;
    }
  };
  struct SlotHash {
    std::size_t operator()(const Slot& slot) const {
      return KeyHash{}(slot.key) ^ (static_cast<std::size_t>(slot.device) << 1) ^
             static_cast<std::size_t>(slot.deterministic);
    }
  };
  using Calls = std::unordered_map<Slot, Value, SlotHash>;
  struct Memo {
    const void* cache;
    Versions versions;
    Calls calls;
  };

  // The memo of the cache, emptied first unless it was made under `now`.
  Calls& of(const void* cache, const Versions& now) {
    for (Memo& memo : memos_) {
      if (memo.cache != cache) continue;
      if (memo.versions != now) {
        memo.calls.clear();
        memo.versions = now;
      }
      return memo.calls;
    }
    if (memos_.size() >= kCaches) memos_.erase(memos_.begin());
    memos_.push_back(Memo{cache, now, {}});
    return memos_.back().calls;
  }

  std::vector<Memo> memos_;
};

}  // namespace cudnn_cache
