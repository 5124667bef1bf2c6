// Micro-benchmarks of the core's hot paths. `python3 -m benchmarks core` runs them and checks the targets.

#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/descriptors.h"
#include "cudnn_cache/synthetic.h"
#include "call_memo.h"
#include "cudnn_cache/runtime.h"
#include "plan_cache.h"

namespace {

using namespace cudnn_cache;

// A ResNet-50 3x3 convolution, bf16 channels-last: what an op keys on every call.
ConvolutionKey resnet_key() {
  return make_convolution_key(
      Direction::forward, make_tensor_key(CUDNN_DATA_BFLOAT16, {64, 128, 28, 28}, Layout::nhwc),
      make_filter_key(CUDNN_DATA_BFLOAT16, {128, 128, 3, 3}, Layout::nhwc),
      make_tensor_key(CUDNN_DATA_BFLOAT16, {64, 128, 28, 28}, Layout::nhwc),
      make_convolution_descriptor_key({1, 1}, {1, 1}, {1, 1}, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                                      CUDNN_TENSOR_OP_MATH));
}

void key_from_values(benchmark::State& state) {
  // Sizes and strides arrive as the op sees them: 64-bit, from the tensors.
  const std::vector<std::int64_t> sizes{64, 128, 28, 28}, strides{100352, 1, 3584, 128};
  const std::vector<std::int64_t> weight{128, 128, 3, 3}, one{1, 1};
  for (auto _ : state) {
    const ConvolutionKey key = make_convolution_key(
        Direction::forward, make_tensor_key(CUDNN_DATA_BFLOAT16, sizes, strides, "input"),
        make_filter_key(CUDNN_DATA_BFLOAT16, weight, Layout::nhwc),
        make_tensor_key(CUDNN_DATA_BFLOAT16, sizes, strides, "output"),
        make_convolution_descriptor_key(one, one, one, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                                        CUDNN_TENSOR_OP_MATH));
    benchmark::DoNotOptimize(key);
  }
}
BENCHMARK(key_from_values);

void key_from_descriptors(benchmark::State& state) {
  const ConvolutionDescriptors descriptors(resnet_key());
  for (auto _ : state) benchmark::DoNotOptimize(decode_convolution_key(Direction::forward, descriptors));
}
BENCHMARK(key_from_descriptors);

// What the legacy backend makes from the key on every call before cuDNN runs: its four descriptors.
void descriptors_from_key(benchmark::State& state) {
  const ConvolutionKey key = resnet_key();
  for (auto _ : state) {
    const ConvolutionDescriptors descriptors(key);
    benchmark::DoNotOptimize(descriptors.convolution.get());
  }
}
BENCHMARK(descriptors_from_key);

// The forward caches (legacy and graph API) of 10k synthetic entries, plus a key each holds.
struct FilledCache {
  CacheStore store;
  const PerfCache<ForwardTraits>* forward = nullptr;
  const PerfCache<GraphForwardTraits>* graph_forward = nullptr;
  ConvolutionKey hit, graph_hit;
  FilledCache() {
    add_synthetic_entries(store, synthetic_origin(), 10000);
    forward = &store.caches(synthetic_origin()).forward;
    graph_forward = &store.caches(synthetic_origin()).graph_forward;
    hit = forward->entries()[forward->size() / 2].first;
    graph_hit = graph_forward->entries()[graph_forward->size() / 2].first;
  }
};

void cache_find_hit(benchmark::State& state) {
  static const FilledCache filled;
  for (auto _ : state) benchmark::DoNotOptimize(filled.forward->find(filled.hit));
}
BENCHMARK(cache_find_hit);

// A hit on the graph API's cache, whose rankings (engine configs with knobs) are the larger ones.
void graph_cache_find_hit(benchmark::State& state) {
  static const FilledCache filled;
  for (auto _ : state) benchmark::DoNotOptimize(filled.graph_forward->find(filled.graph_hit));
}
BENCHMARK(graph_cache_find_hit);

// The plan cache's lookup on a hit: what a graph-API call does after the ranking's, for the plan of the config
// it runs (a second shared lock and a second hash of the key, then a copy of the entry's shared pointers).
// Without a GPU no plan builds, so the cache holds cuDNN's refusals, looked up exactly as plans are. Configs
// stored by their place in heuristics' list are left out: without a GPU, cuDNN 9.19's heuristics divide by
// zero (SIGFPE in libcudnn_engines_runtime_compiled) where they should refuse.
void plan_cache_get_hit(benchmark::State& state) {
  static const FilledCache filled;
  static PlanCache plans(Runtime::instance());
  static PlanStore stored;
  static const std::vector<std::pair<ConvolutionKey, Ranking<GraphForwardTraits>>> entries = [] {
    auto all = filled.graph_forward->entries();
    all.erase(std::remove_if(all.begin(), all.end(), [](const auto& entry) {
                return entry.second.front().heuristic_index != EngineCandidate::kNotListed;
              }), all.end());
    all.resize(std::min<std::size_t>(all.size(), 1000));
    for (const auto& [key, ranking] : all) plans.get(nullptr, 0, key, ranking.front(), stored, false);
    return all;
  }();
  const auto& [key, ranking] = entries[entries.size() / 2];
  for (auto _ : state) benchmark::DoNotOptimize(plans.get(nullptr, 0, key, ranking.front(), stored, false));
}
BENCHMARK(plan_cache_get_hit);

// Note [Each thread's own hits] (call_memo.h): what a hit looks up before its plan runs, the shared caches' way
// (the ranking from the perf cache, the hit counted, the plan from the plan cache) against a thread's memo (the
// two caches' versions read, the memo's entry found, the hit counted in the thread's own slot). Both read the
// runtime's log level and workspace limit, as a call does. In a training step the forward runs on one thread and
// the backward on autograd's: hit_lookup_in_turn has two threads take turns, each with a key of its own
// direction, as those two do; its argument says what each turn does: 0 nothing (the hand-over alone), 1 the
// shared caches' lookup, 2 the memo's. A call's cost is (arg 1 or 2 - arg 0) / 2 per iteration.
struct HitPath {
  // What the runtime's fields were before the hit counter moved to a SpreadCounter: read and written on one line.
  struct Fields {
    std::atomic<int> log_level{0};
    std::atomic<std::uint64_t> workspace_limit{Runtime::kNoWorkspaceLimit};
    std::atomic<std::uint64_t> hits{0};
  };
  template <typename Traits>
  struct Memoized {
    std::shared_ptr<const Ranking<Traits>> ranking;
    std::size_t position = 0;
    PlanCache::Shared ready;
  };
  template <typename Traits>
  struct Side {
    const PerfCache<Traits>* cache = nullptr;
    ConvolutionKey key;
    EngineCandidate config;
    CallMemo<Memoized<Traits>> memo;  // used only by the thread of this side
  };

