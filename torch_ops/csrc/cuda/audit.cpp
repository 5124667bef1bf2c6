// cudnn_cache.audit: each graph-API entry of a device against the engine configs PyTorch's two modes would
// pick for it, all timed the same way (audit_engine_choice, Note [Engine configs]). It answers "is the cached
// choice at least as fast as native's, per key", on random operands of the key's shapes.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../problem.h"
#include "context.h"
#include "cudnn_cache/cache_store.h"
#include "cudnn_cache/graph.h"

namespace cudnn_cache::torch_ops {
namespace {

c10::Dict<std::string, c10::IValue> row(const ConvolutionKey& key, const ChoiceAudit& audit) {
  auto entry = c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  entry.insert("direction", std::string(to_string(static_cast<Direction>(key.direction))));
  entry.insert("key", detail::concat(key));
  for (const auto& [name, choice] : {std::pair{"stored", &audit.stored}, std::pair{"heuristic", &audit.heuristic},
                                     std::pair{"benchmark", &audit.benchmark}}) {
    entry.insert(std::string(name) + "_engine", to_string(choice->config));
    entry.insert(std::string(name) + "_ms", static_cast<double>(choice->time_ms));
  }
  entry.insert("stored_again_ms", static_cast<double>(audit.stored_again_ms));
  return entry;
}

// One row per graph-API entry of the device: direction, key, and for stored, heuristic and benchmark the
// engine config and its median time in ms; and stored_again_ms, the stored config's second timing.
c10::List<c10::Dict<std::string, c10::IValue>> audit(const std::optional<std::int64_t>& device_index) {
  const int device = cuda_device("audit", device_index, "entries are timed on a GPU");
  const c10::cuda::CUDAGuard guard(device);
  Runtime& runtime = Runtime::instance();
  DirectionCaches& caches = rethrow([&] { return std::ref(runtime.caches_for_device(device)); });
  const GraphSearchOptions options = runtime.search_options();
  c10::List<c10::Dict<std::string, c10::IValue>> rows;
  for_each_graph_direction([&](auto traits) {
    for (const auto& [key, ranking] : caches.get<decltype(traits)>().entries()) {
      const KeyOperands operands = operands_for("audit", key, device);
      const ConvolutionBuffers buffers = operands.buffers();
      const ChoiceAudit result = rethrow([&] {
        return audit_engine_choice(current_handle(), key, buffers, &allocate_workspace, *ranking.begin(), options);
      });
      rows.push_back(row(key, result));
    }
  });
  return rows;
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) { m.impl("audit", &audit); }

}  // namespace cudnn_cache::torch_ops
