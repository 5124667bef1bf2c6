// GPU tests of the graph-API backend: search times engine configs, a plan rebuilt from the best config alone
// computes what the legacy API computes, a config cuDNN does not know fails cleanly, the runtime's paths
// (tune, hit, fallback, prepare, backends), and stored plans of runtime-compiled engines. Exits 77 (CTest's
// skip, with the reason printed) where there is no GPU.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "cudnn_cache/graph.h"
#include "graph_internal.h"
#include "plan_cache.h"

using namespace cudnn_cache;

namespace {

Workspace allocate(std::size_t bytes) {
  void* data = nullptr;
  if (cudaMalloc(&data, bytes) != cudaSuccess) {
    cudaGetLastError();
    return Workspace();
  }
  return Workspace(data, data, [](void* memory) { cudaFree(memory); });
}

std::size_t element_bytes(std::int32_t type) {
  return type == CUDNN_DATA_DOUBLE ? 8 : type == CUDNN_DATA_FLOAT ? 4 : 2;
}

std::size_t elements(const std::array<std::int32_t, kMaxTensorDims>& dims, int count) {
  std::size_t total = 1;
  for (int i = 0; i < count; ++i) total *= static_cast<std::size_t>(dims[i]);
  return total;
}

// Device memory holding values of the key's type, written and read as doubles.
struct Buffer {
  Buffer(std::int32_t type, std::size_t count) : type(type), count(count) { cudaMalloc(&data, count * element_bytes(type)); }
  ~Buffer() { cudaFree(data); }

  void fill_random(std::mt19937& random) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::vector<unsigned char> host(count * element_bytes(type));
    for (std::size_t i = 0; i < count; ++i) {
      const float v = value(random);
      if (type == CUDNN_DATA_DOUBLE) {
        const double d = v;
        std::memcpy(&host[i * 8], &d, 8);
      } else if (type == CUDNN_DATA_FLOAT) {
        std::memcpy(&host[i * 4], &v, 4);
      } else {  // bfloat16: the upper half of the float
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const std::uint16_t upper = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(&host[i * 2], &upper, 2);
      }
    }
    cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice);
  }

  std::vector<double> read() const {
    std::vector<unsigned char> host(count * element_bytes(type));
    cudaMemcpy(host.data(), data, host.size(), cudaMemcpyDeviceToHost);
    std::vector<double> values(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (type == CUDNN_DATA_DOUBLE) {
        std::memcpy(&values[i], &host[i * 8], 8);
      } else if (type == CUDNN_DATA_FLOAT) {
        float v;
        std::memcpy(&v, &host[i * 4], 4);
        values[i] = v;
      } else {
        std::uint16_t upper;
        std::memcpy(&upper, &host[i * 2], 2);
        const std::uint32_t bits = static_cast<std::uint32_t>(upper) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        values[i] = v;
      }
    }
    return values;
  }

  std::int32_t type;
  std::size_t count;
  void* data = nullptr;
};

struct Problem {
  const char* name;
  ConvolutionKey key;
  double tolerance;  // relative to the largest magnitude of the reference
};

ConvolutionKey key_of(cudnnDataType_t type, Layout layout, IntSpan x, IntSpan w, IntSpan y, IntSpan padding,
                      IntSpan stride, IntSpan dilation, std::int64_t groups, cudnnMathType_t math) {
  return make_convolution_key(Direction::forward, make_tensor_key(type, x, layout), make_filter_key(type, w, layout),
                              make_tensor_key(type, y, layout),
                              make_convolution_descriptor_key(padding, stride, dilation, groups,
                                                              CUDNN_CROSS_CORRELATION, default_compute_type(type),
                                                              math));
}

std::vector<Problem> problems() {
  return {
      {"2-D NHWC bf16, groups 4",
       key_of(CUDNN_DATA_BFLOAT16, Layout::nhwc, {8, 64, 28, 28}, {128, 16, 3, 3}, {8, 128, 28, 28}, {1, 1}, {1, 1},
              {1, 1}, 4, CUDNN_TENSOR_OP_MATH),
       3e-2},
      {"2-D NCHW fp32 (no TF32), stride 2",
       key_of(CUDNN_DATA_FLOAT, Layout::nchw, {4, 32, 28, 28}, {64, 32, 3, 3}, {4, 64, 14, 14}, {1, 1}, {2, 2},
              {1, 1}, 1, CUDNN_FMA_MATH),
       1e-4},
      {"3-D NCDHW fp32",
       key_of(CUDNN_DATA_FLOAT, Layout::nchw, {2, 16, 8, 8, 8}, {16, 16, 3, 3, 3}, {2, 16, 8, 8, 8}, {1, 1, 1},
              {1, 1, 1}, {1, 1, 1}, 1, CUDNN_FMA_MATH),
       1e-4},
      {"1-D fp64, dilation 2",
       key_of(CUDNN_DATA_DOUBLE, Layout::nchw, {4, 8, 50}, {8, 8, 3}, {4, 8, 50}, {2}, {1}, {2}, 1,
              CUDNN_DEFAULT_MATH),
       1e-9},
  };
}

template <typename Traits>
void run_legacy(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers) {
  const ConvolutionDescriptors descriptors(key);
  std::array<typename Traits::Perf, Traits::algorithm_count> perfs{};
  int returned = 0;
  REQUIRE(Algorithms<Traits>::heuristics(handle, descriptors, Traits::algorithm_count, &returned, perfs.data()) ==
          CUDNN_STATUS_SUCCESS);
  for (int i = 0; i < returned; ++i) {
    if (perfs[i].status != CUDNN_STATUS_SUCCESS) continue;
    auto workspace = perfs[i].memory > 0 ? allocate(perfs[i].memory) : Workspace();
    cudnnSetConvolutionMathType(descriptors.convolution.get(), perfs[i].mathType);
    if (Algorithms<Traits>::execute(handle, descriptors, perfs[i].algo, buffers,
                                    workspace.data(), perfs[i].memory) == CUDNN_STATUS_SUCCESS) {
      return;
    }
  }
  FAIL("no legacy algorithm ran " << key);
}

void run_legacy(cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers) {
  switch (static_cast<Direction>(key.direction)) {
    case Direction::forward: return run_legacy<ForwardTraits>(handle, key, buffers);
    case Direction::backward_data: return run_legacy<BackwardDataTraits>(handle, key, buffers);
    case Direction::backward_filter: return run_legacy<BackwardFilterTraits>(handle, key, buffers);
  }
}

struct Handle {
  Handle() { REQUIRE(cudnnCreate(&handle) == CUDNN_STATUS_SUCCESS); }
  ~Handle() { cudnnDestroy(handle); }
  cudnnHandle_t handle = nullptr;
};

}  // namespace

namespace {

void run_graph(Runtime& runtime, cudnnHandle_t handle, const ConvolutionKey& key, const ConvolutionBuffers& buffers,
               const WorkspaceAllocator& with = allocate) {
  switch (static_cast<Direction>(key.direction)) {
    case Direction::forward: return runtime.run<GraphTraits<Direction::forward>>(handle, 0, key, buffers, with, false);
    case Direction::backward_data:
      return runtime.run<GraphTraits<Direction::backward_data>>(handle, 0, key, buffers, with, false);
    case Direction::backward_filter:
      return runtime.run<GraphTraits<Direction::backward_filter>>(handle, 0, key, buffers, with, false);
  }
}

// Buffers for a key, filled with random values; `written` is the one the key's direction writes.
struct Operands {
  Operands(const ConvolutionKey& key, std::mt19937& random)
      : x(key.input.data_type, elements(key.input.dims, key.input.nb_dims)),
        w(key.weight.data_type, elements(key.weight.dims, key.weight.nb_dims)),
        y(key.output.data_type, elements(key.output.dims, key.output.nb_dims)) {
    for (Buffer* operand : {&x, &w, &y}) operand->fill_random(random);
    const auto direction = static_cast<Direction>(key.direction);
    written = direction == Direction::forward ? &y : direction == Direction::backward_data ? &x : &w;
  }
  ConvolutionBuffers buffers() const { return {x.data, w.data, y.data}; }

