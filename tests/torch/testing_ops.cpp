// libcudnn_cache_testing.so: ops for the Python tests only, built with them and never installed. They write
// synthetic entries (extension/include/cudnn_cache/synthetic.h) to a cache file, which a test then loads through
// the public API (tests/python/testing_ops.py), so the shipped ops library carries no test helpers; and they
// shorten the searches of the loaded ops library (Note [Search bounds]), which is no tuning option.

#include <dlfcn.h>
#include <torch/library.h>

#include <optional>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/runtime.h"
#include "cudnn_cache/synthetic.h"
#include "problem.h"
#include "search_bounds.h"

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

// Sets the bounds of later searches in the ops library at `ops_library` (cudnn_cache.library_path(), loaded
// already): the bounds given, the others at their constants; none restores the constants. This library holds its
// own copy of the core, so it calls the loaded ops library's cudnn_cache_set_search_bounds, found with dlsym.
void set_search_bounds(const std::string& ops_library, std::optional<std::int64_t> warmup,
                       std::optional<std::int64_t> repetitions, std::optional<std::int64_t> max_candidates,
                       std::optional<std::int64_t> mode_b_candidates, std::optional<std::int64_t> knob_variants,
                       std::optional<std::int64_t> finalists, std::optional<bool> flush_l2,
                       std::optional<double> give_up_ratio) {
  graph_internal::SearchBounds bounds;
  for (auto [value, field] : {std::pair{warmup, &bounds.warmup}, std::pair{repetitions, &bounds.repetitions},
                              std::pair{max_candidates, &bounds.max_candidates},
                              std::pair{mode_b_candidates, &bounds.mode_b_candidates},
                              std::pair{knob_variants, &bounds.knob_variants}, std::pair{finalists, &bounds.finalists}}) {
    if (value) *field = static_cast<int>(*value);
  }
  if (flush_l2) bounds.flush_l2 = *flush_l2;
  if (give_up_ratio) bounds.give_up_ratio = static_cast<float>(*give_up_ratio);
  void* library = dlopen(ops_library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  TORCH_CHECK(library != nullptr, "cudnn_cache_testing.set_search_bounds: ", ops_library,
              " is not loaded: import cudnn_cache first");
  const auto set = reinterpret_cast<decltype(&cudnn_cache_set_search_bounds)>(
      dlsym(library, "cudnn_cache_set_search_bounds"));
  if (set != nullptr) set(&bounds);
  dlclose(library);  // the reference this dlopen took; the library stays loaded
  TORCH_CHECK(set != nullptr, "cudnn_cache_testing.set_search_bounds: ", ops_library,
              " has no cudnn_cache_set_search_bounds");
}

}  // namespace

TORCH_LIBRARY(cudnn_cache_testing, m) {
  m.def("write_synthetic_entries(str path, int entries, int seed, str origin_name, int[] origin_numbers) -> ()",
        &write_synthetic_entries);
  m.def("write_synthetic_ranking(str path, int[] key, str backend, str origin_name, int[] origin_numbers, "
        "int seed=1) -> ()",
        &write_synthetic_ranking);
  m.def("set_search_bounds(str ops_library, int? warmup=None, int? repetitions=None, int? max_candidates=None, "
        "int? mode_b_candidates=None, int? knob_variants=None, int? finalists=None, bool? flush_l2=None, "
        "float? give_up_ratio=None) -> ()",
        &set_search_bounds);
}

}  // namespace cudnn_cache::torch_ops
