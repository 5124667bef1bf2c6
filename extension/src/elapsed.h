#pragma once

#include <chrono>
#include <cstdint>

namespace cudnn_cache {

// Microseconds since `start`.
inline std::uint64_t microseconds_since(std::chrono::steady_clock::time_point start) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace cudnn_cache