  Buffer x, w, y;
  Buffer* written;
};

// The largest difference between two results, relative to the largest magnitude of the second; infinite
// when the reference is all zeros, which would make any comparison meaningless.
double relative_difference(const std::vector<double>& result, const std::vector<double>& reference) {
  double largest = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    largest = std::max(largest, std::abs(reference[i]));
    worst = std::max(worst, std::abs(reference[i] - result[i]));
  }
  return largest > 0.0 ? worst / largest : std::numeric_limits<double>::infinity();
}

// Checks that what the key's direction wrote into `operands` is what the legacy API computes on them.
void check_matches_legacy(cudnnHandle_t handle, const ConvolutionKey& key, Operands& operands, double tolerance) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<double> result = operands.written->read();
  run_legacy(handle, key, operands.buffers());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(relative_difference(result, operands.written->read()) <= tolerance);
}

}  // namespace

TEST_CASE("the best engine config, replayed alone, computes what the legacy API computes", "[gpu][graph]") {
  Handle handle;
  std::mt19937 random(2026);
  for (const Problem& problem : problems()) {
    for (Direction direction : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
      ConvolutionKey key = problem.key;
      key.direction = static_cast<std::int32_t>(direction);
      INFO(problem.name << ": " << key);
      Operands operands(key, random);
      const ConvolutionBuffers buffers = operands.buffers();

      const std::vector<EngineCandidate> configs = search_engine_configs(handle.handle, key, buffers, allocate);
      REQUIRE(!configs.empty());
      for (std::size_t i = 1; i < configs.size(); ++i) CHECK(configs[i - 1].time_ms <= configs[i].time_ms);
      CHECK(configs.front().engine_id >= 0);
      WARN(problem.name << " " << to_string(direction) << ": " << configs.size() << " configs, best "
                        << to_string(configs.front()) << " " << configs.front().time_ms << " ms");

      const GraphPlan plan(handle.handle, key, configs.front());
      // Only a config stored by its position in heuristics' list asks heuristics for that list.
      CHECK((plan.heuristics_us() > 0) == (configs.front().heuristic_index != EngineCandidate::kNotListed));
      auto workspace = plan.workspace_bytes() > 0 ? allocate(plan.workspace_bytes()) : Workspace();
      plan.execute(handle.handle, buffers, workspace.data());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      const std::vector<double> graph_result = operands.written->read();

      run_legacy(handle.handle, key, buffers);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(relative_difference(graph_result, operands.written->read()) <= problem.tolerance);
    }
  }
}

TEST_CASE("a config cuDNN does not know fails with an Error, not a crash", "[gpu][graph]") {
  Handle handle;
  EngineCandidate unknown;
  unknown.engine_id = 1 << 20;
  CHECK_THROWS_AS(GraphPlan(handle.handle, problems()[1].key, unknown), Error);
}

TEST_CASE("Runtime::run through the graph backend tunes on a miss, hits afterwards, and computes what the legacy API does",
          "[gpu][graph][runtime]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  runtime.set_miss_policy(MissPolicy::tune);
  std::mt19937 random(7);
  for (const Problem& problem : {problems()[0], problems()[1]}) {
    for (Direction direction : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
      ConvolutionKey key = problem.key;
      key.direction = static_cast<std::int32_t>(direction);
      INFO(problem.name << ": " << key);
      Operands operands(key, random);
      const Stats before = runtime.stats();
      run_graph(runtime, handle.handle, key, operands.buffers());
      const Stats tuned = runtime.stats();
      CHECK(tuned.misses == before.misses + 1);
      CHECK(tuned.tunes == before.tunes + 1);
      run_graph(runtime, handle.handle, key, operands.buffers());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(runtime.stats().hits == tuned.hits + 1);
      CHECK(runtime.stats().fallbacks == before.fallbacks);
      const std::vector<double> graph_result = operands.written->read();
      run_legacy(handle.handle, key, operands.buffers());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(relative_difference(graph_result, operands.written->read()) <= problem.tolerance);
    }
  }
  const PrepareReport report = runtime.prepare(0, 3);
  CHECK(report.entries >= 6);
  CHECK(report.plans == report.entries);  // every entry tuned above has a plan
  runtime.prepare_in_background(0, 2);
  CHECK(runtime.wait_for_prepare().plans == report.plans);
  CHECK_THROWS_AS(runtime.wait_for_prepare(), Error);  // its report was taken
}

TEST_CASE("the backend decides which cache a call uses", "[gpu][graph][runtime]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  runtime.set_miss_policy(MissPolicy::tune);
  const Problem problem = problems()[2];
  ConvolutionKey key = problem.key;
  key.direction = static_cast<std::int32_t>(Direction::backward_filter);
  std::mt19937 random(9);
  Operands operands(key, random);
  DirectionCaches& caches = runtime.caches_for_device(0);
  const Stats before = runtime.stats();
  for (Backend backend : {Backend::legacy, Backend::graph}) {
    runtime.set_backend(backend);
    runtime.convolve<Direction::backward_filter>(handle.handle, 0, key, operands.buffers(), allocate, false);
  }
  CHECK(runtime.stats().tunes == before.tunes + 2);
  // The graph call ran the plan kept after its search (Note [The plan a search keeps]): none was built again.
  CHECK(runtime.stats().plans_built == before.plans_built);
  CHECK(caches.backward_filter.find(key) != nullptr);
  CHECK(caches.graph_backward_filter.find(key) != nullptr);
  runtime.set_backend(Backend::graph);
}

TEST_CASE("a stored engine config cuDNN refuses falls back, is counted, and the result is still right",
          "[gpu][graph][runtime]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  const Problem problem = problems()[3];
  const ConvolutionKey key = problem.key;  // forward
  EngineCandidate unknown;
  unknown.engine_id = 1 << 20;
  unknown.time_ms = 0.001f;
  runtime.caches_for_device(0).graph_forward.insert(key, Ranking<GraphForwardTraits>::of({unknown}));
  std::mt19937 random(8);
  Operands operands(key, random);
  const Stats before = runtime.stats();
  run_graph(runtime, handle.handle, key, operands.buffers());
  CHECK(runtime.stats().hits == before.hits + 1);
  CHECK(runtime.stats().fallbacks == before.fallbacks + 1);
  check_matches_legacy(handle.handle, key, operands, problem.tolerance);
}

