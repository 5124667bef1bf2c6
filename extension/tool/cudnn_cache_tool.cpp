// cudnn_cache_tool: the file commands of python -m cudnn_cache, for machines without Python (LibTorch only).
// Same commands, options, output, messages and exit codes; tests/python/test_command_lines.py runs one table
// of cases through both and compares them. Help texts are each command line's own.

#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cudnn_cache/atomic_file.h"
#include "cudnn_cache/checkpoint.h"
#include "cudnn_cache/error.h"
#include "cudnn_cache/report.h"
#include "cudnn_cache/synthetic.h"

namespace {

using namespace cudnn_cache;

// python -m cudnn_cache's exit codes (EXIT_* in torch_ops/cudnn_cache/__main__.py).
constexpr int kOk = 0;
constexpr int kDifferent = 1;  // diff: the files differ
constexpr int kUsage = 2;
constexpr int kBadFile = 3;  // a file that cannot be read, is invalid, or cannot be written
constexpr std::uint64_t kMaxSeed = 999'999'999'999'999'999ULL;  // 18 digits: parsed without overflow
const std::string kProgram = "cudnn_cache_tool";

// A command's options, as python -m cudnn_cache's parser declares them: a flag, or an option taking a value.
struct Option {
  const char* name;        // "--output"
  const char* short_name;  // "-o", or ""
  bool takes_value;
  bool required;
};

// What a command line gave: its positional arguments, and each option given (a flag's value is "").
struct Arguments {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;

  bool has(const std::string& name) const { return options.count(name) > 0; }
  const std::string& operator[](const std::string& name) const { return options.at(name); }
};

// A usage error, in python -m cudnn_cache's words and form (argparse's, on one line).
struct UsageError {
  std::string message;
  bool of_the_tool = false;  // argparse reports unrecognized arguments as the whole command line's, not a command's
};

struct Command {
  const char* name;
  std::vector<const char*> positionals;  // names as argparse would list them; a last "name..." takes one or more
  std::vector<Option> options;
  const char* synopsis;
  const char* description;
  int (*run)(const Arguments& args);
};

std::string option_label(const Option& option) {
  return std::string(*option.short_name ? std::string(option.short_name) + "/" : "") + option.name;
}

// A positional argument named "name..." takes one or more values.
bool many(std::string_view positional) {
  return positional.size() > 3 && positional.substr(positional.size() - 3) == "...";
}

std::string positional_label(std::string_view positional) {
  return std::string(many(positional) ? positional.substr(0, positional.size() - 3) : positional);
}

// What argparse reads as a value, not an option, where no option looks like a number: "x", "-", "-1", "-2.5".
bool is_value(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-') return true;
  const std::string rest = arg.substr(1);
  return rest.find_first_not_of("0123456789.") == std::string::npos &&
         rest.find_first_of("0123456789") != std::string::npos;
}

// Reads args as argparse reads them for this command: options anywhere, "--" ends them; a value may follow as the
// next argument or after '='.
Arguments parse(const Command& command, const std::vector<std::string>& args) {
  Arguments parsed;
  std::vector<std::string> unrecognized;
  bool options_ended = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (options_ended || is_value(arg)) {
      parsed.positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      options_ended = true;
      continue;
    }
    const std::size_t equals = arg.find('=');
    const std::string name = arg.substr(0, equals);
    const Option* option = nullptr;
    for (const Option& candidate : command.options) {
      if (name == candidate.name || (*candidate.short_name && name == candidate.short_name)) option = &candidate;
    }
    if (!option) {
      unrecognized.push_back(arg);
      continue;
    }
    if (!option->takes_value) {
      if (equals != std::string::npos) {
        throw UsageError{"argument " + option_label(*option) + ": ignored explicit argument '" +
                         arg.substr(equals + 1) + "'"};
      }
      parsed.options[option->name] = "";
    } else if (equals != std::string::npos) {
      parsed.options[option->name] = arg.substr(equals + 1);
    } else if (i + 1 < args.size() && is_value(args[i + 1])) {
      parsed.options[option->name] = args[++i];
    } else {
      throw UsageError{"argument " + option_label(*option) + ": expected one argument"};
    }
  }
  std::vector<std::string> missing;
  const std::size_t wanted = command.positionals.size();
  const bool takes_many = wanted > 0 && many(command.positionals.back());
  for (std::size_t p = parsed.positional.size(); p < wanted; ++p)
    missing.push_back(positional_label(command.positionals[p]));
  for (const Option& option : command.options) {
    if (option.required && !parsed.has(option.name)) missing.push_back(option_label(option));
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& name : missing) list += (list.empty() ? "" : ", ") + name;
    throw UsageError{"the following arguments are required: " + list};
  }
  if (!takes_many) {
    for (std::size_t p = wanted; p < parsed.positional.size(); ++p) unrecognized.push_back(parsed.positional[p]);
  }
  if (!unrecognized.empty()) {
    std::string list;
    for (const std::string& arg : unrecognized) list += (list.empty() ? "" : " ") + arg;
    throw UsageError{"unrecognized arguments: " + list, true};
  }
  return parsed;
}

