// The runtime's parts that need no GPU: the names of miss policies, backends and log levels, and logging.
// tests/gpu/ runs convolutions through it.

#include <catch2/catch.hpp>
#include <sched.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/runtime.h"

using namespace cudnn_cache;
using Catch::Matchers::Contains;

namespace {

// A forward key of a small fp32 3x3 convolution, 8 channels in and out.
ConvolutionKey small_forward_key() {
  return make_convolution_key(
      Direction::forward, make_tensor_key(CUDNN_DATA_FLOAT, {2, 8, 16, 16}, Layout::nchw),
      make_filter_key(CUDNN_DATA_FLOAT, {8, 8, 3, 3}, Layout::nchw),
      make_tensor_key(CUDNN_DATA_FLOAT, {2, 8, 16, 16}, Layout::nchw),
      make_convolution_descriptor_key({1, 1}, {1, 1}, {1, 1}, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                                      CUDNN_DEFAULT_MATH));
}

}  // namespace

TEST_CASE("miss policies and backends round-trip through their names, and others are refused", "[runtime]") {
  for (MissPolicy policy :
       {MissPolicy::tune, MissPolicy::heuristic, MissPolicy::error, MissPolicy::record, MissPolicy::nearest}) {
    CHECK(miss_policy_from_string(to_string(policy)) == policy);
  }
  CHECK_THROWS_WITH(miss_policy_from_string("retry"),
                    Contains("use 'tune', 'heuristic', 'error', 'record' or 'nearest'"));
  for (Backend backend : {Backend::graph, Backend::legacy}) CHECK(backend_from_string(to_string(backend)) == backend);
  CHECK_THROWS_WITH(backend_from_string("v7"), Contains("use 'graph' or 'legacy'"));
  CHECK(graph_backend_available());  // cuDNN 9
  CHECK(Runtime::instance().backend() == Backend::graph);
}

TEST_CASE("usable cores follow the process's CPU affinity, as taskset or a container's CPU set narrows it",
          "[runtime]") {
  cpu_set_t all;
  REQUIRE(sched_getaffinity(0, sizeof(all), &all) == 0);
  CHECK(usable_cores() == CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);  // this thread only
  const int narrowed = usable_cores();
  REQUIRE(sched_setaffinity(0, sizeof(all), &all) == 0);
  CHECK(narrowed == 1);
}

