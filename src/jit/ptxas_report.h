// Parses ptxas's verbose report (NVRTC option --ptxas-options=-v, printed into the program log)
// into per-kernel registers, stack frame, spills and static shared memory.
#pragma once

#include <string_view>
#include <vector>

#include "flare/jit/compiler.h"

namespace flare::jit {

// One ResourceUsage per entry function the report compiled, in report order; max_threads is
// left 0 (ptxas does not print it; see cubin_elf.h).
std::vector<ResourceUsage> parse_ptxas_report(std::string_view log);

}  // namespace flare::jit