// A count of decimal digits only, at most `limit`: python -m cudnn_cache's _count.
std::uint64_t count(const Arguments& args, const std::string& name, std::uint64_t limit, std::uint64_t otherwise) {
  if (!args.has(name)) return otherwise;
  const std::string& text = args[name];
  const bool digits = !text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos;
  const std::uint64_t value = digits ? std::stoull(text) : 0;
  if (!digits || value > limit) {
    throw UsageError{"argument " + name + ": takes an integer from 0 to " + std::to_string(limit) + ", not '" + text +
                     "'"};
  }
  return value;
}

// The first line of an error's text, as python -m cudnn_cache prints it.
std::string reason(const std::exception& e) {
  const std::string text = e.what();
  return text.substr(0, text.find('\n'));
}

int inspect(const Arguments& args) {
  std::cout << entry_table(read_checkpoint(args.positional[0]));
  return kOk;
}

// Each file's verdict as it is read: a valid one on stdout, an invalid one on stderr, and the others still checked.
int validate(const Arguments& args) {
  int status = kOk;
  for (const std::string& path : args.positional) {
    try {
      const std::string text = summary(read_checkpoint(path));
      std::cout << path << ": valid, " << text << std::endl;
    } catch (const std::exception& e) {
      std::cerr << path << ": invalid: " << reason(e) << std::endl;
      status = kBadFile;
    }
  }
  return status;
}

int stats(const Arguments& args) {
  std::cout << statistics(read_checkpoint(args.positional[0]));
  return kOk;
}

int diff_files(const Arguments& args) {
  const std::string& first = args.positional[0];
  const std::string& second = args.positional[1];
  const CheckpointDiff result = diff(read_checkpoint(first), read_checkpoint(second));
  for (const auto& [marker, differences] : {std::pair{"<", &result.only_first}, std::pair{">", &result.only_second},
                                            std::pair{"!", &result.different_best}}) {
    for (const std::string& line : difference_lines(*differences)) std::cout << marker << ' ' << line << '\n';
  }
  std::cout << result.only_first.size() << " only in " << first << ", " << result.only_second.size() << " only in "
            << second << ", " << result.different_best.size() << " with another best, " << result.same << " the same\n";
  return result.identical() ? kOk : kDifferent;
}

int merge(const Arguments& args) {
  const std::string& output = args["--output"];
  const std::vector<std::string> conflicts = merge_files(args.positional, output);
  for (const std::string& line : conflicts) std::cout << "conflict: " << line << '\n';
  std::cout << output << ": wrote " << summary(read_checkpoint(output)) << "; " << conflicts.size()
            << " conflicts (the faster best was kept, the other as runner-up)\n";
  return kOk;
}

int export_json(const Arguments& args) {
  const std::string text = to_json(read_checkpoint(args.positional[0]));
  if (args.has("--output")) {
    write_file_atomically(args["--output"], text);
  } else {
    std::cout << text;
  }
  return kOk;
}

int import_json(const Arguments& args) {
  const std::string& output = args["--output"];
  import_json_file(args.positional[0], output);
  std::cout << output << ": wrote " << summary(read_checkpoint(output)) << '\n';
  return kOk;
}

