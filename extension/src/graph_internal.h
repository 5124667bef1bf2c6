#pragma once

// What the graph API's three files share: graph.cpp builds graphs and plans, graph_search.cpp times engine
// configs (search_engine_configs), graph_audit.cpp measures a stored choice against native's
// (audit_engine_choice). See Note [Engine configs] in cudnn_cache/graph.h.

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include <cudnn_frontend.h>

#include "cudnn_cache/error.h"
#include "cudnn_cache/graph.h"
#include "search_bounds.h"  // the bounds search_engine_configs takes

namespace cudnn_cache::graph_internal {

namespace fe = cudnn_frontend;

// cudnn-frontend's graph, with what it reads of each plan's engine but hands out only for behavior notes:
// the numerical notes (EngineCandidate::numerical_notes).
class Graph : public fe::graph::Graph {
 public:
  // The numerical notes of the engine of the plan at `index`, as EngineCandidate::numerical_notes holds them;
  // kNotesUnknown if cudnn-frontend has none for that index.
  std::int32_t numerical_notes_at(std::int64_t index) const {
    if (index < 0 || static_cast<std::size_t>(index) >= plans.numeric_notes.size()) {
      return EngineCandidate::kNotesUnknown;
    }
    std::int32_t bits = 0;
    for (const fe::NumericalNote_t note : plans.numeric_notes[static_cast<std::size_t>(index)]) {
      if (note != fe::NumericalNote_t::NOT_SET) bits |= 1 << static_cast<int>(note);
    }
    return bits;
  }
};

// The variant pack of a direction's buffers: their pointers in the order of their uids, which is how
// cudnn-frontend's execute takes them without a map per call (fixed uids: it does not depend on the direction).
using VariantPack = std::array<void*, 3>;
VariantPack variant_pack(const ConvolutionBuffers& buffers);

// Scratch memory written before each timed run, so every candidate starts with its operands out of L2 (Note
// [Engine configs]): back-to-back runs on L2-resident buffers favour configs that lose inside a network.
class L2Flush {
 public:
  L2Flush(const WorkspaceAllocator& allocate, bool enabled) {
    int device = 0, l2_bytes = 0;
    if (!enabled || cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess || l2_bytes <= 0) {
      return;
    }
    bytes_ = 2 * static_cast<std::size_t>(l2_bytes);
    buffer_ = allocate(bytes_);  // without memory for it, timing goes on unflushed
  }
  void operator()(cudaStream_t stream) const {
    if (buffer_) cudaMemsetAsync(buffer_.data(), 0, bytes_, stream);
  }

