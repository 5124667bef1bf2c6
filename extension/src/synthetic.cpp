#include "cudnn_cache/synthetic.h"

#include <algorithm>
#include <limits>
#include <random>

#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/error.h"

namespace cudnn_cache {
namespace {

template <typename T, std::size_t N>
T pick(std::mt19937_64& random, const T (&values)[N]) {
  return values[std::uniform_int_distribution<std::size_t>(0, N - 1)(random)];
}

ConvolutionKey random_key(std::mt19937_64& random, Direction direction) {
  const cudnnDataType_t data_types[] = {CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16, CUDNN_DATA_DOUBLE};
  const cudnnMathType_t math_types[] = {CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH};
  const std::int64_t batches[] = {1, 2, 7, 8, 16, 32, 64, 128, 256};
  const std::int64_t channels[] = {1, 3, 16, 32, 64, 96, 128, 256, 512, 1024};
  const std::int64_t spatial[] = {7, 8, 14, 16, 28, 32, 56, 64, 112, 224};
  const std::int64_t kernels[] = {1, 3, 5, 7};
  const std::int64_t strides[] = {1, 1, 1, 2};
  const std::int64_t dilations[] = {1, 1, 1, 2};
  const std::int64_t group_choices[] = {1, 1, 1, 2, 4, 0};  // 0: depthwise

  const int spatial_dims = pick(random, {1, 2, 2, 2, 3});
  const cudnnDataType_t data_type = pick(random, data_types);
  const Layout layout = spatial_dims > 1 && pick(random, {0, 1}) ? Layout::nhwc : Layout::nchw;
  const std::int64_t in_channels = pick(random, channels);
  std::int64_t groups = pick(random, group_choices);
  if (groups == 0) groups = in_channels;
  if (in_channels % groups != 0) groups = 1;
  const std::int64_t out_channels = groups * std::max<std::int64_t>(1, pick(random, channels) / groups);

  std::vector<std::int64_t> input{pick(random, batches), in_channels};
  std::vector<std::int64_t> weight{out_channels, in_channels / groups};
  std::vector<std::int64_t> output{input[0], out_channels};
  std::vector<std::int64_t> padding, stride, dilation;
  for (int d = 0; d < spatial_dims; ++d) {
    const std::int64_t size = spatial_dims == 3 ? pick(random, {8, 16, 32}) : pick(random, spatial);
    const std::int64_t kernel = std::min(size, pick(random, kernels));
    const std::int64_t s = pick(random, strides);
    const std::int64_t dil = kernel > 1 && size >= 2 * kernel ? pick(random, dilations) : 1;
    const std::int64_t pad = (dil * (kernel - 1)) / 2;
    input.push_back(size);
    weight.push_back(kernel);
    output.push_back((size + 2 * pad - dil * (kernel - 1) - 1) / s + 1);
    padding.push_back(pad);
    stride.push_back(s);
    dilation.push_back(dil);
  }
  // Keep every tensor within cuDNN's 32-bit indexing by shrinking the batch.
  std::int64_t input_sample = 1, output_sample = 1;
  for (std::size_t d = 1; d < input.size(); ++d) {
    input_sample *= input[d];
    output_sample *= output[d];
  }
  const std::int64_t max_batch = std::numeric_limits<std::int32_t>::max() / std::max(input_sample, output_sample);
  input[0] = output[0] = std::min(input[0], max_batch);

  const cudnnMathType_t math_type = pick(random, math_types);
  return make_convolution_key(direction, make_tensor_key(data_type, input, layout),
                              make_filter_key(data_type, weight, layout), make_tensor_key(data_type, output, layout),
                              make_convolution_descriptor_key(padding, stride, dilation, groups,
                                                              CUDNN_CROSS_CORRELATION, default_compute_type(data_type),
                                                              math_type));
}

template <typename Traits>
Ranking<Traits> random_ranking(std::mt19937_64& random, cudnnMathType_t math_type) {
  std::vector<Candidate<Traits>> candidates;
  const int count = std::uniform_int_distribution<int>(1, Traits::algorithm_count)(random);
  for (int algorithm = 0; algorithm < count; ++algorithm) {
    Candidate<Traits> candidate;
    candidate.algorithm = static_cast<typename Traits::Algorithm>(algorithm);
    candidate.status = std::uniform_int_distribution<int>(0, 4)(random) == 0 ? CUDNN_STATUS_NOT_SUPPORTED
                                                                             : CUDNN_STATUS_SUCCESS;
    candidate.time_ms = candidate.succeeded() ? std::uniform_real_distribution<float>(0.01f, 20.0f)(random) : 0.0f;
    candidate.workspace_bytes =
        candidate.succeeded() ? std::uint64_t{1} << std::uniform_int_distribution<int>(0, 30)(random) : 0;
    candidate.determinism = algorithm % 2 ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    candidate.math_type = math_type;
    candidates.push_back(candidate);
  }
  return Ranking<Traits>::of(candidates.begin(), candidates.end());
}

// A ranking of the graph API's kind: a few engine configs with sorted, distinct knob types.
template <typename Traits>
Ranking<Traits> random_engine_ranking(std::mt19937_64& random) {
  std::vector<EngineCandidate> candidates;
  const int count = std::uniform_int_distribution<int>(1, 5)(random);
  for (int i = 0; i < count; ++i) {
    EngineCandidate candidate;
    candidate.engine_id = std::uniform_int_distribution<std::int64_t>(0, 80)(random);
    std::int64_t type = 0;
    const int knobs = std::uniform_int_distribution<int>(0, 6)(random);
    for (int k = 0; k < knobs; ++k) {
      type += std::uniform_int_distribution<std::int64_t>(1, 5)(random);
      candidate.knobs[candidate.knob_count++] = {type, std::uniform_int_distribution<std::int64_t>(0, 16)(random)};
    }
    candidate.time_ms = std::uniform_real_distribution<float>(0.005f, 5.0f)(random);
    candidate.workspace_bytes = std::uint64_t{1} << std::uniform_int_distribution<int>(0, 28)(random);
    if (std::uniform_int_distribution<int>(0, 3)(random) == 0) candidate.behavior_notes = EngineCandidate::kRuntimeCompiled;
    // Some are positions in heuristics' list; derived, not drawn, so that the rest of the stream is unchanged.
    if (candidate.engine_id % 5 == 0) candidate.heuristic_index = static_cast<std::int32_t>(candidate.engine_id % 13);
    candidate.numerical_notes = candidate.engine_id % 3 == 0 ? EngineCandidate::kNondeterministic : 0;
    candidates.push_back(candidate);
  }
  return Ranking<Traits>::of(candidates.begin(), candidates.end());
}

// Inserts a random ranking of the backend's kind for `key` into its cache (merged with what the key holds), or
// with `only_new` nothing where the cache holds the key, drawing nothing from `random`.
void insert_random_ranking(DirectionCaches& caches, bool graph, const ConvolutionKey& key, std::mt19937_64& random,
                           bool only_new) {
  const auto math_type = static_cast<cudnnMathType_t>(key.convolution.math_type);
  for_each_cache([&](auto traits) {
    using Traits = decltype(traits);
    if (static_cast<std::int32_t>(Traits::direction) != key.direction || is_graph<Traits> != graph) return;
    PerfCache<Traits>& cache = caches.get<Traits>();
    if (only_new && cache.find(key)) return;
    if constexpr (is_graph<Traits>) {
      cache.insert(key, random_engine_ranking<Traits>(random));
    } else {
      cache.insert(key, random_ranking<Traits>(random, math_type));
    }
  });
}

}  // namespace

Origin synthetic_origin() {
  return Origin::of(DeviceIdentity{"cudnn_cache synthetic GPU", 9, 0, 132}, CudnnVersion::of_library());
}

void add_synthetic_entries(CacheStore& store, const Origin& origin, std::size_t entries, std::uint64_t seed) {
  CUDNN_CACHE_REQUIRE(entries <= kMaxSyntheticEntries, "cannot make ", entries, " synthetic entries: at most ",
                      kMaxSyntheticEntries, " at a time");
  std::mt19937_64 random(seed);
  DirectionCaches& caches = store.caches(origin);
  const std::size_t target = caches.size() + entries;
  while (caches.size() < target) {
    const auto direction = static_cast<Direction>(std::uniform_int_distribution<int>(0, kDirectionCount - 1)(random));
    const bool graph = std::uniform_int_distribution<int>(0, 1)(random) == 1;
    insert_random_ranking(caches, graph, random_key(random, direction), random, true);
  }
}

std::size_t write_synthetic_file(const std::string& path, std::size_t entries, std::uint64_t seed) {
  require_file_target(path);  // before making the entries
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), entries, seed);
  SaveOptions replace;
  replace.merge = false;
  save(store, path, replace);
  return store.size();
}

void add_synthetic_ranking(CacheStore& store, const Origin& origin, bool graph, const ConvolutionKey& key,
                           std::uint64_t seed) {
  std::mt19937_64 random(seed);
  insert_random_ranking(store.caches(origin), graph, key, random, false);
}

}  // namespace cudnn_cache