namespace {

// A 5x5 depthwise convolution in bf16 channels-last, of a size MobileNet-like networks have: the kind cuDNN
// compiles engines for at run time (their plans carry the RUNTIME_COMPILATION behavior note).
Problem depthwise_problem(std::int32_t batch) {
  return {"2-D NHWC bf16 depthwise 5x5",
          key_of(CUDNN_DATA_BFLOAT16, Layout::nhwc, {batch, 240, 14, 14}, {240, 1, 5, 5}, {batch, 240, 14, 14},
                 {2, 2}, {1, 1}, {1, 1}, 240, CUDNN_TENSOR_OP_MATH),
          3e-2};
}

// The backward-filter problem of a depthwise 3x3 layer as MobileNetV2 has them: on an H200 with cuDNN 9.19, 4 of
// the 10 configs a search times are runtime-compiled (a forward depthwise key has 1).
Problem depthwise_wgrad_problem() {
  Problem problem{"2-D NHWC bf16 depthwise 3x3, backward filter",
                  key_of(CUDNN_DATA_BFLOAT16, Layout::nhwc, {8, 64, 28, 28}, {64, 1, 3, 3}, {8, 64, 28, 28}, {1, 1},
                         {1, 1}, {1, 1}, 64, CUDNN_TENSOR_OP_MATH),
                  3e-2};
  problem.key.direction = static_cast<std::int32_t>(Direction::backward_filter);
  return problem;
}

// A runtime-compiled engine config among those search_engine_configs times for the key.
EngineCandidate runtime_compiled_config(cudnnHandle_t handle, const ConvolutionKey& key,
                                        const ConvolutionBuffers& buffers) {
  const std::vector<EngineCandidate> configs = search_engine_configs(handle, key, buffers, allocate);
  for (const EngineCandidate& config : configs) {
    if (config.behavior_notes & EngineCandidate::kRuntimeCompiled) return config;
  }
  FAIL("no runtime-compiled engine config among the " << configs.size() << " for " << key);
  return {};
}

}  // namespace

TEST_CASE("a runtime-compiled plan serializes, restores without compiling, and computes the same",
          "[gpu][graph][plans]") {
  Handle handle;
  const Problem problem = depthwise_problem(8);
  std::mt19937 random(10);
  Operands operands(problem.key, random);
  const EngineCandidate config = runtime_compiled_config(handle.handle, problem.key, operands.buffers());

  auto started = std::chrono::steady_clock::now();
  const GraphPlan built(handle.handle, problem.key, config);
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  const std::vector<std::uint8_t> bytes = built.serialize();
  REQUIRE(!bytes.empty());
  started = std::chrono::steady_clock::now();
  const GraphPlan restored(handle.handle, problem.key, bytes);
  const double restore_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  WARN(to_string(config) << ": built in " << build_ms << " ms, " << bytes.size() << " bytes, restored in "
                         << restore_ms << " ms");
  CHECK(restored.workspace_bytes() == built.workspace_bytes());

  auto workspace = built.workspace_bytes() > 0 ? allocate(built.workspace_bytes()) : Workspace();
  built.execute(handle.handle, operands.buffers(), workspace.data());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<double> expected = operands.written->read();
  cudaMemset(operands.y.data, 0, operands.y.count * element_bytes(operands.y.type));
  restored.execute(handle.handle, operands.buffers(), workspace.data());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(relative_difference(operands.written->read(), expected) == 0.0);

  std::vector<std::uint8_t> garbage(bytes.size(), 0x5a);
  CHECK_THROWS_AS(GraphPlan(handle.handle, problem.key, garbage), Error);
}

TEST_CASE("the plan a search keeps is made as a warm process makes it, and the search's own is freed",
          "[gpu][graph][plans]") {
  Handle handle;
  std::mt19937 random(12);
  // The plan cache keeps the plan of the best config, made again; runs it as a call would.
  const auto kept_and_run = [&](const Problem& problem, Operands& operands, const EngineCandidate& config,
                                std::shared_ptr<const GraphPlan> searched, bool remade) {
    PlanCache plans(Runtime::instance());
    PlanStore stored;
    const std::weak_ptr<const GraphPlan> search_plan = searched;
    plans.adopt(handle.handle, 0, problem.key, config, std::move(searched), stored);
    CHECK(search_plan.expired() == remade);  // gone, with the search's graph and every plan built in it
    const bool compiled = (config.behavior_notes & EngineCandidate::kRuntimeCompiled) != 0;
    CHECK((stored.find(problem.key) != nullptr) == compiled);  // stored for the file, as get() would
    const PlanCache::Shared entry = plans.get(handle.handle, 0, problem.key, config, stored, true);
    REQUIRE(entry->plan);
    CHECK(plans.plans_built == 0);  // get() found the plan adopt() kept; making it is part of the search
    CHECK(plans.plans_deserialized == 0);
    cudaMemset(operands.written->data, 0, operands.written->count * element_bytes(operands.written->type));
    auto workspace = entry->plan->workspace_bytes() > 0 ? allocate(entry->plan->workspace_bytes()) : Workspace();
    entry->plan->execute(handle.handle, operands.buffers(), workspace.data());
    check_matches_legacy(handle.handle, problem.key, operands, problem.tolerance);
  };

  // A search of the dense problem, and the plan it built for its best config.
  const Problem problem = problems()[1];
  Operands dense(problem.key, random);
  std::shared_ptr<const GraphPlan> searched;
  const auto search = [&] {
    const std::vector<EngineCandidate> configs =
        search_engine_configs(handle.handle, problem.key, dense.buffers(), allocate, {}, &searched);
    REQUIRE(searched);
    return configs;
  };

  SECTION("a precompiled engine's plan is built again from its config") {
    const std::vector<EngineCandidate> configs = search();
    REQUIRE((configs.front().behavior_notes & EngineCandidate::kRuntimeCompiled) == 0);
    kept_and_run(problem, dense, configs.front(), std::move(searched), true);
  }
  SECTION("a runtime-compiled engine's plan is restored from its serialized bytes") {
    const Problem depthwise = depthwise_problem(6);
    Operands operands(depthwise.key, random);
    const EngineCandidate config = runtime_compiled_config(handle.handle, depthwise.key, operands.buffers());
    kept_and_run(depthwise, operands, config,
                 std::make_shared<const GraphPlan>(handle.handle, depthwise.key, config), true);
  }
  SECTION("where the config cannot be built again, the search's own plan is kept") {
    const std::vector<EngineCandidate> configs = search();
    EngineCandidate unknown = configs.front();  // an engine cuDNN does not know, with the search's plan
    unknown.engine_id = 1 << 20;
    unknown.heuristic_index = EngineCandidate::kNotListed;
    unknown.behavior_notes = 0;
    kept_and_run(problem, dense, unknown, std::move(searched), false);
  }
}

TEST_CASE("the runtime restores stored plans, rebuilds those of another cuDNN or corrupt ones, and counts both",
          "[gpu][graph][plans][runtime]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  runtime.set_miss_policy(MissPolicy::error);  // every call below must hit
  DirectionCaches& caches = runtime.caches_for_device(0);
  std::mt19937 random(11);
  // One batch size per case: each key is new to the plan cache.
  for (const char* kind : {"valid", "other cuDNN", "corrupt"}) {
    const std::string name = kind;
    const Problem problem = depthwise_problem(name == "valid" ? 2 : name == "corrupt" ? 3 : 4);
    INFO(kind);
    Operands operands(problem.key, random);
    const EngineCandidate config = runtime_compiled_config(handle.handle, problem.key, operands.buffers());
    StoredPlan stored{config, static_cast<std::uint32_t>(cudnnGetVersion()),
                      GraphPlan(handle.handle, problem.key, config).serialize()};
    if (name == "other cuDNN") stored.cudnn_version += 1;
    if (name == "corrupt") stored.bytes.resize(stored.bytes.size() / 2);
    caches.graph_forward.insert(problem.key, Ranking<GraphForwardTraits>::of({config}));
    caches.plans.insert(problem.key, stored);

    const Stats before = runtime.stats();
    run_graph(runtime, handle.handle, problem.key, operands.buffers());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const Stats after = runtime.stats();
    CHECK(after.fallbacks == before.fallbacks);
    const bool valid = name == "valid";
    CHECK(after.plans_deserialized == before.plans_deserialized + (valid ? 1 : 0));
    CHECK(after.plan_rebuilds == before.plan_rebuilds + (valid ? 0 : 1));
    CHECK(after.plans_built == before.plans_built + (valid ? 0 : 1));
    if (!valid) {  // the rebuilt plan replaced the unusable one
      CHECK(caches.plans.find(problem.key)->cudnn_version == static_cast<std::uint32_t>(cudnnGetVersion()));
    }
    check_matches_legacy(handle.handle, problem.key, operands, problem.tolerance);
  }
  runtime.set_miss_policy(MissPolicy::tune);
}

