#include "cudnn_cache/runtime.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <type_traits>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cudnn_cache/error.h"
#include "cudnn_cache/graph.h"

namespace cudnn_cache {
namespace {

template <typename Traits>
using Candidates = std::vector<Candidate<Traits>>;

// The outcome of walking a list of candidates.
struct Attempt {
  bool ran = false;        // some candidate ran
  bool fell_back = false;  // an eligible candidate before it could not run
  std::string why_not;     // why the last one that could not run did not
};

// Runs the first eligible candidate that can run. Eligible: it succeeded when measured, and it is
// deterministic when that is asked for. See Note [Selection, merge and fallback policy].
template <typename Traits>
Attempt run_first_that_runs(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors,
                            const ConvolutionBuffers& buffers, const Candidate<Traits>* begin,
                            const Candidate<Traits>* end, const WorkspaceAllocator& allocate, bool deterministic) {
  Attempt attempt;
  for (const Candidate<Traits>* candidate = begin; candidate != end; ++candidate) {
    if (!candidate->succeeded()) continue;
    if (deterministic && candidate->determinism != CUDNN_DETERMINISTIC) continue;
    std::unique_ptr<Workspace> workspace;
    if (candidate->workspace_bytes > 0) {
      workspace = allocate(candidate->workspace_bytes);
      if (!workspace) {
        attempt.fell_back = true;
        attempt.why_not = detail::concat(Traits::algorithm_name(candidate->algorithm), ": out of memory for a ",
                                         candidate->workspace_bytes, "-byte workspace");
        continue;
      }
    }
    // The candidate was measured with its own math type; run it with that one, as cuDNN reported it.
    CUDNN_CACHE_CHECK(cudnnSetConvolutionMathType(descriptors.convolution.get(), candidate->math_type));
    const cudnnStatus_t status =
        Algorithms<Traits>::execute(handle, descriptors, candidate->algorithm, buffers,
                                    workspace ? workspace->data() : nullptr, candidate->workspace_bytes);
    if (status == CUDNN_STATUS_SUCCESS) {
      attempt.ran = true;
      return attempt;
    }
    attempt.fell_back = true;
    attempt.why_not = detail::concat(Traits::algorithm_name(candidate->algorithm), ": ", cudnnGetErrorString(status));
  }
  if (attempt.why_not.empty()) {
    attempt.why_not = deterministic ? "no deterministic candidate" : "no candidate that succeeded when measured";
  }
  return attempt;
}

// cuDNN's heuristic order for the problem, as candidates (not ranked: the order is cuDNN's).
template <typename Traits>
Candidates<Traits> heuristic_candidates(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors,
                                        const ConvolutionKey& key) {
  std::array<typename Traits::Perf, Traits::algorithm_count> perfs{};
  int returned = 0;
  CUDNN_CACHE_CHECK(Algorithms<Traits>::heuristics(handle, descriptors, Traits::algorithm_count, &returned,
                                                   perfs.data()),
                    key);
  Candidates<Traits> candidates;
  for (int i = 0; i < returned; ++i) candidates.push_back(Candidate<Traits>::from_perf(perfs[i]));
  return candidates;
}

// Find needs one workspace big enough for the hungriest algorithm: ask for the most any algorithm wants and
// halve until the allocator can give it (algorithms that need more then report an allocation failure).
template <typename Traits>
std::pair<std::unique_ptr<Workspace>, std::size_t> search_workspace(cudnnHandle_t handle,
                                                                    const ConvolutionDescriptors& descriptors,
                                                                    const WorkspaceAllocator& allocate) {
  std::size_t bytes = 0;
  for (int algorithm = 0; algorithm < Traits::algorithm_count; ++algorithm) {
    std::size_t needed = 0;
    if (Algorithms<Traits>::workspace_size(handle, descriptors, static_cast<typename Traits::Algorithm>(algorithm),
                                           &needed) == CUDNN_STATUS_SUCCESS) {
      bytes = std::max(bytes, needed);
    }
  }
  for (; bytes > 0; bytes /= 2) {
    if (auto workspace = allocate(bytes)) return {std::move(workspace), bytes};
  }
  return {nullptr, 0};
}

template <typename Traits>
Ranking<Traits> search(cudnnHandle_t handle, const ConvolutionDescriptors& descriptors, const ConvolutionKey& key,
                       const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate) {
  auto [workspace, bytes] = search_workspace<Traits>(handle, descriptors, allocate);
  std::array<typename Traits::Perf, Traits::algorithm_count> perfs{};
  int returned = 0;
  CUDNN_CACHE_CHECK(Algorithms<Traits>::find(handle, descriptors, buffers, Traits::algorithm_count, &returned,
                                             perfs.data(), workspace ? workspace->data() : nullptr, bytes),
                    key);
  const Ranking<Traits> ranking = Ranking<Traits>::of_perfs(perfs.data(), returned);
  CUDNN_CACHE_REQUIRE(!ranking.empty() && ranking.front().succeeded(), "cuDNN found no algorithm that runs ", key);
  return ranking;
}

// Microseconds since `start`.
std::uint64_t microseconds_since(std::chrono::steady_clock::time_point start) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

// Note [Plan cache]
// ~~~~~~~~~~~~~~~~~
// Building an execution plan costs far more than running it, so the plan of each (device, key, engine
// config) is made once (restored from a stored plan, Note [Stored plans], or built) and kept; so is cuDNN's
// refusal to build one, so a stored config this cuDNN does not know costs one attempt per process, not one
// per call. The cache is shared by all threads (cuDNN plans may
// run concurrently), so prepare() can fill it from other threads while training runs: a lookup takes a
// shared lock, a build happens outside any lock, and the first result stored wins. Entries are never
// removed: a plan is tied to its device and cuDNN, not to a file, so loading or clearing the caches does not
// touch it, and references to entries stay valid.
class PlanCache {
 public:
  explicit PlanCache(Runtime& runtime) : runtime_(runtime) {}

