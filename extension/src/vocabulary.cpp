#include "cudnn_cache/vocabulary.h"

#include <sched.h>

#include <algorithm>
#include <limits>
#include <thread>

#include "cudnn_cache/error.h"

namespace cudnn_cache {

std::string within_workspace_limit(std::uint64_t limit) {
  if (limit == std::numeric_limits<std::uint64_t>::max()) return {};
  return detail::concat(" within the workspace limit of ", limit,
                        " bytes; raise the limit (cudnn_cache.set_workspace_limit) or remove it");
}

int usable_cores() {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) return std::max(1, CPU_COUNT(&cpus));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace cudnn_cache
