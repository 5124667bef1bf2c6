#include "cudnn_cache/runtime.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <sched.h>

#include "backends.h"
#include "call_memo.h"
#include "cudnn_cache/error.h"
#include "elapsed.h"
#include "handle_pool.h"
#include "in_flight.h"
#include "plan_cache.h"
#include "search_bounds.h"

namespace cudnn_cache {

namespace {

// The fallback warning's first sentence for a call whose best cached candidate could not run.
std::string could_not_run(const ConvolutionKey& key, const std::string& why) {
  return detail::concat("the best cached algorithm could not run (", why, ") for ", key,
                        "; running the next candidate");
}

// What a call may run: deterministic candidates only when that is asked for, and none whose workspace is over
// the runtime's limit (Note [Workspace limit]).
struct Constraints {
  bool deterministic = false;
  std::uint64_t workspace_limit = Runtime::kNoWorkspaceLimit;
};

// Why a walk found nothing to run when no candidate failed.
std::string none_eligible(const Constraints& constraints) {
  return (constraints.deterministic ? "no deterministic candidate" : "no candidate that succeeded when measured") +
         within_workspace_limit(constraints.workspace_limit);
}

// Whether cuDNN reports the candidate deterministic (Note [Deterministic calls]).
bool deterministic(const EngineCandidate& candidate) { return candidate.deterministic(); }
template <typename Traits>
bool deterministic(const Candidate<Traits>& candidate) { return candidate.determinism == CUDNN_DETERMINISTIC; }

// Whether a call may run the candidate: it ran when measured, its workspace is within the limit, and it is
// deterministic when that is asked for.
template <typename Candidate>
bool eligible(const Candidate& candidate, const Constraints& constraints) {
  if (!candidate.succeeded() || candidate.workspace_bytes > constraints.workspace_limit) return false;
  return !constraints.deterministic || deterministic(candidate);
}

// The allocator a call under a workspace limit uses: it refuses more than the limit, so that no call exceeds it
// even where a plan's workspace differs from the one its config was stored with.
class BoundedAllocator {
 public:
  BoundedAllocator(const WorkspaceAllocator& allocate, std::uint64_t limit)
      : allocate_(allocate), limit_(limit),
        bounded_(limit == Runtime::kNoWorkspaceLimit
                     ? WorkspaceAllocator()
                     : WorkspaceAllocator([this](std::size_t bytes) {
                         return bytes > limit_ ? Workspace() : allocate_(bytes);
                       })) {}
  BoundedAllocator(const BoundedAllocator&) = delete;
  BoundedAllocator& operator=(const BoundedAllocator&) = delete;

  const WorkspaceAllocator& get() const { return bounded_ ? bounded_ : allocate_; }

