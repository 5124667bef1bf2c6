#pragma once

// Helpers shared by the perf cache, checkpoint, atomic file and synthetic tests: valid keys, candidates,
// a temporary folder, and a readable comparison of checkpoints.

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cudnn_cache/attention.h"
#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/key.h"
#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache::testing {

// A valid attention key: (batch, 8 heads, sequence, 64) fp16 operands laid out as (batch, sequence, heads, 64).
inline AttentionKey attention_key(AttentionDirection direction, std::int64_t batch = 2, std::int64_t sequence = 128) {
  const AttentionOperand operand{{batch, 8, sequence, 64}, {sequence * 8 * 64, 64, 8 * 64, 1}};
  AttentionKey key;
  key.direction = static_cast<std::int64_t>(direction);
  key.data_type = CUDNN_DATA_HALF;
  key.stats = 1;
  key.q = key.k = key.v = key.o = operand;
  if (direction == AttentionDirection::backward) key.d_o = key.d_q = key.d_k = key.d_v = operand;
  return key;
}

// A valid key: a 2-D 3x3 convolution with padding 1 of a (batch, channels, 16, 16) input. Different batches
// or channel counts give different keys.
inline ConvolutionKey conv_key(Direction direction, std::int64_t batch = 1, std::int64_t channels = 8,
                               Layout layout = Layout::nchw, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  return make_convolution_key(direction, make_tensor_key(type, {batch, channels, 16, 16}, layout),
                              make_filter_key(type, {channels, channels, 3, 3}, layout),
                              make_tensor_key(type, {batch, channels, 16, 16}, layout),
                              make_convolution_descriptor_key({1, 1}, {1, 1}, {1, 1}, 1, CUDNN_CROSS_CORRELATION,
                                                              default_compute_type(type), CUDNN_DEFAULT_MATH));
}

template <typename Traits>
Candidate<Traits> candidate(int algorithm, float time_ms, std::uint64_t workspace_bytes = 0,
                            cudnnStatus_t status = CUDNN_STATUS_SUCCESS,
                            cudnnMathType_t math_type = CUDNN_DEFAULT_MATH) {
  Candidate<Traits> result;
  result.algorithm = static_cast<typename Traits::Algorithm>(algorithm);
  result.status = status;
  result.time_ms = time_ms;
  result.workspace_bytes = workspace_bytes;
  result.math_type = math_type;
  return result;
}

// An engine config with the given id, time and knobs (sorted by type, as a search stores them), of a
// deterministic engine.
inline EngineCandidate engine(std::int64_t id, float time_ms, std::initializer_list<Knob> knobs = {}) {
  EngineCandidate result;
  result.engine_id = id;
  result.time_ms = time_ms;
  result.numerical_notes = 0;
  for (const Knob& knob : knobs) result.knobs[result.knob_count++] = knob;
  return result;
}

template <typename Traits>
Candidate<Traits> failure(int algorithm, cudnnMathType_t math_type = CUDNN_DEFAULT_MATH) {
  return candidate<Traits>(algorithm, 0.0f, 0, CUDNN_STATUS_NOT_SUPPORTED, math_type);
}

// "[IMPLICIT_GEMM/0 1.5ms 64B ok, FFT/1 0ms 0B status 3000]", for failure messages.
template <typename Traits>
std::string to_text(const Ranking<Traits>& ranking) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < ranking.size(); ++i) {
    const auto& c = ranking[i];
    out << (i ? ", " : "") << Traits::describe(c) << ' ' << c.time_ms << "ms " << c.workspace_bytes << "B "
        << (c.succeeded() ? "ok" : "failed");
  }
  return out.str() + ']';
}

// The first difference between the entries of two checkpoints (headers are not compared), or "" if none.
inline std::string difference(const Checkpoint& a, const Checkpoint& b) {
  if (a.sections.size() != b.sections.size()) {
    return "section counts differ: " + std::to_string(a.sections.size()) + " vs " + std::to_string(b.sections.size());
  }
  for (std::size_t s = 0; s < a.sections.size(); ++s) {
    const CheckpointSection& x = a.sections[s];
    const CheckpointSection& y = b.sections[s];
    std::ostringstream out;
    if (x.origin != y.origin) {
      out << "section " << s << ": origin " << x.origin << " vs " << y.origin;
      return out.str();
    }
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      const auto& xs = x.entries<Traits>();
      const auto& ys = y.entries<Traits>();
      if (!out.str().empty()) return;
      if (xs.size() != ys.size()) {
        out << x.origin << ' ' << Traits::direction << ": " << xs.size() << " vs " << ys.size() << " entries";
        return;
      }
      for (std::size_t i = 0; i < xs.size(); ++i) {
        if (xs[i].first != ys[i].first) {
          out << "entry " << i << ": key " << xs[i].first << " vs " << ys[i].first;
          return;
        }
        if (xs[i].second != ys[i].second) {
          out << xs[i].first << ": " << to_text(xs[i].second) << " vs " << to_text(ys[i].second);
          return;
        }
      }
    });
    if (!out.str().empty()) return out.str();
    const auto plans_differ = [&](const auto& xs, const auto& ys, const char* what) {
      if (xs.size() != ys.size()) {
        out << x.origin << ": " << xs.size() << " vs " << ys.size() << " " << what << "s";
        return true;
      }
      for (std::size_t i = 0; i < xs.size(); ++i) {
        if (xs[i].first != ys[i].first || !(*xs[i].second == *ys[i].second)) {
          out << x.origin << ": " << what << " " << i << " differs";
          return true;
        }
      }
      return false;
    };
    if (plans_differ(x.plans, y.plans, "stored plan") || plans_differ(x.attention, y.attention, "attention plan")) {
      return out.str();
    }
    if (x.pending_graph != y.pending_graph || x.pending_legacy != y.pending_legacy) {
      out << x.origin << ": pending keys differ (" << x.pending() << " vs " << y.pending() << ")";
      return out.str();
    }
  }
  return {};
}

// The message of the cudnn_cache::Error that f() throws, "no error" if it returns, or "other exception: ...".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other exception: ") + e.what();
  }
  return "no error";
}

// A fresh folder under /tmp, removed with everything in it when the object goes.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = std::string(kPrefix) + "XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TemporaryFolder() {
    std::error_code ignored;
    if (path_.rfind(kPrefix, 0) == 0) std::filesystem::remove_all(path_, ignored);  // never anything else
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // The names of every entry of the folder, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  static constexpr const char* kPrefix = "/tmp/cudnn_cache_test.";
  std::string path_;
};

}  // namespace cudnn_cache::testing