TEST_CASE("prepare's default threads: one per 16 entries, up to the usable cores and 8", "[runtime]") {
  const int cores = usable_cores();
  CHECK(default_prepare_threads(0) == 1);
  CHECK(default_prepare_threads(16) == 1);
  CHECK(default_prepare_threads(17) == std::min(cores, 2));
  CHECK(default_prepare_threads(90) == std::min(cores, 6));
  CHECK(default_prepare_threads(10'000) == std::min(cores, 8));
}

TEST_CASE("log levels parse, gate messages, and reach the handler", "[runtime][log]") {
  CHECK(log_level_from_string("debug") == LogLevel::debug);
  CHECK(log_level_from_string("info") == LogLevel::info);
  CHECK(log_level_from_string("off") == LogLevel::off);
  CHECK_THROWS_WITH(log_level_from_string("verbose"), Contains("use 'off', 'info' or 'debug'"));
  for (LogLevel level : {LogLevel::off, LogLevel::info, LogLevel::debug}) {
    CHECK(log_level_from_string(to_string(level)) == level);
  }

  Runtime& runtime = Runtime::instance();
  const LogLevel before = runtime.log_level();
  std::vector<std::pair<LogLevel, std::string>> seen;
  runtime.set_log_handler([&](LogLevel level, const std::string& message) { seen.emplace_back(level, message); });
  runtime.set_log_level(LogLevel::info);
  CHECK(runtime.logs(LogLevel::info));
  CHECK_FALSE(runtime.logs(LogLevel::debug));
  CHECK_FALSE(runtime.logs(LogLevel::off));
  runtime.log(LogLevel::debug, "not shown");
  runtime.log(LogLevel::info, "shown");
  runtime.set_log_level(LogLevel::off);
  runtime.log(LogLevel::info, "not shown either");
  runtime.set_log_handler(nullptr);
  runtime.set_log_level(before);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::make_pair(LogLevel::info, std::string("shown")));
}

TEST_CASE("search options are kept, and values out of range are refused naming the field", "[runtime][search]") {
  Runtime runtime;
  GraphSearchOptions options;
  options.build_threads = 4;
  options.exhaustive = true;
  options.rank_deterministic = true;
  runtime.set_search_options(options);
  CHECK(runtime.search_options().build_threads == 4);
  CHECK(runtime.search_options().exhaustive);
  CHECK(runtime.search_options().rank_deterministic);

  GraphSearchOptions bad = options;
  bad.build_threads = -1;
  CHECK_THROWS_WITH(runtime.set_search_options(bad), Contains("tuning option build_threads must be >= 0"));
  CHECK(runtime.search_options().build_threads == 4);  // unchanged
}

TEST_CASE("the record policy's misses are kept once each, and drop out once their key is cached", "[runtime]") {
  CHECK(miss_policy_from_string("record") == MissPolicy::record);
  Runtime runtime;
  const Origin origin = Origin::of(DeviceIdentity{"Test GPU", 9, 0, 132}, CudnnVersion{9, 19, 0});
  const ConvolutionKey forward = small_forward_key();
  ConvolutionKey backward = forward;
  backward.direction = static_cast<std::int32_t>(Direction::backward_data);
  runtime.record_miss(origin, Backend::graph, forward);
  runtime.record_miss(origin, Backend::graph, forward);
  runtime.record_miss(origin, Backend::legacy, forward);
  runtime.record_miss(origin, Backend::graph, backward);
  std::vector<RecordedMiss> misses = runtime.recorded_misses();
  REQUIRE(misses.size() == 3);
  CHECK(misses[0].origin == origin);

  // A graph ranking for the forward key covers the graph miss only; the legacy cache still lacks it.
  EngineCandidate config;
  config.engine_id = 3;
  config.time_ms = 0.5f;
  runtime.store().caches(origin).graph_forward.insert(forward, Ranking<GraphForwardTraits>::of({config}));
  misses = runtime.recorded_misses();
  REQUIRE(misses.size() == 2);
  for (const RecordedMiss& miss : misses) {
    CHECK_FALSE((miss.backend == Backend::graph && miss.key == forward));
  }
  runtime.clear_recorded_misses();
  CHECK(runtime.recorded_misses().empty());

  // Pending keys of a loaded file are recorded misses too (Note [Pending keys]): what tune_pending and sync tune.
  CacheStore file;
  file.caches(origin).pending.insert(false, backward);
  merge_into(runtime.store(), snapshot(file));
  misses = runtime.recorded_misses();
  REQUIRE(misses.size() == 1);
  CHECK((misses[0].backend == Backend::legacy && misses[0].key == backward && misses[0].origin == origin));
}

TEST_CASE("a runtime reads its limits from the environment when it starts, and ignores a value that is not a count",
          "[runtime][workspace_limit]") {
  const auto runtime_with = [](const char* plans, const char* workspace) {
    setenv("CUDNN_CACHE_PLAN_CACHE_LIMIT", plans, 1);
    setenv("CUDNN_CACHE_WORKSPACE_LIMIT", workspace, 1);
    auto runtime = std::make_unique<Runtime>();
    unsetenv("CUDNN_CACHE_PLAN_CACHE_LIMIT");
    unsetenv("CUDNN_CACHE_WORKSPACE_LIMIT");
    return runtime;
  };
  {
    const auto runtime = runtime_with("250", "67108864");
    CHECK(runtime->plan_cache_limit() == 250);
    CHECK(runtime->workspace_limit() == 67108864);
  }
  {
    const auto runtime = runtime_with("", "0");
    CHECK(runtime->plan_cache_limit() == 10000);
    CHECK(runtime->workspace_limit() == 0);  // no workspace at all: a limit like any other
  }
  {
    const auto runtime = runtime_with("ten", "64MB");  // the Python package refuses both at import
    CHECK(runtime->plan_cache_limit() == 10000);
    CHECK(runtime->workspace_limit() == Runtime::kNoWorkspaceLimit);
  }
  Runtime runtime;
  CHECK(runtime.workspace_limit() == Runtime::kNoWorkspaceLimit);
  runtime.set_workspace_limit(1 << 20);
  CHECK(runtime.workspace_limit() == 1 << 20);
}
