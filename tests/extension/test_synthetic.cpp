// Synthetic cache content (synthetic.h): distinct, valid, reproducible and varied entries.

#include <catch2/catch.hpp>
#include <set>

#include "cache_fixtures.h"
#include "cudnn_cache/synthetic.h"

using namespace cudnn_cache;
using cudnn_cache::testing::difference;

namespace {

// Every key of every direction of the origin's caches.
std::vector<ConvolutionKey> keys_of(const CacheStore& store, const Origin& origin) {
  std::vector<ConvolutionKey> keys;
  const DirectionCaches* caches = store.find(origin);
  if (!caches) return keys;
  for_each_cache([&](auto traits) {
    for (const auto& entry : caches->get<decltype(traits)>().entries()) keys.push_back(entry.first);
  });
  return keys;
}

Checkpoint synthetic_snapshot(std::size_t entries, std::uint64_t seed) {
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), entries, seed);
  return snapshot(store);
}

}  // namespace

TEST_CASE("add_synthetic_entries adds exactly N distinct, valid entries", "[synthetic]") {
  const std::size_t n = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{1000});
  CAPTURE(n);
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), n);
  CHECK(store.size() == n);
  CHECK(store.origins().size() == 1);

  const std::vector<ConvolutionKey> keys = keys_of(store, synthetic_origin());
  CHECK(std::set<ConvolutionKey>(keys.begin(), keys.end()).size() == n);
  for (const ConvolutionKey& key : keys) {
    const std::string problem = check_key(key);
    INFO(key);
    CHECK(problem == "");
  }
}

TEST_CASE("add_synthetic_entries adds N more to a non-empty store", "[synthetic]") {
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), 100, 1);
  add_synthetic_entries(store, synthetic_origin(), 50, 2);
  CHECK(store.size() == 150);
  add_synthetic_entries(store, synthetic_origin(), 30, 1);  // the same seed: its first keys are there already
  CHECK(store.size() == 180);
}

TEST_CASE("add_synthetic_entries refuses more than kMaxSyntheticEntries before allocating", "[synthetic]") {
  CacheStore store;
  CHECK_THROWS_WITH(add_synthetic_entries(store, synthetic_origin(), kMaxSyntheticEntries + 1),
                    Catch::Matchers::Contains("at most 100000 at a time"));
  CHECK_THROWS_AS(add_synthetic_entries(store, synthetic_origin(), std::size_t{99999999999999}), Error);
  CHECK(store.size() == 0);
}

TEST_CASE("synthetic rankings are valid rankings", "[synthetic]") {
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), 300);
  const Checkpoint checkpoint = snapshot(store);
  REQUIRE(checkpoint.sections.size() == 1);
  for_each_cache([&](auto traits) {
    using Traits = decltype(traits);
    for (const auto& [key, ranking] : checkpoint.sections[0].entries<Traits>()) {
      INFO(key << ": " << testing::to_text(ranking));
      CHECK(key.direction == static_cast<std::int32_t>(Traits::direction));
      CHECK_FALSE(ranking.empty());
      CHECK(Ranking<Traits>::of(ranking.begin(), ranking.end()) == ranking);  // ranked, no duplicates
    }
  });
}

TEST_CASE("the same seed gives the same entries, another seed others", "[synthetic]") {
  const Checkpoint first = synthetic_snapshot(200, 7);
  CHECK(difference(first, synthetic_snapshot(200, 7)) == "");
  CHECK(difference(first, synthetic_snapshot(200, 8)) != "");
}

TEST_CASE("synthetic entries cover every direction, several data types and both layouts", "[synthetic]") {
  CacheStore store;
  const Origin origin = synthetic_origin();
  add_synthetic_entries(store, origin, 1000);
  const DirectionCaches& caches = *store.find(origin);
  CHECK(caches.forward.size() > 0);
  CHECK(caches.backward_data.size() > 0);
  CHECK(caches.backward_filter.size() > 0);
  CHECK(caches.graph_forward.size() > 0);
  CHECK(caches.graph_backward_data.size() > 0);
  CHECK(caches.graph_backward_filter.size() > 0);

  std::set<std::int32_t> data_types, filter_formats, ranks;
  std::set<std::string> input_layouts;
  for (const ConvolutionKey& key : keys_of(store, origin)) {
    data_types.insert(key.input.data_type);
    filter_formats.insert(key.weight.format);
    ranks.insert(key.input.nb_dims);
    input_layouts.insert(layout_name(key.input));
  }
  CHECK(data_types.size() > 1);
  CHECK(data_types ==
        std::set<std::int32_t>{CUDNN_DATA_FLOAT, CUDNN_DATA_HALF, CUDNN_DATA_BFLOAT16, CUDNN_DATA_DOUBLE});
  CHECK(filter_formats == std::set<std::int32_t>{CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC});
  CHECK(input_layouts.count("NCHW") == 1);
  CHECK(input_layouts.count("NHWC") == 1);
  CHECK(ranks == std::set<std::int32_t>{4, 5});
}

TEST_CASE("synthetic_origin is a made-up GPU with this process's cuDNN", "[synthetic]") {
  const Origin origin = synthetic_origin();
  CHECK(origin.same_cudnn(CudnnVersion::of_library()));
  CHECK_FALSE(origin.device.name.empty());
}
