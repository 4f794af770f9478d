// Steps shared by compile() and the disk cache: the NVRTC option list (also hashed into every
// cache key), the spec's entry names, and resource usage from the cubin plus ptxas's report.
#pragma once

#include <string>
#include <vector>

#include "flare/jit/compiler.h"

namespace flare::jit {

// Throws kInvalidArgument unless `arch` reads "sm_<digits>" with an optional 'a' or 'f' suffix.
void check_arch(const std::string& arch);

// The exact options compile() passes to NVRTC for `arch`.
std::vector<std::string> nvrtc_options(const std::string& arch);

// spec.entry split at ';' (empty names dropped).
std::vector<std::string> entry_names(const KernelSpec& spec);

// Usage of each of `entries` (every kernel of the cubin when empty), read from the cubin, with
// spill counts and static shared memory added from ptxas's report in `log`. An entry the report
// lacks is a logged warning, never an error: the compile succeeded, and the CI config tests are
// the ones that insist on the numbers. Throws kCompileError when an entry is not a kernel of the
// cubin (a misspelled or non-extern "C" entry).
std::vector<ResourceUsage> resource_usage(const std::string& log, const std::string& cubin,
                                          const std::vector<std::string>& entries,
                                          const std::string& label);

}  // namespace flare::jit
