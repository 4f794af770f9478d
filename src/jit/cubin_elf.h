// Reads what a cubin (an ELF file) says about its kernels: their names, register counts and
// __launch_bounds__ thread limits, from the .nv.info attribute sections.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flare::jit {

struct CubinKernel {
  std::string name;
  int registers = -1;   // EIATTR_REGCOUNT; -1 when the cubin does not record it
  int max_threads = 0;  // EIATTR_MAX_THREADS (x * y * z of __launch_bounds__); 0 when none
};

// True for a 64-bit little-endian ELF image, the only kind NVRTC produces.
bool is_elf64(std::string_view bytes);

// Every kernel of the cubin, in section order. Throws kInternal on a malformed image.
std::vector<CubinKernel> read_cubin_kernels(std::string_view cubin);

}  // namespace flare::jit
