// Support for the tests of the `flare` tool: a scratch directory removed after the test, raw
// file access for crafting .npy bytes, and running the built CLI binary with its exit code
// and output captured.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace flare::testing {

// A fresh directory under the system temp directory, deleted with its contents on scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "flare_tools_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs the `flare` binary built beside the tests (FLARE_CLI_PATH) with `args` (each is
// single-quoted for the shell), capturing stdout and stderr into files of `scratch`.
inline CliResult run_cli(const std::vector<std::string>& args, const ScratchDir& scratch) {
  const std::string cli = FLARE_CLI_PATH;
  if (!std::filesystem::exists(cli)) {
    ADD_FAILURE() << "the flare binary " << cli << " is missing: build the flare_cli target";
    return {};
  }
  // Built with append only: GCC 12 at -O3 reports a false -Wrestrict for "literal" + string.
  std::string command;
  const auto append_quoted = [&command](const std::string& text) {
    command += '\'';
    for (char c : text) {
      if (c == '\'') {
        command.append("'\\''");
      } else {
        command += c;
      }
    }
    command += '\'';
  };
  append_quoted(cli);
  for (const std::string& arg : args) {
    command += ' ';
    append_quoted(arg);
  }
  const std::string out_path = scratch.file("cli_stdout.txt");
  const std::string err_path = scratch.file("cli_stderr.txt");
  command.append(" >");
  append_quoted(out_path);
  command.append(" 2>");
  append_quoted(err_path);
  const int status = std::system(command.c_str());
  CliResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_file_bytes(out_path);
  result.err = read_file_bytes(err_path);
  return result;
}

}  // namespace flare::testing
