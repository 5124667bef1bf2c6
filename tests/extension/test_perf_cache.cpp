// Rankings, the merge rule, the thread-safe perf cache and the per-origin cache store
// (Note [Selection, merge and fallback policy] in perf_cache.h).

#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <thread>
#include <vector>

#include "cache_fixtures.h"
#include "cudnn_cache/cache_store.h"
#include "cudnn_cache/device.h"
#include "cudnn_cache/perf_cache.h"

using namespace cudnn_cache;
using Catch::Matchers::Contains;
using cudnn_cache::testing::candidate;
using cudnn_cache::testing::conv_key;
using cudnn_cache::testing::error_of;
using cudnn_cache::testing::failure;
using cudnn_cache::testing::to_text;

namespace {

using Fwd = ForwardTraits;
using FwdRanking = Ranking<Fwd>;

Candidate<Fwd> ok(int algorithm, float time_ms, std::uint64_t workspace_bytes = 0,
                  cudnnMathType_t math_type = CUDNN_DEFAULT_MATH) {
  return candidate<Fwd>(algorithm, time_ms, workspace_bytes, CUDNN_STATUS_SUCCESS, math_type);
}

Candidate<Fwd> failed(int algorithm, cudnnMathType_t math_type = CUDNN_DEFAULT_MATH) {
  return failure<Fwd>(algorithm, math_type);
}

// The algorithms of a ranking, best first.
template <typename Traits>
std::vector<int> algorithms(const Ranking<Traits>& ranking) {
  std::vector<int> result;
  for (const auto& c : ranking) result.push_back(c.algorithm);
  return result;
}

// merge() must not depend on the order of its arguments.
FwdRanking merged(const FwdRanking& a, const FwdRanking& b) {
  const FwdRanking ab = merge(a, b);
  INFO("merge(a, b) = " << to_text(ab) << ", merge(b, a) = " << to_text(merge(b, a)));
  CHECK(ab == merge(b, a));
  return ab;
}

Origin origin(const std::string& gpu, std::int32_t cudnn_minor = 19) {
  return Origin{DeviceIdentity{gpu, 9, 0, 132}, 9, cudnn_minor};
}

}  // namespace

// --- Ranking -------------------------------------------------------------------------------------------------

TEST_CASE("Ranking puts successes first, faster first, then smaller workspace", "[perf_cache]") {
  const auto ranking = FwdRanking::of({failed(0), ok(1, 2.0f, 0), ok(2, 1.0f, 4096), failed(4), ok(3, 1.0f, 1024)});
  INFO(to_text(ranking));
  CHECK(algorithms(ranking) == std::vector<int>{3, 2, 1, 0, 4});
  CHECK(ranking.front().algorithm == 3);
  CHECK_FALSE(ranking[3].succeeded());
  CHECK_FALSE(ranking[4].succeeded());
}

TEST_CASE("Ranking is the same whatever order the candidates come in", "[perf_cache]") {
  std::vector<Candidate<Fwd>> candidates{ok(0, 3.0f), ok(1, 1.0f, 8), ok(2, 1.0f, 2), failed(3), ok(4, 0.5f)};
  const auto expected = FwdRanking::of(candidates.begin(), candidates.end());
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return a.algorithm < b.algorithm; });
  do {
    CHECK(FwdRanking::of(candidates.begin(), candidates.end()) == expected);
  } while (std::next_permutation(candidates.begin(), candidates.end(),
                                 [](const auto& a, const auto& b) { return a.algorithm < b.algorithm; }));
}

