#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "cudnn_cache/cudnn.h"

namespace cudnn_cache {

// The one exception type of the project. A cuDNN failure carries its status; user and file errors carry
// CUDNN_STATUS_SUCCESS and say in their message what was wrong and what to do.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, cudnnStatus_t status = CUDNN_STATUS_SUCCESS)
      : std::runtime_error(message), status_(status) {}

  // The cuDNN status of a failed cuDNN call, or CUDNN_STATUS_SUCCESS for any other error.
  cudnnStatus_t status() const noexcept { return status_; }

 private:
  cudnnStatus_t status_;
};

namespace detail {

// Streams every argument into one string; used to build error messages from keys and values.
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  ((out << args), ...);
  return out.str();
}

[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* expression, const char* file, int line,
                                    const std::string& context);

}  // namespace detail
}  // namespace cudnn_cache

// Checks a cuDNN call. On failure throws cudnn_cache::Error carrying the status, the failing expression, and
// whatever context follows (typically the key being worked on), streamed with operator<<.
#define CUDNN_CACHE_CHECK(expression, ...)                                                                  \
  do {                                                                                                     \
    const cudnnStatus_t cudnn_cache_status_ = (expression);                                                \
    if (cudnn_cache_status_ != CUDNN_STATUS_SUCCESS) {                                                     \
      ::cudnn_cache::detail::throw_cudnn_error(cudnn_cache_status_, #expression, __FILE__, __LINE__,       \
                                               ::cudnn_cache::detail::concat(__VA_ARGS__));                \
    }                                                                                                      \
  } while (false)

// Throws cudnn_cache::Error with the streamed message unless the condition holds.
#define CUDNN_CACHE_REQUIRE(condition, ...)                                                                 \
  do {                                                                                                     \
    if (!(condition)) {                                                                                    \
      throw ::cudnn_cache::Error(::cudnn_cache::detail::concat(__VA_ARGS__));                              \
    }                                                                                                      \
  } while (false)
