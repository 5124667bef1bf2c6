// cudnn_cache_run_model: runs a TorchScript model from LibTorch, with the cudnn_cache ops linked in and an
// optional cache file loaded first, so a C++ deployment starts at tuned speed.
//
//   cudnn_cache_run_model MODEL.pt [--cache FILE] [--device cpu|cuda] [--input N,C,H,W] [--train-step]
//
// The input is torch::manual_seed(0) then torch::randn(sizes) on the CPU generator, moved to the device, so it
// is the same tensor Python's torch.manual_seed(0); torch.randn(sizes) gives. Prints, one per line:
//   cache_entries=<n>               (with --cache: entries loaded; 0 when the file does not exist yet)
//   output_shape=[...] / output_sum=<6 significant digits>
//   grad_sum=<6 significant digits> (with --train-step: the sum of every parameter's gradient of output.sum())
//   stats hits=<n> misses=<n> tunes=<n> fallbacks=<n> entries=<n>
// Exit status: 0 on success, 1 on any error (message on stderr), 2 on a usage error.
//
// Nothing here references a symbol of libcudnn_cache_ops: the ops are reached through the dispatcher by name,
// and the library registers them when it is loaded. The CMake target links it with --no-as-needed so the
// linker keeps it.

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: cudnn_cache_run_model MODEL.pt [--cache FILE] [--device cpu|cuda] [--input N,C,H,W] [--train-step]\n"
    "  --cache FILE   load this cudnn_cache file first, if it exists\n"
    "  --device D     cpu (default) or cuda\n"
    "  --input SIZES  comma-separated input sizes (default 1,3,224,224)\n"
    "  --train-step   also run backward of output.sum() and print the sum of the parameter gradients\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string model;
  std::string cache;
  std::string device = "cpu";
  std::vector<std::int64_t> input_sizes{1, 3, 224, 224};
  bool train_step = false;
};

std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> sizes;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1) {
      throw UsageError("--input: '" + text + "' is not a list of positive integers such as 1,3,224,224");
    }
    sizes.push_back(value);
  }
  if (sizes.empty()) throw UsageError("--input: no sizes given; pass e.g. 1,3,224,224");
  return sizes;
}

Options parse_arguments(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(argument + " needs a value");
      return argv[++i];
    };
    if (argument == "--cache") {
      options.cache = value();
    } else if (argument == "--device") {
      options.device = value();
      if (options.device != "cpu" && options.device != "cuda") {
        throw UsageError("--device must be cpu or cuda, got '" + options.device + "'");
      }
    } else if (argument == "--input") {
      options.input_sizes = parse_sizes(value());
    } else if (argument == "--train-step") {
      options.train_step = true;
    } else if (argument == "-h" || argument == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (argument.rfind("--", 0) == 0) {
      throw UsageError("unknown option " + argument);
    } else if (options.model.empty()) {
      options.model = argument;
    } else {
      throw UsageError("more than one model given ('" + options.model + "' and '" + argument + "')");
    }
  }
  if (options.model.empty()) throw UsageError("no model given");
  return options;
}

// The cudnn_cache ops, called through the dispatcher by their schema names.
template <typename Signature>
c10::TypedOperatorHandle<Signature> cache_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

std::string significant(double value) {
  std::ostringstream out;
  out << std::setprecision(6) << value;
  return out.str();
}

int run(const Options& options) {
  // Fails here, naming the op, if libcudnn_cache_ops was not linked in after all.
  const auto load = cache_op<std::int64_t(const std::string&)>("cudnn_cache::load");
  const auto stats = cache_op<c10::Dict<std::string, std::int64_t>()>("cudnn_cache::stats");

  if (options.device == "cuda" && !torch::cuda::is_available()) {
    throw std::runtime_error("--device cuda: no CUDA device is available; use --device cpu");
  }
  const torch::Device device(options.device == "cuda" ? torch::kCUDA : torch::kCPU);

  if (!options.cache.empty()) {
    if (std::filesystem::exists(options.cache)) {
      const std::int64_t entries = load.call(options.cache);  // before printing: it may throw
      std::cout << "cache_entries=" << entries << "\n";
    } else {
      std::cout << "cache_entries=0 (" << options.cache << " does not exist; starting with an empty cache)\n";
    }
  }

  if (!std::filesystem::exists(options.model)) {
    throw std::runtime_error("model file '" + options.model + "' does not exist");
  }
  torch::jit::Module module = torch::jit::load(options.model, device);

  at::manual_seed(0);
  const torch::Tensor input = torch::randn(options.input_sizes).to(device);  // CPU generator, as in Python

  std::optional<at::NoGradGuard> no_grad;
  if (!options.train_step) no_grad.emplace();
  const torch::IValue result = module.forward({input});
  if (!result.isTensor()) {
    throw std::runtime_error("the model returned a " + result.tagKind() + ", not a tensor");
  }
  const torch::Tensor output = result.toTensor();
  std::cout << "output_shape=" << output.sizes() << "\n";
  std::cout << "output_sum=" << significant(output.sum().item<double>()) << "\n";

  if (options.train_step) {
    output.sum().backward();
    double grad_sum = 0;
    for (const torch::Tensor& parameter : module.parameters()) {
      if (parameter.grad().defined()) grad_sum += parameter.grad().sum().item<double>();
    }
    std::cout << "grad_sum=" << significant(grad_sum) << "\n";
  }

  const c10::Dict<std::string, std::int64_t> counters = stats.call();
  std::cout << "stats";
  for (const char* name : {"hits", "misses", "tunes", "fallbacks", "entries"}) {
    std::cout << " " << name << "=" << counters.at(name);
  }
  std::cout << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_arguments(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "cudnn_cache_run_model: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "cudnn_cache_run_model: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "cudnn_cache_run_model: " << e.what() << "\n";
    return 1;
  }
}
