// cudnn_cache_tool: check, list and make cache files from the command line.

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/graph.h"
#include "cudnn_cache/report.h"
#include "cudnn_cache/synthetic.h"

namespace {

using namespace cudnn_cache;

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;
constexpr std::uint64_t kMaxSeed = 999'999'999'999'999'999ULL;  // 18 digits: parsed without overflow

// One command: its arguments as the usage line shows them, what it does, and the function that runs it.
struct Command {
  const char* name;
  const char* arguments;
  std::string description;
  int (*run)(const std::vector<std::string>& args);
};

int validate(const std::vector<std::string>& args);
int inspect(const std::vector<std::string>& args);
int synth(const std::vector<std::string>& args);
int build_plans(const std::vector<std::string>& args);

const Command kCommands[] = {
    {"validate", "FILE", "check FILE; prints a summary, or the reason it is invalid on stderr", &validate},
    {"inspect", "FILE", "print a table of every entry in FILE", &inspect},
    {"synth", "FILE --entries N [--seed S]",
     "write a valid file of N synthetic entries (for tests and benchmarks; N at most " +
         std::to_string(kMaxSyntheticEntries) + "), replacing FILE",
     &synth},
    {"build-plans", "--device-pci-bus-id ID",
     "a builder process: build plans for a search of the process that started it, on the GPU of PCI bus id ID, "
     "served on its fd 3 (a socket); started by cudnn_cache itself (tuning option build_processes)",
     &build_plans},
};

const char* const kExitCodes = "exit codes: 0 success, 1 invalid file or failed command, 2 usage error\n";

std::string usage_text() {
  std::string text =
      "usage: cudnn_cache_tool <command> [arguments]\n       cudnn_cache_tool <command> --help\n\n"
      "commands:\n";
  for (const Command& command : kCommands) {
    const std::string synopsis = std::string(command.name) + " " + command.arguments;
    text += "  " + synopsis + std::string(synopsis.size() < 35 ? 35 - synopsis.size() : 1, ' ') + command.description +
            "\n";
  }
  return text + "\n" + kExitCodes;
}

std::string command_help(const Command& command) {
  return std::string("usage: cudnn_cache_tool ") + command.name + " " + command.arguments + "\n\n" +
         command.description + "\n\n" + kExitCodes;
}

// A usage error is one line on stderr: what was wrong, and where the usage is.
int usage_error(const std::string& message, const std::string& help = "cudnn_cache_tool --help") {
  std::cerr << "cudnn_cache_tool: " << message << " (see " << help << ")\n";
  return kUsage;
}

bool is_help(const std::string& arg) { return arg == "-h" || arg == "--help"; }

// The one FILE of validate and inspect; anything else is a usage error. Options are refused rather than read as
// file names (a file whose name starts with '-' is reached as ./-name).
bool single_file(const std::string& command, const std::vector<std::string>& args, int& status) {
  const std::string help = "cudnn_cache_tool " + command + " --help";
  if (args.size() != 1) {
    status = usage_error(command + " takes exactly one FILE", help);
    return false;
  }
  if (args[0].size() > 1 && args[0][0] == '-') {
    status = usage_error("unknown option '" + args[0] + "' for " + command, help);
    return false;
  }
  return true;
}

int validate(const std::vector<std::string>& args) {
  int status = kOk;
  if (!single_file("validate", args, status)) return status;
  const std::string text = summary(read_checkpoint(args[0]));  // throws before anything is printed
  std::cout << args[0] << ": valid, " << text << '\n';
  return kOk;
}

int inspect(const std::vector<std::string>& args) {
  int status = kOk;
  if (!single_file("inspect", args, status)) return status;
  std::cout << entry_table(read_checkpoint(args[0]));
  return kOk;
}

// A count of decimal digits only, at most `limit` (itself at most kMaxSeed).
bool parse_count(const std::string& text, std::uint64_t limit, std::uint64_t& value) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) return false;
  value = std::stoull(text);
  return value <= limit;
}

int synth(const std::vector<std::string>& args) {
  const std::string help = "cudnn_cache_tool synth --help";
  std::string path;
  std::uint64_t entries = 0, seed = 1;
  bool have_entries = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--entries" || arg == "--seed") {
      if (i + 1 == args.size()) return usage_error(arg + " needs a value", help);
      const bool is_entries = arg == "--entries";
      const std::uint64_t limit = is_entries ? kMaxSyntheticEntries : kMaxSeed;
      if (!parse_count(args[++i], limit, is_entries ? entries : seed)) {
        return usage_error(arg + " takes an integer from 0 to " + std::to_string(limit) + ", not '" + args[i] + "'",
                           help);
      }
      have_entries |= is_entries;
    } else if (path.empty() && !(arg.size() > 1 && arg[0] == '-')) {
      path = arg;
    } else {
      return usage_error("unexpected argument '" + arg + "' for synth", help);
    }
  }
  if (path.empty() || !have_entries) return usage_error("synth needs FILE and --entries N", help);
  const std::size_t written = write_synthetic_file(path, entries, seed);
  std::cout << path << ": wrote " << written << " synthetic entries\n";
  return kOk;
}

// A builder process exits on its own after this long without a request: its parent closes it sooner (Note
// [Builder processes]); this is for a parent that stopped without closing its socket.
constexpr std::chrono::seconds kBuilderIdle{60};
constexpr int kBuilderSocket = 3;

int build_plans(const std::vector<std::string>& args) {
  const std::string help = "cudnn_cache_tool build-plans --help";
  if (args.size() != 2 || args[0] != "--device-pci-bus-id" || args[1].empty() || args[1][0] == '-') {
    return usage_error("build-plans takes exactly --device-pci-bus-id ID", help);
  }
  struct stat socket_stat {};
  if (fstat(kBuilderSocket, &socket_stat) != 0 || !S_ISSOCK(socket_stat.st_mode)) {
    return usage_error("build-plans serves the process that starts it on fd 3, which is not a socket here: "
                       "cudnn_cache starts it (tuning option build_processes), not a shell",
                       help);
  }
  return run_plan_builder(kBuilderSocket, args[1], kBuilderIdle);
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) return usage_error("no command given");
  const std::string& name = args[0];
  if (is_help(name) || name == "help") {
    if (name == "help" && args.size() > 1) return run({args[1], "--help"});
    std::cout << usage_text();
    return kOk;
  }
  for (const Command& command : kCommands) {
    if (name != command.name) continue;
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const std::string& arg : rest) {
      if (is_help(arg)) {
        std::cout << command_help(command);
        return kOk;
      }
    }
    return command.run(rest);
  }
  return usage_error("unknown command '" + name + "'");
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