// Two configs a search of the key times: one that needs a workspace and one that needs none.
std::pair<EngineCandidate, EngineCandidate> needing_workspace_and_not(cudnnHandle_t handle, const ConvolutionKey& key,
                                                                      Operands& operands) {
  const std::vector<EngineCandidate> configs = search_engine_configs(handle, key, operands.buffers(), allocate);
  const auto needs = std::find_if(configs.begin(), configs.end(), [](const auto& c) { return c.workspace_bytes > 0; });
  const auto needs_none =
      std::find_if(configs.begin(), configs.end(), [](const auto& c) { return c.workspace_bytes == 0; });
  REQUIRE(needs != configs.end());
  REQUIRE(needs_none != configs.end());
  return {*needs, *needs_none};
}

TEST_CASE("a stored config whose workspace cannot be allocated falls back to the next one", "[gpu][graph][runtime]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  ConvolutionKey key = problems()[1].key;  // fp32 stride 2: several engines, some needing a workspace
  key.direction = static_cast<std::int32_t>(Direction::backward_filter);
  std::mt19937 random(12);
  Operands operands(key, random);
  auto [first, second] = needing_workspace_and_not(handle.handle, key, operands);
  first.time_ms = 0.001f;  // ranked first
  second.time_ms = 0.002f;
  runtime.caches_for_device(0).graph_backward_filter.insert(key,
                                                            Ranking<GraphBackwardFilterTraits>::of({first, second}));
  const WorkspaceAllocator out_of_memory = [](std::size_t) { return Workspace(); };
  const Stats before = runtime.stats();
  runtime.run<GraphTraits<Direction::backward_filter>>(handle.handle, 0, key, operands.buffers(), out_of_memory, false);
  CHECK(runtime.stats().hits == before.hits + 1);
  CHECK(runtime.stats().fallbacks == before.fallbacks + 1);
  check_matches_legacy(handle.handle, key, operands, problems()[1].tolerance);
}

TEST_CASE("both backends count fallbacks the same way: a cached candidate passed over, never a heuristic one",
          "[gpu][graph][runtime]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  ConvolutionKey key = problems()[1].key;
  key.direction = static_cast<std::int32_t>(Direction::backward_filter);
  std::mt19937 random(13);
  Operands operands(key, random);
  DirectionCaches& caches = runtime.caches_for_device(0);
  const WorkspaceAllocator out_of_memory = [](std::size_t) { return Workspace(); };

  // Legacy: the first cached algorithm needs a workspace the allocator refuses; the second needs none.
  using Legacy = BackwardFilterTraits;
  Candidate<Legacy> first{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_STATUS_SUCCESS, 0.001f, 1 << 20};
  Candidate<Legacy> second{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_STATUS_SUCCESS, 0.002f, 0};
  first.math_type = second.math_type = CUDNN_FMA_MATH;
  caches.backward_filter.erase(key);
  caches.backward_filter.insert(key, Ranking<Legacy>::of({first, second}));
  Stats before = runtime.stats();
  runtime.run<Legacy>(handle.handle, 0, key, operands.buffers(), out_of_memory, false);
  CHECK(runtime.stats().hits == before.hits + 1);
  CHECK(runtime.stats().fallbacks == before.fallbacks + 1);
  check_matches_legacy(handle.handle, key, operands, problems()[1].tolerance);

  // A miss under the heuristic policy walks cuDNN's heuristic order past what cannot run, in both backends,
  // and counts no fallback: nothing cached was passed over.
  runtime.set_miss_policy(MissPolicy::heuristic);
  caches.backward_filter.erase(key);
  caches.graph_backward_filter.erase(key);
  before = runtime.stats();
  runtime.run<Legacy>(handle.handle, 0, key, operands.buffers(), out_of_memory, false);
  runtime.run<GraphTraits<Direction::backward_filter>>(handle.handle, 0, key, operands.buffers(), out_of_memory,
                                                       false);
  runtime.set_miss_policy(MissPolicy::tune);
  CHECK(runtime.stats().misses == before.misses + 2);
  CHECK(runtime.stats().fallbacks == before.fallbacks);
  check_matches_legacy(handle.handle, key, operands, problems()[1].tolerance);
}

namespace {

// One key of a concurrency test: its tolerance and what one thread computed for it.
struct Expected {
  ConvolutionKey key;
  double tolerance;
  std::vector<double> values;
};

// Tunes each key (the way the problem's own direction runs) on one thread and reads what it computes from the
// operands of seed 7.
std::vector<Expected> expected_by_one_thread(Runtime& runtime, const std::vector<Problem>& problems) {
  std::vector<Expected> expected;
  Handle handle;
  for (const Problem& problem : problems) {
    for (Direction direction : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
      ConvolutionKey key = problem.key;
      key.direction = static_cast<std::int32_t>(direction);
      std::mt19937 random(7);
      Operands reference(key, random);
      run_graph(runtime, handle.handle, key, reference.buffers());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      expected.push_back({key, problem.tolerance, reference.written->read()});
    }
  }
  return expected;
}

// Starts `threads` threads together, each with its own handle and non-blocking stream; thread t runs key
// `keys[t % keys.size()]` `iterations` times on the operands of seed 7, then its output is checked against what
// one thread computed.
void check_threads_compute_what_one_thread_computes(Runtime& runtime, const std::vector<Expected>& keys,
                                                    int threads, int iterations) {
  std::vector<std::vector<double>> results(threads);
  std::mutex failures_mutex;
  std::vector<std::string> failures;  // Catch2 is not thread-safe: threads report here
  std::atomic<int> ready{0};
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      cudnnHandle_t handle = nullptr;
      cudaStream_t stream = nullptr;
      try {
        const ConvolutionKey& key = keys[t % keys.size()].key;
        CUDNN_CACHE_REQUIRE(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
        CUDNN_CACHE_CHECK(cudnnCreate(&handle));
        CUDNN_CACHE_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
        CUDNN_CACHE_CHECK(cudnnSetStream(handle, stream));
        std::mt19937 random(7);
        Operands operands(key, random);  // the reference's inputs
        ++ready;
        while (ready.load() < threads) std::this_thread::yield();  // start together
        for (int i = 0; i < iterations; ++i) run_graph(runtime, handle, key, operands.buffers());
        CUDNN_CACHE_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess, "synchronize");
        results[t] = operands.written->read();
      } catch (const std::exception& e) {
        ++ready;
        const std::lock_guard lock(failures_mutex);
        failures.push_back(e.what());
      }
      if (handle != nullptr) cudnnDestroy(handle);
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  }
  for (std::thread& thread : running) thread.join();
  CHECK(failures.empty());
  for (const std::string& failure : failures) WARN(failure);
  for (int t = 0; t < threads; ++t) {
    const Expected& expected = keys[t % keys.size()];
    INFO("thread " << t << ": " << expected.key);
    REQUIRE(results[t].size() == expected.values.size());
    CHECK(relative_difference(results[t], expected.values) <= expected.tolerance);
  }
}

}  // namespace

