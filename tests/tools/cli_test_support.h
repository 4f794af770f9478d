// Support for the tests of the `flare` tool: a scratch directory removed after the test, raw
// file access for crafting .npy bytes, and running the built CLI binary with its exit code
// and output captured (stderr into a file, or from a terminal for what only terminals see).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

// Runs the `flare` binary with stderr on a pseudo-terminal (stdout into a file of `scratch`),
// for output the tool draws on terminals only. `err` holds what the terminal received, with
// its line discipline's "\r\n" for each newline.
inline CliResult run_cli_on_terminal(const std::vector<std::string>& args,
                                     const ScratchDir& scratch) {
  const std::string cli = FLARE_CLI_PATH;
  const std::string out_path = scratch.file("cli_stdout.txt");
  const int terminal = posix_openpt(O_RDWR | O_NOCTTY);
  if (terminal < 0 || grantpt(terminal) != 0 || unlockpt(terminal) != 0) {
    ADD_FAILURE() << "no pseudo-terminal: " << std::strerror(errno);
    return {};
  }
  // Opened before the fork: reading the terminal side fails (EIO) while no process has it open.
  const int stderr_side = open(ptsname(terminal), O_RDWR | O_NOCTTY);
  std::vector<std::string> argv_text = {cli};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_text) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(stderr_side, STDERR_FILENO);
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  close(stderr_side);
  CliResult result;
  char buffer[4096];
  // Read until the child (the last holder of the other side) exits: then read fails with EIO.
  for (ssize_t got; (got = read(terminal, buffer, sizeof(buffer))) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    result.err.append(buffer, static_cast<size_t>(got));
  }
  close(terminal);
  int status = 0;
  waitpid(child, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_file_bytes(out_path);
  return result;
}

}  // namespace flare::testing