TEST_CASE("Ranking keeps the better of duplicate (algorithm, math type) pairs", "[perf_cache]") {
  SECTION("the faster time") {
    const auto ranking = FwdRanking::of({ok(1, 3.0f), ok(1, 1.0f), ok(1, 2.0f)});
    REQUIRE(ranking.size() == 1);
    CHECK(ranking.front().time_ms == 1.0f);
  }
  SECTION("the smaller workspace on equal times") {
    const auto ranking = FwdRanking::of({ok(1, 1.0f, 512), ok(1, 1.0f, 64), ok(1, 1.0f, 128)});
    REQUIRE(ranking.size() == 1);
    CHECK(ranking.front().workspace_bytes == 64);
  }
  SECTION("a success over a failure") {
    const auto ranking = FwdRanking::of({failed(1), ok(1, 9.0f)});
    REQUIRE(ranking.size() == 1);
    CHECK(ranking.front().succeeded());
  }
  SECTION("but another math type is another candidate") {
    const auto ranking = FwdRanking::of({ok(1, 2.0f, 0, CUDNN_TENSOR_OP_MATH), ok(1, 1.0f), ok(1, 3.0f)});
    INFO(to_text(ranking));
    REQUIRE(ranking.size() == 2);
    CHECK(ranking[0].math_type == CUDNN_DEFAULT_MATH);
    CHECK(ranking[0].time_ms == 1.0f);
    CHECK(ranking[1].math_type == CUDNN_TENSOR_OP_MATH);
  }
}

TEST_CASE("Ranking keeps at most kMaxCandidates, the best ones", "[perf_cache]") {
  std::vector<Candidate<Fwd>> candidates;
  for (int algorithm = 0; algorithm < Fwd::algorithm_count; ++algorithm) {
    for (const auto math : {CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH}) {
      const float time = static_cast<float>(candidates.size() * 7 % 24) + 1.0f;  // 24 distinct times
      candidates.push_back(ok(algorithm, time, 0, math));
    }
  }
  const auto ranking = FwdRanking::of(candidates.begin(), candidates.end());
  INFO(to_text(ranking));
  REQUIRE(ranking.size() == kMaxCandidates);
  for (std::size_t i = 0; i < ranking.size(); ++i) CHECK(ranking[i].time_ms == static_cast<float>(i + 1));
}

TEST_CASE("a graph ranking keeps at most kMaxEngineConfigs, the best ones", "[perf_cache]") {
  std::vector<EngineCandidate> configs;
  for (std::size_t i = 0; i < kMaxEngineConfigs + 5; ++i) {
    configs.push_back(testing::engine(static_cast<std::int64_t>(i), static_cast<float>((i * 7) % (kMaxEngineConfigs + 5)) + 1));
  }
  const auto ranking = Ranking<GraphForwardTraits>::of(configs.begin(), configs.end());
  REQUIRE(ranking.size() == kMaxEngineConfigs);
  for (std::size_t i = 0; i < ranking.size(); ++i) CHECK(ranking[i].time_ms == static_cast<float>(i + 1));
}

