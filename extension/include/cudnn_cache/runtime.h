#pragma once

// The process-wide cache and the one operation built on it: run a convolution with its cached algorithm.
//
// Note [Running a cached convolution]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// For a call, the runtime looks the key up in the caches of the call's device (its Origin: the GPU identity
// and this cuDNN's major.minor). On a hit it walks the ranking as Note [Selection, merge and fallback
// policy] says. On a miss the miss policy decides:
//   * tune: time every algorithm now on the call's own buffers (cudnnFind*AlgorithmEx), store the ranking,
//     then run the best;
//   * heuristic: run cuDNN's heuristic order (cudnnGet*Algorithm_v7); nothing is stored, since nothing was
//     measured;
//   * error: throw an Error that names the key, so CI can prove a cache file covers a model.
// A call that cannot run its best cached candidate (out of memory for the workspace, NOT_SUPPORTED, ...)
// counts one fallback and warns once per process; if no cached candidate runs, cuDNN's heuristics do.
//
// The graph API's path (run_graph) is the same walk over engine configs, each run through an execution
// plan built once per key and config and kept in the plan cache (Note [Plan cache]); a config cuDNN refuses
// to build (another release, NOT_SUPPORTED) is a fallback like any other. Its last resort is the legacy
// heuristics. Stored engine configs carry no determinism note, so deterministic calls take the legacy path.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "cudnn_cache/algorithms.h"
#include "cudnn_cache/cache_store.h"

namespace cudnn_cache {

// What happens when a convolution's key is not in the cache; see Note [Running a cached convolution].
enum class MissPolicy { tune, heuristic, error };

// "tune", "heuristic" or "error".
const char* to_string(MissPolicy policy);
// The policy of that name; throws Error naming the valid names otherwise.
MissPolicy miss_policy_from_string(const std::string& name);

// Counters since the process started (or since reset_stats).
struct Stats {
  std::uint64_t hits = 0;       // calls whose key was cached
  std::uint64_t misses = 0;     // calls whose key was not
  std::uint64_t tunes = 0;      // searches run (by misses under the tune policy, and by tune())
  std::uint64_t fallbacks = 0;  // calls that could not run their best candidate
};

// Device memory for a cuDNN workspace, released when destroyed.
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual void* data() = 0;
};

// Returns a workspace of at least `bytes` bytes, or null when the device has no memory for it.
using WorkspaceAllocator = std::function<std::unique_ptr<Workspace>(std::size_t bytes)>;

class Runtime {
 public:
  // The process-wide runtime.
  static Runtime& instance();

  CacheStore& store() { return store_; }

  void set_miss_policy(MissPolicy policy) { miss_policy_.store(policy); }
  MissPolicy miss_policy() const { return miss_policy_.load(); }

  Stats stats() const;
  void reset_stats();

  // Where warnings go (the torch layer routes them to TORCH_WARN); stderr by default.
  void set_warning_handler(std::function<void(const std::string&)> handler);

  // The caches of CUDA device `index`; its identity is read once.
  DirectionCaches& caches_for_device(int index);

  // Runs the convolution of `key` on the buffers; see Note [Running a cached convolution]. With
  // `deterministic`, only candidates cuDNN reports as deterministic are run.
  template <typename Traits>
  void run(cudnnHandle_t handle, int device, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
           const WorkspaceAllocator& allocate, bool deterministic);

  // Times every algorithm for `key` now, on the buffers, and stores the ranking (merged with what is there).
  // The buffer the direction writes is overwritten.
  template <typename Traits>
  Ranking<Traits> tune(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                       const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate);

  // run() for the graph API's engine configs of direction D; see Note [Running a cached convolution].
  template <Direction D>
  void run_graph(cudnnHandle_t handle, int device, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                 const WorkspaceAllocator& allocate, bool deterministic);

  // tune() for the graph API: times every engine config (search_engine_configs) and stores the best.
  template <Direction D>
  Ranking<GraphTraits<D>> tune_graph(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                                     const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate);

  // Builds the execution plan of the best engine config of every graph-API entry of CUDA device `device`
  // into the plan cache, so first calls build nothing. Returns how many plans it built; a config cuDNN
  // refuses is skipped (its first call falls back). Safe to call from another thread than the one training.
  std::size_t prepare(cudnnHandle_t handle, int device);

 private:
  static constexpr int kMaxDevices = 64;

  void count_fallback(const ConvolutionKey& key, const std::string& why);

  CacheStore store_;
  std::atomic<MissPolicy> miss_policy_{MissPolicy::tune};
  std::atomic<std::uint64_t> hits_{0}, misses_{0}, tunes_{0}, fallbacks_{0};
  std::atomic<bool> warned_{false};
  std::mutex mutex_;  // guards the handler and the filling of device_caches_
  std::function<void(const std::string&)> warning_handler_;
  std::array<std::atomic<DirectionCaches*>, kMaxDevices> device_caches_{};
};

}  // namespace cudnn_cache