 private:
  const WorkspaceAllocator& allocate_;
  std::uint64_t limit_;
  WorkspaceAllocator bounded_;  // empty without a limit: no wrapper on the hot path
};

// Another origin whose cache of Traits holds the key, if any (the first in origin order).
template <typename Traits>
std::optional<Origin> cached_elsewhere(const CacheStore& store, const Origin& origin, const ConvolutionKey& key) {
  for (const auto& [other, caches] : store.origins()) {
    if (other != origin && caches->template get<Traits>().find(key)) return other;
  }
  return std::nullopt;
}

// Whether the handle's stream is capturing a CUDA graph. A stream that cannot tell (the legacy default
// stream while another captures) counts as capturing.
bool capturing(cudnnHandle_t handle) {
  cudaStream_t stream = nullptr;
  CUDNN_CACHE_CHECK(cudnnGetStream(handle, &stream));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clears it for whoever checks next
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Throws an Error saying `what` cannot run while the handle's stream captures a CUDA graph.
void require_not_capturing(cudnnHandle_t handle, const ConvolutionKey& key) {
  CUDNN_CACHE_REQUIRE(!capturing(handle), "cannot tune ", key, " while its stream is capturing a CUDA graph: ",
                      "timing synchronises the stream, which ends the capture. Tune before capturing");
}

// What a walk over candidates came to: whether one ran, and why the last eligible one that could not run did
// not ("" when none failed); the one that ran, by its place, and what the backend made ready for it.
template <typename Chosen>
struct Walk {
  bool ran = false;
  std::string why_not;
  std::size_t position = 0;
  typename Chosen::Ready ready;
};

// The one walk of every call (Note [Running a cached convolution]): runs the candidates in order, skipping those
// the call may not run, until one runs. `ranked`: the first candidate leads a ranking (the backend may keep
// what it builds for it); cuDNN's heuristic order is not one.
template <typename Chosen, typename Candidates>
Walk<Chosen> walk(Chosen& backend, const Candidates& candidates, bool ranked, const ConvolutionBuffers& buffers,
                  const WorkspaceAllocator& allocate, const Constraints& constraints) {
  Walk<Chosen> walked;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const auto& candidate = candidates[i];
    if (!eligible(candidate, constraints)) continue;
    typename Chosen::Ready ready = backend.ready(candidate, ranked && i == 0);  // leads by place, eligible or not
    const std::string* refusal = Chosen::refusal(ready);
    std::string failure = refusal ? *refusal : backend.run(ready, candidate, buffers, allocate);
    if (failure.empty()) {
      walked.ran = true;
      walked.position = i;
      walked.ready = std::move(ready);
      return walked;
    }
    walked.why_not = std::move(failure);
  }
  return walked;
}

// The last resort of every call, and the heuristic miss policy's choice: cuDNN's heuristic order, run through
// the legacy API and stored nowhere. `why_not_cached` says why the cached candidates did not run, if any did not.
template <typename Traits>
void run_heuristics(LegacyBackend<Traits>& legacy, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                    const WorkspaceAllocator& allocate, const Constraints& constraints,
                    const std::string& why_not_cached) {
  const auto walked = walk(legacy, legacy.heuristics(), false, buffers, allocate, constraints);
  if (walked.ran) return;
  throw Error(detail::concat("cudnn_cache: no cuDNN engine or algorithm could run ", key, " (last: ",
                             why_not_cached.empty() ? "" : why_not_cached + "; ",
                             walked.why_not.empty() ? none_eligible(constraints) : walked.why_not, ")"));
}

// The value of an environment variable that holds a count, if it is set and holds one; a value that is not one
// is reported on stderr and ignored (the Python package refuses it at import first).
std::optional<std::uint64_t> count_variable(const char* variable, const char* what) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const char* end = value + std::strlen(value);
  std::uint64_t count = 0;
  const auto [stop, failure] = std::from_chars(value, end, count);
  if (failure == std::errc() && stop == end) return count;
  std::cerr << "cudnn_cache: " << variable << ": '" << value << "' is not a non-negative integer (" << what
            << "); it is ignored\n";
  return std::nullopt;
}

// The value of an environment variable that names a setting, parsed by `parse` (one of the *_from_string
// functions), if it is set and names one; a name that is not one is reported on stderr, saying what `stays`,
// and ignored (the Python package refuses it at import first).
template <typename Parse>
auto named_variable(const char* variable, Parse parse, const char* stays) -> std::optional<decltype(parse(""))> {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  try {
    return parse(value);
  } catch (const Error& e) {
    std::cerr << "cudnn_cache: " << variable << ": " << e.what() << "; " << stays << '\n';
    return std::nullopt;
  }
}

// The bounds of the runtime's searches (Note [Search bounds]): the constants, unless a test set others.
std::mutex search_bounds_mutex;
graph_internal::SearchBounds runtime_search_bounds;  // guarded by search_bounds_mutex

graph_internal::SearchBounds current_search_bounds() {
  std::lock_guard lock(search_bounds_mutex);
  return runtime_search_bounds;
}

}  // namespace

std::size_t SpreadCounter::shard() {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % kShards;
  return mine;
}

Runtime& Runtime::instance() {
  static Runtime runtime;
  return runtime;
}

Runtime::Runtime()
    : plans_(std::make_unique<PlanCache>(*this)),
      searching_(std::make_unique<InFlight>()),
      backend_(graph_backend_available() ? Backend::graph : Backend::legacy) {
  if (const auto level = named_variable("CUDNN_CACHE_LOG", log_level_from_string, "logging stays off")) {
    log_level_ = *level;
  }
  if (const auto limit = count_variable("CUDNN_CACHE_PLAN_CACHE_LIMIT", "the most execution plans kept; 0: no bound")) {
    plans_->set_limit(*limit);
  }
  if (const auto limit = count_variable("CUDNN_CACHE_WORKSPACE_LIMIT", "the most bytes of workspace a call uses")) {
    workspace_limit_ = *limit;
  }
  if (const auto policy =
          named_variable("CUDNN_CACHE_MISS_POLICY", miss_policy_from_string, "the miss policy stays 'tune'")) {
    miss_policy_ = *policy;
  }
}

