#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache {
namespace {

template <std::size_t N>
std::string lookup(const std::array<const char*, N>& names, int algorithm) {
  if (algorithm >= 0 && static_cast<std::size_t>(algorithm) < N) return names[algorithm];
  return "ALGO_" + std::to_string(algorithm);
}

// Indexed by cudnnConvolution*Algo_t value; the static_asserts keep them in step with cuDNN.
constexpr std::array<const char*, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> kForwardNames = {
    "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr std::array<const char*, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> kBackwardDataNames = {
    "ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr std::array<const char*, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> kBackwardFilterNames = {
    "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
static_assert(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED == 7);
static_assert(CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED == 5);
static_assert(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING == 6);

}  // namespace

std::uint64_t next_cache_version() {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::string ForwardTraits::algorithm_name(int algorithm) { return lookup(kForwardNames, algorithm); }
std::string BackwardDataTraits::algorithm_name(int algorithm) { return lookup(kBackwardDataNames, algorithm); }
std::string BackwardFilterTraits::algorithm_name(int algorithm) { return lookup(kBackwardFilterNames, algorithm); }

std::string ForwardTraits::describe(const Candidate& candidate) { return algorithm_name(candidate.algorithm); }
std::string BackwardDataTraits::describe(const Candidate& candidate) { return algorithm_name(candidate.algorithm); }
std::string BackwardFilterTraits::describe(const Candidate& candidate) { return algorithm_name(candidate.algorithm); }

std::string to_string(const EngineCandidate& candidate) {
  std::string text = "engine " + std::to_string(candidate.engine_id);
  for (const Knob* knob = candidate.knobs_begin(); knob != candidate.knobs_end(); ++knob) {
    text += (knob == candidate.knobs_begin() ? " (" : ", ") + ("k" + std::to_string(knob->type)) + "=" +
            std::to_string(knob->value);
  }
  if (candidate.knob_count > 0) text += ")";
  if (candidate.heuristic_index != EngineCandidate::kNotListed) {
    text += " as heuristics' config #" + std::to_string(candidate.heuristic_index);
  }
  if (candidate.behavior_notes & EngineCandidate::kRuntimeCompiled) text += " runtime-compiled";
  if (candidate.numerical_notes != EngineCandidate::kNotesUnknown &&
      (candidate.numerical_notes & EngineCandidate::kNondeterministic)) {
    text += " nondeterministic";
  }
  return text;
}

std::string algorithm_name(Direction direction, int algorithm) {
  switch (direction) {
    case Direction::forward: return ForwardTraits::algorithm_name(algorithm);
    case Direction::backward_data: return BackwardDataTraits::algorithm_name(algorithm);
    case Direction::backward_filter: return BackwardFilterTraits::algorithm_name(algorithm);
  }
  return "ALGO_" + std::to_string(algorithm);
}

}  // namespace cudnn_cache
