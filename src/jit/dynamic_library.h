// dlopen/dlsym helpers of the CUDA driver and NVRTC loaders: the first of several candidate
// files that opens, and function pointers resolved by symbol name.
#pragma once

#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

namespace flare::dynamic_library {

// dlopen (RTLD_NOW | RTLD_LOCAL) of the first candidate that loads, or nullptr with `errors`
// holding each candidate's dlerror() (its name when there is none), joined by "; ".
void* open_first(const std::vector<std::string>& candidates, std::string& errors);

// dlsym returns an object pointer; copying its bytes is the portable way to a function pointer.
template <class Fn>
bool resolve(void* library, const char* name, Fn*& function) {
  void* symbol = dlsym(library, name);
  static_assert(sizeof(function) == sizeof(symbol));
  std::memcpy(&function, &symbol, sizeof(symbol));
  return symbol != nullptr;
}

}  // namespace flare::dynamic_library
