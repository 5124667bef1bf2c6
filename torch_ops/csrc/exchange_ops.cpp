// Sharing tuning between processes, as ops (Note [Sharing tuning between processes]): the device identity,
// the misses the record policy remembered, an inventory of the cache, and its entries as bytes to send and
// to merge. cudnn_cache/distributed.py moves them with torch.distributed.
//
// An origin travels as (name, [compute capability major, minor, SMs, cuDNN major, minor]). Lists of entries
// travel as int64 tensors, one row each, with the origins in a table beside them.

#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/exchange.h"
#include "cudnn_cache/runtime.h"
#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

std::vector<std::int64_t> origin_numbers(const Origin& origin) {
  const DeviceIdentity& d = origin.device;
  return {d.compute_capability_major, d.compute_capability_minor, d.multiprocessor_count, origin.cudnn_major,
          origin.cudnn_minor};
}

// A list of entries as the ops return it: the origins' names and numbers, and an int64 tensor of rows.
using EntryRows = std::tuple<std::vector<std::string>, std::vector<std::int64_t>, at::Tensor>;

// One row per record: its origin's index in the table (origins in order of first use), its backend (0 graph,
// 1 legacy), the `extra_columns` words `extra` appends, then the key's words.
template <typename Record, typename Extra>
EntryRows entry_rows(const std::vector<Record>& records, std::int64_t extra_columns, Extra extra) {
  std::map<Origin, std::int64_t> indices;
  std::vector<std::string> names;
  std::vector<std::int64_t> numbers, values;
  for (const Record& record : records) {
    const auto [slot, added] = indices.try_emplace(record.origin, static_cast<std::int64_t>(indices.size()));
    if (added) {
      names.push_back(record.origin.device.name);
      for (std::int64_t n : origin_numbers(record.origin)) numbers.push_back(n);
    }
    values.push_back(slot->second);
    values.push_back(record.backend == Backend::graph ? 0 : 1);
    extra(record, values);
    for (std::int64_t word : key_to_list(record.key)) values.push_back(word);
  }
  const auto columns = static_cast<std::int64_t>(2 + extra_columns + key_to_list(ConvolutionKey{}).size());
  const auto rows = static_cast<std::int64_t>(values.size()) / columns;
  return {names, numbers, at::tensor(values, at::kLong).reshape({rows, columns})};
}

std::tuple<std::string, std::vector<std::int64_t>> device_origin(const std::optional<std::int64_t>& device) {
  TORCH_CHECK(at::cuda::is_available(), "cudnn_cache.device_origin: no CUDA device; an origin is a GPU's");
  const std::int64_t index = device.value_or(at::cuda::current_device());
  TORCH_CHECK(index >= 0 && index < at::cuda::device_count(), "cudnn_cache.device_origin: device ", index,
              " does not exist; this process sees ", at::cuda::device_count(), " CUDA devices");
  const Origin& origin = rethrow([&] { return std::cref(Runtime::instance().origin_of_device(int(index))); });
  return {origin.device.name, origin_numbers(origin)};
}

EntryRows recorded_misses() {
  return entry_rows(Runtime::instance().recorded_misses(), 0, [](const RecordedMiss&, std::vector<std::int64_t>&) {});
}

void clear_recorded_misses() { Runtime::instance().clear_recorded_misses(); }

// Rows with the entry's digest (its 64 bits as int64) after the backend.
EntryRows inventory() {
  return entry_rows(cudnn_cache::inventory(snapshot(Runtime::instance().store())), 1,
                    [](const EntryRecord& record, std::vector<std::int64_t>& values) {
                      std::int64_t digest = 0;
                      std::memcpy(&digest, &record.digest, sizeof digest);
                      values.push_back(digest);
                    });
}

// Strings end to end in a uint8 tensor, and where each ends.
std::pair<at::Tensor, std::vector<std::int64_t>> concatenated(const std::vector<std::string>& parts) {
  std::vector<std::int64_t> ends;
  std::size_t total = 0;
  for (const std::string& part : parts) ends.push_back(static_cast<std::int64_t>(total += part.size()));
  at::Tensor result = at::empty({static_cast<std::int64_t>(total)}, at::kByte);
  auto* out = static_cast<char*>(result.data_ptr());
  for (const std::string& part : parts) out = std::copy(part.begin(), part.end(), out);
  return {result, ends};
}