 private:
  std::size_t bytes_ = 0;
  Workspace buffer_;
};

// How one built plan is timed.
struct Timing {
  int warmup = 0;
  int repetitions = 1;
  const L2Flush* flush = nullptr;  // null: not flushed (PyTorch's way)
  float give_up_ms = std::numeric_limits<float>::infinity();
  // The warm-up's second run is timed (Note [Giving up on a slow plan]): a plan gives up there when that run
  // took more than probe_ratio x give_up_ms and more than probe_floor_ms.
  float probe_ratio = 2.0f;
  float probe_floor_ms = 0.5f;
};

// Note [Timing the whole call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every timed run starts on an idle stream: time_plan drains it (after the L2 flush, when there is one) and then
// records the start event, so the time is the call as a step that waits for it sees it, the host's part
// (preparing, launching, any gap between kernels) and the GPU's. That is how native benchmark mode times its
// candidates (cudnn-frontend's time_sorted_plan: a warm-up run, the device synchronized, then start event, run,
// stop event), and a search's first pass stands for that pick (Note [Never slower than native's pick]), so it
// must measure the same thing; the paired rounds that decide between a challenger and native's picks, the
// search's and the audit's, measure it too.
// Configs of one key differ in their host part (a split or runtime-compiled config launches more kernels, or
// does more before its first), and where a key's kernels take a few microseconds that is what a step pays: on an
// H200 (2026-12-05) a 16 -> 16 3x3 convolution, batch 8, trained under intercept with the search's choices took
// +14.2 us per iteration over native heuristics, and +5.7 us with heuristics' first config stored for every key,
// when no run was timed from idle. A first pass that timed GPU time only (the flush still running while
// the host launched the plan, so the start event hid the host's part) ranked configs by another measure than
// native's: on RegNetY-400MF's squeeze-excitation backward-data keys (fp32, 1x1 spatial, H100 2026-12-06) the
// search stored heuristics' engine 63 in every run, with engine 74, native benchmark mode's pick and 8-15% faster
// from idle in every audit, ranked behind it; timed from idle, it stored engine 74 in six runs of six. On a
// GPU-bound key the host's part is about the same for every config and the comparison is the GPU's.
inline Timing round_timing(int round, int warmup, const L2Flush& flush) {
  return Timing{round == 0 ? warmup : 0, 1, &flush};
}

// Times of one built plan's runs after the warm-up, per Note [Engine configs]; empty if it failed to run.
// Gives up on a plan that cannot win (Note [Giving up on a slow plan]): after the warm-up's second run, or after
// 3 runs whose fastest is slower than timing.give_up_ms; the runs timed until then are its times.
std::vector<float> time_plan(const Graph& graph, cudnnHandle_t handle, VariantPack& pack,
                             void* workspace, std::int64_t index, const Timing& timing);

float median(std::vector<float> times);

// Whether every buffer is kGraphAlignment-byte aligned.
bool aligned(const ConvolutionBuffers& buffers);

// The engine config of the graph's plan at `index` (built), without its time; nullopt if cuDNN cannot say, or
// it has more knobs than a key stores. The graph's first `listed` plans are heuristics' list (heuristic_graph):
// one of them with knobs of types cudnn-frontend cannot name is described by its position too, the only way
// to make that plan again (EngineCandidate::heuristic_index). Any other plan is its engine and nameable knobs.
std::optional<EngineCandidate> describe_plan(Graph& graph, std::int64_t index, std::int64_t listed = 0);

// What the graphs of convolutions and of attention (attention.cpp) share: errors that name the `subject` of the
// graph (its key, or the plan's description), and restoring and serializing a plan.

// The failed status of cudnn-frontend's `what` as an Error: NOT_SUPPORTED where the graph is not supported.
// error_t's getters are not const, hence the copy.
template <typename Subject>
[[noreturn]] void throw_graph_error(fe::error_t status, const char* what, const Subject& subject) {
  const cudnnStatus_t cudnn_status = status.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED
                                         ? CUDNN_STATUS_NOT_SUPPORTED
                                         : CUDNN_STATUS_EXECUTION_FAILED;
  throw Error(detail::concat("cuDNN graph API: ", what, " failed (", status.get_message(), ") for ", subject),
              cudnn_status);
}

template <typename Subject>
void check_status(fe::error_t status, const char* what, const Subject& subject) {
  if (status.is_bad()) throw_graph_error(status, what, subject);
}

// A graph whose one plan (index 0, selected) is restored from serialize_selected's bytes, without building
// anything (Note [Stored plans]). Throws Error if cuDNN rejects the bytes.
template <typename Subject>
std::shared_ptr<Graph> restored_graph(cudnnHandle_t handle, const Subject& subject,
                                      const std::vector<std::uint8_t>& serialized) {
  auto graph = std::make_shared<Graph>();
  try {
    // No warm-up: it would capture a throw-away CUDA graph on the caller's device for every plan.
    check_status(graph->deserialize(handle, serialized, /*enforce_precompiled=*/false, /*run_warmup=*/false),
                 "deserialize", subject);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the JSON parser throws on bytes that are not UBJSON
    throw Error(detail::concat("cuDNN graph API: deserialize failed (", e.what(), ") for ", subject),
                CUDNN_STATUS_BAD_PARAM);
  }
  return graph;
}

// The bytes of the graph's selected plan (the one built last). Throws Error if cuDNN cannot serialize it.
template <typename Subject>
std::vector<std::uint8_t> serialize_selected(const Graph& graph, const Subject& subject) {
  std::vector<std::uint8_t> bytes;
  fe::error_t status;
  try {
    status = graph.serialize(bytes, /*serialize_structure=*/false);
  } catch (const std::exception& e) {  // cudnn-frontend lets some cuDNN failures escape as exceptions
    throw Error(detail::concat("cuDNN graph API: serialize failed (", e.what(), ") for ", subject));
  }
  CUDNN_CACHE_REQUIRE(status.is_good(), "cuDNN graph API: serialize failed (", status.get_message(), ") for ",
                      subject);
  return bytes;
}

// The config's plan in the graph: one of heuristics' list at its position, if the plan there is still that
// engine and those knobs (the graph is a heuristic_graph), any other appended. Returns its index, or -1 if it
// is not there or cuDNN does not take it.
std::int64_t add_plan(Graph& graph, const EngineCandidate& config);

// The operation graph with the configs of heuristics mode A and the fallback list, in that order; mode A's alone
// without `fallback`. Mode A's configs come first either way, so a position in mode A's list names the same
// config in both.
std::shared_ptr<Graph> heuristic_graph(cudnnHandle_t handle, const ConvolutionKey& key, bool deterministic,
                                       bool fallback = true);

// `index` if the graph's plan there builds (which selects it), else -1.
std::int64_t build_at(Graph& graph, std::int64_t index);

// Whether cuDNN compiles the engine of the graph's plan at `index` at run time (its RUNTIME_COMPILATION behavior
// note), built or not; nullopt if cuDNN cannot say.
std::optional<bool> runtime_compiled_at(Graph& graph, std::int64_t index);

// The first `count` configs of heuristics mode B that mode A ranks differently.
std::vector<EngineCandidate> mode_b_configs(cudnnHandle_t handle, const ConvolutionKey& key, int count);

// Variants of `best` that change one knob by at most `distance` steps to a value cuDNN allows, at most `count`.
std::vector<EngineCandidate> knob_variants(Graph& graph, const EngineCandidate& best, int count, int distance);

}  // namespace cudnn_cache::graph_internal
