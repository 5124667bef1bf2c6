// cuDNN SDPA graphs of PyTorch's attention calls: See Note [Persisted attention plans] in attention.h.

#include "cudnn_cache/attention.h"

#include <chrono>
#include <memory>
#include <sstream>
#include <unordered_map>

#include "cudnn_cache/error.h"
#include "cudnn_cache/plan_store.h"
#include "elapsed.h"
#include "graph_internal.h"

namespace cudnn_cache {

namespace fe = cudnn_frontend;

namespace {

// The uids of the graph's tensors; execute() passes pointers by them.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kScale, kSeed, kOffset, kDO, kDQ, kDK, kDV };

bool present(const AttentionOperand& operand) { return operand.dims[0] != 0; }
bool zero(const AttentionOperand& operand) {
  return operand.dims == decltype(operand.dims){} && operand.strides == decltype(operand.strides){};
}

bool valid(const AttentionOperand& operand) {
  for (int d = 0; d < 4; ++d) {
    if (operand.dims[d] <= 0 || operand.strides[d] < 0) return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& out, const AttentionOperand& operand) {
  out << '[';
  for (int d = 0; d < 4; ++d) out << (d ? "," : "") << operand.dims[d];
  out << "]/[";
  for (int d = 0; d < 4; ++d) out << (d ? "," : "") << operand.strides[d];
  return out << ']';
}

std::shared_ptr<fe::graph::Tensor_attributes> operand(fe::graph::Graph& graph, const char* name, Uid uid,
                                                      const AttentionOperand& o) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({o.dims.begin(), o.dims.end()})
                          .set_stride({o.strides.begin(), o.strides.end()}));
}

void mark_output(const std::shared_ptr<fe::graph::Tensor_attributes>& tensor, Uid uid, const AttentionOperand& o) {
  tensor->set_output(true).set_uid(uid).set_dim({o.dims.begin(), o.dims.end()});
  tensor->set_stride({o.strides.begin(), o.strides.end()});
}

std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph& graph, const char* name, Uid uid,
                                                     fe::DataType_t type, bool by_value) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_is_pass_by_value(by_value)
                          .set_data_type(type));
}

// The stats operand: float (b, h, s_q, 1), contiguous, as PyTorch allocates its logsumexp.
AttentionOperand stats_operand(const AttentionKey& key) {
  const auto& q = key.q.dims;
  return {{q[0], q[1], q[2], 1}, {q[1] * q[2], q[2], 1, 1}};
}

// The options both directions' attributes take alike: scale, causal mask, bias, dropout.
template <typename Attributes>
void set_common(fe::graph::Graph& graph, const AttentionKey& key, Attributes& attributes) {
  attributes.set_attn_scale(scalar(graph, "scale", kScale, fe::DataType_t::FLOAT, true));
  attributes.set_causal_mask(key.is_causal != 0);
  if (key.has_bias()) attributes.set_bias(operand(graph, "bias", kBias, key.bias));
  if (key.dropout_bits != 0) {
    attributes.set_dropout(key.dropout_probability(), scalar(graph, "seed", kSeed, fe::DataType_t::INT64, false),
                           scalar(graph, "offset", kOffset, fe::DataType_t::INT64, false));
  }
}

// The key's operation graph, with heuristics mode A's plans listed and none built.
std::shared_ptr<graph_internal::Graph> make_graph(cudnnHandle_t handle, const AttentionKey& key) {
  auto graph = std::make_shared<graph_internal::Graph>();
  const fe::DataType_t type = key.data_type == CUDNN_DATA_BFLOAT16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  graph->set_io_data_type(type)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto q = operand(*graph, "q", kQ, key.q), k = operand(*graph, "k", kK, key.k),
             v = operand(*graph, "v", kV, key.v);
  if (key.which() == AttentionDirection::forward) {
    auto attributes = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(key.stats != 0);
    set_common(*graph, key, attributes);
    auto [o, stats] = graph->sdpa(q, k, v, attributes);
    mark_output(o, kO, key.o);
    if (stats) {
      mark_output(stats, kStats, stats_operand(key));
      stats->set_data_type(fe::DataType_t::FLOAT);
    }
  } else {
    auto attributes = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward");
    set_common(*graph, key, attributes);
    const auto stats = operand(*graph, "stats", kStats, stats_operand(key));
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, operand(*graph, "o", kO, key.o),
                                             operand(*graph, "do", kDO, key.d_o), stats, attributes);
    mark_output(dq, kDQ, key.d_q);
    mark_output(dk, kDK, key.d_k);
    mark_output(dv, kDV, key.d_v);
  }
  try {
    graph_internal::check_status(graph->validate(), "validate", key);
    graph_internal::check_status(graph->build_operation_graph(handle), "build_operation_graph", key);
    graph_internal::check_status(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", key);
    graph_internal::check_status(graph->check_support(handle), "check_support", key);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // cudnn-frontend lets some cuDNN failures escape as exceptions
    throw Error(detail::concat("cuDNN graph API: ", e.what(), " for ", key), CUDNN_STATUS_NOT_SUPPORTED);
  }
  return graph;
}

}  // namespace

