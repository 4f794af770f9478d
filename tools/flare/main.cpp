// `flare`: the command-line front end of the engine. Dispatches to one subcommand and turns
// errors into messages and exit codes (flare::Error: 1, usage errors: 2).
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "flare/core/error.h"
#include "tools/flare/args.h"
#include "tools/flare/commands.h"
#include "tools/flare/plan_latency.h"

namespace {

struct Command {
  std::string_view name;
  int (*run)(int argc, char** argv);
  std::string_view summary;
};

constexpr Command kCommands[] = {
    {"attention", flare::cli::run_attention,
     "batch attention on tensors from .npy files; writes o.npy and lse.npy"},
    {"bench", flare::cli::run_bench, "benchmark a synthetic serving workload (decode or prefill)"},
    {"generate", flare::cli::run_generate,
     "greedy decoding of a Llama preset (random weights) on the whole-model megakernel"},
    {"info", flare::cli::run_info, "version, CUDA devices, JIT cache location, CPU threads"},
    {"plan-latency", run_plan_latency, "time the host planner on serving-sized batches"},
};

void print_usage(std::FILE* stream) {
  std::fprintf(stream,
               "flare %s: a C++/CUDA attention engine for LLM serving\n\n"
               "usage: flare <command> [options]\n\ncommands:\n",
               FLARE_VERSION);
  for (const Command& command : kCommands) {
    std::fprintf(stream, "  %-13s %.*s\n", command.name.data(),
                 static_cast<int>(command.summary.size()), command.summary.data());
  }
  std::fprintf(stream, "\n'flare <command> --help' describes a command's options.\n");
}

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "--version") {
    std::printf("flare %s\n", FLARE_VERSION);
    return 0;
  }
  for (const Command& command : kCommands) {
    if (command.name == name) return command.run(argc - 1, argv + 1);
  }
  throw flare::cli::UsageError("", "unknown command '" + std::string(name) + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const flare::cli::UsageError& error) {
    const std::string& command = error.command();
    std::fprintf(stderr, "flare%s%s: usage error: %s\nTry 'flare%s%s --help'.\n",
                 command.empty() ? "" : " ", command.c_str(), error.what(),
                 command.empty() ? "" : " ", command.c_str());
    return 2;
  } catch (const flare::Error& error) {
    std::fprintf(stderr, "flare: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    // Anything else is a bug or the system running out of something; still a clean exit.
    std::fprintf(stderr, "flare: error: %s\n", error.what());
    return 1;
  }
}
