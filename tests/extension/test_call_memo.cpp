// A thread's memo of its hits (Note [Each thread's own hits] in call_memo.h), the cache versions it is checked
// against (Note [Cache versions] in perf_cache.h), and the hit counter threads add to apart.

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "cache_fixtures.h"
#include "call_memo.h"
#include "cudnn_cache/perf_cache.h"
#include "cudnn_cache/runtime.h"
#include "plan_cache.h"

using namespace cudnn_cache;
using cudnn_cache::testing::candidate;
using cudnn_cache::testing::conv_key;

namespace {

using Memo = CallMemo<int>;
using Versions = Memo::Versions;

Candidate<ForwardTraits> ok(int algorithm, float time_ms) { return candidate<ForwardTraits>(algorithm, time_ms); }

}  // namespace

TEST_CASE("a memo gives back what it keeps for the same cache, key, determinism and versions", "[call_memo]") {
  Memo memo;
  const int cache = 0, other_cache = 0;
  const ConvolutionKey key = conv_key(Direction::forward);
  const Versions made{1, 2, 3};
  CHECK(memo.find(&cache, 0, key, false, made) == nullptr);
  memo.insert(&cache, 0, key, false, made, 7);
  REQUIRE(memo.find(&cache, 0, key, false, made) != nullptr);
  CHECK(*memo.find(&cache, 0, key, false, made) == 7);

  CHECK(memo.find(&cache, 0, key, true, made) == nullptr);  // a deterministic call is another call
  CHECK(memo.find(&cache, 1, key, false, made) == nullptr);  // so is a call on another GPU of the cache's model
  memo.insert(&cache, 1, key, false, made, 9);
  CHECK(*memo.find(&cache, 0, key, false, made) == 7);
  CHECK(*memo.find(&cache, 1, key, false, made) == 9);
  memo.erase(&cache, 1, key, false);
  CHECK(memo.find(&other_cache, 0, key, false, made) == nullptr);  // so is another cache's (another device, runtime)
  CHECK(memo.find(&cache, 0, conv_key(Direction::forward, 2), false, made) == nullptr);
  CHECK(memo.size(&cache) == 1);  // looking for other calls leaves the entry

  memo.insert(&cache, 0, key, false, made, 8);  // a new value for the call replaces the old
  CHECK(*memo.find(&cache, 0, key, false, made) == 8);
  memo.erase(&cache, 0, key, false);
  CHECK(memo.find(&cache, 0, key, false, made) == nullptr);
  CHECK(memo.size(&cache) == 0);
}

TEST_CASE("a cache's memo is dropped whole at its next call under other versions, whichever key it is for",
          "[call_memo]") {
  const int cache = 0, other_cache = 0;
  const ConvolutionKey key = conv_key(Direction::forward);
  const ConvolutionKey other = conv_key(Direction::forward, 2);
  const ConvolutionKey third = conv_key(Direction::forward, 3);
  const Versions made{1, 2, 3};
  for (const Versions now : {Versions{9, 2, 3}, Versions{1, 9, 3}, Versions{1, 2, 9}}) {
    INFO("versions now: cache " << now.cache << ", plans " << now.plans << ", workspace limit " << now.workspace_limit);
    Memo memo;
    memo.insert(&cache, 0, key, false, made, 1);
    memo.insert(&cache, 0, other, true, made, 2);
    memo.insert(&other_cache, 0, key, false, made, 3);
    CHECK(memo.find(&cache, 0, third, false, now) == nullptr);  // a call of another key notices the change
    CHECK(memo.size(&cache) == 0);
    CHECK(memo.find(&cache, 0, key, false, made) == nullptr);
    CHECK(memo.find(&cache, 0, other, true, now) == nullptr);
    REQUIRE(memo.find(&other_cache, 0, key, false, made) != nullptr);  // another cache's memo stays
    CHECK(*memo.find(&other_cache, 0, key, false, made) == 3);
    memo.insert(&cache, 0, key, false, now, 4);  // made again under the new versions
    CHECK(*memo.find(&cache, 0, key, false, now) == 4);
  }
}