int synth(const Arguments& args) {
  const std::uint64_t entries = count(args, "--entries", kMaxSyntheticEntries, 0);
  const std::uint64_t seed = count(args, "--seed", kMaxSeed, 1);
  const std::size_t written = write_synthetic_file(args.positional[0], entries, seed);
  std::cout << args.positional[0] << ": wrote " << written << " synthetic entries\n";
  return kOk;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"inspect", {"file"}, {}, "FILE", "a table of every entry", &inspect},
      {"validate", {"file..."}, {}, "FILE [FILE ...]", "check files; a summary of each", &validate},
      {"stats", {"file"}, {}, "FILE", "entries per origin and cache, and stored plans", &stats},
      {"diff",
       {"first", "second"},
       {},
       "FIRST SECOND",
       "entries only in one file, and entries with another best",
       &diff_files},
      {"merge",
       {"input..."},
       {{"--output", "-o", true, true}},
       "INPUT [INPUT ...] -o OUTPUT",
       "merge files into one; conflicts are reported",
       &merge},
      {"export",
       {"file"},
       {{"--json", "", false, true}, {"--output", "-o", true, false}},
       "FILE --json [-o OUTPUT]",
       "a cache file as JSON (default: on stdout)",
       &export_json},
      {"import",
       {"JSON"},
       {{"--json", "", false, false}, {"--output", "-o", true, true}},
       "JSON [--json] -o OUTPUT",
       "a cache file from a JSON export",
       &import_json},
      {"synth",
       {"file"},
       {{"--entries", "", true, true}, {"--seed", "", true, false}},
       "FILE --entries N [--seed S]",
       "a file of synthetic entries, for tests and benchmarks (N at most 100000; the same seed, the same entries)",
       &synth},
  };
  return all;
}

const char* const kExitCodes =
    "exit codes: 0 success (diff: the same entries and bests), 1 diff found differences, 2 usage error, 3 a file "
    "that cannot be read, is invalid or cannot be written\n";

std::string usage_text() {
  std::string text =
      "usage: " + kProgram + " COMMAND [arguments]\n       " + kProgram + " COMMAND --help\n\ncommands:\n";
  for (const Command& command : commands()) {
    const std::string synopsis = std::string(command.name) + " " + command.synopsis;
    text += "  " + synopsis + std::string(synopsis.size() < 40 ? 40 - synopsis.size() : 1, ' ') + command.description +
            "\n";
  }
  return text + "\n" + kExitCodes;
}

std::string command_help(const Command& command) {
  return "usage: " + kProgram + " " + command.name + " " + command.synopsis + "\n\n" + command.description + "\n\n" +
         kExitCodes;
}

bool is_help(const std::string& arg) { return arg == "-h" || arg == "--help"; }

// One line on stderr, as python -m cudnn_cache's parser writes it.
int usage_error(const std::string& prog, const std::string& message) {
  std::cerr << prog << ": " << message << " (see " << prog << " --help)\n";
  return kUsage;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) return usage_error(kProgram, "the following arguments are required: COMMAND");
  const std::string& name = args[0];
  if (is_help(name) || name == "help") {
    if (name == "help" && args.size() > 1) return run({args[1], "--help"});
    std::cout << usage_text();
    return kOk;
  }
  for (const Command& command : commands()) {
    if (name != command.name) continue;
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const std::string& arg : rest) {
      if (arg == "--") break;
      if (is_help(arg)) {
        std::cout << command_help(command);
        return kOk;
      }
    }
    const std::string prog = kProgram + " " + command.name;
    try {
      return command.run(parse(command, rest));
    } catch (const UsageError& e) {
      return usage_error(e.of_the_tool ? kProgram : prog, e.message);
    } catch (const std::exception& e) {  // Error, cereal::Exception, bad_alloc...: one line naming the command
      std::cerr << prog << ": " << reason(e) << '\n';
      return kBadFile;
    }
  }
  std::string choices;
  for (const Command& command : commands())
    choices += (choices.empty() ? "'" : ", '") + std::string(command.name) + "'";
  return usage_error(kProgram, "argument COMMAND: invalid choice: '" + name + "' (choose from " + choices + ")");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << kProgram << ": " << reason(e) << '\n';
    return kBadFile;
  }
}