  FilledCache filled;
  PlanCache plans{Runtime::instance()};
  PlanStore stored;
  Fields fields;
  SpreadCounter hits;
  Side<GraphForwardTraits> forward;
  Side<GraphBackwardDataTraits> backward;

  HitPath() {
    set_up(forward, filled.store.caches(synthetic_origin()).graph_forward);
    set_up(backward, filled.store.caches(synthetic_origin()).graph_backward_data);
  }

  template <typename Traits>
  void set_up(Side<Traits>& side, const PerfCache<Traits>& cache) {
    side.cache = &cache;
    // A config stored by engine and knobs (see plan_cache_get_hit).
    for (const auto& [key, ranking] : cache.entries()) {
      if (ranking.front().heuristic_index != EngineCandidate::kNotListed) continue;
      side.key = key;
      side.config = ranking.front();
      break;
    }
    shared(side);  // its plan (a refusal, without a GPU) into the cache
    memo(side);    // and its entry into the memo
  }

  template <typename Traits>
  void shared(Side<Traits>& side) {
    benchmark::DoNotOptimize(fields.log_level.load(std::memory_order_relaxed));
    benchmark::DoNotOptimize(fields.workspace_limit.load(std::memory_order_relaxed));
    const auto ranking = side.cache->find(side.key);
    ++fields.hits;
    benchmark::DoNotOptimize(plans.get(nullptr, 0, side.key, side.config, stored, true));
    benchmark::DoNotOptimize(ranking);
  }

