// Reads what a cubin (an ELF file) says about its kernels: their names, register counts, stack
// sizes and __launch_bounds__ thread limits, from the .nv.info attribute sections.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flare::jit {

// What the driver itself reads from the image: present for every kernel of every cubin, unlike
// ptxas's verbose report (see resource_usage in compile_steps.h).
struct CubinKernel {
  std::string name;
  int registers = 0;  // EIATTR_REGCOUNT; 0 when the cubin does not record it
  // Local memory per thread: max of EIATTR_FRAME_SIZE (its own frame, spills included) and
  // EIATTR_MIN_STACK_SIZE (with non-recursive callees; a recursive callee's frame is in neither).
  int stack_bytes = 0;
  int max_threads = 0;  // EIATTR_MAX_THREADS (x * y * z of __launch_bounds__); 0 when none
};

// True for a 64-bit little-endian ELF image, the only kind NVRTC produces.
bool is_elf64(std::string_view bytes);

// Every kernel of the cubin, in section order. Throws kInternal on a malformed image.
std::vector<CubinKernel> read_cubin_kernels(std::string_view cubin);

}  // namespace flare::jit