void Runtime::log(LogLevel level, const std::string& message) const {
  if (!logs(level)) return;
  std::lock_guard lock(mutex_);
  if (log_handler_) {
    log_handler_(level, message);
  } else {
    std::cerr << "cudnn_cache [" << to_string(level) << "] " << message << '\n';
  }
}

void Runtime::set_log_handler(std::function<void(LogLevel, const std::string&)> handler) {
  std::lock_guard lock(mutex_);
  log_handler_ = std::move(handler);
}

Runtime::~Runtime() {
  stopping_.store(true);  // a prepare still running builds no more plans
  finish_background();
}

void Runtime::set_backend(Backend backend) {
  CUDNN_CACHE_REQUIRE(backend == Backend::legacy || graph_backend_available(), "the graph backend needs cuDNN 8.9 "
                      "or later, and this process has cuDNN ", CudnnVersion::of_library(), "; use 'legacy'");
  backend_ = backend;
}

void Runtime::set_search_options(const GraphSearchOptions& options) {
  CUDNN_CACHE_REQUIRE(options.build_threads >= 0, "tuning option build_threads must be >= 0 (0: the cores this "
                      "process may use), got ", options.build_threads);
  std::lock_guard lock(mutex_);
  search_options_ = options;
}

GraphSearchOptions Runtime::search_options() const {
  GraphSearchOptions options;
  {
    std::lock_guard lock(mutex_);
    options = search_options_;
  }
  if (logs(LogLevel::debug)) options.debug_log = [this](const std::string& line) { log(LogLevel::debug, line); };
  return options;
}

void Runtime::set_plan_cache_limit(std::size_t limit) { plans_->set_limit(limit); }

std::size_t Runtime::plan_cache_limit() const { return plans_->limit(); }

Stats Runtime::stats() const {
  return {hits_.load(),
          misses_.load(),
          tunes_.load(),
          fallbacks_.load(),
          tune_us_.load(),
          plans_->plans_built.load(),
          plans_->build_us.load(),
          plans_->plans_deserialized.load(),
          plans_->plan_rebuilds.load(),
          plans_->plan_evictions.load(),
          capture_misses_.load(),
          tune_waits_.load(),
          lent_.load(),
          plans_->size()};
}

void Runtime::reset_stats() {
  hits_.reset();
  for (auto* counter : {&misses_, &tunes_, &fallbacks_, &tune_us_, &plans_->plans_built, &plans_->build_us,
                        &plans_->plans_deserialized, &plans_->plan_rebuilds, &plans_->plan_evictions,
                        &capture_misses_, &tune_waits_, &lent_}) {
    *counter = 0;
  }
}

void Runtime::set_warning_handler(std::function<void(const std::string&)> handler) {
  std::lock_guard lock(mutex_);
  warning_handler_ = std::move(handler);
}

DirectionCaches& Runtime::caches_for_device(int index) {
  CUDNN_CACHE_REQUIRE(index >= 0 && index < kMaxDevices, "CUDA device index ", index, " is out of range");
  if (DirectionCaches* caches = device_caches_[index].load(std::memory_order_acquire)) return *caches;
  const Origin origin = Origin::of_device(index);  // outside the lock: it calls into CUDA
  std::lock_guard lock(mutex_);
  DirectionCaches& caches = store_.caches(origin);
  device_origins_[index] = origin;
  device_caches_[index].store(&caches, std::memory_order_release);
  return caches;
}

const Origin& Runtime::origin_of_device(int index) {
  caches_for_device(index);  // reads the identity once; device_origins_[index] is set before its slot
  return device_origins_[index];
}

void Runtime::record_miss(const Origin& origin, Backend backend, const ConvolutionKey& key) {
  store_.caches(origin).pending.insert(backend == Backend::graph, key);
}

std::vector<RecordedMiss> Runtime::recorded_misses() const {
  std::vector<RecordedMiss> result;
  for (const auto& [origin, caches] : store_.origins()) {
    for (const Backend backend : {Backend::graph, Backend::legacy}) {
      for (const ConvolutionKey& key : caches->pending_keys(backend == Backend::graph)) {
        result.push_back({origin, backend, key});
      }
    }
  }
  return result;
}

