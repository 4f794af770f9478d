// Paying the JIT up front: every kernel a set of BatchDecode and BatchPrefill configurations may
// launch on a device, compiled in parallel into the JIT disk cache (flare/jit/compiler.h), so
// that the configurations' constructors and first plan()s (a prefill plan picks its tiles from
// its batch) load a cubin from the disk instead of compiling (about a second a kernel). A
// serving process calls precompile() once at start with the configurations, user variants
// included (BatchDecodeConfig::variant, BatchPrefillConfig::variant), it will use.
#pragma once

#include <span>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/jit/compiler.h"

namespace flare {

struct PrecompileReport {
  int kernels = 0;             // distinct kernels of the configurations
  int compiled = 0;            // compiled by this call
  int from_cache = 0;          // found in the disk cache
  double wall_seconds = 0;     // the whole call
  double compile_seconds = 0;  // summed over the kernels compiled (the threads overlap them)
};

// The distinct kernels of the configurations on a device of these limits (no GPU needed):
// a decode configuration's kernel; a prefill configuration's merge kernel and the prefill
// kernel of each tile pair its plans may pick (its fixed tiles, or one per query tile 16, 32,
// 64 and 128 with the KV tile of choose_prefill_tiles). Throws what the constructors throw for
// a bad configuration, naming it ("decode[1]", "prefill[0]").
std::vector<jit::KernelSpec> kernels_to_precompile(std::span<const BatchDecodeConfig> decode,
                                                   std::span<const BatchPrefillConfig> prefill,
                                                   const PrefillDeviceLimits& limits);

// kernels_to_precompile for `device`'s limits, compiled for its architecture on num_threads
// threads (0: one per hardware thread). Every configuration is checked before anything is
// compiled; a kernel that fails to compile (a user variant's source) throws kCompileError with
// NVRTC's log after the others finish. Configurations' `device` fields are not read.
PrecompileReport precompile(std::span<const BatchDecodeConfig> decode,
                            std::span<const BatchPrefillConfig> prefill, int device,
                            int num_threads = 0);

}  // namespace flare
