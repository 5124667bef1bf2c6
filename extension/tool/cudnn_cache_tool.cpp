// cudnn_cache_tool: check, list and make cache files from the command line.

#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/synthetic.h"

namespace {

using namespace cudnn_cache;

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;

const char* const kUsageText =
    "usage: cudnn_cache_tool <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  validate FILE                      check FILE; prints a summary, or the reason it is invalid on stderr\n"
    "  inspect FILE                       print a table of every entry in FILE\n"
    "  synth FILE --entries N [--seed S]  write a valid file of N synthetic entries (for tests and benchmarks)\n"
    "\n"
    "exit codes: 0 success, 1 invalid file or failed command, 2 usage error\n";

int usage_error(const std::string& message) {
  std::cerr << "cudnn_cache_tool: " << message << "\n\n" << kUsageText;
  return kUsage;
}

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

std::size_t stored_plans(const Checkpoint& checkpoint) {
  std::size_t plans = 0;
  for (const CheckpointSection& section : checkpoint.sections) plans += section.plans.size();
  return plans;
}

int validate(const std::string& path) {
  const Checkpoint checkpoint = read_checkpoint(path);
  std::cout << path << ": valid, " << checkpoint.size() << " entries for " << checkpoint.sections.size()
            << " device/cuDNN origin(s); file format " << checkpoint.header.format_version << ", written with "
            << version_text(checkpoint.header.cudnn_version, checkpoint.header.cuda_runtime_version) << "; "
            << stored_plans(checkpoint) << " stored plans\n";
  return kOk;
}

int inspect(const std::string& path) {
  const Checkpoint checkpoint = read_checkpoint(path);
  std::vector<std::vector<std::string>> rows = {{"direction", "input", "weight", "output", "convolution", "dtype",
                                                 "layout", "api", "best", "time_ms", "workspace", "device"}};
  for (const CheckpointSection& section : checkpoint.sections) {
    std::ostringstream origin;
    origin << section.origin;
    for_each_cache([&](auto traits) {
      using Traits = decltype(traits);
      const char* api = std::is_same_v<typename Traits::Candidate, EngineCandidate> ? "graph" : "legacy";
      for (const auto& [key, ranking] : section.entries<Traits>()) {
        const auto& best = ranking.front();
        std::ostringstream time;
        time << std::fixed << std::setprecision(4) << best.time_ms;
        rows.push_back({to_string(Traits::direction), sizes_text(key.input.dims, key.input.nb_dims),
                        sizes_text(key.weight.dims, key.weight.nb_dims),
                        sizes_text(key.output.dims, key.output.nb_dims), convolution_text(key.convolution),
                        data_type_name(key.input.data_type), layout_name(key.input), api,
                        best.succeeded() ? Traits::describe(best) : "(none succeeded)",
                        best.succeeded() ? time.str() : "-", bytes_text(best.workspace_bytes), origin.str()});
      }
    });
  }
  std::vector<std::size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) {
      std::cout << (i ? "  " : "") << std::left << std::setw(i + 1 < row.size() ? int(widths[i]) : 0) << row[i];
    }
    std::cout << '\n';
  }
  std::cout << checkpoint.size() << " entries; file format " << checkpoint.header.format_version << ", written with "
            << version_text(checkpoint.header.cudnn_version, checkpoint.header.cuda_runtime_version) << "; "
            << stored_plans(checkpoint) << " stored plans\n";
  return kOk;
}

bool parse_count(const std::string& text, std::uint64_t& value) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 18) return false;
  value = std::stoull(text);
  return true;
}

int synth(const std::vector<std::string>& args) {
  std::string path;
  std::uint64_t entries = 0, seed = 1;
  bool have_entries = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--entries" || arg == "--seed") {
      if (i + 1 == args.size()) return usage_error(arg + " needs a value");
      std::uint64_t& target = arg == "--entries" ? entries : seed;
      if (!parse_count(args[++i], target)) return usage_error(arg + " takes a non-negative integer, not '" + args[i] + "'");
      have_entries |= arg == "--entries";
    } else if (path.empty() && arg.rfind("--", 0) != 0) {
      path = arg;
    } else {
      return usage_error("unexpected argument '" + arg + "' for synth");
    }
  }
  if (path.empty() || !have_entries) return usage_error("synth needs FILE and --entries N");
  CacheStore store;
  add_synthetic_entries(store, synthetic_origin(), entries, seed);
  save(store, path);
  std::cout << path << ": wrote " << store.size() << " synthetic entries\n";
  return kOk;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) return usage_error("no command given");
  const std::string& command = args[0];
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsageText;
    return kOk;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "validate" || command == "inspect") {
    if (rest.size() != 1) return usage_error(command + " takes exactly one FILE");
    return command == "validate" ? validate(rest[0]) : inspect(rest[0]);
  }
  if (command == "synth") return synth(rest);
  return usage_error("unknown command '" + command + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {  // one line, whatever the bytes: Error, cereal::Exception, bad_alloc...
    std::string message = e.what();
    for (char& c : message) {
      if (c == '\n') c = ' ';
    }
    std::cerr << "cudnn_cache_tool: " << message << '\n';
    return kFailed;
  }
}
