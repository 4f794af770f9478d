// Argument parsing shared by the flare subcommands: every option is declared up front, so an
// unknown, repeated or malformed argument is a UsageError (exit code 2) rather than a guess.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flare/core/tensor.h"

namespace flare::cli {

// A command line that does not parse; main() prints it with a hint and exits with 2.
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& command, const std::string& message)
      : std::runtime_error(message), command_(command) {}
  const std::string& command() const { return command_; }  // "bench", or "" for `flare`

 private:
  std::string command_;
};

struct OptionSpec {
  std::string_view name;  // without the leading "--"
  bool takes_value;       // "--name VALUE" (or "--name=VALUE") versus a bare switch
};

// The parsed arguments of one subcommand. argv[0] is the subcommand's name; "--help"/"-h"
// is always accepted.
class Args {
 public:
  Args(std::string command, int argc, char** argv, std::initializer_list<OptionSpec> options);

  const std::string& command() const { return command_; }
  bool help() const { return help_; }
  bool has(std::string_view name) const;  // given on the command line (value or switch)

  std::optional<std::string> text(std::string_view name) const;
  std::string text_or(std::string_view name, std::string_view fallback) const;
  // Required value: UsageError "missing --name" when absent.
  std::string required(std::string_view name) const;
  int64_t integer_or(std::string_view name, int64_t fallback, int64_t min_value) const;
  double number_or(std::string_view name, double fallback) const;
  // The value when it is one of `choices`, else a UsageError listing them.
  std::string choice_or(std::string_view name, std::initializer_list<std::string_view> choices,
                        std::string_view fallback) const;
  // cpu, cuda or cuda:N, else a UsageError naming the option and the value.
  Device device_or(std::string_view name, std::string_view fallback) const;

  [[noreturn]] void usage_error(const std::string& message) const;

 private:
  const OptionSpec& spec_of(std::string_view name) const;

  std::string command_;
  std::vector<OptionSpec> specs_;
  std::map<std::string, std::string, std::less<>> values_;  // switches map to ""
  bool help_ = false;
};

}  // namespace flare::cli