void Runtime::clear_recorded_misses() {
  for (const auto& [origin, caches] : store_.origins()) store_.caches(origin).pending.clear();
}

void Runtime::count_fallback(const std::string& what) {
  ++fallbacks_;
  if (warned_.exchange(true)) return;
  const std::string message = detail::concat(
      "cudnn_cache: ", what, ". Counted in stats()['fallbacks']; this warning is shown once per process.");
  std::lock_guard lock(mutex_);
  if (warning_handler_) {
    warning_handler_(message);
  } else {
    std::cerr << message << '\n';
  }
}

namespace {

// What a thread's hit of a key ran (Note [Each thread's own hits]): the ranking, the place in it of the candidate
// that ran, and what the backend made ready for that candidate.
template <typename Traits>
struct Memoized {
  std::shared_ptr<const Ranking<Traits>> ranking;
  std::size_t position = 0;
  typename BackendOf<Traits>::type::Ready ready;
};

// The calling thread's memo of the caches of Traits.
template <typename Traits>
CallMemo<Memoized<Traits>>& call_memo() {
  thread_local CallMemo<Memoized<Traits>> memo;
  return memo;
}

}  // namespace

// Note [Running a cached convolution] is this function; Note [One run path] says what a backend adds to it.
template <typename Traits>
void Runtime::run(cudnnHandle_t handle, int device, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                  const WorkspaceAllocator& allocate, bool deterministic) {
  using Legacy = LegacyTraits<Traits::direction>;
  DirectionCaches& caches = caches_for_device(device);
  if constexpr (is_graph<Traits>) {  // Note [Prepare at the first call]
    if (prepare_at_first_call_[static_cast<std::size_t>(device)].load(std::memory_order_relaxed)) {
      start_first_call_prepare(device);
    }
  }
  auto backend = backend_for<Traits>(handle, device, key, *plans_, caches);
  PerfCache<Traits>& cache = caches.get<Traits>();
  const Constraints constraints{deterministic, workspace_limit()};
  const BoundedAllocator bounded(allocate, constraints.workspace_limit);
  // Note [Each thread's own hits]; the versions first, so that a change after them makes what follows stale.
  CallMemo<Memoized<Traits>>& memo = call_memo<Traits>();
  const typename CallMemo<Memoized<Traits>>::Versions versions{cache.version(), plans_->version(),
                                                               constraints.workspace_limit};
  const bool memoizes = !logs(LogLevel::debug);  // a debug log shows every hit, which the memo would not
  if (memoizes) {
    if (const Memoized<Traits>* hit = memo.find(&cache, device, key, deterministic, versions)) {
      if (backend.run(hit->ready, (*hit->ranking)[hit->position], buffers, bounded.get()).empty()) {
        hits_.add(1);
        return;
      }
      memo.erase(&cache, device, key, deterministic);  // the full path walks it again, and counts what it passes over
    }
  }
  const Found<Traits> found = lookup<Traits>(handle, device, cache, key, backend, buffers, allocate, deterministic);
  std::string why_not;  // why the cached candidates did not run, when they did not
  if constexpr (is_graph<Traits>) {  // Note [Deterministic calls]
    if (deterministic && found.ranking && !found.lent &&
        std::none_of(found.ranking->begin(), found.ranking->end(),
                     [](const EngineCandidate& config) { return config.deterministic(); })) {
      return run<Legacy>(handle, device, key, buffers, allocate, true);
    }
  }
  if (found.ranking) {
    auto walked = walk(backend, *found.ranking, !found.lent, buffers, bounded.get(), constraints);
    if (walked.ran && walked.why_not.empty() && !found.lent && memoizes) {
      memo.insert(&cache, device, key, deterministic, versions,
                  Memoized<Traits>{found.ranking, walked.position, std::move(walked.ready)});
    }
    if (walked.ran && (walked.why_not.empty() || found.lent)) return;
    if (!found.lent) {  // a lent candidate passed over is no fallback: nothing was cached for the key
      why_not = walked.why_not.empty() ? none_eligible(constraints) : std::move(walked.why_not);
      count_fallback(could_not_run(key, why_not));  // a cached candidate passed over
      if (walked.ran) return;
    }
  }
  if constexpr (is_graph<Traits>) {
    if (!found.ranking || found.lent) {  // nothing tuned for the key: Note [Native heuristics' choice]
      auto chosen = std::make_shared<const Ranking<Traits>>(
          backend.native_choice(deterministic, !capturing(handle), constraints.workspace_limit));
      if (walk(backend, *chosen, true, buffers, bounded.get(), constraints).ran) {
        cache.lend(key, std::move(chosen));
        return;
      }
    }
    LegacyBackend<Legacy> legacy(handle, key);
    run_heuristics(legacy, key, buffers, bounded.get(), constraints, why_not);
  } else {
    run_heuristics(backend, key, buffers, bounded.get(), constraints, why_not);
  }
}