// The bytes of a checkpoint of the cache's entries with these digests (and their stored plans), as uint8.
at::Tensor export_entries(at::IntArrayRef digests) {
  std::unordered_set<std::uint64_t> chosen;
  for (std::int64_t digest : digests) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &digest, sizeof bits);
    chosen.insert(bits);
  }
  return concatenated({rethrow([&] { return serialize(select(snapshot(Runtime::instance().store()), chosen)); })})
      .first;
}

// Merges the checkpoint in `data` (uint8, on any device) into the cache, all or nothing; with an origin, only
// its entries. `source` names the bytes in errors. Returns the entries merged.
std::int64_t import_entries(const at::Tensor& data, const std::string& source,
                            const std::optional<std::string>& origin_name, at::IntArrayRef numbers) {
  const std::string text = bytes_of(data, "import_entries", source);
  return rethrow([&] {
    Checkpoint checkpoint = deserialize(text, source);
    if (origin_name) checkpoint = only_origin(checkpoint, origin_from(*origin_name, numbers, "import_entries"));
    merge_into(Runtime::instance().store(), checkpoint);
    return static_cast<std::int64_t>(checkpoint.size());
  });
}

// An origin's tag on a shared store (Note [Entries on a shared store]).
std::string origin_tag(const std::string& name, at::IntArrayRef numbers) {
  return rethrow([&] { return cudnn_cache::origin_tag(origin_from(name, numbers, "origin_tag")); });
}

// Every entry of the checkpoint in `data` on its own (Note [Entries on a shared store]): each one's name, its
// origin in words, and their checkpoints' bytes end to end with where each ends.
std::tuple<std::vector<std::string>, std::vector<std::string>, at::Tensor, std::vector<std::int64_t>> split_entries(
    const at::Tensor& data, const std::string& source) {
  const std::string text = bytes_of(data, "split_entries", source);
  return rethrow([&] {
    std::vector<std::string> names, origins, parts;
    for (const SingleEntry& single : cudnn_cache::split_entries(deserialize(text, source))) {
      names.push_back(single.name);
      origins.push_back(detail::concat(single.origin));
      parts.push_back(serialize(single.checkpoint));
    }
    auto [bytes, ends] = concatenated(parts);
    return std::make_tuple(names, origins, bytes, ends);
  });
}

// Merges single-entry checkpoints (the bytes of the i-th end at ends[i]), each checked like a file and to be
// the one entry named names[i]; those that are not are left out. Returns the merged checkpoint's bytes and,
// for each one left out, its index and why.
std::tuple<at::Tensor, std::vector<std::int64_t>, std::vector<std::string>> merge_entries(
    const at::Tensor& data, at::IntArrayRef ends, std::vector<std::string> names, const std::string& source) {
  const std::string text = bytes_of(data, "merge_entries", source);
  TORCH_CHECK(ends.size() == names.size(), "cudnn_cache.merge_entries: ", ends.size(), " ends for ", names.size(),
              " names");
  CacheStore merged;  // Note [Selection, merge and fallback policy]: per candidate the faster measurement wins
  std::vector<std::int64_t> refused;
  std::vector<std::string> reasons;
  std::int64_t begin = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    TORCH_CHECK(begin <= ends[i] && ends[i] <= static_cast<std::int64_t>(text.size()),
                "cudnn_cache.merge_entries: end ", ends[i], " of entry ", i, " is outside the ", text.size(), " bytes");
    const std::string where = source + " " + names[i];
    try {
      Checkpoint checkpoint = deserialize(text.substr(begin, ends[i] - begin), where);
      check_single_entry(checkpoint, names[i], where);
      merge_into(merged, std::move(checkpoint));
    } catch (const Error& e) {
      refused.push_back(static_cast<std::int64_t>(i));
      reasons.emplace_back(e.what());
    }
    begin = ends[i];
  }
  return {concatenated({rethrow([&] { return serialize(snapshot(merged)); })}).first, refused, reasons};
}

// The shared-store names of the entries settle() changed in this process (replaced_entry_names): save() pushes
// them in place of the server's copies.
std::vector<std::string> replaced_entry_names() {
  return rethrow([] { return cudnn_cache::replaced_entry_names(Runtime::instance().store()); });
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("device_origin", &device_origin);
  m.impl("recorded_misses", &recorded_misses);
  m.impl("clear_recorded_misses", &clear_recorded_misses);
  m.impl("inventory", &inventory);
  m.impl("export_entries", &export_entries);
  m.impl("import_entries", &import_entries);
  m.impl("origin_tag", &origin_tag);
  m.impl("split_entries", &split_entries);
  m.impl("merge_entries", &merge_entries);
  m.impl("replaced_entry_names", &replaced_entry_names);
}

}  // namespace cudnn_cache::torch_ops