TEST_CASE("a memo holds at most kLimit calls of a cache, and the memos of kCaches caches", "[call_memo]") {
  Memo memo;
  const int cache = 0;
  const Versions made{1, 1, 1};
  for (std::int64_t batch = 1; batch <= static_cast<std::int64_t>(Memo::kLimit); ++batch) {
    memo.insert(&cache, 0, conv_key(Direction::forward, batch), false, made, static_cast<int>(batch));
  }
  CHECK(memo.size(&cache) == Memo::kLimit);
  CHECK(*memo.find(&cache, 0, conv_key(Direction::forward, 1), false, made) == 1);
  const ConvolutionKey past = conv_key(Direction::forward, static_cast<std::int64_t>(Memo::kLimit) + 1);
  memo.insert(&cache, 0, past, false, made, 0);  // past the limit: it starts afresh
  CHECK(memo.size(&cache) == 1);
  CHECK(memo.find(&cache, 0, conv_key(Direction::forward, 1), false, made) == nullptr);
  CHECK(*memo.find(&cache, 0, past, false, made) == 0);

  // One cache more than it keeps: the first one met is forgotten, the others stay.
  std::vector<int> caches(Memo::kCaches);
  const ConvolutionKey key = conv_key(Direction::forward);
  for (std::size_t i = 0; i < caches.size(); ++i) memo.insert(&caches[i], 0, key, false, made, static_cast<int>(i));
  CHECK(memo.size(&cache) == 0);
  for (std::size_t i = 0; i < caches.size(); ++i) {
    REQUIRE(memo.find(&caches[i], 0, key, false, made) != nullptr);
    CHECK(*memo.find(&caches[i], 0, key, false, made) == static_cast<int>(i));
  }
}

TEST_CASE("a perf cache's version changes with what its lookups return, and with nothing else",
          "[call_memo][perf_cache]") {
  PerfCache<ForwardTraits> cache;
  const ConvolutionKey key = conv_key(Direction::forward);
  const ConvolutionKey other = conv_key(Direction::forward, 2);
  std::set<std::uint64_t> seen{cache.version()};
  const auto changed = [&] { return seen.insert(cache.version()).second; };

  cache.insert(key, Ranking<ForwardTraits>::of({ok(1, 2.0f)}));
  CHECK(changed());
  cache.insert(key, Ranking<ForwardTraits>::of({ok(2, 1.0f)}));  // a merge
  CHECK(changed());
  const std::uint64_t before = cache.version();
  cache.find(key);
  cache.find(other);
  cache.entries();
  cache.nearest(other);
  cache.lend(other, std::make_shared<const Ranking<ForwardTraits>>());  // a miss's, never a hit's
  cache.lent(other);
  cache.reserve(10);
  CHECK(cache.erase(conv_key(Direction::forward, 3)) == false);  // nothing to erase
  CHECK(cache.version() == before);
  CHECK(cache.erase(key));
  CHECK(changed());
  cache.clear();
  CHECK(changed());

  // Another cache, even one made where this one was, never shows a version this one showed.
  PerfCache<ForwardTraits> next;
  CHECK(seen.count(next.version()) == 0);
}

TEST_CASE("the plan cache's version changes when it evicts, not when it stores", "[call_memo][plan_cache]") {
  PlanCache plans(Runtime::instance());
  PlanStore stored;
  EngineCandidate config;
  config.engine_id = 0;
  // Without a GPU no plan builds: each slot holds cuDNN's refusal, kept and evicted as a plan is.
  const auto get = [&](std::int64_t batch) {
    plans.get(nullptr, 0, conv_key(Direction::forward, batch), config, stored, false);
  };
  plans.set_limit(10);
  const std::uint64_t first = plans.version();
  for (std::int64_t batch = 1; batch <= 10; ++batch) get(batch);
  get(1);  // a hit
  CHECK(plans.version() == first);
  get(11);  // over the limit: a sweep evicts
  CHECK(plans.plan_evictions > 0);
  const std::uint64_t after = plans.version();
  CHECK(after != first);
  plans.set_limit(100);  // nothing to evict
  CHECK(plans.version() == after);
  plans.set_limit(1);
  CHECK(plans.version() != after);
}

TEST_CASE("a spread counter sums what many threads add, and resets", "[call_memo][concurrency]") {
  SpreadCounter counter;
  CHECK(counter.load() == 0);
  constexpr int kThreads = 24;  // more than its shards: some threads share one
  constexpr int kAdds = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) counter.add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(counter.load() == static_cast<std::uint64_t>(kThreads) * kAdds);
  counter.add(5);
  CHECK(counter.load() == static_cast<std::uint64_t>(kThreads) * kAdds + 5);
  counter.reset();
  CHECK(counter.load() == 0);
}
