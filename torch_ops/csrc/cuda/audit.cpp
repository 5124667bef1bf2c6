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

at::ScalarType scalar_type(std::int32_t data_type) {
  switch (data_type) {
    case CUDNN_DATA_HALF: return at::kHalf;
    case CUDNN_DATA_BFLOAT16: return at::kBFloat16;
    case CUDNN_DATA_DOUBLE: return at::kDouble;
    default: return at::kFloat;
  }
}

// Random memory for a tensor of these dims and strides (its span: the last element's offset plus one).
at::Tensor operand(std::int32_t data_type, const std::int32_t* dims, const std::int32_t* strides, int nb_dims,
                   int device) {
  std::int64_t span = 1;
  for (int d = 0; d < nb_dims; ++d) span += static_cast<std::int64_t>(dims[d] - 1) * strides[d];
  return at::randn({span}, at::TensorOptions().dtype(scalar_type(data_type)).device(at::kCUDA, device));
}

at::Tensor filter_operand(const FilterKey& w, int device) {
  std::int64_t count = 1;
  for (int d = 0; d < w.nb_dims; ++d) count *= w.dims[d];
  return at::randn({count}, at::TensorOptions().dtype(scalar_type(w.data_type)).device(at::kCUDA, device));
}

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
  return entry;
}

// One row per graph-API entry of the device: direction, key, and for stored, heuristic and benchmark the
// engine config and its median time in ms.
c10::List<c10::Dict<std::string, c10::IValue>> audit(const std::optional<std::int64_t>& device_index) {
  TORCH_CHECK(at::cuda::is_available(), "cudnn_cache.audit: no CUDA device; entries are timed on a GPU");
  const std::int64_t index = device_index.value_or(at::cuda::current_device());
  TORCH_CHECK(index >= 0 && index < at::cuda::device_count(), "cudnn_cache.audit: device ", index,
              " does not exist; this process sees ", at::cuda::device_count(), " CUDA devices");
  const int device = static_cast<int>(index);
  const c10::cuda::CUDAGuard guard(device);
  Runtime& runtime = Runtime::instance();
  DirectionCaches& caches = rethrow([&] { return std::ref(runtime.caches_for_device(device)); });
  const GraphSearchOptions options = runtime.search_options();
  c10::List<c10::Dict<std::string, c10::IValue>> rows;
  for_each_graph_direction([&](auto traits) {
    for (const auto& [key, ranking] : caches.get<decltype(traits)>().entries()) {
      const at::Tensor x = operand(key.input.data_type, key.input.dims.data(), key.input.strides.data(),
                                   key.input.nb_dims, device);
      const at::Tensor y = operand(key.output.data_type, key.output.dims.data(), key.output.strides.data(),
                                   key.output.nb_dims, device);
      const at::Tensor w = filter_operand(key.weight, device);
      const ConvolutionBuffers buffers{x.data_ptr(), w.data_ptr(), y.data_ptr()};
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
