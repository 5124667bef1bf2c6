// cudnn_cache_tool: check, list and make cache files from the command line.

#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/report.h"
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

int validate(const std::string& path) {
  std::cout << path << ": valid, " << summary(read_checkpoint(path)) << '\n';
  return kOk;
}

int inspect(const std::string& path) {
  std::cout << entry_table(read_checkpoint(path));
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
      if (!parse_count(args[++i], target)) {
        return usage_error(arg + " takes a non-negative integer, not '" + args[i] + "'");
      }
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
  SaveOptions replace;
  replace.merge = false;  // synth writes exactly these entries
  save(store, path, replace);
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
