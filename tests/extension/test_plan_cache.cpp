// The plan cache's limit and eviction (Note [Plan cache]). Without a GPU no plan builds, so each slot holds
// cuDNN's refusal, stored and looked up exactly as a plan is; tests/gpu/ runs real plans.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "backends.h"
#include "cache_fixtures.h"
#include "cudnn_cache/runtime.h"
#include "plan_cache.h"

using namespace cudnn_cache;

namespace {

EngineCandidate config_of_engine(std::int64_t engine) {
  EngineCandidate config;
  config.engine_id = engine;
  return config;
}

// A plan cache of its own, with slot i (i >= 1) the refusal of engine 0 for the key of batch i.
struct Plans {
  PlanCache cache{Runtime::instance()};
  PlanStore stored;

  PlanCache::Shared get(std::int64_t slot) {
    return cache.get(nullptr, 0, testing::conv_key(Direction::forward, slot), config_of_engine(0), stored, false);
  }
  bool holds(std::int64_t slot) const { return cache.contains(0, testing::conv_key(Direction::forward, slot), config_of_engine(0)); }
};

}  // namespace

TEST_CASE("the plan cache keeps at most its limit, evicting in batches down to 90%", "[plan_cache]") {
  Plans plans;
  CHECK(plans.cache.limit() == PlanCache::kDefaultLimit);
  plans.cache.set_limit(20);
  for (std::int64_t slot = 1; slot <= 20; ++slot) {
    const PlanCache::Shared entry = plans.get(slot);
    CHECK_FALSE(entry->plan);
    CHECK_FALSE(entry->refusal.empty());
  }
  CHECK(plans.cache.size() == 20);
  CHECK(plans.cache.plan_evictions == 0);
  plans.get(21);  // over the limit: a sweep down to 18
  CHECK(plans.cache.size() == 18);
  CHECK(plans.cache.plan_evictions == 3);
  for (std::int64_t slot = 22; slot <= 200; ++slot) {
    plans.get(slot);
    REQUIRE(plans.cache.size() <= 20);
  }
  CHECK(plans.cache.plan_evictions == 200 - plans.cache.size());
  CHECK(plans.holds(200));  // the entry just inserted is never evicted
}

TEST_CASE("an entry hit since the last sweep survives the next, when unused ones can go instead",
          "[plan_cache]") {
  Plans plans;
  plans.cache.set_limit(100);
  for (std::int64_t slot = 1; slot <= 101; ++slot) plans.get(slot);  // the 101st sweeps down to 90
  REQUIRE(plans.cache.size() == 90);
  // The even slots still cached are hit: they must outlive the next sweep, which evicts 11 of the 45 or so
  // odd ones, unused since the last sweep. A policy blind to hits would evict about half of its 11 among them.
  std::vector<std::int64_t> hit;
  for (std::int64_t slot = 2; slot <= 100; slot += 2) {
    if (plans.holds(slot)) hit.push_back(slot);
  }
  REQUIRE(hit.size() >= 39);
  for (const std::int64_t slot : hit) plans.get(slot);
  REQUIRE(plans.cache.size() == 90);
  for (std::int64_t slot = 1001; slot <= 1011; ++slot) plans.get(slot);  // the 11th sweeps
  REQUIRE(plans.cache.plan_evictions == 22);
  REQUIRE(plans.cache.size() == 90);
  for (const std::int64_t slot : hit) CHECK(plans.holds(slot));
  CHECK(plans.holds(1011));
}

TEST_CASE("a plan cache without a limit never evicts, and a lower limit evicts at once", "[plan_cache]") {
  Plans plans;
  plans.cache.set_limit(0);
  for (std::int64_t slot = 1; slot <= 300; ++slot) plans.get(slot);
  CHECK(plans.cache.size() == 300);
  CHECK(plans.cache.plan_evictions == 0);

  plans.cache.set_limit(300);  // not over it: nothing goes
  CHECK(plans.cache.size() == 300);
  plans.cache.set_limit(50);
  CHECK(plans.cache.size() == 45);
  CHECK(plans.cache.plan_evictions == 300 - 45);
  plans.get(301);  // under the limit again: nothing more goes
  CHECK(plans.cache.size() == 46);
  CHECK(plans.cache.plan_evictions == 300 - 45);
}

TEST_CASE("threads share the plan cache while its limit evicts", "[plan_cache][concurrency]") {
  Plans plans;
  plans.cache.set_limit(40);
  constexpr int kThreads = 4;
  constexpr std::int64_t kSlots = 120;  // three times the limit: most lookups miss, so sweeps run all along
  std::atomic<bool> over_limit{false}, refusal_missing{false}, done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Overlapping walks: each thread visits every slot, from its own start and with its own stride.
      for (std::int64_t i = 0; i < 1500; ++i) {
        const std::int64_t slot = 1 + (t * 31 + i * (t + 1)) % kSlots;
        const PlanCache::Shared entry = plans.get(slot);
        if (entry->refusal.empty()) refusal_missing = true;
        if (plans.cache.size() > plans.cache.limit()) over_limit = true;
      }
    });
  }
  threads.emplace_back([&] {
    while (!done) {
      if (plans.cache.size() > 40) over_limit = true;
    }
  });
  for (int t = 0; t < kThreads; ++t) threads[t].join();
  done = true;
  threads.back().join();
  CHECK_FALSE(over_limit);
  CHECK_FALSE(refusal_missing);
  CHECK(plans.cache.size() <= 40);
  CHECK(plans.cache.plan_evictions > 0);
}

TEST_CASE("the runtime sets the plan cache's limit and counts its evictions", "[plan_cache][runtime]") {
  Runtime& runtime = Runtime::instance();
  const std::size_t before = runtime.plan_cache_limit();
  runtime.set_plan_cache_limit(123);
  CHECK(runtime.plan_cache_limit() == 123);
  runtime.set_plan_cache_limit(before);
  CHECK(runtime.stats().plan_evictions == 0);  // no graph-API call ran in this process
  runtime.reset_stats();
  CHECK(runtime.stats().plan_evictions == 0);
}

TEST_CASE("a graph key borrows a neighbour's engine configs in order, never one cuDNN compiles at run time",
          "[plan_cache][nearest]") {
  Plans plans;  // Note [Nearest key]: a borrowed config is built for the key when a call runs it, not here
  const ConvolutionKey key = testing::conv_key(Direction::forward, 2);
  GraphBackend<Direction::forward> backend(nullptr, 0, key, plans.cache, plans.stored);
  EngineCandidate compiled = testing::engine(7, 0.5f);
  compiled.behavior_notes = EngineCandidate::kRuntimeCompiled;
  const auto neighbour =
      Ranking<GraphForwardTraits>::of({testing::engine(5, 2.0f), compiled, testing::engine(3, 1.0f, {{2, 16}})});
  const Ranking<GraphForwardTraits> lent = backend.borrow(neighbour);
  REQUIRE(lent.size() == 2);
  CHECK(lent[0] == neighbour[1]);  // engine 3, as the neighbour measured it
  CHECK(lent[1].engine_id == 5);
  CHECK(backend.borrow(Ranking<GraphForwardTraits>::of({compiled})).empty());
  CHECK(plans.cache.size() == 0);
}
