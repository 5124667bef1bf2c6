#include "cudnn_cache/vocabulary.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace cudnn_cache {

int usable_cores() {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) return std::max(1, CPU_COUNT(&cpus));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int default_build_processes() { return std::min(usable_cores() - 1, 8); }

}  // namespace cudnn_cache