  template <typename Traits>
  void memo(Side<Traits>& side) {
    benchmark::DoNotOptimize(fields.log_level.load(std::memory_order_relaxed));
    const typename CallMemo<Memoized<Traits>>::Versions versions{
        side.cache->version(), plans.version(), fields.workspace_limit.load(std::memory_order_relaxed)};
    const Memoized<Traits>* hit = side.memo.find(side.cache, 0, side.key, false, versions);
    if (hit == nullptr) {
      side.memo.insert(side.cache, 0, side.key, false, versions,
                       {side.cache->find(side.key), 0, plans.get(nullptr, 0, side.key, side.config, stored, true)});
      return;
    }
    hit->ready->use();  // as GraphBackend::run does
    hits.add(1);
    benchmark::DoNotOptimize(hit);
  }

  template <typename Traits>
  void turn(int what, Side<Traits>& side) {
    if (what == 1) shared(side);
    if (what == 2) memo(side);
  }
};

void hit_lookup_shared(benchmark::State& state) {
  static HitPath path;
  for (auto _ : state) path.shared(path.forward);
}
BENCHMARK(hit_lookup_shared);

void hit_lookup_memo(benchmark::State& state) {
  static HitPath path;
  for (auto _ : state) path.memo(path.forward);
}
BENCHMARK(hit_lookup_memo);

void hit_lookup_in_turn(benchmark::State& state) {
  static HitPath path;
  const int what = static_cast<int>(state.range(0));
  std::atomic<int> turn{0};  // 0: this thread's, 1: the partner's, 2: the partner stops
  std::thread partner([&] {
    for (;;) {
      int now;
      while ((now = turn.load(std::memory_order_acquire)) == 0) {
      }
      if (now == 2) return;
      path.turn(what, path.backward);
      turn.store(0, std::memory_order_release);
    }
  });
  for (auto _ : state) {
    path.turn(what, path.forward);
    turn.store(1, std::memory_order_release);
    while (turn.load(std::memory_order_acquire) != 0) {
    }
  }
  turn.store(2, std::memory_order_release);
  partner.join();
}
BENCHMARK(hit_lookup_in_turn)->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

void cache_find_miss(benchmark::State& state) {
  static const FilledCache filled;
  const ConvolutionKey miss = resnet_key();
  for (auto _ : state) benchmark::DoNotOptimize(filled.forward->find(miss));
}
BENCHMARK(cache_find_miss);

std::string temporary_path() {
  const char* folder = std::getenv("TMPDIR");
  return std::string(folder ? folder : "/tmp") + "/cudnn_cache_bench_" + std::to_string(::getpid()) + ".bin";
}

// Replacing the file: serialization and the atomic write, under the file's lock.
void save_10k(benchmark::State& state) {
  static const FilledCache filled;
  const std::string path = temporary_path();
  SaveOptions replace;
  replace.merge = false;
  for (auto _ : state) save(filled.store, path, replace);
  std::remove(path.c_str());
  std::remove(lock_path_of(path).c_str());
}
BENCHMARK(save_10k)->Unit(benchmark::kMillisecond);

// The default save into a file that already holds the same 10k entries: read, merge, write.
void save_10k_merging(benchmark::State& state) {
  static const FilledCache filled;
  const std::string path = temporary_path();
  for (auto _ : state) save(filled.store, path);
  std::remove(path.c_str());
  std::remove(lock_path_of(path).c_str());
}
BENCHMARK(save_10k_merging)->Unit(benchmark::kMillisecond);

// Loading a file of `entries` synthetic entries into an empty store (the store's teardown is not timed).
void load_entries(benchmark::State& state, std::size_t entries) {
  CacheStore source;
  add_synthetic_entries(source, synthetic_origin(), entries);
  const std::string path = temporary_path();
  save(source, path);
  for (auto _ : state) {
    auto store = std::make_unique<CacheStore>();
    benchmark::DoNotOptimize(load(*store, path).entries);
    state.PauseTiming();
    store.reset();
    state.ResumeTiming();
  }
  std::remove(path.c_str());
  std::remove(lock_path_of(path).c_str());
}

void load_10k(benchmark::State& state) { load_entries(state, 10000); }
BENCHMARK(load_10k)->Unit(benchmark::kMillisecond);

// The file a dynamic-shape training run may grow to (issue 17's target: 150 ms).
void load_100k(benchmark::State& state) { load_entries(state, 100000); }
BENCHMARK(load_100k)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
