// Argument parsing for the flare subcommands (see args.h).
#include "tools/flare/args.h"

#include <charconv>
#include <cmath>
#include <system_error>

#include "flare/core/error.h"

namespace flare::cli {

Args::Args(std::string command, int argc, char** argv, std::initializer_list<OptionSpec> options)
    : command_(std::move(command)), specs_(options) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (!arg.starts_with("--") || arg.size() == 2) {
      usage_error("unexpected argument '" + std::string(arg) + "' (options start with --)");
    }
    arg.remove_prefix(2);
    std::optional<std::string_view> inline_value;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const OptionSpec& spec = spec_of(arg);
    if (values_.contains(arg)) usage_error("--" + std::string(arg) + " is given twice");
    std::string value;
    if (spec.takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else {
        if (i + 1 >= argc) usage_error("--" + std::string(arg) + " needs a value");
        value = argv[++i];
      }
    } else if (inline_value) {
      usage_error("--" + std::string(arg) + " is a switch and takes no value");
    }
    values_.emplace(std::string(arg), std::move(value));
  }
}

const OptionSpec& Args::spec_of(std::string_view name) const {
  for (const OptionSpec& spec : specs_) {
    if (spec.name == name) return spec;
  }
  usage_error("unknown option --" + std::string(name));
}

bool Args::has(std::string_view name) const { return values_.contains(name); }

std::optional<std::string> Args::text(std::string_view name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::text_or(std::string_view name, std::string_view fallback) const {
  return text(name).value_or(std::string(fallback));
}

std::string Args::required(std::string_view name) const {
  std::optional<std::string> value = text(name);
  if (!value) usage_error("missing --" + std::string(name));
  return *value;
}

int64_t Args::integer_or(std::string_view name, int64_t fallback, int64_t min_value) const {
  const std::optional<std::string> value = text(name);
  if (!value) return fallback;
  int64_t parsed = 0;
  const char* end = value->data() + value->size();
  const auto [ptr, error] = std::from_chars(value->data(), end, parsed);
  if (error != std::errc() || ptr != end) {
    usage_error("--" + std::string(name) + " expects an integer, got '" + *value + "'");
  }
  if (parsed < min_value) {
    usage_error("--" + std::string(name) + " must be >= " + std::to_string(min_value) + ", got " +
                *value);
  }
  return parsed;
}

double Args::number_or(std::string_view name, double fallback) const {
  const std::optional<std::string> value = text(name);
  if (!value) return fallback;
  double parsed = 0;
  const char* end = value->data() + value->size();
  const auto [ptr, error] = std::from_chars(value->data(), end, parsed);
  if (error != std::errc() || ptr != end || !std::isfinite(parsed)) {
    usage_error("--" + std::string(name) + " expects a finite number, got '" + *value + "'");
  }
  return parsed;
}

std::string Args::choice_or(std::string_view name, std::initializer_list<std::string_view> choices,
                            std::string_view fallback) const {
  const std::string value = text_or(name, fallback);
  std::string listed;
  for (std::string_view choice : choices) {
    if (choice == value) return value;
    if (!listed.empty()) listed += '|';
    listed += choice;
  }
  usage_error("--" + std::string(name) + " must be one of " + listed + ", got '" + value + "'");
}

Device Args::device_or(std::string_view name, std::string_view fallback) const {
  const std::string value = text_or(name, fallback);
  try {
    return parse_device(value);
  } catch (const Error&) {
    usage_error("--" + std::string(name) + " must be cpu, cuda or cuda:N, got '" + value + "'");
  }
}

void Args::usage_error(const std::string& message) const { throw UsageError(command_, message); }

}  // namespace flare::cli
