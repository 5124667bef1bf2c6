// Sharing tuning between processes, as ops (Note [Sharing tuning between processes]): the device identity,
// the misses the record policy remembered, an inventory of the cache, and its entries as bytes to send and
// to merge. cudnn_cache/distributed.py moves them with torch.distributed.
//
// An origin travels as (name, [compute capability major, minor, SMs, cuDNN major, minor]). Lists of entries
// travel as int64 tensors, one row each, with the origins in a table beside them.

#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <cstring>
#include <map>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/exchange.h"
#include "cudnn_cache/runtime.h"
#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

using OriginTable = std::tuple<std::vector<std::string>, std::vector<std::int64_t>>;

std::vector<std::int64_t> origin_numbers(const Origin& origin) {
  const DeviceIdentity& d = origin.device;
  return {d.compute_capability_major, d.compute_capability_minor, d.multiprocessor_count, origin.cudnn_major,
          origin.cudnn_minor};
}


// Assigns each distinct origin an index in the table, in order of first use.
class OriginIndex {
 public:
  std::int64_t operator()(const Origin& origin) {
    const auto [slot, added] = indices_.try_emplace(origin, static_cast<std::int64_t>(indices_.size()));
    if (added) {
      std::get<0>(table_).push_back(origin.device.name);
      for (std::int64_t n : origin_numbers(origin)) std::get<1>(table_).push_back(n);
    }
    return slot->second;
  }
  const OriginTable& table() const { return table_; }

 private:
  std::map<Origin, std::int64_t> indices_;
  OriginTable table_;
};

// Rows of `columns` int64 values, as a [rows, columns] tensor.
at::Tensor rows_tensor(const std::vector<std::int64_t>& values, std::int64_t columns) {
  const auto rows = static_cast<std::int64_t>(values.size()) / columns;
  return at::tensor(values, at::kLong).reshape({rows, columns});
}

std::int64_t backend_number(Backend backend) { return backend == Backend::graph ? 0 : 1; }

std::tuple<std::string, std::vector<std::int64_t>> device_origin(const std::optional<std::int64_t>& device) {
  TORCH_CHECK(at::cuda::is_available(), "cudnn_cache.device_origin: no CUDA device; an origin is a GPU's");
  const std::int64_t index = device.value_or(at::cuda::current_device());
  TORCH_CHECK(index >= 0 && index < at::cuda::device_count(), "cudnn_cache.device_origin: device ", index,
              " does not exist; this process sees ", at::cuda::device_count(), " CUDA devices");
  const Origin& origin = rethrow([&] { return std::cref(Runtime::instance().origin_of_device(int(index))); });
  return {origin.device.name, origin_numbers(origin)};
}

// Rows: origin index, backend (0 graph, 1 legacy), then the key's words.
std::tuple<std::vector<std::string>, std::vector<std::int64_t>, at::Tensor> recorded_misses() {
  OriginIndex origins;
  std::vector<std::int64_t> values;
  const std::vector<RecordedMiss> misses = Runtime::instance().recorded_misses();
  for (const RecordedMiss& miss : misses) {
    values.push_back(origins(miss.origin));
    values.push_back(backend_number(miss.backend));
    for (std::int64_t word : key_to_list(miss.key)) values.push_back(word);
  }
  const auto columns = static_cast<std::int64_t>(2 + key_to_list(ConvolutionKey{}).size());
  return {std::get<0>(origins.table()), std::get<1>(origins.table()), rows_tensor(values, columns)};
}

void clear_recorded_misses() { Runtime::instance().clear_recorded_misses(); }

// Rows: origin index, backend (0 graph, 1 legacy), digest (its 64 bits as int64), then the key's words.
std::tuple<std::vector<std::string>, std::vector<std::int64_t>, at::Tensor> inventory() {
  OriginIndex origins;
  std::vector<std::int64_t> values;
  for (const EntryRecord& record : cudnn_cache::inventory(snapshot(Runtime::instance().store()))) {
    values.push_back(origins(record.origin));
    values.push_back(backend_number(record.backend));
    std::int64_t digest = 0;
    std::memcpy(&digest, &record.digest, sizeof digest);
    values.push_back(digest);
    for (std::int64_t word : key_to_list(record.key)) values.push_back(word);
  }
  const auto columns = static_cast<std::int64_t>(3 + key_to_list(ConvolutionKey{}).size());
  return {std::get<0>(origins.table()), std::get<1>(origins.table()), rows_tensor(values, columns)};
}

// The bytes of a checkpoint of the cache's entries with these digests (and their stored plans), as uint8.
at::Tensor export_entries(at::IntArrayRef digests) {
  std::unordered_set<std::uint64_t> chosen;
  for (std::int64_t digest : digests) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &digest, sizeof bits);
    chosen.insert(bits);
  }
  const std::string bytes = rethrow([&] { return serialize(select(snapshot(Runtime::instance().store()), chosen)); });
  at::Tensor result = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
  std::memcpy(result.data_ptr(), bytes.data(), bytes.size());
  return result;
}

// Merges the checkpoint in `data` (uint8, on any device) into the cache, all or nothing; with an origin, only
// its entries. `source` names the bytes in errors. Returns the entries merged.
std::int64_t import_entries(const at::Tensor& data, const std::string& source,
                            const std::optional<std::string>& origin_name, at::IntArrayRef numbers) {
  TORCH_CHECK(data.scalar_type() == at::kByte && data.dim() == 1, "cudnn_cache.import_entries: ", source,
              ": expected a 1-D uint8 tensor of checkpoint bytes, got ", data.scalar_type(), " of ", data.dim(),
              " dimensions");
  const at::Tensor bytes = data.to(at::kCPU).contiguous();
  const std::string text(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
  return rethrow([&] {
    Checkpoint checkpoint = deserialize(text, source);
    if (origin_name) checkpoint = only_origin(checkpoint, origin_from(*origin_name, numbers, "import_entries"));
    merge_into(Runtime::instance().store(), checkpoint);
    return static_cast<std::int64_t>(checkpoint.size());
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("device_origin", &device_origin);
  m.impl("recorded_misses", &recorded_misses);
  m.impl("clear_recorded_misses", &clear_recorded_misses);
  m.impl("inventory", &inventory);
  m.impl("export_entries", &export_entries);
  m.impl("import_entries", &import_entries);
}

}  // namespace cudnn_cache::torch_ops
