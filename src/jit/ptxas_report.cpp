// ptxas -v report parser. The report, per kernel (CUDA 12/13 wording):
//   ptxas info    : Compiling entry function 'k' for 'sm_90a'
//   ptxas info    : Function properties for k
//   ptxas         .     1024 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
//   ptxas info    : Used 42 registers, used 1 barriers, 4096 bytes smem, 1024 bytes cumulative
//   stack size
// "Function properties" blocks also appear for non-inlined device functions; only entries
// (named by "Compiling entry function") are reported.
#include "src/jit/ptxas_report.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>

namespace flare::jit {
namespace {

// The integer right before `suffix` in `line` ("... 4096 bytes smem" -> 4096), or -1.
int number_before(std::string_view line, std::string_view suffix) {
  const size_t at = line.find(suffix);
  if (at == std::string_view::npos) return -1;
  size_t begin = at;
  while (begin > 0 && line[begin - 1] == ' ') --begin;
  size_t end = begin;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9') --begin;
  if (begin == end) return -1;
  return std::atoi(std::string(line.substr(begin, end - begin)).c_str());
}

// The text between the first pair of single quotes, or the rest of the line after `prefix`.
std::string_view quoted_or_rest(std::string_view line, std::string_view prefix) {
  std::string_view rest = line.substr(line.find(prefix) + prefix.size());
  if (!rest.empty() && rest.front() == '\'') {
    rest.remove_prefix(1);
    return rest.substr(0, rest.find('\''));
  }
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\r')) rest.remove_suffix(1);
  return rest;
}

struct FunctionProperties {
  int stack_frame = 0;
  int spill_stores = 0;
  int spill_loads = 0;
};

}  // namespace

std::vector<ResourceUsage> parse_ptxas_report(std::string_view log) {
  std::vector<ResourceUsage> entries;
  std::map<std::string, FunctionProperties, std::less<>> properties;
  std::string properties_of;  // function of the latest "Function properties for" line
  int current_entry = -1;     // index into entries of the latest "Compiling entry function"
  while (!log.empty()) {
    const size_t newline = log.find('\n');
    const std::string_view line = log.substr(0, newline);
    log.remove_prefix(newline == std::string_view::npos ? log.size() : newline + 1);

    if (line.find("Compiling entry function ") != std::string_view::npos) {
      ResourceUsage usage;
      usage.entry = std::string(quoted_or_rest(line, "Compiling entry function "));
      entries.push_back(usage);
      current_entry = static_cast<int>(entries.size()) - 1;
    } else if (line.find("Function properties for ") != std::string_view::npos) {
      properties_of = std::string(quoted_or_rest(line, "Function properties for "));
    } else if (line.find("bytes stack frame") != std::string_view::npos) {
      FunctionProperties& p = properties[properties_of];
      p.stack_frame = std::max(0, number_before(line, "bytes stack frame"));
      p.spill_stores = std::max(0, number_before(line, "bytes spill stores"));
      p.spill_loads = std::max(0, number_before(line, "bytes spill loads"));
    } else if (line.find("Used ") != std::string_view::npos &&
               line.find(" registers") != std::string_view::npos && current_entry >= 0) {
      ResourceUsage& usage = entries[current_entry];
      usage.registers = std::max(0, number_before(line, "registers"));
      usage.static_shared_bytes = std::max(0, number_before(line, "bytes smem"));
      // A kernel calling non-inlined functions reports their frames only in this total.
      usage.local_bytes = std::max(0, number_before(line, "bytes cumulative stack size"));
    }
  }
  // The report does not say which entry calls a non-inlined device function, so its frame and
  // spills count against every entry of the unit: a "must not spill / no local memory" check may
  // err only on the safe side. (A recursive callee's frame is in no entry's cumulative stack.)
  int callee_spills = 0;
  int callee_frame = 0;
  for (const auto& [function, p] : properties) {
    const bool is_entry = std::any_of(entries.begin(), entries.end(),
                                      [&](const ResourceUsage& u) { return u.entry == function; });
    if (is_entry) continue;
    callee_spills += p.spill_stores + p.spill_loads;
    callee_frame = std::max(callee_frame, p.stack_frame);
  }
  for (ResourceUsage& usage : entries) {
    usage.spill_bytes = callee_spills;
    usage.local_bytes = std::max(usage.local_bytes, callee_frame);
    const auto found = properties.find(usage.entry);
    if (found == properties.end()) continue;
    usage.local_bytes = std::max(usage.local_bytes, found->second.stack_frame);
    usage.spill_bytes += found->second.spill_stores + found->second.spill_loads;
  }
  return entries;
}

}  // namespace flare::jit
