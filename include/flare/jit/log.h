// JIT logging: what is compiling and how long it took, and warnings that do not stop a kernel
// from being used, on stderr, unless FLARE_LOG=quiet.
#pragma once

#include <string>

namespace flare::jit {

void log_info(const std::string& message);

// "[flare] warning: <message>".
void log_warning(const std::string& message);

}  // namespace flare::jit