TEST_CASE("Ranking::of_perfs ranks what cudnnFind*AlgorithmEx returns", "[perf_cache]") {
  cudnnConvolutionFwdAlgoPerf_t perfs[3]{};
  perfs[0] = {CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_STATUS_NOT_SUPPORTED, -1.0f, 0,
              CUDNN_NON_DETERMINISTIC,        CUDNN_DEFAULT_MATH,         {}};
  perfs[1] = {CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
              CUDNN_STATUS_SUCCESS,
              0.75f,
              std::size_t{1} << 33,
              CUDNN_DETERMINISTIC,
              CUDNN_TENSOR_OP_MATH,
              {}};
  perfs[2] = {
      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_STATUS_SUCCESS, 0.5f, 0, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH, {}};
  const auto ranking = FwdRanking::of_perfs(perfs, 3);
  INFO(to_text(ranking));
  REQUIRE(algorithms(ranking) == std::vector<int>{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_FFT});
  const auto& gemm = ranking[1];
  CHECK(gemm.status == CUDNN_STATUS_SUCCESS);
  CHECK(gemm.time_ms == 0.75f);
  CHECK(gemm.workspace_bytes == (std::uint64_t{1} << 33));
  CHECK(gemm.determinism == CUDNN_DETERMINISTIC);
  CHECK(gemm.math_type == CUDNN_TENSOR_OP_MATH);
  CHECK(ranking[2].status == CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(FwdRanking::of_perfs(perfs, 0).empty());
}

// --- merge ---------------------------------------------------------------------------------------------------

TEST_CASE("merge keeps the better measurement of each candidate", "[perf_cache]") {
  SECTION("a faster time wins") {
    const auto result = merged(FwdRanking::of({ok(1, 2.0f, 0)}), FwdRanking::of({ok(1, 1.5f, 1 << 20)}));
    REQUIRE(result.size() == 1);
    CHECK(result.front().time_ms == 1.5f);
    CHECK(result.front().workspace_bytes == (1u << 20));
  }
  SECTION("on a tie, the smaller workspace wins") {
    const auto result = merged(FwdRanking::of({ok(1, 1.0f, 256)}), FwdRanking::of({ok(1, 1.0f, 128)}));
    REQUIRE(result.size() == 1);
    CHECK(result.front().workspace_bytes == 128);
  }
  SECTION("a success beats a failure") {
    const auto result = merged(FwdRanking::of({failed(1)}), FwdRanking::of({ok(1, 100.0f)}));
    REQUIRE(result.size() == 1);
    CHECK(result.front().succeeded());
  }
  SECTION("distinct algorithms are united and ranked again") {
    const auto result = merged(FwdRanking::of({ok(0, 3.0f), failed(5)}), FwdRanking::of({ok(2, 1.0f), ok(0, 4.0f)}));
    INFO(to_text(result));
    CHECK(algorithms(result) == std::vector<int>{2, 0, 5});
    CHECK(result[1].time_ms == 3.0f);
  }
  SECTION("measurements are never averaged") {
    const auto result = merged(FwdRanking::of({ok(3, 1.0f)}), FwdRanking::of({ok(3, 3.0f)}));
    CHECK(result.front().time_ms == 1.0f);
  }
}

// --- PerfCache -----------------------------------------------------------------------------------------------

TEST_CASE("PerfCache find on a miss returns nothing and inserts nothing", "[perf_cache]") {
  PerfCache<Fwd> cache;
  PerfCache<Fwd>::Shared found = std::make_shared<const FwdRanking>(FwdRanking::of({ok(1, 1.0f)}));
  REQUIRE_NOTHROW(found = cache.find(conv_key(Direction::forward)));
  CHECK(found == nullptr);
  CHECK(cache.size() == 0);
  CHECK(cache.entries().empty());
}

TEST_CASE("PerfCache insert, find, merge, erase and clear", "[perf_cache]") {
  PerfCache<Fwd> cache;
  const ConvolutionKey key = conv_key(Direction::forward);
  const ConvolutionKey other = conv_key(Direction::forward, 2);
  const auto first = FwdRanking::of({ok(1, 2.0f), ok(2, 3.0f)});
  cache.insert(key, first);

  REQUIRE(cache.size() == 1);
  REQUIRE(cache.find(key) != nullptr);
  CHECK(*cache.find(key) == first);
  CHECK(cache.find(other) == nullptr);

  SECTION("inserting again merges") {
    const auto second = FwdRanking::of({ok(2, 1.0f), ok(0, 5.0f)});
    cache.insert(key, second);
    CHECK(cache.size() == 1);
    const auto found = cache.find(key);
    REQUIRE(found != nullptr);
    INFO(to_text(*found));
    CHECK(*found == merge(first, second));
    CHECK(algorithms(*found) == std::vector<int>{2, 1, 0});
  }
  SECTION("replacing stores the ranking as given, unmerged, and moves the version on") {
    const auto held = cache.find(key);
    const std::uint64_t version = cache.version();
    const auto settled = FwdRanking::of({ok(2, 2.5f), ok(1, 2.6f)});  // 1 was faster in the old ranking
    cache.replace(key, settled);
    CHECK(*cache.find(key) == settled);
    CHECK(algorithms(*cache.find(key)) == std::vector<int>{2, 1});
    CHECK(cache.version() != version);
    CHECK(*held == first);  // a ranking found before stays as it was
    cache.replace(other, first);  // a key it did not hold: stored
    CHECK(cache.size() == 2);
    CHECK_THAT(error_of([&] { cache.replace(key, FwdRanking()); }), Contains("empty ranking"));
    CHECK_THAT(error_of([&] { cache.replace(conv_key(Direction::backward_data), first); }),
               Contains("forward cache cannot hold a key of direction backward_data"));
    CHECK(*cache.find(key) == settled);
  }
  SECTION("a replaced key is listed as replaced until it is merged, erased or cleared") {
    CHECK(cache.replaced_entries().empty());  // inserted, not replaced
    const auto settled = FwdRanking::of({ok(2, 2.5f), ok(1, 2.6f)});
    cache.replace(key, settled);
    cache.replace(other, first);
    const auto replaced = cache.replaced_entries();
    REQUIRE(replaced.size() == 2);
    CHECK(replaced[0].first < replaced[1].first);  // sorted by key, as entries() is
    CHECK(replaced == cache.entries());
    cache.insert(other, FwdRanking::of({ok(3, 9.0f)}));  // merged: no longer as replace() left it
    REQUIRE(cache.replaced_entries().size() == 1);
    CHECK(cache.replaced_entries()[0] == PerfCache<Fwd>::Entry{key, settled});
    cache.replace(other, first);
    cache.erase(key);
    REQUIRE(cache.replaced_entries().size() == 1);
    CHECK(cache.replaced_entries()[0].first == other);
    cache.clear();
    cache.insert(other, first);
    CHECK(cache.replaced_entries().empty());
  }
  SECTION("a ranking found stays as it was while the key is merged, erased or cleared") {
    const auto held = cache.find(key);
    cache.insert(key, FwdRanking::of({ok(2, 0.5f)}));
    cache.erase(key);
    cache.clear();
    CHECK(*held == first);
  }
  SECTION("erase removes only that key") {
    cache.insert(other, first);
    CHECK(cache.erase(key));
    CHECK_FALSE(cache.erase(key));
    CHECK_FALSE(cache.find(key) != nullptr);
    CHECK(cache.find(other) != nullptr);
    CHECK(cache.size() == 1);
  }
  SECTION("clear removes everything") {
    cache.insert(other, first);
    cache.clear();
    CHECK(cache.size() == 0);
    CHECK_FALSE(cache.find(key) != nullptr);
    CHECK(cache.find(other) == nullptr);
  }
}

TEST_CASE("PerfCache refuses keys of another direction and empty rankings", "[perf_cache]") {
  PerfCache<Fwd> cache;
  const auto ranking = FwdRanking::of({ok(1, 1.0f)});
  CHECK_THAT(error_of([&] { cache.insert(conv_key(Direction::backward_data), ranking); }),
             Contains("forward cache cannot hold a key of direction backward_data"));
  CHECK_THAT(error_of([&] { PerfCache<BackwardFilterTraits>().insert(conv_key(Direction::forward), {}); }),
             Contains("backward_filter cache cannot hold a key of direction forward"));
  CHECK_THAT(error_of([&] { cache.insert(conv_key(Direction::forward), FwdRanking()); }), Contains("empty ranking"));
  CHECK(cache.size() == 0);
}

TEST_CASE("PerfCache entries are sorted by key", "[perf_cache]") {
  PerfCache<Fwd> cache;
  const std::vector<std::int64_t> batches{5, 3, 9, 1, 7, 2};
  for (const std::int64_t batch : batches) {
    cache.insert(conv_key(Direction::forward, batch), FwdRanking::of({ok(0, static_cast<float>(batch))}));
  }
  const auto entries = cache.entries();
  REQUIRE(entries.size() == batches.size());
  for (std::size_t i = 1; i < entries.size(); ++i) CHECK(entries[i - 1].first < entries[i].first);
  for (const auto& [key, ranking] : entries) CHECK(ranking.front().time_ms == static_cast<float>(key.input.dims[0]));
}

TEST_CASE("PerfCache holds the merge of everything 8 threads insert concurrently", "[perf_cache][concurrency]") {
  constexpr int kThreads = 8, kKeys = 16, kRounds = 60;
  std::vector<ConvolutionKey> keys;
  for (int k = 0; k < kKeys; ++k) keys.push_back(conv_key(Direction::forward, 1 + k));
  // What thread t inserts for key k in round r: overlapping algorithms and math types, varied times.
  auto measured = [](int t, int k, int r) {
    const int algorithm = (t + r) % Fwd::algorithm_count;
    const auto math = r % 3 == 0 ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH;
    const float time = 0.25f * static_cast<float>(1 + (t * 7919 + k * 31 + r * 17) % 97);
    if ((t + k + r) % 11 == 0) return failed(algorithm, math);
    return ok(algorithm, time, static_cast<std::uint64_t>((t * r) % 5) * 64, math);
  };

  PerfCache<Fwd> cache;
  std::atomic<int> bad_finds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kKeys; ++i) {
          const int k = (i + t) % kKeys;  // threads start on different keys and overlap everywhere
          cache.insert(keys[k], FwdRanking::of({measured(t, k, r)}));
          const auto found = cache.find(keys[(k + 1) % kKeys]);
          if (found && (found->empty() || !std::is_sorted(found->begin(), found->end(), ranks_before<Fwd>))) {
            ++bad_finds;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(bad_finds == 0);

  REQUIRE(cache.size() == static_cast<std::size_t>(kKeys));
  for (int k = 0; k < kKeys; ++k) {
    std::vector<Candidate<Fwd>> everything;
    for (int t = 0; t < kThreads; ++t) {
      for (int r = 0; r < kRounds; ++r) everything.push_back(measured(t, k, r));
    }
    const auto expected = FwdRanking::of(everything.begin(), everything.end());
    const auto best = std::min_element(everything.begin(), everything.end(), ranks_before<Fwd>);
    const auto found = cache.find(keys[k]);
    REQUIRE(found != nullptr);
    INFO("key " << k << ": " << to_text(*found) << " expected " << to_text(expected));
    CHECK(found->front().time_ms == best->time_ms);
    CHECK(*found == expected);
  }
}

TEST_CASE("PerfCache nearest finds the nearest key of the family it holds, never the key itself", "[perf_cache]") {
  PerfCache<Fwd> cache;
  const auto at = [](std::int64_t batch, std::int64_t channels = 8) {
    return conv_key(Direction::forward, batch, channels);  // 16x16 outputs: pixels follow the batch
  };
  CHECK(cache.nearest(at(2)).second == nullptr);  // an empty cache
  cache.insert(at(1), FwdRanking::of({ok(1, 1.0f)}));
  cache.insert(at(8), FwdRanking::of({ok(8, 1.0f)}));
  cache.insert(at(3, 16), FwdRanking::of({ok(3, 1.0f)}));  // other channels: another family
  const auto nearest_algorithm = [&](const ConvolutionKey& key) {
    const auto [neighbour, ranking] = cache.nearest(key);
    REQUIRE(ranking != nullptr);
    CHECK(cache.find(neighbour) == ranking);
    return static_cast<int>(ranking->front().algorithm);
  };
  CHECK(nearest_algorithm(at(2)) == 1);   // 2x from batch 1, 4x from batch 8
  CHECK(nearest_algorithm(at(4)) == 8);   // 2x from batch 8, 4x from batch 1
  CHECK(nearest_algorithm(at(1)) == 8);   // a key held: its nearest other key
  CHECK(nearest_algorithm(at(2, 16)) == 3);
  CHECK(cache.nearest(at(2, 4)).second == nullptr);  // no key of its family
  CHECK(cache.nearest(conv_key(Direction::forward, 2, 8, Layout::nhwc)).second == nullptr);
}

TEST_CASE("PerfCache lends a ranking to a key it does not hold until the key is inserted, erased or cleared",
          "[perf_cache]") {
  PerfCache<Fwd> cache;
  const ConvolutionKey key = conv_key(Direction::forward, 2), held = conv_key(Direction::forward, 1);
  cache.insert(held, FwdRanking::of({ok(1, 1.0f)}));
  CHECK(cache.lent(key) == nullptr);
  const auto lent = std::make_shared<const FwdRanking>(FwdRanking::of({ok(1, 1.0f)}));
  cache.lend(key, lent);
  CHECK(cache.lent(key) == lent);
  CHECK(cache.find(key) == nullptr);  // lent is not held: not found, listed nor counted
  CHECK(cache.size() == 1);
  CHECK(cache.entries().size() == 1);
  const auto nothing = std::make_shared<const FwdRanking>();  // a key lent nothing runs native heuristics' choice
  const auto chosen = std::make_shared<const FwdRanking>(FwdRanking::of({ok(3, 0.0f)}));
  cache.lend(key, chosen);  // lending again replaces: what a borrowed ranking that did not run gives way to
  CHECK(cache.lent(key) == chosen);
  cache.lend(key, lent);
  CHECK(cache.lent(key) == lent);
  cache.lend(held, nothing);  // a held key is never lent anything
  CHECK(cache.lent(held) == nullptr);
  cache.insert(key, FwdRanking::of({ok(2, 0.5f)}));  // tuned: its own ranking from now on
  CHECK(cache.lent(key) == nullptr);
  const ConvolutionKey other = conv_key(Direction::forward, 4);
  cache.lend(other, nothing);
  CHECK(cache.lent(other) == nothing);
  cache.erase(other);
  CHECK(cache.lent(other) == nullptr);
  cache.lend(other, nothing);
  cache.clear();
  CHECK(cache.lent(other) == nullptr);
}

TEST_CASE("PerfCache keeps at most kMaxLent lent rankings, however many keys borrow", "[perf_cache]") {
  PerfCache<Fwd> cache;
  const auto nothing = std::make_shared<const FwdRanking>();
  const auto key = [](std::size_t i) { return conv_key(Direction::forward, 1 + static_cast<std::int64_t>(i)); };
  for (std::size_t i = 0; i < PerfCache<Fwd>::kMaxLent; ++i) cache.lend(key(i), nothing);
  CHECK(cache.lent(key(0)) == nothing);
  CHECK(cache.lent(key(PerfCache<Fwd>::kMaxLent - 1)) == nothing);
  const auto again = std::make_shared<const FwdRanking>();
  cache.lend(key(0), again);  // a key lent again, at the limit: replaced, nothing forgotten
  CHECK(cache.lent(key(0)) == again);
  CHECK(cache.lent(key(PerfCache<Fwd>::kMaxLent - 1)) == nothing);
  cache.lend(key(PerfCache<Fwd>::kMaxLent), nothing);  // one more: the others are forgotten
  CHECK(cache.lent(key(PerfCache<Fwd>::kMaxLent)) == nothing);
  CHECK(cache.lent(key(0)) == nullptr);
  CHECK(cache.lent(key(PerfCache<Fwd>::kMaxLent - 1)) == nullptr);
}

// --- CacheStore ----------------------------------------------------------------------------------------------

TEST_CASE("DirectionCaches::get returns the cache of the direction", "[perf_cache]") {
  DirectionCaches caches;
  CHECK(&caches.get<ForwardTraits>() == &caches.forward);
  CHECK(&caches.get<BackwardDataTraits>() == &caches.backward_data);
  CHECK(&caches.get<BackwardFilterTraits>() == &caches.backward_filter);
  const DirectionCaches& constant = caches;
  CHECK(&constant.get<ForwardTraits>() == &caches.forward);
  CHECK(&constant.get<BackwardDataTraits>() == &caches.backward_data);
  CHECK(&constant.get<BackwardFilterTraits>() == &caches.backward_filter);

  caches.get<BackwardDataTraits>().insert(conv_key(Direction::backward_data),
                                          Ranking<BackwardDataTraits>::of({candidate<BackwardDataTraits>(1, 1.0f)}));
  CHECK(caches.size() == 1);
  CHECK(caches.backward_data.size() == 1);
  caches.clear();
  CHECK(caches.size() == 0);
}

TEST_CASE("CacheStore keeps one stable set of caches per origin", "[perf_cache]") {
  CacheStore store;
  const Origin a = origin("GPU A"), b = origin("GPU B"), c = origin("GPU A", 20);
  CHECK(store.find(a) == nullptr);
  CHECK(store.origins().empty());

  DirectionCaches& caches_a = store.caches(a);
  caches_a.forward.insert(conv_key(Direction::forward), FwdRanking::of({ok(0, 1.0f)}));
  caches_a.backward_data.insert(conv_key(Direction::backward_data),
                                Ranking<BackwardDataTraits>::of({candidate<BackwardDataTraits>(0, 1.0f)}));
  for (int i = 0; i < 100; ++i) store.caches(origin("filler GPU " + std::to_string(i)));
  store.caches(b).backward_filter.insert(conv_key(Direction::backward_filter),
                                         Ranking<BackwardFilterTraits>::of({candidate<BackwardFilterTraits>(0, 1.0f)}));

  CHECK(&store.caches(a) == &caches_a);
  CHECK(store.find(a) == &caches_a);
  CHECK(store.find(c) == nullptr);  // same GPU, another cuDNN minor: another origin
  CHECK(caches_a.size() == 2);
  CHECK(store.size() == 3);

  const auto origins = store.origins();
  REQUIRE(origins.size() == 102);
  for (std::size_t i = 1; i < origins.size(); ++i) CHECK(origins[i - 1].first < origins[i].first);
  CHECK(origins.front().first == a);
  CHECK(origins.front().second == &caches_a);

  store.clear();
  CHECK(store.size() == 0);
  CHECK(store.origins().size() == 102);
  CHECK(&store.caches(a) == &caches_a);
  caches_a.forward.insert(conv_key(Direction::forward), FwdRanking::of({ok(0, 1.0f)}));
  CHECK(store.size() == 1);
}

TEST_CASE("Origin compares device and cuDNN major.minor", "[perf_cache]") {
  const Origin a = origin("GPU A", 19);
  CHECK(a.same_cudnn(CudnnVersion{9, 19, 5}));
  CHECK_FALSE(a.same_cudnn(CudnnVersion{9, 20, 0}));
  CHECK_FALSE(a.same_cudnn(CudnnVersion{8, 19, 0}));
  CHECK(Origin::of(a.device, CudnnVersion{9, 19, 7}) == a);
  CHECK(CudnnVersion::from_number(91902).number() == 91902);
  CHECK(a != origin("GPU A", 18));
  CHECK(origin("GPU A", 18) < a);
}

TEST_CASE("DeviceIdentity::of_device throws without a GPU, or names the GPU", "[perf_cache]") {
  std::string name;
  const std::string error = error_of([&] { name = DeviceIdentity::of_device(0).name; });
  if (error == "no error") {
    CHECK_FALSE(name.empty());  // a machine with a GPU
  } else {
    CHECK_THAT(error, Contains("CUDA device 0"));
    CHECK_THAT(error_of([] { Origin::of_device(0); }), Contains("CUDA device 0"));
  }
}

// --- algorithm names -----------------------------------------------------------------------------------------

TEST_CASE("algorithm_name names each direction's algorithms", "[perf_cache]") {
  CHECK(algorithm_name(Direction::forward, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) ==
        "IMPLICIT_PRECOMP_GEMM");
  CHECK(algorithm_name(Direction::forward, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED) == "WINOGRAD_NONFUSED");
  CHECK(algorithm_name(Direction::backward_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1) == "ALGO_1");
  CHECK(algorithm_name(Direction::backward_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING) == "FFT_TILING");
  CHECK(algorithm_name(Direction::backward_filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3) == "ALGO_3");
  CHECK(algorithm_name(Direction::backward_filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING) == "FFT_TILING");
  for (const Direction direction : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
    CAPTURE(direction);
    CHECK(algorithm_name(direction, 42) == "ALGO_42");
    CHECK(algorithm_name(direction, -1) == "ALGO_-1");
  }
  CHECK(ForwardTraits::algorithm_name(Fwd::algorithm_count) == "ALGO_" + std::to_string(Fwd::algorithm_count));
  CHECK(BackwardDataTraits::algorithm_name(CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD) == "WINOGRAD");
  CHECK(BackwardFilterTraits::algorithm_name(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT) == "FFT");
}

TEST_CASE("engine configs rank and merge by the same rule, one measurement per engine and knobs", "[perf_cache]") {
  auto engine = [](std::int64_t id, float time_ms, std::uint64_t workspace, std::int64_t knob_value) {
    EngineCandidate result;
    result.engine_id = id;
    result.time_ms = time_ms;
    result.workspace_bytes = workspace;
    result.knobs[result.knob_count++] = {2, knob_value};
    return result;
  };
  using Graph = GraphForwardTraits;
  const auto ranking = Ranking<Graph>::of({engine(7, 2.0f, 0, 1), engine(9, 1.0f, 64, 1), engine(9, 1.0f, 8, 2),
                                           engine(7, 1.5f, 0, 1)});
  REQUIRE(ranking.size() == 3);  // engine 7 with knob 1 measured twice: the faster one is kept
  CHECK(ranking[0].engine_id == 9);
  CHECK(ranking[0].workspace_bytes == 8);  // equal times: the smaller workspace first
  CHECK(ranking[1].workspace_bytes == 64);
  CHECK(ranking[2].engine_id == 7);
  CHECK(ranking[2].time_ms == 1.5f);

  const auto merged = merge(ranking, Ranking<Graph>::of({engine(9, 0.5f, 64, 1), engine(30, 3.0f, 0, 0)}));
  REQUIRE(merged.size() == 4);
  CHECK(merged[0].engine_id == 9);
  CHECK(merged[0].time_ms == 0.5f);  // the faster measurement of engine 9, knob 1 wins
  CHECK(merged[3].engine_id == 30);

  PerfCache<Graph> cache;
  CHECK_FALSE(cache.find(conv_key(Direction::forward)));
  cache.insert(conv_key(Direction::forward), ranking);
  REQUIRE(cache.find(conv_key(Direction::forward)));
  CHECK(*cache.find(conv_key(Direction::forward)) == ranking);
  CHECK_THROWS_AS(cache.insert(conv_key(Direction::backward_data), ranking), Error);
}

TEST_CASE("a merge keeps the better measurement of a config and the numerical notes whichever measurement knows them",
          "[perf_cache]") {
  using Graph = GraphBackwardFilterTraits;
  EngineCandidate old_file;  // a format 4 entry: faster, notes unknown
  old_file.engine_id = 5;
  old_file.time_ms = 1.0f;
  EngineCandidate searched = old_file;  // the same config timed again by a search, which read its notes
  searched.time_ms = 1.1f;
  searched.numerical_notes = 0;  // deterministic
  EngineCandidate split = old_file;  // another config, nondeterministic
  split.engine_id = 6;
  split.time_ms = 0.9f;
  split.numerical_notes = EngineCandidate::kNondeterministic;
  for (const auto& [a, b] : {std::pair{Ranking<Graph>::of({old_file, split}), Ranking<Graph>::of({searched})},
                             std::pair{Ranking<Graph>::of({searched}), Ranking<Graph>::of({old_file, split})}}) {
    const auto merged = merge(a, b);
    REQUIRE(merged.size() == 2);
    CHECK(merged[1].engine_id == 5);
    CHECK(merged[1].time_ms == 1.0f);  // the better measurement
    CHECK(merged[1].deterministic());  // and what the search knew of the config
    CHECK_FALSE(merged[0].deterministic());
    CHECK(merged[0].numerical_notes == EngineCandidate::kNondeterministic);
  }
  // Notes already known are not replaced by another measurement's.
  EngineCandidate other_notes = searched;
  other_notes.time_ms = 2.0f;
  other_notes.numerical_notes = EngineCandidate::kNondeterministic;
  CHECK(merge(Ranking<Graph>::of({searched}), Ranking<Graph>::of({other_notes}))[0].numerical_notes == 0);
}
