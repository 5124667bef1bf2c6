#pragma once

// Scaled dot-product attention through cuDNN's SDPA graphs, with their compiled plans kept in the cache file.
//
// Note [Persisted attention plans]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's cuDNN attention (aten::_cudnn_attention_forward and _backward, which F.scaled_dot_product_attention
// runs on Hopper) builds one cuDNN graph per shape, layout and option set, in every process: cuDNN compiles
// its SDPA engines at run time, so each build is a compilation of hundreds of milliseconds, and a model fed
// sequences of many lengths pays it for every new length of its first epoch (the real-workloads benchmark's
// speech workload: most of its first epoch). Nothing of it outlives the process.
//
// cudnn_cache builds the same graph (cudnn-frontend's sdpa and sdpa_backward nodes, with what PyTorch gives
// them: causal mask, additive bias, dropout from PyTorch's Philox seed and offset, softmax stats in float) and
// keeps the plan cuDNN built, serialized, under the device's Origin as it keeps the runtime-compiled plans of
// convolutions (Note [Stored plans] in plan_store.h), keyed by an AttentionKey: every size and stride of every
// operand and every option the graph depends on. A later process restores the plan from its bytes, which takes
// milliseconds, instead of compiling it. There is nothing to tune: for a graph, cuDNN's heuristics give the
// engine PyTorch runs, and the first of their list that builds is used, as PyTorch does. The scale is passed by
// value at run time, so it is not part of the key.
//
// Plans are built and restored once per thread and kept for the thread (PyTorch keeps its own per thread, since
// cuDNN does not promise every engine's plans are safe to share between threads); the stored bytes are shared.

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include <cudnn.h>

#include "cudnn_cache/key.h"
#include "cudnn_cache/perf_cache.h"

namespace cudnn_cache {

enum class AttentionDirection : std::int64_t { forward = 0, backward = 1 };

// One 4-d operand of an attention graph: sizes (batch, heads, sequence, head dim) and strides, in elements.
struct AttentionOperand {
  std::array<std::int64_t, 4> dims{};
  std::array<std::int64_t, 4> strides{};
};

// What an attention graph depends on. Plain data, zero-initialised, every field 64 bits wide (compared and hashed
// as bytes, stored as one block of words); an operand that a call lacks stays all zero.
struct AttentionKey {
  std::int64_t direction = 0;     // AttentionDirection
  std::int64_t data_type = 0;     // cudnnDataType_t of every operand but the stats: HALF or BFLOAT16
  std::int64_t is_causal = 0;     // 1: the causal mask (top-left aligned, as PyTorch's is_causal)
  std::int64_t stats = 0;         // forward: 1 when it writes the softmax stats (training); backward: 1
  std::int64_t dropout_bits = 0;  // the float dropout probability's bit pattern; 0: no dropout
  AttentionOperand q, k, v;
  AttentionOperand o;             // the output (forward), or the forward's output (backward)
  AttentionOperand bias;          // the additive bias, when there is one
  AttentionOperand d_o, d_q, d_k, d_v;  // backward only: the output's gradient and the three gradients

  AttentionDirection which() const { return static_cast<AttentionDirection>(direction); }
  bool has_bias() const { return bias.dims[0] != 0; }
  float dropout_probability() const {
    const auto bits = static_cast<std::uint32_t>(dropout_bits);
    float probability = 0.0f;
    std::memcpy(&probability, &bits, sizeof probability);
    return probability;
  }
  void set_dropout_probability(float probability) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &probability, sizeof bits);
    dropout_bits = probability == 0.0f ? 0 : bits;
  }
};
static_assert(std::is_standard_layout_v<AttentionKey> && std::is_trivially_copyable_v<AttentionKey>);
static_assert(std::has_unique_object_representations_v<AttentionKey>, "no padding: keys compare as bytes");
template <>
struct IsKey<AttentionKey> : std::true_type {};  // ==, <, hash_value: See Note [Keys are values] in key.h

std::ostream& operator<<(std::ostream& out, const AttentionKey& key);

// What is wrong with a key read from a file ("" if nothing): the direction, data type and flags must be ones a
// call makes, the operands of the direction present with positive sizes and non-negative strides.
std::string check_key(const AttentionKey& key);

// The device buffers of one call, for the operands its key has; scale is passed by value.
struct AttentionBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;            // forward: written; backward: read
  void* stats = nullptr;        // float (b, h, s_q, 1): written by a training forward, read by the backward
  const void* bias = nullptr;
  const void* seed = nullptr;   // int64 Philox seed and offset, on the device, when the key has dropout
  const void* offset = nullptr;
  const void* d_o = nullptr;    // backward only
  void* d_q = nullptr;
  void* d_k = nullptr;
  void* d_v = nullptr;
  float scale = 1.0f;
};

// A built (or restored) cuDNN SDPA plan for one key. Move-only; use from one thread at a time.
class AttentionPlan {
 public:
  // Builds the key's graph and the first plan of cuDNN's heuristics (mode A) that builds. Throws Error.
  AttentionPlan(cudnnHandle_t handle, const AttentionKey& key);
  // Restores a plan from serialize()'s bytes, building nothing. Throws Error when cuDNN rejects them.
  AttentionPlan(cudnnHandle_t handle, const AttentionKey& key, const std::vector<std::uint8_t>& serialized);
  ~AttentionPlan();
  AttentionPlan(AttentionPlan&&) noexcept;
  AttentionPlan& operator=(AttentionPlan&&) noexcept;

  std::uint64_t workspace_bytes() const { return workspace_bytes_; }
  // The engine of the plan built (engine_id -1 for one restored, or one cuDNN does not describe).
  const EngineCandidate& config() const { return config_; }
  // The plan as bytes a later process restores. Throws Error where cuDNN cannot serialize it.
  std::vector<std::uint8_t> serialize() const;
  // Runs the plan on the handle's stream; workspace holds workspace_bytes(). Throws Error.
  void execute(cudnnHandle_t handle, const AttentionBuffers& buffers, void* workspace) const;

 private:
  struct Graph;
  AttentionKey key_;
  std::unique_ptr<Graph> graph_;
  std::uint64_t workspace_bytes_ = 0;
  EngineCandidate config_;
};

// What attention calls cost in plans over the process; read by stats().
struct AttentionCounters {
  std::atomic<std::uint64_t> built{0};     // plans built (compiled) by calls
  std::atomic<std::uint64_t> restored{0};  // plans restored from stored bytes instead
  std::atomic<std::uint64_t> rebuilds{0};  // stored bytes this cuDNN rejected: built again, and they replaced
  std::atomic<std::uint64_t> build_us{0};  // time spent building and restoring, in microseconds
  void reset() {
    for (auto* counter : {&built, &restored, &rebuilds, &build_us}) counter->store(0);
  }
};

template <typename Key>
class StoredPlans;

// The plan of `key` for the calling thread on CUDA device `device`: the thread's own if it has one; else restored
// from the bytes `stored` holds for the key, when this cuDNN wrote them; else built, and its bytes stored (where
// cuDNN can serialize it) for save() to write. Counted in `counters`. Throws Error if no plan builds.
const AttentionPlan& attention_plan(cudnnHandle_t handle, int device, const AttentionKey& key,
                                    StoredPlans<AttentionKey>& stored, AttentionCounters& counters);

}  // namespace cudnn_cache
