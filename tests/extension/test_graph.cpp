// The key -> cudnn-frontend graph mapping, checked without a GPU (tests/gpu/ runs the plans).

#include <catch2/catch.hpp>

#include "cudnn_cache/graph.h"
#include "cudnn_cache/synthetic.h"

using namespace cudnn_cache;

namespace {

std::vector<ConvolutionKey> synthetic_keys(std::size_t count) {
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), count, 7);
  const Checkpoint checkpoint = snapshot(store);
  std::vector<ConvolutionKey> keys;
  for (const auto& section : checkpoint.sections) {
    for_each_cache([&](auto traits) {
      for (const auto& entry : section.entries<decltype(traits)>()) keys.push_back(entry.first);
    });
  }
  return keys;
}

}  // namespace

TEST_CASE("every synthetic key maps onto a graph cudnn-frontend accepts", "[graph]") {
  const auto keys = synthetic_keys(600);
  REQUIRE(keys.size() == 600);
  std::array<int, kDirectionCount> per_direction{};
  for (const ConvolutionKey& key : keys) {
    INFO(key);
    CHECK(check_graph(key) == "");
    ++per_direction[key.direction];
  }
  for (int count : per_direction) CHECK(count > 100);
}

TEST_CASE("check_graph reports what cudnn-frontend rejects", "[graph]") {
  ConvolutionKey key = make_convolution_key(
      Direction::forward, make_tensor_key(CUDNN_DATA_FLOAT, {2, 8, 16, 16}, Layout::nchw),
      make_filter_key(CUDNN_DATA_FLOAT, {4, 8, 3, 3}, Layout::nchw),
      make_tensor_key(CUDNN_DATA_FLOAT, {2, 4, 16, 16}, Layout::nchw),
      make_convolution_descriptor_key({1, 1}, {1, 1}, {1, 1}, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT,
                                      CUDNN_FMA_MATH));
  REQUIRE(check_graph(key) == "");
  key.convolution.nb_spatial_dims = 0;  // no padding, stride or dilation at all
  CHECK_FALSE(check_graph(key).empty());
}
