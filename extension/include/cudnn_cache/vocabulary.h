#pragma once

// What the layers share: device memory for a workspace, how the graph search is bounded, and where a lower layer
// writes its log. The runtime (runtime.h) passes these down; nothing here reaches up to it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>

namespace cudnn_cache {

// A line of the log, for a layer below the runtime to write without knowing it (Runtime::log adds the level).
using LogSink = std::function<void(const std::string& line)>;

// Device memory for a cuDNN workspace, given back by `release(context)` when destroyed; empty (no data) when the
// allocator had none. A value: a call that needs a workspace allocates nothing on the host for it.
class Workspace {
 public:
  using Release = void (*)(void* context);

  Workspace() = default;
  Workspace(void* data, void* context, Release release) : data_(data), context_(context), release_(release) {}
  Workspace(Workspace&& other) noexcept { *this = std::move(other); }
  Workspace& operator=(Workspace&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(data_, other.data_);
      std::swap(context_, other.context_);
      std::swap(release_, other.release_);
    }
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { reset(); }

  void* data() const { return data_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void reset() {
    if (release_ != nullptr) release_(context_);
    data_ = context_ = nullptr;
    release_ = nullptr;
  }

  void* data_ = nullptr;
  void* context_ = nullptr;
  Release release_ = nullptr;
};

// Returns a workspace of at least `bytes` bytes, or an empty one when the device has no memory for it.
using WorkspaceAllocator = std::function<Workspace(std::size_t bytes)>;

// The workspace of `bytes` a candidate needs (none for 0 bytes), or nullopt when the allocator cannot give it.
inline std::optional<Workspace> workspace_for(const WorkspaceAllocator& allocate, std::size_t bytes) {
  if (bytes == 0) return Workspace();
  Workspace workspace = allocate(bytes);
  if (!workspace) return std::nullopt;
  return std::optional<Workspace>(std::move(workspace));
}

// What an error about finding nothing to run adds under a workspace limit of `limit` bytes (the limit and the
// fix); "" for no limit (the largest value).
std::string within_workspace_limit(std::uint64_t limit);

// The cores this process may run on (its CPU affinity, which taskset and container CPU sets narrow), at least
// 1: what "0 threads" means for a search's plan builds and for prepare().
int usable_cores();

// A graph-API search's options (Note [Engine configs]); how it times candidates, and how many, are the search's
// own constants (Note [Search bounds] in extension/src/search_bounds.h).
struct GraphSearchOptions {
  bool deterministic = false;  // only configs cuDNN reports deterministic
  // Also rank the deterministic configs against native's deterministic picks in the paired rounds (Note [Never
  // slower than native's pick]): set for the search of a deterministic call's miss, and for every search by the
  // tuning option of that name (tuning ahead of deterministic training). Other searches time native's
  // deterministic pick too, but leave deterministic configs in their first-pass order: the rounds cost time.
  bool rank_deterministic = false;
  // Threads that build the heuristic candidates' plans while the calling thread times them (Note [Parallel
  // candidate builds] in graph_search.cpp); 0: the cores this process may run on. 1 builds on the caller only.
  int build_threads = 0;
  // Offline tuning (Note [Exhaustive search] in graph_search.cpp): every config of heuristics modes A and B and
  // the fallback list, knob variants up to 4 steps away (runtime-compiled engines too), and 5 finalists at least,
  // in place of the search's bounds on candidates.
  bool exhaustive = false;
  // Configs that need more workspace are not timed: the runtime's workspace limit (Note [Workspace limit]).
  std::uint64_t max_workspace_bytes = std::numeric_limits<std::uint64_t>::max();
  // Where the search writes its debug log (its profile and its rounds), where set: the runtime sets it at
  // CUDNN_CACHE_LOG=debug (Runtime::search_options). Not a tuning option.
  LogSink debug_log;
};

}  // namespace cudnn_cache
