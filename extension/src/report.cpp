#include "cudnn_cache/report.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>
#include <type_traits>

#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/error.h"

namespace cudnn_cache {
namespace {

std::string version_text(std::uint32_t cudnn_version, std::uint32_t cuda_version) {
  std::ostringstream out;
  out << "cuDNN " << CudnnVersion::from_number(cudnn_version) << ", CUDA runtime " << cuda_version / 1000 << '.'
      << (cuda_version % 1000) / 10;
  return out.str();
}

std::string sizes_text(const std::array<std::int32_t, kMaxTensorDims>& dims, int count) {
  std::string text;
  for (int i = 0; i < count; ++i) text += (i ? "x" : "") + std::to_string(dims[i]);
  return text;
}

std::string bytes_text(std::uint64_t bytes) {
  std::ostringstream out;
  if (bytes < 1024) {
    out << bytes << " B";
  } else if (bytes < (1u << 20)) {
    out << std::fixed << std::setprecision(1) << bytes / 1024.0 << " KiB";
  } else {
    out << std::fixed << std::setprecision(1) << bytes / double(1u << 20) << " MiB";
  }
  return out.str();
}

std::string convolution_text(const ConvolutionDescriptorKey& c) {
  std::ostringstream out;
  auto list = [&](const char* name, const std::array<std::int32_t, kMaxSpatialDims>& values) {
    out << name;
    for (int i = 0; i < c.nb_spatial_dims; ++i) out << (i ? "," : "") << values[i];
    out << ' ';
  };
  list("p", c.padding);
  list("s", c.stride);
  list("d", c.dilation);
  out << 'g' << c.groups;
  return out.str();
}

template <typename Traits>
constexpr const char* api_name() {
  return is_graph<Traits> ? "graph" : "legacy";
}

template <typename Traits>
std::string cache_name() {
  return std::string(api_name<Traits>()) + ' ' + to_string(Traits::direction);
}

template <typename Traits>
std::string best_text(const Ranking<Traits>& ranking) {
  const auto& best = ranking.front();
  if (!best.succeeded()) return "(none succeeded)";
  std::ostringstream out;
  out << Traits::describe(best) << ' ' << std::fixed << std::setprecision(4) << best.time_ms << " ms";
  return out.str();
}

std::size_t stored_plans(const Checkpoint& checkpoint) {
  std::size_t plans = 0;
  for (const CheckpointSection& section : checkpoint.sections) plans += section.plans.size();
  return plans;
}

std::string table_text(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::ostringstream out;
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) {
      out << (i ? "  " : "") << std::left << std::setw(i + 1 < row.size() ? int(widths[i]) : 0) << row[i];
    }
    out << '\n';
  }
  return out.str();
}

}  // namespace

std::string summary(const Checkpoint& checkpoint) {
  std::ostringstream out;
  out << checkpoint.size() << " entries for " << checkpoint.sections.size() << " device/cuDNN origin(s); file format "
      << checkpoint.header.format_version << ", written with "
      << version_text(checkpoint.header.cudnn_version, checkpoint.header.cuda_runtime_version) << "; "
      << stored_plans(checkpoint) << " stored plans; " << checkpoint.pending() << " pending keys";
  return out.str();
}

std::string entry_table(const Checkpoint& checkpoint) {
  std::vector<std::vector<std::string>> rows = {{"direction", "input", "weight", "output", "convolution", "dtype",
                                                 "layout", "api", "best", "time_ms", "workspace", "device"}};
  for (const CheckpointSection& section : checkpoint.sections) {
    std::ostringstream origin;
    origin << section.origin;
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      for (const auto& [key, ranking] : section.entries<Traits>()) {
        const auto& best = ranking.front();
        std::ostringstream time;
        time << std::fixed << std::setprecision(4) << best.time_ms;
        rows.push_back({to_string(Traits::direction), sizes_text(key.input.dims, key.input.nb_dims),
                        sizes_text(key.weight.dims, key.weight.nb_dims),
                        sizes_text(key.output.dims, key.output.nb_dims), convolution_text(key.convolution),
                        data_type_name(key.input.data_type), layout_name(key.input), api_name<Traits>(),
                        best.succeeded() ? Traits::describe(best) : "(none succeeded)",
                        best.succeeded() ? time.str() : "-", bytes_text(best.workspace_bytes), origin.str()});
      }
    });
  }
  return table_text(rows) + summary(checkpoint) + '\n';
}

