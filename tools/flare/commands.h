// The subcommands of the `flare` tool, one source file each. Each takes the arguments after
// `flare` (argv[0] is the subcommand's name), prints to stdout and returns the exit code;
// errors are thrown (flare::Error -> exit 1, cli::UsageError -> exit 2) and reported by main.
#pragma once

namespace flare::cli {

int run_attention(int argc, char** argv);  // attention_command.cpp
int run_bench(int argc, char** argv);      // bench_command.cpp
int run_info(int argc, char** argv);       // info_command.cpp
int run_generate(int argc, char** argv);   // generate_command.cpp

}  // namespace flare::cli