// Issue 15, item 4: the plan cache shares one execution plan per key and config between threads (and handles),
// where PyTorch keeps its plans thread-local. This runs the same keys from many threads at once, each with its own
// handle and stream, and compares every thread's result with one thread's.
TEST_CASE("threads on their own streams run the same keys at once and compute what one thread computes",
          "[gpu][graph][runtime][threads]") {
  Runtime& runtime = Runtime::instance();
  for (const Expected& key : expected_by_one_thread(runtime, {problems()[0], problems()[1]})) {
    check_threads_compute_what_one_thread_computes(runtime, {key}, 8, 25);
  }
}

// Issue 17: with a plan cache of 2 entries and 6 keys run at once, every call can evict a plan another thread
// is running; that thread's plan stays alive until its run ends, and the next call rebuilds it.
TEST_CASE("threads running more keys than the plan cache holds evict each other's plans and compute the same",
          "[gpu][graph][runtime][threads][plan_cache]") {
  Runtime& runtime = Runtime::instance();
  const std::vector<Expected> keys = expected_by_one_thread(runtime, {problems()[0], problems()[1]});
  const std::size_t limit = runtime.plan_cache_limit();
  runtime.set_plan_cache_limit(2);
  const Stats before = runtime.stats();
  check_threads_compute_what_one_thread_computes(runtime, keys, 12, 10);
  CHECK(runtime.stats().plans <= 2);  // the plans in memory, within the limit
  runtime.set_plan_cache_limit(limit);
  const Stats after = runtime.stats();
  CHECK(after.plan_evictions > before.plan_evictions);
  CHECK(after.plans_built > before.plans_built);  // evicted plans were built again
  CHECK(after.hits == before.hits + 12 * 10);     // the rankings stayed: only plans were evicted
  CHECK(after.misses == before.misses);
}

