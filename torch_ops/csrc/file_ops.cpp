// Cache files as ops, without touching this process's cache: what python -m cudnn_cache runs (summary, table,
// statistics, diff, merge, JSON export and import, synthetic files). Errors name the file and the reason.

#include <torch/library.h>

#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/report.h"
#include "cudnn_cache/synthetic.h"
#include "problem.h"

namespace cudnn_cache::torch_ops {
namespace {

std::string file_summary(const std::string& path) {
  return rethrow([&] { return summary(read_checkpoint(path)); });
}

std::string file_table(const std::string& path) {
  return rethrow([&] { return entry_table(read_checkpoint(path)); });
}

std::string file_statistics(const std::string& path) {
  return rethrow([&] { return statistics(read_checkpoint(path)); });
}

std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, std::int64_t> file_diff(
    const std::string& first, const std::string& second) {
  return rethrow([&] {
    const CheckpointDiff result = diff(read_checkpoint(first), read_checkpoint(second));
    return std::make_tuple(difference_lines(result.only_first), difference_lines(result.only_second),
                           difference_lines(result.different_best), static_cast<std::int64_t>(result.same));
  });
}

// Writes the merge of the input files to `output` atomically; returns the conflicts.
std::vector<std::string> file_merge(const std::vector<std::string>& inputs, const std::string& output) {
  return rethrow([&] { return merge_files(inputs, output); });
}

std::string file_export_json(const std::string& path) {
  return rethrow([&] { return to_json(read_checkpoint(path)); });
}

// Writes the cache file of a JSON export to `output` atomically, stamped with this build's format.
void file_import_json(const std::string& json_path, const std::string& output) {
  rethrow([&] { import_json_file(json_path, output); });
}

// Replaces `path` with a file of `entries` synthetic entries (for tests and benchmarks); returns the count.
std::int64_t file_synth(const std::string& path, std::int64_t entries, std::int64_t seed) {
  TORCH_CHECK(entries >= 0 && seed >= 0, "cudnn_cache synth: entries and seed must be >= 0, got ", entries, " and ",
              seed);
  return rethrow([&] {
    return static_cast<std::int64_t>(
        write_synthetic_file(path, static_cast<std::size_t>(entries), static_cast<std::uint64_t>(seed)));
  });
}

// Writes `content` to `path` atomically (Note [Atomic save]); a directory or FIFO there is refused.
void file_write(const std::string& path, const std::string& content) {
  rethrow([&] { write_file_atomically(path, content); });
}

// A cache file's bytes (uint8), checked like a file before anything is written, written atomically.
void file_write_checkpoint(const std::string& path, const at::Tensor& data) {
  const std::string content = bytes_of(data, "file_write_checkpoint", path);
  rethrow([&] {
    deserialize(content, path);
    write_file_atomically(path, content);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(cudnn_cache, CompositeImplicitAutograd, m) {
  m.impl("file_summary", &file_summary);
  m.impl("file_table", &file_table);
  m.impl("file_statistics", &file_statistics);
  m.impl("file_diff", &file_diff);
  m.impl("file_merge", &file_merge);
  m.impl("file_export_json", &file_export_json);
  m.impl("file_import_json", &file_import_json);
  m.impl("file_synth", &file_synth);
  m.impl("file_write", &file_write);
  m.impl("file_write_checkpoint", &file_write_checkpoint);
}

}  // namespace cudnn_cache::torch_ops