template <typename Traits>
Ranking<Traits> Runtime::tune(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                              const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate) {
  require_not_capturing(handle, key);
  DirectionCaches& caches = caches_for_device(device);
  auto backend = backend_for<Traits>(handle, device, key, *plans_, caches);
  const Ranking<Traits> ranking = search<Traits>(backend, key, buffers, allocate, false);
  caches.get<Traits>().insert(key, ranking);
  return ranking;
}

template <typename Traits, typename Chosen>
Ranking<Traits> Runtime::search(Chosen& backend, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                                const WorkspaceAllocator& allocate, bool deterministic) {
  const auto started = std::chrono::steady_clock::now();
  GraphSearchOptions options = search_options();
  options.max_workspace_bytes = workspace_limit();  // Note [Workspace limit]
  options.rank_deterministic = options.rank_deterministic || deterministic;
  const Ranking<Traits> ranking = backend.search(buffers, allocate, options, current_search_bounds());
  const std::uint64_t took_us = microseconds_since(started);
  ++tunes_;
  tune_us_ += took_us;
  if (logs(LogLevel::debug)) {  // the search's duration last, for profiling cold starts from the log
    log(LogLevel::debug, detail::concat("tuned: ", ranking.size(), " ", Chosen::kind, "s ranked for ", key, "; best ",
                                        Traits::describe(ranking.front()), " at ", ranking.front().time_ms,
                                        " ms; the search took ", took_us / 1000, " ms"));
  }
  return ranking;
}

// The ranking cached for the key, or what the miss policy makes of a miss: a search run now and stored (tune;
// one at a time per key, Note [One search per key]), nothing (heuristic: the caller runs cuDNN's heuristics),
// the nearest key's ranking, lent (nearest), or an Error naming the key (error).
// Under the record and nearest policies the miss is also remembered as pending, for the device's cache of the
// backend. A miss under the tune policy while the stream captures a CUDA graph is a record miss, counted in
// capture_misses: nothing may be timed during a capture (Note [Running a cached convolution]).
template <typename Traits, typename Chosen>
Runtime::Found<Traits> Runtime::lookup(cudnnHandle_t handle, int device, PerfCache<Traits>& cache,
                                       const ConvolutionKey& key, Chosen& backend, const ConvolutionBuffers& buffers,
                                       const WorkspaceAllocator& allocate, bool deterministic) {
  const char* kind = Chosen::kind;
  std::shared_ptr<const Ranking<Traits>> ranking = cache.find(key);
  if (ranking) {
    hits_.add(1);
    if (logs(LogLevel::debug)) {
      log(LogLevel::debug, detail::concat("hit: ", kind, " ", Traits::describe(ranking->front()), " for ", key));
    }
    return {std::move(ranking)};
  }
  ++misses_;
  MissPolicy policy = miss_policy();
  const bool deferred = policy == MissPolicy::tune && capturing(handle);
  if (deferred) {
    ++capture_misses_;
    policy = MissPolicy::record;
  }
  if (policy != MissPolicy::tune && policy != MissPolicy::error) {  // a key lent before runs what it was lent
    if (auto lent = cache.lent(key)) return {std::move(lent), true};
  }
  if (logs(LogLevel::debug)) {
    log(LogLevel::debug, detail::concat("miss (policy '", to_string(policy), "'",
                                        deferred ? ", in CUDA-graph capture: tuned outside it" : "", "): no ", kind,
                                        " for ", key));
  }
  // An entry measured on another GPU or with another cuDNN is never used (Note [Selection, merge and fallback
  // policy]), but a call that finds one is told so and counted.
  const Origin& origin = origin_of_device(device);
  const std::optional<Origin> elsewhere = cached_elsewhere<Traits>(store_, origin, key);
  const std::string only_elsewhere =
      elsewhere ? detail::concat(" (the cache holds it only for ", *elsewhere, ", not for ", origin, ")") : "";
  if (policy == MissPolicy::error) {
    throw Error(detail::concat("cudnn_cache: no cached ", kind, " for ", key, only_elsewhere,
                               " and the miss policy is 'error'. Run scripts/warm_start.py for this model and input "
                               "shape, then load its file"));
  }
  if (elsewhere) {
    count_fallback(detail::concat("no cached ", kind, " for ", key, only_elsewhere, "; the miss policy '",
                                  to_string(policy), "' applies. Run the warm start on this GPU and cuDNN to cache it "
                                  "for them"));
  }
  if (policy == MissPolicy::record || policy == MissPolicy::nearest) record_miss(origin, Chosen::backend, key);
  if (policy == MissPolicy::nearest) return {lend(cache, key, backend), true};
  if (policy == MissPolicy::tune) {
    const bool searched = searching_->run_once(&cache, key, [&] {
      ranking =
          std::make_shared<const Ranking<Traits>>(search<Traits>(backend, key, buffers, allocate, deterministic));
      cache.insert(key, *ranking);
    });
    if (!searched) {  // another thread searched it meanwhile (null if the cache was cleared since)
      ++tune_waits_;
      ranking = cache.find(key);
    }
  }
  return {std::move(ranking)};
}