std::string statistics(const Checkpoint& checkpoint) {
  std::ostringstream out;
  out << summary(checkpoint) << '\n';
  for (const CheckpointSection& section : checkpoint.sections) {
    out << section.origin << ":";
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      out << ' ' << cache_name<Traits>() << ' ' << section.entries<Traits>().size() << ',';
    });
    std::uint64_t plan_bytes = 0;
    for (const auto& [key, plan] : section.plans) plan_bytes += plan->bytes.size();
    out << " stored plans " << section.plans.size() << " (" << bytes_text(plan_bytes) << "), pending keys "
        << section.pending_graph.size() << " graph, " << section.pending_legacy.size() << " legacy\n";
  }
  return out.str();
}

CheckpointDiff diff(const Checkpoint& first, const Checkpoint& second) {
  std::map<Origin, const CheckpointSection*> seconds;
  for (const CheckpointSection& section : second.sections) seconds[section.origin] = &section;
  const CheckpointSection empty;
  CheckpointDiff result;
  auto compare = [&](const CheckpointSection& a, const CheckpointSection& b, const Origin& origin) {
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      const auto& xs = a.entries<Traits>();
      const auto& ys = b.entries<Traits>();
      std::size_t i = 0, j = 0;  // both sorted by key
      while (i < xs.size() || j < ys.size()) {
        if (j == ys.size() || (i < xs.size() && xs[i].first < ys[j].first)) {
          result.only_first.push_back({origin, cache_name<Traits>(), xs[i].first, best_text(xs[i].second), "-"});
          ++i;
        } else if (i == xs.size() || ys[j].first < xs[i].first) {
          result.only_second.push_back({origin, cache_name<Traits>(), ys[j].first, "-", best_text(ys[j].second)});
          ++j;
        } else {
          if (xs[i].second.front().same_choice(ys[j].second.front())) {
            ++result.same;
          } else {
            result.different_best.push_back(
                {origin, cache_name<Traits>(), xs[i].first, best_text(xs[i].second), best_text(ys[j].second)});
          }
          ++i;
          ++j;
        }
      }
    });
  };
  for (const CheckpointSection& section : first.sections) {
    const auto found = seconds.find(section.origin);
    compare(section, found == seconds.end() ? empty : *found->second, section.origin);
    if (found != seconds.end()) seconds.erase(found);
  }
  for (const auto& [origin, section] : seconds) compare(empty, *section, origin);
  return result;
}

MergeResult merge(const std::vector<Checkpoint>& checkpoints) {
  CacheStore store;
  MergeResult result;
  for (const Checkpoint& checkpoint : checkpoints) {
    for (const CheckpointSection& section : checkpoint.sections) {
      DirectionCaches& caches = store.caches(section.origin);
      for_each_cache([&](auto traits) {
        using Traits = decltype(traits);
        for (const auto& [key, ranking] : section.entries<Traits>()) {
          const auto existing = caches.get<Traits>().find(key);
          if (existing && !existing->front().same_choice(ranking.front())) {
            result.conflicts.push_back(
                {section.origin, cache_name<Traits>(), key, best_text(*existing), best_text(ranking)});
          }
        }
      });
    }
    merge_into(store, checkpoint);
  }
  result.merged = snapshot(store);
  return result;
}

std::vector<std::string> difference_lines(const std::vector<EntryDifference>& differences) {
  std::vector<std::string> lines;
  for (const EntryDifference& d : differences) {
    lines.push_back(detail::concat(d.cache, " on ", d.origin, ": ", d.key, ": ", d.first, " | ", d.second));
  }
  return lines;
}

std::vector<std::string> merge_files(const std::vector<std::string>& inputs, const std::string& output) {
  CUDNN_CACHE_REQUIRE(!inputs.empty(), "merge: give at least one input file");
  std::vector<Checkpoint> checkpoints;
  for (const std::string& input : inputs) checkpoints.push_back(read_checkpoint(input));
  const MergeResult result = merge(checkpoints);
  write_file_atomically(output, serialize(result.merged));
  return difference_lines(result.conflicts);
}

void import_json_file(const std::string& json_path, const std::string& output) {
  const Checkpoint imported = from_json(read_file(json_path), json_path);
  write_file_atomically(output, serialize(merge({imported}).merged));
}

}  // namespace cudnn_cache
