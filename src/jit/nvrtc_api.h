// NVRTC reached through dlopen: its function table, version and the CUDA include directories
// found at run time (NVRTC's own builtin headers do not include cuda_fp16.h / cuda_bf16.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace flare::jit::nvrtc {

using Result = int;  // nvrtcResult
using Program = struct _nvrtcProgram*;
inline constexpr Result kSuccess = 0;

struct Api {
  Result (*nvrtcVersion)(int* major, int* minor);
  const char* (*nvrtcGetErrorString)(Result result);
  Result (*nvrtcCreateProgram)(Program* program, const char* source, const char* name,
                               int num_headers, const char* const* headers,
                               const char* const* include_names);
  Result (*nvrtcDestroyProgram)(Program* program);
  Result (*nvrtcCompileProgram)(Program program, int num_options, const char* const* options);
  Result (*nvrtcGetProgramLogSize)(Program program, size_t* bytes);
  Result (*nvrtcGetProgramLog)(Program program, char* log);
  Result (*nvrtcGetCUBINSize)(Program program, size_t* bytes);
  Result (*nvrtcGetCUBIN)(Program program, char* cubin);
};

struct Toolkit {
  const Api* api = nullptr;  // null when NVRTC could not be loaded
  std::string unavailable_reason;
  std::string library_path;  // the file dlopen found, for messages
  int version_major = 0;
  int version_minor = 0;
  // Passed as -I: the toolkit's include/ (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h) and its cccl/
  // subdirectory (cuda/std, cuda/barrier) when present. Empty when no toolkit headers exist.
  std::vector<std::string> include_dirs;
};

// Loads NVRTC once per process (thread-safe, never throws).
const Toolkit& toolkit();

// "13.0", or "unavailable" when NVRTC cannot be loaded: part of every cache key.
std::string version_string();

}  // namespace flare::jit::nvrtc