// What the nearest miss policy lends the key, lent to it in the cache: what of the nearest key's ranking the
// backend may run for it (none when the cache holds no key of its family). Note [Nearest key].
template <typename Traits, typename Chosen>
std::shared_ptr<const Ranking<Traits>> Runtime::lend(PerfCache<Traits>& cache, const ConvolutionKey& key,
                                                     Chosen& backend) {
  const auto [neighbour, neighbours] = cache.nearest(key);
  std::shared_ptr<const Ranking<Traits>> lent;
  if (neighbours) {
    Ranking<Traits> borrowed = backend.borrow(*neighbours);
    // Shared rather than copied when the key may run the neighbour's ranking as it is.
    lent = borrowed == *neighbours ? neighbours : std::make_shared<const Ranking<Traits>>(std::move(borrowed));
  } else {
    lent = std::make_shared<const Ranking<Traits>>();
  }
  cache.lend(key, lent);
  ++lent_;
  if (logs(LogLevel::debug)) {
    log(LogLevel::debug,
        neighbours ? detail::concat("lent: ", lent->size(), " of ", neighbours->size(), " ", Chosen::kind, "s of ",
                                    neighbour, " to ", key)
                   : detail::concat("lent: nothing (no key of its family is cached) to ", key));
  }
  return lent;
}

template <Direction D>
void Runtime::convolve(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                       const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate, bool deterministic) {
  if (backend() == Backend::graph) return run<GraphTraits<D>>(handle, device, key, buffers, allocate, deterministic);
  run<LegacyTraits<D>>(handle, device, key, buffers, allocate, deterministic);
}

template <Direction D>
void Runtime::tune_direction(Backend backend, cudnnHandle_t handle, int device, const ConvolutionKey& key,
                             const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate) {
  if (backend == Backend::graph) {
    tune<GraphTraits<D>>(handle, device, key, buffers, allocate);
  } else {
    tune<LegacyTraits<D>>(handle, device, key, buffers, allocate);
  }
}

// Note [Prepare beside a capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// prepare()'s threads make cuDNN handles (cudnnCreate allocates device memory) and build plans (a runtime-compiled
// engine loads a module): calls CUDA prohibits on every thread while any thread captures a CUDA graph in the
// global mode, PyTorch's default. A background prepare racing a torch.cuda.graph() capture broke both (H100,
// 2026-12-05, 10 of 12 tries: the capture raised "operation failed due to a previous error during capture",
// cudnnCreate failed with DEVICE_ALLOCATION_FAILED). None of these calls is stream work, so none can become part
// of another thread's capture: each of prepare's threads puts itself in the relaxed capture mode, under which
// CUDA lets that thread make them whatever other threads capture.
namespace {
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // the thread's own while the guard lives
};
}  // namespace