std::ostream& operator<<(std::ostream& out, const AttentionKey& key) {
  out << (key.which() == AttentionDirection::forward ? "attention forward" : "attention backward")
      << (key.data_type == CUDNN_DATA_BFLOAT16 ? " bf16" : " fp16") << " q" << key.q << " k" << key.k << " v"
      << key.v << " o" << key.o;
  if (key.has_bias()) out << " bias" << key.bias;
  if (key.which() == AttentionDirection::backward) {
    out << " do" << key.d_o << " dq" << key.d_q << " dk" << key.d_k << " dv" << key.d_v;
  }
  if (key.is_causal) out << " causal";
  if (key.dropout_bits) out << " dropout " << key.dropout_probability();
  if (key.which() == AttentionDirection::forward && key.stats) out << " stats";
  return out;
}

std::string check_key(const AttentionKey& key) {
  const bool forward = key.direction == static_cast<std::int64_t>(AttentionDirection::forward);
  if (!forward && key.direction != static_cast<std::int64_t>(AttentionDirection::backward)) {
    return detail::concat("attention direction ", key.direction, " (0: forward, 1: backward)");
  }
  if (key.data_type != CUDNN_DATA_HALF && key.data_type != CUDNN_DATA_BFLOAT16) {
    return detail::concat("attention data type ", key.data_type, " (fp16 or bf16 only)");
  }
  if ((key.is_causal != 0 && key.is_causal != 1) || (key.stats != 0 && key.stats != 1) || (!forward && !key.stats)) {
    return "attention flags out of range";
  }
  const float dropout = key.dropout_probability();
  if (key.dropout_bits != 0 && !(dropout > 0.0f && dropout < 1.0f)) {
    return detail::concat("attention dropout probability ", dropout, " (must lie in (0, 1))");
  }
  for (const AttentionOperand* o : {&key.q, &key.k, &key.v, &key.o}) {
    if (!valid(*o)) return "attention operand with a size < 1 or a negative stride";
  }
  if (present(key.bias) && !valid(key.bias)) return "attention bias with a size < 1 or a negative stride";
  for (const AttentionOperand* o : {&key.d_o, &key.d_q, &key.d_k, &key.d_v}) {
    if (forward ? !zero(*o) : !valid(*o)) {
      return forward ? "attention forward key with gradient operands" : "attention backward key without gradients";
    }
  }
  return "";
}

struct AttentionPlan::Graph {
  std::shared_ptr<graph_internal::Graph> graph;
};

AttentionPlan::AttentionPlan(cudnnHandle_t handle, const AttentionKey& key)
    : key_(key), graph_(std::make_unique<Graph>()) {
  graph_->graph = make_graph(handle, key);
  graph_internal::Graph& graph = *graph_->graph;
  std::int64_t built = -1;
  for (std::int64_t i = 0; i < graph.get_execution_plan_count() && built < 0; ++i) {
    built = graph_internal::build_at(graph, i);  // the first that builds, as PyTorch's build_plans does
  }
  if (built < 0) throw Error(detail::concat("cuDNN graph API: no plan builds for ", key), CUDNN_STATUS_NOT_SUPPORTED);
  if (const auto config = graph_internal::describe_plan(graph, built)) config_ = *config;
  std::int64_t bytes = 0;
  graph_internal::check_status(graph.get_workspace_size(bytes), "get_workspace_size", key);
  workspace_bytes_ = static_cast<std::uint64_t>(bytes);
}

