// dlopen of the first loadable candidate, for the CUDA driver and NVRTC loaders.
#include "src/jit/dynamic_library.h"

namespace flare::dynamic_library {

void* open_first(const std::vector<std::string>& candidates, std::string& errors) {
  for (const std::string& candidate : candidates) {
    void* library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) return library;
    const char* error = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(error ? error : candidate);
  }
  return nullptr;
}

}  // namespace flare::dynamic_library
