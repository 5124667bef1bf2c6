// Uses the core (a key, a cache, a file round trip) and, when installed, the ops through the dispatcher.

#include <cstdio>
#include <string>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/report.h"
#include "cudnn_cache/synthetic.h"

#ifdef CONSUMER_HAS_OPS
#include <ATen/core/dispatch/Dispatcher.h>
#endif

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer FILE\n");
    return 2;
  }
  cudnn_cache::CacheStore store;
  cudnn_cache::add_synthetic_entries(store, cudnn_cache::synthetic_origin(), 12);
  cudnn_cache::save(store, argv[1]);
  std::printf("core: %s\n", cudnn_cache::summary(cudnn_cache::read_checkpoint(argv[1])).c_str());
#ifdef CONSUMER_HAS_OPS
  const auto format_version = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("cudnn_cache::format_version", "")
                                  .typed<std::int64_t()>();
  std::printf("ops: format_version %lld\n", static_cast<long long>(format_version.call()));
#endif
  return 0;
}
