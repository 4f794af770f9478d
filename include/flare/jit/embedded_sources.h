// The kernels/*.cuh sources, embedded into the library at build time so NVRTC can compile
// them wherever the library is installed.
#pragma once

#include <span>

namespace flare::jit {

struct EmbeddedSource {
  const char* name;  // file name, e.g. "decode.cuh"
  const char* text;
};

std::span<const EmbeddedSource> embedded_sources();

}  // namespace flare::jit