AttentionPlan::AttentionPlan(cudnnHandle_t handle, const AttentionKey& key, const std::vector<std::uint8_t>& serialized)
    : key_(key), graph_(std::make_unique<Graph>()) {
  graph_->graph = graph_internal::restored_graph(handle, key, serialized);
  std::int64_t bytes = 0;
  graph_internal::check_status(graph_->graph->get_workspace_size(bytes), "get_workspace_size", key);
  workspace_bytes_ = static_cast<std::uint64_t>(bytes);
}

AttentionPlan::~AttentionPlan() = default;
AttentionPlan::AttentionPlan(AttentionPlan&&) noexcept = default;
AttentionPlan& AttentionPlan::operator=(AttentionPlan&&) noexcept = default;

std::vector<std::uint8_t> AttentionPlan::serialize() const {
  return graph_internal::serialize_selected(*graph_->graph, key_);
}

void AttentionPlan::execute(cudnnHandle_t handle, const AttentionBuffers& b, void* workspace) const {
  float scale = b.scale;
  std::unordered_map<std::int64_t, void*> pack = {{kQ, const_cast<void*>(b.q)},
                                                  {kK, const_cast<void*>(b.k)},
                                                  {kV, const_cast<void*>(b.v)},
                                                  {kO, b.o},
                                                  {kScale, &scale}};
  if (key_.which() == AttentionDirection::backward || key_.stats) pack[kStats] = b.stats;
  if (key_.has_bias()) pack[kBias] = const_cast<void*>(b.bias);
  if (key_.dropout_bits != 0) {
    pack[kSeed] = const_cast<void*>(b.seed);
    pack[kOffset] = const_cast<void*>(b.offset);
  }
  if (key_.which() == AttentionDirection::backward) {
    pack[kDO] = const_cast<void*>(b.d_o);
    pack[kDQ] = b.d_q;
    pack[kDK] = b.d_k;
    pack[kDV] = b.d_v;
  }
  graph_internal::check_status(graph_->graph->execute(handle, pack, workspace), "execute", key_);
}

namespace {

// A plan of a thread's cache: its device and key.
struct ThreadPlanKey {
  int device;
  AttentionKey key;
  bool operator==(const ThreadPlanKey& other) const { return device == other.device && key == other.key; }
};
struct ThreadPlanKeyHash {
  std::size_t operator()(const ThreadPlanKey& k) const { return hash_value(k.key) ^ static_cast<std::size_t>(k.device); }
};

}  // namespace

const AttentionPlan& attention_plan(cudnnHandle_t handle, int device, const AttentionKey& key,
                                    AttentionPlanStore& stored, AttentionCounters& counters) {
  thread_local std::unordered_map<ThreadPlanKey, AttentionPlan, ThreadPlanKeyHash> plans;
  const ThreadPlanKey slot{device, key};
  if (const auto found = plans.find(slot); found != plans.end()) return found->second;

  const auto start = std::chrono::steady_clock::now();
  const std::uint32_t version = static_cast<std::uint32_t>(cudnnGetVersion());
  const std::shared_ptr<const StoredPlan> bytes = stored.find(key);
  if (bytes && bytes->cudnn_version == version) {
    try {
      AttentionPlan restored(handle, key, bytes->bytes);
      counters.restored.fetch_add(1);
      counters.build_us.fetch_add(microseconds_since(start));
      return plans.emplace(slot, std::move(restored)).first->second;
    } catch (const Error&) {
      counters.rebuilds.fetch_add(1);  // bytes this cuDNN does not take: built below, and replaced
    }
  }
  AttentionPlan built(handle, key);
  counters.built.fetch_add(1);
  try {
    // A plan whose engine cuDNN does not name, or cannot serialize, is built again in the next process.
    if (built.config().engine_id >= 0) stored.insert(key, StoredPlan{built.config(), version, built.serialize()});
  } catch (const Error&) {
  }
  counters.build_us.fetch_add(microseconds_since(start));
  return plans.emplace(slot, std::move(built)).first->second;
}

}  // namespace cudnn_cache
