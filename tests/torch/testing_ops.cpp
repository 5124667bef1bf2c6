// libcudnn_cache_testing.so: ops for the Python tests only, built with them and never installed. They write
// synthetic entries (extension/include/cudnn_cache/synthetic.h) to a cache file, which a test then loads through
// the public API (tests/python/testing_ops.py), so the shipped ops library carries no test helpers.

#include <torch/library.h>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/runtime.h"
#include "cudnn_cache/synthetic.h"
#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

void write(const CacheStore& store, const std::string& path) {
  SaveOptions replace;
  replace.merge = false;
  rethrow([&] { save(store, path, replace); });
}

// A file holding `entries` synthetic entries of the origin, from `seed`.
void write_synthetic_entries(const std::string& path, std::int64_t entries, std::int64_t seed,
                             const std::string& origin_name, at::IntArrayRef numbers) {
  TORCH_CHECK(entries >= 0, "cudnn_cache_testing.write_synthetic_entries: entries must be >= 0, got ", entries);
  CacheStore store;
  const Origin origin = origin_from(origin_name, numbers, "write_synthetic_entries");
  rethrow([&] {
    add_synthetic_entries(store, origin, static_cast<std::size_t>(entries), static_cast<std::uint64_t>(seed));
  });
  write(store, path);
}

// A file holding one synthetic ranking for the key under the origin, where a search would store one.
void write_synthetic_ranking(const std::string& path, at::IntArrayRef key, const std::string& backend,
                             const std::string& origin_name, at::IntArrayRef numbers, std::int64_t seed) {
  CacheStore store;
  const Origin origin = origin_from(origin_name, numbers, "write_synthetic_ranking");
  rethrow([&] {
    add_synthetic_ranking(store, origin, backend_from_string(backend) == Backend::graph, key_from_list(key),
                          static_cast<std::uint64_t>(seed));
  });
  write(store, path);
}

}  // namespace

TORCH_LIBRARY(cudnn_cache_testing, m) {
  m.def("write_synthetic_entries(str path, int entries, int seed, str origin_name, int[] origin_numbers) -> ()",
        &write_synthetic_entries);
  m.def("write_synthetic_ranking(str path, int[] key, str backend, str origin_name, int[] origin_numbers, "
        "int seed=1) -> ()",
        &write_synthetic_ranking);
}

}  // namespace cudnn_cache::torch_ops