// Note [Prepare's threads]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Each of prepare()'s threads builds with a cuDNN handle of its own, and in a warm process (prepare's purpose)
// none exists yet: making one takes 11-20 ms on an H200, and the threads' plan builds contend inside cuDNN.
// A few entries gain nothing from more threads (their builds contend), many do; so a thread is started per 16
// entries, up to the usable cores and at most 8. The warm start that pays for it is the models benchmark's
// prepare_s (`python3 -m benchmarks models`).
int default_prepare_threads(std::size_t entries) {
  constexpr std::size_t kEntriesPerThread = 16;
  const auto wanted = static_cast<int>(std::min<std::size_t>((entries + kEntriesPerThread - 1) / kEntriesPerThread, 8));
  return std::max(1, std::min(usable_cores(), wanted));
}

PrepareReport Runtime::prepare(int device, int threads) {
  const auto started = std::chrono::steady_clock::now();
  DirectionCaches& caches = caches_for_device(device);
  prepare_at_first_call_[static_cast<std::size_t>(device)].store(false);  // this prepare is the one it would start
  std::vector<std::pair<ConvolutionKey, std::vector<EngineCandidate>>> work;
  for_each_graph_direction([&](auto traits) {
    for (const auto& [key, ranking] : caches.get<decltype(traits)>().entries()) {
      work.emplace_back(key, std::vector<EngineCandidate>(ranking.begin(), ranking.end()));
    }
  });
  PrepareReport report;
  report.entries = work.size();
  if (threads <= 0) threads = default_prepare_threads(work.size());
  threads = static_cast<int>(std::min<std::size_t>(threads, work.size()));

  const std::uint64_t limit = workspace_limit();
  std::atomic<std::size_t> next{0}, ready{0};
  std::mutex failure_mutex;
  std::string failure;
  auto build = [&] {
    const RelaxedCaptureMode relaxed;  // Note [Prepare beside a capture]
    try {
      const HandlePool::Lease lease(device);
      const cudnnHandle_t handle = lease.get();
      for (std::size_t i; !stopping_.load(std::memory_order_relaxed) && (i = next++) < work.size();) {
        const auto& [key, ranking] = work[i];
        for (const EngineCandidate& config : ranking) {
          if (config.workspace_bytes > limit) continue;  // a call would not run it (Note [Workspace limit])
          if (plans_->get(handle, device, key, config, caches.plans, &config == &ranking.front())->plan) {
            ++ready;
            break;
          }
        }
      }
    } catch (const Error& e) {
      std::lock_guard lock(failure_mutex);
      if (failure.empty()) failure = e.what();
    }
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back(build);
  for (std::thread& worker : workers) worker.join();
  CUDNN_CACHE_REQUIRE(failure.empty(), "cudnn_cache.prepare on CUDA device ", device, ": ", failure);
  report.plans = ready;
  report.seconds = 1e-6 * static_cast<double>(microseconds_since(started));
  if (logs(LogLevel::info)) {
    log(LogLevel::info, detail::concat("prepare: ", report.plans, " of ", report.entries,
                                       " plans ready for CUDA device ", device, " in ", report.seconds, " s on ",
                                       threads, " threads"));
  }
  return report;
}

void Runtime::prepare_in_background(int device, int threads) {
  caches_for_device(device);  // checks the index
  prepare_at_first_call_[static_cast<std::size_t>(device)].store(false);  // no call starts another meanwhile
  finish_background();
  std::lock_guard lock(background_mutex_);
  start_in_background(device, threads);
  reported_ = background_.size() - 1;
}

void Runtime::start_in_background(int device, int threads) {
  background_.push_back(std::async(std::launch::async, [this, device, threads] { return prepare(device, threads); }));
}

// The lock is not held while waiting: a call that starts its first-call prepare meanwhile goes on at once.
void Runtime::finish_background() {
  std::vector<std::future<PrepareReport>> started;
  {
    std::lock_guard lock(background_mutex_);
    started = std::exchange(background_, {});
    reported_.reset();
  }
  for (std::future<PrepareReport>& prepare : started) {
    if (prepare.valid()) prepare.wait();  // not valid: wait_for_prepare took its report
  }
}

// Note [Prepare at the first call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A process that CUDNN_CACHE_PATH starts loads its file when cudnn_cache is imported, before the training script
// has picked its GPU (a rank calls torch.cuda.set_device after its imports): a prepare there would make a CUDA
// context on device 0 in every rank. So the load arms prepare_at_first_call instead, and nothing prepares until
// a graph-API call runs on a device: that call starts prepare(device) in the background, once per device, and
// the plans of the calls still to come (the rest of the first step, its backward pass) are built on prepare's
// threads while the calling thread goes on, building what it meets first itself (a plan now and then is built
// by both; the plan cache keeps one). Measured before it (H100, 2026-12-05, fresh processes): the zero-code
// warm start of MobileNetV2 bf16 took 1.09 and 1.31 s with every call building its plan, against 0.53 and 0.60
// s for load + prepare(background=True). A prepare builds every entry of the device, used by this model or not,
// so a file of more than kFirstCallPrepareLimit entries of the device (one shared by many models) is left to the
// calls. Safe beside a CUDA-graph capture (Note [Prepare beside a capture]), even when the first call is in one.
// Its report is not kept (stats() counts its plans); a failure (no cuDNN handle) leaves the calls to build.
constexpr std::size_t kFirstCallPrepareLimit = 1000;

void Runtime::prepare_at_first_call(bool on) {
  for (std::atomic<bool>& armed : prepare_at_first_call_) armed.store(on);
}

void Runtime::start_first_call_prepare(int device) {
  if (!prepare_at_first_call_[static_cast<std::size_t>(device)].exchange(false)) return;  // another call did
  std::size_t entries = 0;
  DirectionCaches& caches = caches_for_device(device);
  for_each_graph_direction([&](auto traits) { entries += caches.get<decltype(traits)>().size(); });
  if (entries == 0 || entries > kFirstCallPrepareLimit) {
    if (logs(LogLevel::info) && entries > 0) {
      log(LogLevel::info, detail::concat("prepare at the first call on CUDA device ", device, " skipped: ", entries,
                                         " entries, more than ", kFirstCallPrepareLimit, " (calls build their plans)"));
    }
    return;
  }
  std::lock_guard lock(background_mutex_);
  start_in_background(device, 0);
}

PrepareReport Runtime::wait_for_prepare() {
  std::future<PrepareReport> reported;
  {
    std::lock_guard lock(background_mutex_);
    CUDNN_CACHE_REQUIRE(reported_.has_value(), "no background prepare was started, or its report was already taken");
    reported = std::move(background_[*std::exchange(reported_, std::nullopt)]);
  }
  return reported.get();  // outside the lock, as finish_background waits
}

#define CUDNN_CACHE_INSTANTIATE(Traits)                                                                         \
  template void Runtime::run<Traits>(cudnnHandle_t, int, const ConvolutionKey&, const ConvolutionBuffers&,     \
                                     const WorkspaceAllocator&, bool);                                         \
  template Ranking<Traits> Runtime::tune<Traits>(cudnnHandle_t, int, const ConvolutionKey&,                    \
                                                 const ConvolutionBuffers&, const WorkspaceAllocator&)
CUDNN_CACHE_INSTANTIATE(ForwardTraits);
CUDNN_CACHE_INSTANTIATE(BackwardDataTraits);
CUDNN_CACHE_INSTANTIATE(BackwardFilterTraits);
CUDNN_CACHE_INSTANTIATE(GraphForwardTraits);
CUDNN_CACHE_INSTANTIATE(GraphBackwardDataTraits);
CUDNN_CACHE_INSTANTIATE(GraphBackwardFilterTraits);
#undef CUDNN_CACHE_INSTANTIATE

#define CUDNN_CACHE_INSTANTIATE_DIRECTION(D)                                                                   \
  template void Runtime::convolve<D>(cudnnHandle_t, int, const ConvolutionKey&, const ConvolutionBuffers&,      \
                                     const WorkspaceAllocator&, bool);                                          \
  template void Runtime::tune_direction<D>(Backend, cudnnHandle_t, int, const ConvolutionKey&,                  \
                                           const ConvolutionBuffers&, const WorkspaceAllocator&)
CUDNN_CACHE_INSTANTIATE_DIRECTION(Direction::forward);
CUDNN_CACHE_INSTANTIATE_DIRECTION(Direction::backward_data);
CUDNN_CACHE_INSTANTIATE_DIRECTION(Direction::backward_filter);
#undef CUDNN_CACHE_INSTANTIATE_DIRECTION

}  // namespace cudnn_cache

void cudnn_cache_set_search_bounds(const cudnn_cache::graph_internal::SearchBounds* bounds) {
  std::lock_guard lock(cudnn_cache::search_bounds_mutex);
  cudnn_cache::runtime_search_bounds = bounds ? *bounds : cudnn_cache::graph_internal::SearchBounds{};
}
