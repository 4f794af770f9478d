// Whether a name can stand in generated CUDA source as a C identifier (a JIT define, a user
// variant's name, scalar or tensor).
#pragma once

#include <algorithm>
#include <cctype>
#include <string_view>

namespace flare {

inline bool is_c_identifier(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace flare
