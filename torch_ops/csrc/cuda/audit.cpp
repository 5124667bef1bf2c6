// cudnn_cache.audit: each graph-API entry of a device against the engine configs PyTorch's two modes would
// pick for it, all timed the same way (audit_engine_choice, Note [Engine configs]). It answers "is the cached
// choice at least as fast as native's, per key", on random operands of the key's shapes. cudnn_cache.settle
// acts on the answer: it audits each entry with more rounds and lets a native pick take the stored config's
// place where the rounds show that pick faster (settle_engine_choice).

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

// Calls f(key, ranking, cache, buffers) for each graph-API entry of the device, on random operands of its
// shapes, with the device current; `what` names the caller in errors.
template <typename F>
void for_each_entry(const char* what, const std::optional<std::int64_t>& device_index, F&& f) {
  const int device = cuda_device(what, device_index, "entries are timed on a GPU");
  const c10::cuda::CUDAGuard guard(device);
  DirectionCaches& caches = rethrow([&] { return std::ref(Runtime::instance().caches_for_device(device)); });
  for_each_graph_direction([&](auto traits) {
    auto& cache = caches.get<decltype(traits)>();
    for (const auto& [key, ranking] : cache.entries()) {
      const KeyOperands operands = operands_for(what, key, device);
      f(key, ranking, cache, operands.buffers());
    }
  });
}

// One row per graph-API entry of the device: direction, key, and for stored, heuristic and benchmark the
// engine config and its median time in ms; and stored_again_ms, the stored config's second timing.
c10::List<c10::Dict<std::string, c10::IValue>> audit(const std::optional<std::int64_t>& device_index) {
  const GraphSearchOptions options = Runtime::instance().search_options();
  c10::List<c10::Dict<std::string, c10::IValue>> rows;
  for_each_entry("audit", device_index, [&](const ConvolutionKey& key, const auto& ranking, auto&, const auto& buffers) {
    rows.push_back(row(key, rethrow([&] {
      return audit_engine_choice(current_handle(), key, buffers, &allocate_workspace, ranking.front(), options);
    })));
  });
  return rows;
}

// Note [Settling in steady state] (extension/src/paired_timing.h): each graph-API entry of the device decided
// again by an audit of its stored config. One row per entry, the audit's (stored_* is the choice before), with
// settled_engine, the entry's first config now, and changed, whether that is another config.
c10::List<c10::Dict<std::string, c10::IValue>> settle(const std::optional<std::int64_t>& device_index) {
  const GraphSearchOptions options = Runtime::instance().search_options();
  c10::List<c10::Dict<std::string, c10::IValue>> rows;
  for_each_entry("settle", device_index, [&](const ConvolutionKey& key, const auto& ranking, auto& cache,
                                             const auto& buffers) {
    const SettledChoice settled = rethrow([&] {
      return settle_engine_choice(current_handle(), key, buffers, &allocate_workspace,
                                  std::vector<EngineCandidate>(ranking.begin(), ranking.end()), options);
    });
    auto now = std::decay_t<decltype(ranking)>::of(settled.configs.begin(), settled.configs.end());
    const bool changed = !now.front().same_choice(ranking.front());
    auto entry = row(key, settled.audit);
    entry.insert("settled_engine", to_string(now.front()));
    entry.insert("changed", changed);
    if (changed) rethrow([&] { cache.replace(key, std::move(now)); });  // else the search's times stand
    rows.push_back(std::move(entry));
  });
  return rows;
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("audit", &audit);
  m.impl("settle", &settle);
}

}  // namespace cudnn_cache::torch_ops