  struct Entry {
    std::shared_ptr<const GraphPlan> plan;  // null when cuDNN refused the config
    std::string refusal;                    // why it did
  };

  // The entry of `config` for `key` on `device`, made on first use: from the plan `stored` holds for the key
  // when it is one of this config and this cuDNN, else built (Note [Stored plans]). When `best` (the config
  // leads its ranking) and cuDNN compiled it at run time, the plan built is serialized into `stored`.
  const Entry& get(cudnnHandle_t handle, int device, const ConvolutionKey& key, const EngineCandidate& config,
                   PlanStore& stored, bool best) {
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

  // Keeps `plan`, which a search built for `config`, as if get() had built it (and stores it, as get() would).
  void adopt(int device, const ConvolutionKey& key, const EngineCandidate& config,
             std::shared_ptr<const GraphPlan> plan, PlanStore& stored) {
    keep_serialized(key, config, *plan, stored);
    std::unique_lock lock(mutex_);
    entries_.try_emplace(Slot{device, key, config}, Entry{std::move(plan), {}});
  }

  std::atomic<std::uint64_t> plans_built{0}, build_us{0}, plans_deserialized{0}, plan_rebuilds{0};

 private:
  // Serializes the plan into `stored` when cuDNN compiled its engine at run time (Note [Stored plans]).
  static void keep_serialized(const ConvolutionKey& key, const EngineCandidate& config, const GraphPlan& plan,
                              PlanStore& stored) {
    if ((config.behavior_notes & EngineCandidate::kRuntimeCompiled) == 0) return;
    try {
      stored.insert(key, {config, static_cast<std::uint32_t>(cudnnGetVersion()), plan.serialize()});
    } catch (const Error&) {
      // not serializable here: later processes rebuild it, as without a stored plan
    }
  }

  // The plan `stored` holds for this config, if this cuDNN can load it; a stored plan it cannot load is
  // counted as a rebuild.
  Entry restore(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config,
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

  Entry build(cudnnHandle_t handle, const ConvolutionKey& key, const EngineCandidate& config, PlanStore& stored,
              bool best) {
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
  void debug(const Args&... args) {
    if (runtime_.logs(LogLevel::debug)) runtime_.log(LogLevel::debug, detail::concat(args...));
  }

  Runtime& runtime_;

  struct Slot {
    int device;
    ConvolutionKey key;
    EngineCandidate config;  // only its choice (engine and knobs) counts
    friend bool operator==(const Slot& a, const Slot& b) {
      return a.device == b.device && a.key == b.key && a.config.same_choice(b.config);
    }
  };
  struct SlotHash {
    std::size_t operator()(const Slot& slot) const {
      std::size_t hash = KeyHash{}(slot.key) ^ (static_cast<std::size_t>(slot.device) << 48);
      hash = hash * 1099511628211u ^ static_cast<std::size_t>(slot.config.engine_id);
      for (const Knob* knob = slot.config.knobs_begin(); knob != slot.config.knobs_end(); ++knob) {
        hash = hash * 1099511628211u ^ static_cast<std::size_t>(knob->type << 32 ^ knob->value);
      }
      return hash;
    }
  };

  std::shared_mutex mutex_;
  std::unordered_map<Slot, Entry, SlotHash> entries_;
};

namespace {

// Times the key's engine configs, and keeps the plan the search built for the best one.
template <Direction D>
Ranking<GraphTraits<D>> search_graph(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                                     const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate,
                                     const GraphSearchOptions& options, PlanCache& plans, PlanStore& stored) {
  std::shared_ptr<const GraphPlan> best_plan;
  const std::vector<EngineCandidate> configs =
      search_engine_configs(handle, key, buffers, allocate, options, &best_plan);
  if (best_plan) plans.adopt(device, key, configs.front(), std::move(best_plan), stored);
  return Ranking<GraphTraits<D>>::of(configs.begin(), configs.end());
}

// The fallback warning's first sentence for a call whose best cached candidate could not run.
std::string could_not_run(const ConvolutionKey& key, const std::string& why) {
  return detail::concat("the best cached algorithm could not run (", why, ") for ", key,
                        "; running the next candidate");
}

// Another origin whose cache of Traits holds the key, if any (the first in origin order).
template <typename Traits>
std::optional<Origin> cached_elsewhere(const CacheStore& store, const Origin& origin, const ConvolutionKey& key) {
  for (const auto& [other, caches] : store.origins()) {
    if (other != origin && caches->template get<Traits>().find(key)) return other;
  }
  return std::nullopt;
}

// Counters a lookup updates, and the runtime it logs to.
struct Counters {
  Runtime& runtime;
  std::atomic<std::uint64_t>& hits;
  std::atomic<std::uint64_t>& misses;
  std::atomic<std::uint64_t>& tunes;
  std::atomic<std::uint64_t>& tune_us;
  std::atomic<std::uint64_t>& capture_misses;
};

// Runs search() and counts it as a tune.
template <typename Search>
auto timed_search(Counters counters, Search&& search) {
  const auto started = std::chrono::steady_clock::now();
  auto ranking = search();
  ++counters.tunes;
  counters.tune_us += microseconds_since(started);
  return ranking;
}

// Logs a search's result at debug level.
template <typename Traits>
void log_tune(Runtime& runtime, const ConvolutionKey& key, const Ranking<Traits>& ranking, const char* kind) {
  if (!runtime.logs(LogLevel::debug)) return;
  runtime.log(LogLevel::debug, detail::concat("tuned: ", ranking.size(), " ", kind, "s ranked for ", key, "; best ",
                                              Traits::describe(ranking.front()), " at ", ranking.front().time_ms,
                                              " ms"));
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

// The ranking cached for the key, or what the miss policy makes of a miss: a search run now and stored
// (tune), nothing (heuristic: the caller runs cuDNN's heuristics), or an Error naming the key (error).
// Under the record policy the miss is also remembered, as a miss of `origin`'s cache of `backend`. A miss
// under the tune policy while the stream captures a CUDA graph is a record miss, counted in
// counters.capture_misses: nothing may be timed during a capture (Note [Running a cached convolution]).
template <typename Traits, typename Search>
std::optional<Ranking<Traits>> lookup(cudnnHandle_t handle, PerfCache<Traits>& cache, const ConvolutionKey& key,
                                      MissPolicy policy, Counters counters, const char* kind, const Origin& origin,
                                      Backend backend, Search&& search) {
  Runtime& runtime = counters.runtime;
  std::optional<Ranking<Traits>> ranking = cache.find(key);
  if (ranking) {
    ++counters.hits;
    if (runtime.logs(LogLevel::debug)) {
      runtime.log(LogLevel::debug,
                  detail::concat("hit: ", kind, " ", Traits::describe(ranking->front()), " for ", key));
    }
    return ranking;
  }
  ++counters.misses;
  const bool deferred = policy == MissPolicy::tune && capturing(handle);
  if (deferred) {
    ++counters.capture_misses;
    policy = MissPolicy::record;
  }
  if (runtime.logs(LogLevel::debug)) {
    runtime.log(LogLevel::debug, detail::concat("miss (policy '", to_string(policy), "'",
                                                deferred ? ", in CUDA-graph capture: tuned outside it" : "",
                                                "): no ", kind, " for ", key));
  }
  // An entry measured on another GPU or with another cuDNN is never used (Note [Selection, merge and fallback
  // policy]), but a call that finds one is told so and counted.
  const std::optional<Origin> elsewhere = cached_elsewhere<Traits>(runtime.store(), origin, key);
  const std::string only_elsewhere =
      elsewhere ? detail::concat(" (the cache holds it only for ", *elsewhere, ", not for ", origin, ")") : "";
  if (policy == MissPolicy::error) {
    throw Error(detail::concat("cudnn_cache: no cached ", kind, " for ", key, only_elsewhere,
                               " and the miss policy is 'error'. Run scripts/warm_start.py for this model and input "
                               "shape, then load its file"));
  }
  if (elsewhere) {
    runtime.count_fallback(detail::concat("no cached ", kind, " for ", key, only_elsewhere, "; the miss policy '",
                                          to_string(policy), "' applies. Run the warm start on this GPU and cuDNN "
                                          "to cache it for them"));
  }
  if (policy == MissPolicy::record) runtime.record_miss(origin, backend, key);
  if (policy == MissPolicy::tune) {
    ranking = timed_search(counters, search);
    log_tune(runtime, key, *ranking, kind);
    cache.insert(key, *ranking);
  }
  return ranking;
}

}  // namespace

namespace {

// The value of `values` whose to_string is `name`; otherwise an Error naming `what` and every valid name.
template <typename Enum, std::size_t N>
Enum from_name(const std::string& name, const std::array<Enum, N>& values, const char* what) {
  std::string valid;
  for (std::size_t i = 0; i < N; ++i) {
    if (name == to_string(values[i])) return values[i];
    valid += detail::concat(i == 0 ? "" : i + 1 == N ? " or " : ", ", "'", to_string(values[i]), "'");
  }
  throw Error(detail::concat("unknown ", what, " '", name, "'; use ", valid));
}

}  // namespace

const char* to_string(MissPolicy policy) {
  switch (policy) {
    case MissPolicy::tune: return "tune";
    case MissPolicy::heuristic: return "heuristic";
    case MissPolicy::error: return "error";
    case MissPolicy::record: return "record";
  }
  return "unknown";
}

MissPolicy miss_policy_from_string(const std::string& name) {
  return from_name(name, std::array{MissPolicy::tune, MissPolicy::heuristic, MissPolicy::error, MissPolicy::record},
                   "miss policy");
}

const char* to_string(Backend backend) { return backend == Backend::graph ? "graph" : "legacy"; }

Backend backend_from_string(const std::string& name) {
  return from_name(name, std::array{Backend::graph, Backend::legacy}, "backend");
}

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::off: return "off";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "unknown";
}

LogLevel log_level_from_string(const std::string& name) {
  return from_name(name, std::array{LogLevel::off, LogLevel::info, LogLevel::debug}, "log level");
}

bool graph_backend_available() { return cudnnGetVersion() >= 8900; }

Runtime& Runtime::instance() {
  static Runtime runtime;
  return runtime;
}

Runtime::Runtime()
    : plans_(std::make_unique<PlanCache>(*this)),
      backend_(graph_backend_available() ? Backend::graph : Backend::legacy) {
  if (const char* level = std::getenv("CUDNN_CACHE_LOG"); level != nullptr && *level != '\0') {
    try {
      log_level_ = log_level_from_string(level);
    } catch (const Error& e) {
      std::cerr << "cudnn_cache: CUDNN_CACHE_LOG: " << e.what() << "; logging stays off\n";
    }
  }
}

void Runtime::log(LogLevel level, const std::string& message) {
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
  std::lock_guard lock(background_mutex_);
  if (background_.valid()) background_.wait();
}

void Runtime::set_backend(Backend backend) {
  CUDNN_CACHE_REQUIRE(backend == Backend::legacy || graph_backend_available(), "the graph backend needs cuDNN 8.9 "
                      "or later, and this process has cuDNN ", CudnnVersion::of_library(), "; use 'legacy'");
  backend_ = backend;
}

void Runtime::set_search_options(const GraphSearchOptions& options) {
  const auto check = [](bool valid, const char* field, double value, const char* expected) {
    CUDNN_CACHE_REQUIRE(valid, "tuning option ", field, " must be ", expected, ", got ", value);
  };
  check(options.warmup >= 0, "warmup", options.warmup, ">= 0");
  check(options.repetitions >= 1, "repetitions", options.repetitions, ">= 1");
  check(options.max_candidates >= 1, "max_candidates", options.max_candidates, ">= 1");
  check(options.mode_b_candidates >= 0, "mode_b_candidates", options.mode_b_candidates, ">= 0");
  check(options.knob_variants >= 0, "knob_variants", options.knob_variants, ">= 0");
  check(options.finalists >= 0, "finalists", options.finalists, ">= 0");
  check(options.give_up_ratio >= 1.0f, "give_up_ratio", options.give_up_ratio, ">= 1 (1.5 by default)");
  std::lock_guard lock(mutex_);
  search_options_ = options;
}

GraphSearchOptions Runtime::search_options() const {
  std::lock_guard lock(mutex_);
  return search_options_;
}

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
          capture_misses_.load()};
}

void Runtime::reset_stats() {
  for (auto* counter : {&hits_, &misses_, &tunes_, &fallbacks_, &tune_us_, &plans_->plans_built, &plans_->build_us,
                        &plans_->plans_deserialized, &plans_->plan_rebuilds, &capture_misses_}) {
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
  std::lock_guard lock(recorded_mutex_);
  recorded_.emplace(origin, static_cast<int>(backend), key);
}

std::vector<RecordedMiss> Runtime::recorded_misses() const {
  std::vector<RecordedMiss> result;
  std::lock_guard lock(recorded_mutex_);
  for (const auto& [origin, backend, key] : recorded_) {
    bool cached = false;
    if (const DirectionCaches* caches = store_.find(origin)) {
      for_each_cache([&, caches = caches, backend = backend, key = key](auto traits) {
        using Traits = decltype(traits);
        const bool graph = std::is_same_v<typename Traits::Candidate, EngineCandidate>;
        if (graph != (backend == static_cast<int>(Backend::graph))) return;
        if (static_cast<std::int32_t>(Traits::direction) != key.direction) return;
        cached = cached || caches->template get<Traits>().find(key).has_value();
      });
    }
    if (!cached) result.push_back({origin, static_cast<Backend>(backend), key});
  }
  return result;
}

void Runtime::clear_recorded_misses() {
  std::lock_guard lock(recorded_mutex_);
  recorded_.clear();
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

template <typename Traits>
void Runtime::run(cudnnHandle_t handle, int device, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
                  const WorkspaceAllocator& allocate, bool deterministic) {
  PerfCache<Traits>& cache = caches_for_device(device).get<Traits>();
  const ConvolutionDescriptors descriptors(key);
  const std::optional<Ranking<Traits>> ranking =
      lookup(handle, cache, key, miss_policy(), {*this, hits_, misses_, tunes_, tune_us_, capture_misses_},
             "algorithm",
             origin_of_device(device), Backend::legacy,
             [&] { return search<Traits>(handle, descriptors, key, buffers, allocate); });
  Candidates<Traits> heuristic;
  if (!ranking) heuristic = heuristic_candidates<Traits>(handle, descriptors, key);
  const Candidate<Traits>* begin = ranking ? ranking->begin() : heuristic.data();
  const Candidate<Traits>* end = ranking ? ranking->end() : heuristic.data() + heuristic.size();
  Attempt attempt = run_first_that_runs<Traits>(handle, descriptors, buffers, begin, end, allocate, deterministic);
  if (attempt.fell_back || !attempt.ran) count_fallback(could_not_run(key, attempt.why_not));
  if (attempt.ran) return;
  if (ranking) {  // nothing cached could run: cuDNN's heuristics are the last resort
    heuristic = heuristic_candidates<Traits>(handle, descriptors, key);
    attempt = run_first_that_runs<Traits>(handle, descriptors, buffers, heuristic.data(),
                                          heuristic.data() + heuristic.size(), allocate, deterministic);
    if (attempt.ran) return;
  }
  throw Error(detail::concat("cudnn_cache: no cuDNN algorithm could run ", key, " (last: ", attempt.why_not, ")"));
}

template <typename Traits>
Ranking<Traits> Runtime::tune(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                              const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate) {
  require_not_capturing(handle, key);
  PerfCache<Traits>& cache = caches_for_device(device).get<Traits>();
  const ConvolutionDescriptors descriptors(key);
  const Ranking<Traits> ranking = timed_search({*this, hits_, misses_, tunes_, tune_us_, capture_misses_}, [&] {
    return search<Traits>(handle, descriptors, key, buffers, allocate);
  });
  log_tune(*this, key, ranking, "algorithm");
  cache.insert(key, ranking);
  return ranking;
}

template <Direction D>
void Runtime::run_graph(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                        const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate, bool deterministic) {
  using Legacy = LegacyTraits<D>;
  if (deterministic) return run<Legacy>(handle, device, key, buffers, allocate, true);
  DirectionCaches& caches = caches_for_device(device);
  PerfCache<GraphTraits<D>>& cache = caches.get<GraphTraits<D>>();
  const std::optional<Ranking<GraphTraits<D>>> ranking =
      lookup(handle, cache, key, miss_policy(), {*this, hits_, misses_, tunes_, tune_us_, capture_misses_},
             "engine config",
             origin_of_device(device), Backend::graph, [&] {
               return search_graph<D>(handle, device, key, buffers, allocate, search_options(), *plans_,
                                      caches.plans);
             });
  std::string why_not = "heuristic miss policy";
  if (ranking) {
    PlanStore& stored = caches.plans;
    for (const EngineCandidate& config : *ranking) {
      const PlanCache::Entry& entry = plans_->get(handle, device, key, config, stored, &config == ranking->begin());
      if (!entry.plan) {
        why_not = entry.refusal;
        continue;
      }
      const GraphPlan& plan = *entry.plan;
      std::unique_ptr<Workspace> workspace;
      if (plan.workspace_bytes() > 0 && !(workspace = allocate(plan.workspace_bytes()))) {
        why_not = detail::concat(to_string(config), ": out of memory for a ", plan.workspace_bytes(),
                                 "-byte workspace");
        continue;
      }
      try {
        plan.execute(handle, buffers, workspace ? workspace->data() : nullptr);
      } catch (const Error& e) {
        why_not = detail::concat(to_string(config), ": ", e.what());
        continue;
      }
      if (&config != ranking->begin()) count_fallback(could_not_run(key, why_not));
      return;
    }
    count_fallback(could_not_run(key, why_not));
  }
  // The last resort, and the heuristic policy's choice: cuDNN's legacy heuristics, stored nowhere.
  const ConvolutionDescriptors descriptors(key);
  const Candidates<Legacy> heuristic = heuristic_candidates<Legacy>(handle, descriptors, key);
  const Attempt attempt = run_first_that_runs<Legacy>(handle, descriptors, buffers, heuristic.data(),
                                                      heuristic.data() + heuristic.size(), allocate, false);
  if (attempt.ran) return;
  throw Error(detail::concat("cudnn_cache: no cuDNN engine or algorithm could run ", key, " (last: ", why_not, "; ",
                             attempt.why_not, ")"));
}

template <Direction D>
Ranking<GraphTraits<D>> Runtime::tune_graph(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                                            const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate) {
  require_not_capturing(handle, key);
  DirectionCaches& caches = caches_for_device(device);
  PerfCache<GraphTraits<D>>& cache = caches.get<GraphTraits<D>>();
  const Ranking<GraphTraits<D>> ranking = timed_search({*this, hits_, misses_, tunes_, tune_us_, capture_misses_}, [&] {
    return search_graph<D>(handle, device, key, buffers, allocate, search_options(), *plans_, caches.plans);
  });
  log_tune(*this, key, ranking, "engine config");
  cache.insert(key, ranking);
  return ranking;
}

template <Direction D>
void Runtime::convolve(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                       const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate, bool deterministic) {
  if (backend() == Backend::graph) return run_graph<D>(handle, device, key, buffers, allocate, deterministic);
  run<LegacyTraits<D>>(handle, device, key, buffers, allocate, deterministic);
}

template <Direction D>
void Runtime::tune_direction(cudnnHandle_t handle, int device, const ConvolutionKey& key,
                             const ConvolutionBuffers& buffers, const WorkspaceAllocator& allocate) {
  if (backend() == Backend::graph) {
    tune_graph<D>(handle, device, key, buffers, allocate);
  } else {
    tune<LegacyTraits<D>>(handle, device, key, buffers, allocate);
  }
}

namespace {

// cuDNN handles for prepare's threads, one per thread at a time. They are made once and never destroyed:
// the plans built with them live in the plan cache for the rest of the process.
class HandlePool {
 public:
  static HandlePool& instance() {
    static HandlePool* pool = new HandlePool;  // never destroyed, like the handles
    return *pool;
  }

  // A handle for CUDA device `device`, which becomes the calling thread's current device.
  cudnnHandle_t take(int device) {
    CUDNN_CACHE_REQUIRE(cudaSetDevice(device) == cudaSuccess, "cannot use CUDA device ", device);
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        const cudnnHandle_t handle = free.back();
        free.pop_back();
        return handle;
      }
    }
    cudnnHandle_t handle = nullptr;
    CUDNN_CACHE_CHECK(cudnnCreate(&handle));
    return handle;
  }

  void give_back(int device, cudnnHandle_t handle) {
    std::lock_guard lock(mutex_);
    free_[device].push_back(handle);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudnnHandle_t>> free_;
};

}  // namespace

PrepareReport Runtime::prepare(int device, int threads) {
  const auto started = std::chrono::steady_clock::now();
  DirectionCaches& caches = caches_for_device(device);
  std::vector<std::pair<ConvolutionKey, std::vector<EngineCandidate>>> work;
  for_each_graph_direction([&](auto traits) {
    for (const auto& [key, ranking] : caches.get<decltype(traits)>().entries()) {
      work.emplace_back(key, std::vector<EngineCandidate>(ranking.begin(), ranking.end()));
    }
  });
  PrepareReport report;
  report.entries = work.size();
  if (threads <= 0) threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  threads = static_cast<int>(std::min<std::size_t>(threads, work.size()));

  std::atomic<std::size_t> next{0}, ready{0};
  std::mutex failure_mutex;
  std::string failure;
  auto build = [&] {
    try {
      const cudnnHandle_t handle = HandlePool::instance().take(device);
      for (std::size_t i; (i = next++) < work.size();) {
        const auto& [key, ranking] = work[i];
        for (const EngineCandidate& config : ranking) {
          if (plans_->get(handle, device, key, config, caches.plans, &config == &ranking.front()).plan) {
            ++ready;
            break;
          }
        }
      }
      HandlePool::instance().give_back(device, handle);
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
  std::lock_guard lock(background_mutex_);
  if (background_.valid()) background_.wait();
  background_ = std::async(std::launch::async, [this, device, threads] { return prepare(device, threads); });
}

PrepareReport Runtime::wait_for_prepare() {
  std::lock_guard lock(background_mutex_);
  CUDNN_CACHE_REQUIRE(background_.valid(), "no background prepare was started, or its report was already taken");
  return background_.get();
}

#define CUDNN_CACHE_INSTANTIATE(Traits)                                                                         \
  template void Runtime::run<Traits>(cudnnHandle_t, int, const ConvolutionKey&, const ConvolutionBuffers&,     \
                                     const WorkspaceAllocator&, bool);                                         \
  template Ranking<Traits> Runtime::tune<Traits>(cudnnHandle_t, int, const ConvolutionKey&,                    \
                                                 const ConvolutionBuffers&, const WorkspaceAllocator&)
CUDNN_CACHE_INSTANTIATE(ForwardTraits);
CUDNN_CACHE_INSTANTIATE(BackwardDataTraits);
CUDNN_CACHE_INSTANTIATE(BackwardFilterTraits);
#undef CUDNN_CACHE_INSTANTIATE

#define CUDNN_CACHE_INSTANTIATE_GRAPH(D)                                                                       \
  template void Runtime::run_graph<D>(cudnnHandle_t, int, const ConvolutionKey&, const ConvolutionBuffers&,     \
                                      const WorkspaceAllocator&, bool);                                         \
  template Ranking<GraphTraits<D>> Runtime::tune_graph<D>(cudnnHandle_t, int, const ConvolutionKey&,             \
                                                          const ConvolutionBuffers&, const WorkspaceAllocator&);     \
  template void Runtime::convolve<D>(cudnnHandle_t, int, const ConvolutionKey&, const ConvolutionBuffers&,      \
                                     const WorkspaceAllocator&, bool);                                          \
  template void Runtime::tune_direction<D>(cudnnHandle_t, int, const ConvolutionKey&, const ConvolutionBuffers&, \
                                           const WorkspaceAllocator&)
CUDNN_CACHE_INSTANTIATE_GRAPH(Direction::forward);
CUDNN_CACHE_INSTANTIATE_GRAPH(Direction::backward_data);
CUDNN_CACHE_INSTANTIATE_GRAPH(Direction::backward_filter);
#undef CUDNN_CACHE_INSTANTIATE_GRAPH

}  // namespace cudnn_cache
