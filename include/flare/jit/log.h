// JIT logging: what is compiling and how long it took, on stderr, unless FLARE_LOG=quiet.
#pragma once

#include <string>

namespace flare::jit {

void log_info(const std::string& message);

}  // namespace flare::jit
