// Loaded kernels: a process-wide table from (cache key, device) to a loaded CUmodule and its
// functions, so each configuration is compiled once and loaded once per device.
#pragma once

#include <string>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"

namespace flare::jit {

// The function `entry` of spec compiled for `device`'s architecture (compile_cached + load).
// Thread-safe. Throws kNoCudaDevice, kCompileError, kCudaError.
cuda::Function get_kernel(const KernelSpec& spec, const std::string& entry, int device);

}  // namespace flare::jit
