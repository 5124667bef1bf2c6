#pragma once

// Note [One search per key]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A search times every candidate of a key on the GPU, for up to seconds. Threads that miss the same key at once
// (a model run from several threads, or autograd's backward thread meeting a key the forward thread is tuning)
// would each run one, and each would time its candidates while the others load the GPU, so every ranking
// would be skewed and the tuning time paid several times over. So the runtime searches a key once at a time:
// the first thread to miss it searches and stores the ranking, and the others wait for that search to end and
// then take what it stored, as a hit would (counted in stats().tune_waits). They wait rather than run cuDNN's
// heuristic choice meanwhile, because that run would share the GPU with the search's timing. A search that
// throws passes its error to the threads that waited for it, as their own search would have; the next miss
// of the key searches again.

#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "cudnn_cache/key.h"

namespace cudnn_cache {

class InFlight {
 public:
  // Runs `work` for the key in `owner` (a cache: keys of different caches are different work) unless a call for
  // the same key and owner is running it now; then waits for that call's work to end instead, and rethrows its
  // exception if it threw. Returns whether this call ran `work`.
  template <typename Work>
  bool run_once(const void* owner, const ConvolutionKey& key, Work&& work) {
    const Slot slot{owner, key};
    std::promise<void> finished;
    std::shared_future<void> other;
    {
      const std::lock_guard lock(mutex_);
      const auto [running, inserted] = running_.try_emplace(slot, finished.get_future().share());
      if (!inserted) other = running->second;
    }
    if (other.valid()) {
      other.get();
      return false;
    }
    try {
      std::forward<Work>(work)();
    } catch (...) {
      end(slot);
      finished.set_exception(std::current_exception());
      throw;
    }
    end(slot);
    finished.set_value();
    return true;
  }

 private:
  struct Slot {
    const void* owner;
    ConvolutionKey key;
    friend bool operator==(const Slot& a, const Slot& b) { return a.owner == b.owner && a.key == b.key; }
  };
  struct SlotHash {
    std::size_t operator()(const Slot& slot) const {
      return KeyHash{}(slot.key) ^ (std::hash<const void*>{}(slot.owner) * 1099511628211u);
    }
  };

  // Forgets the slot before its waiters are woken, so a miss after the work ended runs it again.
  void end(const Slot& slot) {
    const std::lock_guard lock(mutex_);
    running_.erase(slot);
  }

  std::mutex mutex_;
  std::unordered_map<Slot, std::shared_future<void>, SlotHash> running_;
};

}  // namespace cudnn_cache
