#include <array>
#include <string>

#include "cudnn_cache/error.h"
#include "cudnn_cache/runtime.h"

// The names of the runtime's settings, both ways.

namespace cudnn_cache {
namespace {

// The value of `values` whose to_string is `name`; otherwise an Error naming `what` and every valid name.
template <typename Enum, std::size_t N>
Enum from_name(const std::string& name, const std::array<Enum, N>& values, const char* what) {
  std::string valid;
  for (std::size_t i = 0; i < N; ++i) {
    if (name == to_string(values[i])) return values[i];
    valid += detail::concat(i == 0 ? "" : i + 1 == N ? " or " : ", ", "'", to_string(values[i]), "'");
  }
  throw Error(detail::concat("unknown ", what, " '", name, "'; use ", valid));
}

}  // namespace

const char* to_string(MissPolicy policy) {
  switch (policy) {
    case MissPolicy::tune: return "tune";
    case MissPolicy::heuristic: return "heuristic";
    case MissPolicy::error: return "error";
    case MissPolicy::record: return "record";
    case MissPolicy::nearest: return "nearest";
  }
  return "unknown";
}

MissPolicy miss_policy_from_string(const std::string& name) {
  return from_name(name, std::array{MissPolicy::tune, MissPolicy::heuristic, MissPolicy::error, MissPolicy::record,
                                    MissPolicy::nearest},
                   "miss policy");
}

const char* to_string(Backend backend) { return backend == Backend::graph ? "graph" : "legacy"; }

Backend backend_from_string(const std::string& name) {
  return from_name(name, std::array{Backend::graph, Backend::legacy}, "backend");
}

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::off: return "off";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "unknown";
}

LogLevel log_level_from_string(const std::string& name) {
  return from_name(name, std::array{LogLevel::off, LogLevel::info, LogLevel::debug}, "log level");
}

bool graph_backend_available() { return cudnnGetVersion() >= 8900; }

}  // namespace cudnn_cache
