#include "cudnn_cache/error.h"

namespace cudnn_cache::detail {

void throw_cudnn_error(cudnnStatus_t status, const char* expression, const char* file, int line,
                       const std::string& context) {
  throw Error(concat(cudnnGetErrorString(status), " (", static_cast<int>(status), ") from ", expression, " at ", file,
                     ":", line, context.empty() ? "" : " for ", context),
              status);
}

}  // namespace cudnn_cache::detail