// Note [Each thread's own hits]: a thread's later calls of a key run what its first ran without looking it up
// again, and so must run what the caches say whenever they change: a ranking replaced, a workspace limit set,
// a plan evicted. Which config a call ran shows in the workspace it asks for (one config needs some, the other
// none), and a plan evicted from the cache is built again by the next call that runs it.
TEST_CASE("a thread's memo of its hits runs what the caches hold after they change", "[gpu][graph][runtime][memo]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  const Problem problem = problems()[1];  // fp32 stride 2: several engines, some needing a workspace
  ConvolutionKey key = problem.key;
  key.direction = static_cast<std::int32_t>(Direction::backward_filter);
  std::mt19937 random(21);
  Operands operands(key, random);
  const auto [needs, needs_none] = needing_workspace_and_not(handle.handle, key, operands);
  auto& cache = runtime.caches_for_device(0).graph_backward_filter;
  const auto rank = [&](EngineCandidate first, EngineCandidate second) {
    first.time_ms = 0.001f;
    second.time_ms = 0.002f;
    cache.erase(key);
    cache.insert(key, Ranking<GraphBackwardFilterTraits>::of({first, second}));
  };
  std::size_t asked = 0;  // the workspace the last call asked for
  const WorkspaceAllocator recording = [&](std::size_t bytes) {
    asked = bytes;
    return allocate(bytes);
  };
  const auto call = [&] {
    asked = 0;
    run_graph(runtime, handle.handle, key, operands.buffers(), recording);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    check_matches_legacy(handle.handle, key, operands, problem.tolerance);
    return asked;
  };

  rank(needs, needs_none);
  const Stats before = runtime.stats();
  for (int i = 0; i < 3; ++i) CHECK(call() > 0);
  CHECK(runtime.stats().hits == before.hits + 3);  // the memo's hits are counted as hits
  CHECK(runtime.stats().fallbacks == before.fallbacks);

  rank(needs_none, needs);  // the ranking replaced: the other config leads
  for (int i = 0; i < 2; ++i) CHECK(call() == 0);
  rank(needs, needs_none);
  CHECK(call() > 0);

  runtime.set_workspace_limit(0);  // the config that needs a workspace may not run
  for (int i = 0; i < 2; ++i) CHECK(call() == 0);
  runtime.set_workspace_limit(Runtime::kNoWorkspaceLimit);
  CHECK(call() > 0);

  // Two keys in turn under a plan cache of one: each call evicts the other key's plan, so each builds its own
  // again, however recently this thread ran it.
  ConvolutionKey other_key = key;
  other_key.direction = static_cast<std::int32_t>(Direction::forward);
  Operands other(other_key, random);
  run_graph(runtime, handle.handle, other_key, other.buffers());  // tuned if it was not
  const std::size_t limit = runtime.plan_cache_limit();
  runtime.set_plan_cache_limit(1);
  const Stats evicting = runtime.stats();
  for (int i = 0; i < 3; ++i) {
    CHECK(call() > 0);
    run_graph(runtime, handle.handle, other_key, other.buffers());
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const Stats after = runtime.stats();
  CHECK(after.plans <= 1);
  CHECK(after.plans_built + after.plans_deserialized >= evicting.plans_built + evicting.plans_deserialized + 5);
  CHECK(after.hits == evicting.hits + 6);
  CHECK(after.fallbacks == before.fallbacks);
  runtime.set_plan_cache_limit(limit);
  cache.erase(key);
}

// Note [Workspace limit]: under a limit of no workspace at all, every call asks for none and computes what it
// computed without the limit, and a search stores only configs that need none.
TEST_CASE("a workspace limit holds every call and search to it, and results stay the same",
          "[gpu][graph][runtime][workspace_limit]") {
  Runtime& runtime = Runtime::instance();
  REQUIRE(runtime.miss_policy() == MissPolicy::tune);
  const std::vector<Expected> keys = expected_by_one_thread(runtime, {problems()[0], problems()[1]});
  bool any_needs_workspace = false;  // else the test would hold without the limit
  for (const Expected& expected : keys) {
    for_each_graph_direction([&](auto traits) {
      if (static_cast<std::int32_t>(decltype(traits)::direction) != expected.key.direction) return;
      const auto ranking = runtime.caches_for_device(0).get<decltype(traits)>().find(expected.key);
      REQUIRE(ranking);
      any_needs_workspace = any_needs_workspace || ranking->front().workspace_bytes > 0;
    });
  }
  CHECK(any_needs_workspace);

  std::size_t most_asked = 0;
  const WorkspaceAllocator counting = [&](std::size_t bytes) {
    most_asked = std::max(most_asked, bytes);
    return allocate(bytes);
  };
  runtime.set_workspace_limit(0);
  Handle handle;
  for (const Expected& expected : keys) {
    INFO(expected.key);
    std::mt19937 random(7);
    Operands operands(expected.key, random);
    run_graph(runtime, handle.handle, expected.key, operands.buffers(), counting);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(most_asked == 0);
    CHECK(relative_difference(operands.written->read(), expected.values) <= expected.tolerance);

    // Searched again under the limit, the key's ranking holds only configs that need no workspace.
    for_each_graph_direction([&](auto traits) {
      if (static_cast<std::int32_t>(decltype(traits)::direction) != expected.key.direction) return;
      auto& cache = runtime.caches_for_device(0).get<decltype(traits)>();
      cache.erase(expected.key);
      run_graph(runtime, handle.handle, expected.key, operands.buffers());
      const auto ranking = cache.find(expected.key);
      REQUIRE(ranking);
      for (const EngineCandidate& config : *ranking) CHECK(config.workspace_bytes == 0);
    });
  }
  runtime.set_workspace_limit(Runtime::kNoWorkspaceLimit);
}

// Note [One search per key]: threads that miss one key at once search it once; the others wait for that search
// and run what it stored.
TEST_CASE("threads that miss one key at once search it once and compute what one thread computes",
          "[gpu][graph][runtime][threads]") {
  Runtime& runtime = Runtime::instance();
  REQUIRE(runtime.miss_policy() == MissPolicy::tune);
  const Expected forward = expected_by_one_thread(runtime, {problems()[1]}).front();
  runtime.caches_for_device(0).graph_forward.erase(forward.key);
  const Stats before = runtime.stats();
  check_threads_compute_what_one_thread_computes(runtime, {forward}, 8, 1);
  const Stats after = runtime.stats();
  CHECK(after.tunes == before.tunes + 1);
  const std::uint64_t misses = after.misses - before.misses;
  CHECK(misses + (after.hits - before.hits) == 8);  // a thread that came after the search ended hit
  CHECK(misses >= 2);                               // the search takes far longer than the threads' start
  CHECK(after.tune_waits == before.tune_waits + misses - 1);
}

namespace {

using graph_internal::SearchBounds;

// Bounds that leave only step 1 of a search: its first `max_candidates` heuristic configs (Note [Search bounds]).
SearchBounds only_heuristics(int max_candidates) {
  SearchBounds bounds;
  bounds.max_candidates = max_candidates;
  bounds.mode_b_candidates = 0;
  bounds.knob_variants = 0;
  return bounds;
}

bool distinct_choices(const std::vector<EngineCandidate>& configs) {
  for (std::size_t i = 0; i < configs.size(); ++i) {
    for (std::size_t j = i + 1; j < configs.size(); ++j) {
      if (configs[i].same_choice(configs[j])) return false;
    }
  }
  return true;
}

// Every config of `serial` is timed by `other` too, described the same way.
void check_same_configs(const std::vector<EngineCandidate>& serial, const std::vector<EngineCandidate>& other) {
  REQUIRE(other.size() == serial.size());
  CHECK(distinct_choices(other));
  for (const EngineCandidate& config : serial) {
    INFO(to_string(config));
    const auto same = std::find_if(other.begin(), other.end(),
                                   [&](const EngineCandidate& c) { return c.same_choice(config); });
    REQUIRE(same != other.end());
    CHECK(same->workspace_bytes == config.workspace_bytes);
    CHECK(same->behavior_notes == config.behavior_notes);
    CHECK(same->numerical_notes == config.numerical_notes);
    CHECK(same->heuristic_index == config.heuristic_index);
  }
}

}  // namespace

// Note [Deterministic calls]: a search records each config's numerical notes and always times native's
// deterministic pick (what a search restricted to deterministic engines times first).
TEST_CASE("a search records every config's numerical notes and times native's deterministic pick",
          "[gpu][graph][search][deterministic]") {
  Handle handle;
  for (const Problem& problem : {problems()[0], problems()[1]}) {
    for (Direction direction : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
      ConvolutionKey key = problem.key;
      key.direction = static_cast<std::int32_t>(direction);
      INFO(problem.name << ": " << key);
      std::mt19937 random(21);
      Operands operands(key, random);
      GraphSearchOptions only_deterministic;
      only_deterministic.deterministic = true;
      const std::vector<EngineCandidate> native = search_engine_configs(handle.handle, key, operands.buffers(),
                                                                        allocate, only_deterministic,
                                                                        only_heuristics(1));
      REQUIRE(native.size() == 1);
      CHECK(native.front().deterministic());
      for (const SearchBounds& bounds : {only_heuristics(1), SearchBounds{}}) {
        const std::vector<EngineCandidate> configs =
            search_engine_configs(handle.handle, key, operands.buffers(), allocate, GraphSearchOptions{}, bounds);
        for (const EngineCandidate& config : configs) {
          CHECK(config.numerical_notes != EngineCandidate::kNotesUnknown);
        }
        CHECK(std::any_of(configs.begin(), configs.end(),
                          [&](const EngineCandidate& config) { return config.same_choice(native.front()); }));
      }
    }
  }
}

TEST_CASE("a deterministic call runs the ranking's deterministic configs; without known ones, the legacy path",
          "[gpu][graph][runtime][deterministic]") {
  Handle handle;
  Runtime& runtime = Runtime::instance();
  runtime.set_miss_policy(MissPolicy::tune);
  const Problem problem = problems()[1];
  // Problem 1 at a batch no other test uses: the plans this test counts are built for it alone.
  ConvolutionKey key = key_of(CUDNN_DATA_FLOAT, Layout::nchw, {3, 32, 28, 28}, {64, 32, 3, 3}, {3, 64, 14, 14},
                              {1, 1}, {2, 2}, {1, 1}, 1, CUDNN_FMA_MATH);
  key.direction = static_cast<std::int32_t>(Direction::backward_filter);
  INFO(key);
  std::mt19937 random(23);
  Operands operands(key, random);
  DirectionCaches& caches = runtime.caches_for_device(0);
  caches.backward_filter.erase(key);
  caches.graph_backward_filter.erase(key);
  const std::vector<EngineCandidate> configs =
      search_engine_configs(handle.handle, key, operands.buffers(), allocate);
  REQUIRE(std::any_of(configs.begin() + 1, configs.end(), [](const EngineCandidate& c) { return c.deterministic(); }));
  const auto run = [&](bool deterministic) {
    runtime.run<GraphTraits<Direction::backward_filter>>(handle.handle, 0, key, operands.buffers(), allocate,
                                                        deterministic);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return operands.written->read();
  };

  // The best config marked nondeterministic: a deterministic call passes over it, as over a config over the
  // workspace limit, and runs the next deterministic one through the graph API, building only its plan.
  std::vector<EngineCandidate> marked = configs;
  marked.front().numerical_notes |= EngineCandidate::kNondeterministic;
  caches.graph_backward_filter.insert(key, Ranking<GraphBackwardFilterTraits>::of(marked.begin(), marked.end()));
  Stats before = runtime.stats();
  const std::vector<double> first = run(true);
  Stats after = runtime.stats();
  CHECK(after.hits == before.hits + 1);
  CHECK(after.tunes == before.tunes);
  CHECK(after.fallbacks == before.fallbacks);
  CHECK(after.plans_built == before.plans_built + 1);
  CHECK(caches.backward_filter.find(key) == nullptr);  // not the legacy path
  CHECK(run(true) == first);                           // bitwise the same again
  check_matches_legacy(handle.handle, key, operands, problem.tolerance);
  before = runtime.stats();
  run(false);  // a call that need not be deterministic runs the best: its plan is another
  CHECK(runtime.stats().plans_built == before.plans_built + 1);

  // Configs whose notes are unknown (a file of format 4): the legacy path, lookup and miss policy included.
  std::vector<EngineCandidate> unknown = configs;
  for (EngineCandidate& config : unknown) config.numerical_notes = EngineCandidate::kNotesUnknown;
  caches.graph_backward_filter.erase(key);
  caches.graph_backward_filter.insert(key, Ranking<GraphBackwardFilterTraits>::of(unknown.begin(), unknown.end()));
  before = runtime.stats();
  run(true);
  after = runtime.stats();
  CHECK(after.tunes == before.tunes + 1);  // the legacy cache's miss, tuned
  CHECK(after.fallbacks == before.fallbacks);
  REQUIRE(caches.backward_filter.find(key) != nullptr);
  check_matches_legacy(handle.handle, key, operands, problem.tolerance);
}

TEST_CASE("the search's bounds bound what is timed: heuristics, mode B, knob variants", "[gpu][graph][search]") {
  Handle handle;
  const Problem problem = problems()[1];
  std::mt19937 random(13);
  Operands operands(problem.key, random);
  const auto search = [&](const SearchBounds& bounds) {
    return search_engine_configs(handle.handle, problem.key, operands.buffers(), allocate, GraphSearchOptions{},
                                 bounds);
  };

  const std::vector<EngineCandidate> first = search(only_heuristics(1));
  REQUIRE(first.size() == 1);

  SearchBounds with_variants = only_heuristics(1);
  with_variants.knob_variants = 4;
  const std::vector<EngineCandidate> variants = search(with_variants);
  INFO(variants.size() << " configs for " << problem.key);
  CHECK(variants.size() <= 5);
  CHECK(distinct_choices(variants));
  for (const EngineCandidate& config : variants) {
    CHECK(config.engine_id == first.front().engine_id);  // the heuristic's pick and its knob neighbours only
    CHECK(config.knob_count == first.front().knob_count);
  }

  SearchBounds with_mode_b = only_heuristics(1);
  with_mode_b.mode_b_candidates = 3;
  const std::vector<EngineCandidate> mode_b = search(with_mode_b);
  CHECK(mode_b.size() >= 1);
  CHECK(mode_b.size() <= 4);
  CHECK(distinct_choices(mode_b));

  const std::vector<EngineCandidate> all = search(SearchBounds{});
  CHECK(all.size() >= search(only_heuristics(10)).size());
  CHECK(distinct_choices(all));
}

// Note [Giving up on a slow plan]: how many runs of a plan are timed, by what the timing asks.
TEST_CASE("a plan slower than the give-up bound stops after the warm-up's second run, or after 3 timed runs",
          "[gpu][graph][search]") {
  Handle handle;
  const Problem problem = problems()[1];
  std::mt19937 random(17);
  Operands operands(problem.key, random);
  const std::shared_ptr<graph_internal::Graph> graph = graph_internal::heuristic_graph(handle.handle, problem.key, false);
  REQUIRE(graph->build_plan_at_index(0).is_good());
  std::int64_t bytes = 0;
  REQUIRE(graph->get_workspace_size_plan_at_index(0, bytes).is_good());
  const Workspace workspace = bytes > 0 ? allocate(static_cast<std::size_t>(bytes)) : Workspace();
  graph_internal::VariantPack pack = graph_internal::variant_pack(operands.buffers());
  const auto runs = [&](graph_internal::Timing timing) {
    const std::vector<float> times = graph_internal::time_plan(*graph, handle.handle, pack, workspace.data(), 0, timing);
    for (float ms : times) CHECK(ms > 0.0f);
    return times.size();
  };
  constexpr float kSlower = 1e-6f;  // every run is slower than this bound
  graph_internal::Timing timing{3, 7};
  CHECK(runs(timing) == 7);  // no bound
  timing.give_up_ms = 1e9f;
  CHECK(runs(timing) == 7);  // a bound it never reaches
  timing.give_up_ms = kSlower;
  timing.probe_floor_ms = 0.0f;
  CHECK(runs(timing) == 1);  // the warm-up's second run, timed, gives up
  timing.probe_floor_ms = 1e9f;
  CHECK(runs(timing) == 3);  // above the probe's floor only: the 3 timed runs' rule
  timing.probe_floor_ms = 0.0f;
  timing.warmup = 1;
  CHECK(runs(timing) == 3);  // no second warm-up run to time
  timing.warmup = 3;
  timing.probe_ratio = 1e12f;
  CHECK(runs(timing) == 3);  // not slower than probe_ratio x the bound
}

// Note [Parallel candidate builds]: where a plan is built changes nothing a search times, nor how each config is
// described.
TEST_CASE("plans built on worker threads: the search times the same heuristic configs as on the caller alone",
          "[gpu][graph][search]") {
  // The depthwise keys' candidates include engines cuDNN compiles at run time (Note [Parallel candidate builds]):
  // one for the forward key, several for the backward-filter one; the dense key's are precompiled.
  Handle handle;
  for (const Problem& problem : {depthwise_problem(8), depthwise_wgrad_problem(), problems()[1]}) {
    INFO(problem.name);
    std::mt19937 random(16);
    Operands operands(problem.key, random);
    const auto search = [&](int threads, std::shared_ptr<const GraphPlan>* best, double* ms) {
      GraphSearchOptions options;
      options.build_threads = threads;
      const auto started = std::chrono::steady_clock::now();
      std::vector<EngineCandidate> configs = search_engine_configs(handle.handle, problem.key, operands.buffers(),
                                                                   allocate, options, only_heuristics(10), best);
      *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
      return configs;
    };
    // The best plan handed back is the best config's, built on a worker or on the caller, and runs on the caller's
    // handle; so does the plan restored from its bytes, as a later process would.
    const auto check_best = [&](const std::shared_ptr<const GraphPlan>& best, const EngineCandidate& config) {
      REQUIRE(best != nullptr);
      CHECK(best->workspace_bytes() == config.workspace_bytes);
      auto workspace = best->workspace_bytes() > 0 ? allocate(best->workspace_bytes()) : Workspace();
      best->execute(handle.handle, operands.buffers(), workspace.data());
      check_matches_legacy(handle.handle, problem.key, operands, problem.tolerance);
      if ((config.behavior_notes & EngineCandidate::kRuntimeCompiled) == 0) return;
      const GraphPlan restored(handle.handle, problem.key, best->serialize());
      CHECK(restored.workspace_bytes() == config.workspace_bytes);
      restored.execute(handle.handle, operands.buffers(), workspace.data());
      check_matches_legacy(handle.handle, problem.key, operands, problem.tolerance);
    };
    double serial_ms = 0, parallel_ms = 0;
    const std::vector<EngineCandidate> serial = search(1, nullptr, &serial_ms);
    std::shared_ptr<const GraphPlan> best;
    const std::vector<EngineCandidate> parallel = search(8, &best, &parallel_ms);
    WARN(problem.name << ": " << serial.size() << " configs timed in " << serial_ms << " ms on the caller, "
                      << parallel.size() << " in " << parallel_ms << " ms with 8 build threads");
    check_same_configs(serial, parallel);
    check_best(best, parallel.front());
  }
}

TEST_CASE("an exhaustive search times every heuristic config, keeps at least what the default one does",
          "[gpu][graph][search]") {
  Handle handle;
  for (const Problem& problem : {problems()[1], depthwise_problem(8)}) {
    INFO(problem.name);
    std::mt19937 random(17);
    Operands operands(problem.key, random);
    const auto search = [&](const GraphSearchOptions& options, const SearchBounds& bounds,
                            std::shared_ptr<const GraphPlan>* best = nullptr) {
      return search_engine_configs(handle.handle, problem.key, operands.buffers(), allocate, options, bounds, best);
    };
    const std::vector<EngineCandidate> usual = search(GraphSearchOptions{}, SearchBounds{});
    const std::vector<EngineCandidate> every_heuristic =
        search(GraphSearchOptions{}, only_heuristics(1000));  // no bound on step 1
    GraphSearchOptions options;
    options.exhaustive = true;
    std::shared_ptr<const GraphPlan> best;
    const std::vector<EngineCandidate> all = search(options, SearchBounds{}, &best);
    WARN(problem.name << ": " << usual.size() << " configs kept by the default search, " << every_heuristic.size()
                      << " heuristic configs in all, " << all.size() << " kept by an exhaustive search");
    CHECK(all.size() <= kMaxEngineConfigs);
    CHECK(all.size() >= std::min(usual.size(), kMaxEngineConfigs));
    CHECK(all.size() >= std::min(every_heuristic.size(), kMaxEngineConfigs));
    CHECK(distinct_choices(all));
    REQUIRE(best != nullptr);
    auto workspace = best->workspace_bytes() > 0 ? allocate(best->workspace_bytes()) : Workspace();
    best->execute(handle.handle, operands.buffers(), workspace.data());
    check_matches_legacy(handle.handle, problem.key, operands, problem.tolerance);
  }
}

TEST_CASE("audit times the stored config against the configs both native modes pick", "[gpu][graph][audit]") {
  Handle handle;
  for (const Problem& problem : {problems()[0], problems()[1]}) {
    INFO(problem.name);
    std::mt19937 random(14);
    Operands operands(problem.key, random);
    const std::vector<EngineCandidate> stored = search_engine_configs(handle.handle, problem.key, operands.buffers(),
                                                                      allocate);
    const ChoiceAudit audit =
        audit_engine_choice(handle.handle, problem.key, operands.buffers(), allocate, stored.front());
    CHECK(audit.stored.config.same_choice(stored.front()));
    for (const ChoiceAudit::Choice* choice : {&audit.stored, &audit.heuristic, &audit.benchmark}) {
      CHECK(choice->time_ms > 0.0f);
      CHECK(choice->config.time_ms == choice->time_ms);
      if (choice->config.same_choice(audit.stored.config)) {
        CHECK(choice->time_ms == audit.stored.time_ms);  // the same config is timed once
      }
    }
    CHECK(audit.stored_again_ms > 0.0f);
    // benchmark=False runs the first config of the heuristic order that runs: the one-candidate search's.
    const std::vector<EngineCandidate> heuristic_order = search_engine_configs(
        handle.handle, problem.key, operands.buffers(), allocate, GraphSearchOptions{}, only_heuristics(10));
    const std::vector<EngineCandidate> first = search_engine_configs(
        handle.handle, problem.key, operands.buffers(), allocate, GraphSearchOptions{}, only_heuristics(1));
    CHECK(audit.heuristic.config.same_choice(first.front()));
    // benchmark=True picks among the same ten.
    CHECK(std::any_of(heuristic_order.begin(), heuristic_order.end(),
                      [&](const EngineCandidate& c) { return c.same_choice(audit.benchmark.config); }));
    // A stored config cuDNN cannot build is an Error, not a crash.
    EngineCandidate unknown = stored.front();
    unknown.engine_id = 1 << 20;
    CHECK_THROWS_AS(audit_engine_choice(handle.handle, problem.key, operands.buffers(), allocate, unknown), Error);
  }
}

TEST_CASE("settling puts native's faster pick before a stored config that is slower in steady state",
          "[gpu][graph][audit][settle]") {
  // Note [Settling in steady state]: a search under load may store a config that is slower where the audit
  // measures. Here the slowest config an exhaustive search kept stands first, as such a misjudged choice.
  Handle handle;
  for (const Problem& problem : {problems()[0], problems()[1]}) {
    INFO(problem.name);
    std::mt19937 random(16);
    Operands operands(problem.key, random);
    GraphSearchOptions options;
    options.exhaustive = true;
    const std::vector<EngineCandidate> ranked =
        search_engine_configs(handle.handle, problem.key, operands.buffers(), allocate, options);
    REQUIRE(ranked.size() >= 2);
    const EngineCandidate slowest = ranked.back();
    INFO("the fastest " << to_string(ranked.front()) << ", the slowest " << to_string(slowest));
    REQUIRE(slowest.time_ms > 1.3f * ranked.front().time_ms);
    std::vector<EngineCandidate> misjudged{slowest};
    misjudged.front().time_ms = 0.0f;
    misjudged.insert(misjudged.end(), ranked.begin(), ranked.end() - 1);
    const SettledChoice settled = settle_engine_choice(handle.handle, problem.key, operands.buffers(), allocate,
                                                       misjudged, GraphSearchOptions{});
    CHECK(settled.audit.stored.config.same_choice(slowest));
    CHECK(settled.audit.stored.round_ms.size() == 3 * static_cast<std::size_t>(SearchBounds{}.repetitions));
    const auto now = Ranking<GraphForwardTraits>::of(settled.configs.begin(), settled.configs.end());
    INFO("settled first: " << to_string(now.front()) << "; native's picks " << to_string(settled.audit.heuristic.config)
                           << " and " << to_string(settled.audit.benchmark.config));
    CHECK((now.front().same_choice(settled.audit.heuristic.config) ||
           now.front().same_choice(settled.audit.benchmark.config)));
    CHECK_FALSE(now.front().same_choice(slowest));
    // The settled first config runs and computes what the legacy API does.
    const GraphPlan plan(handle.handle, problem.key, now.front());
    auto workspace = plan.workspace_bytes() > 0 ? allocate(plan.workspace_bytes()) : Workspace();
    plan.execute(handle.handle, operands.buffers(), workspace.data());
    check_matches_legacy(handle.handle, problem.key, operands, problem.tolerance);
  }
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("skipped: no CUDA GPU here; these tests run on the GPU machine (scripts/gpu_check.sh)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}

TEST_CASE("a heuristic config with knobs cudnn-frontend cannot name is stored by its position and replays native's plan",
          "[gpu][graph][search]") {
  // ResNet-50's fp32 7x7 stem with TF32 allowed: cuDNN 9's heuristics put first TF32 NHWC engines whose knobs
  // include deprecated types (LDGA, LDGC, ...) that PyTorch runs as they are and cudnn-frontend cannot name
  // (forward: engine 48; backward-filter: engine 34, which the nameable rest of it ran 1.5x slower than).
  Handle handle;
  const ConvolutionKey forward = key_of(CUDNN_DATA_FLOAT, Layout::nchw, {32, 3, 224, 224}, {64, 3, 7, 7},
                                        {32, 64, 112, 112}, {3, 3}, {2, 2}, {1, 1}, 1, CUDNN_TENSOR_OP_MATH);
  int exercised = 0;
  for (const Direction direction : {Direction::forward, Direction::backward_filter}) {
    ConvolutionKey key = forward;
    key.direction = static_cast<std::int32_t>(direction);
    INFO(to_string(direction));
    std::mt19937 random(15);
    Operands operands(key, random);
    const std::vector<EngineCandidate> first = search_engine_configs(handle.handle, key, operands.buffers(), allocate,
                                                                     GraphSearchOptions{}, only_heuristics(1));
    REQUIRE(first.size() == 1);
    const ChoiceAudit audit = audit_engine_choice(handle.handle, key, operands.buffers(), allocate, first.front());
    INFO("heuristics' first pick: " << to_string(audit.heuristic.config) << "; the search's: "
                                    << to_string(first.front()));
    // The one-candidate search times what native benchmark=False runs, and the audit knows it for that plan.
    CHECK(first.front().same_choice(audit.heuristic.config));
    CHECK(audit.heuristic.time_ms == audit.stored.time_ms);
    if (first.front().heuristic_index == EngineCandidate::kNotListed) continue;
    ++exercised;
    // Made again in a graph of its own, it is the same plan: it runs and computes what the legacy API does.
    const GraphPlan plan(handle.handle, key, first.front());
    CHECK(plan.workspace_bytes() == first.front().workspace_bytes);
    CHECK(plan.heuristics_us() > 0);  // made from heuristics' list, which it asked for
    auto workspace = plan.workspace_bytes() > 0 ? allocate(plan.workspace_bytes()) : Workspace();
    plan.execute(handle.handle, operands.buffers(), workspace.data());
    check_matches_legacy(handle.handle, key, operands, 1e-2);
    // A position that holds another config is refused, as an entry of another cuDNN would be.
    EngineCandidate other = first.front();
    other.engine_id += 1;
    try {
      const GraphPlan refused(handle.handle, key, other);
      FAIL("a config that is not at its position in heuristics' list made a plan");
    } catch (const Error& error) {
      CHECK(error.status() == CUDNN_STATUS_NOT_SUPPORTED);
      CHECK_THAT(error.what(), Catch::Matchers::Contains("heuristics' config #"));
    }
  }
  REQUIRE(exercised > 0);  // else this cuDNN no longer exercises the case
}
