// Finds and loads NVRTC with dlopen, and the CUDA include directories its compiles need.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "src/jit/dynamic_library.h"
#include "src/jit/nvrtc_api.h"

namespace flare::jit::nvrtc {
namespace {

namespace fs = std::filesystem;

struct LoadedToolkit {
  Api table{};
  Toolkit toolkit;
};

std::string resolve_all(void* library, Api& t) {
#define FLARE_RESOLVE(name) \
  if (!dynamic_library::resolve(library, #name, t.name)) return #name
  FLARE_RESOLVE(nvrtcVersion);
  FLARE_RESOLVE(nvrtcGetErrorString);
  FLARE_RESOLVE(nvrtcCreateProgram);
  FLARE_RESOLVE(nvrtcDestroyProgram);
  FLARE_RESOLVE(nvrtcCompileProgram);
  FLARE_RESOLVE(nvrtcGetProgramLogSize);
  FLARE_RESOLVE(nvrtcGetProgramLog);
  FLARE_RESOLVE(nvrtcGetCUBINSize);
  FLARE_RESOLVE(nvrtcGetCUBIN);
#undef FLARE_RESOLVE
  return "";
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// Sonames first (the loader's search path, ldconfig), then the usual toolkit locations.
std::vector<std::string> library_candidates() {
  std::vector<std::string> candidates = {"libnvrtc.so.13", "libnvrtc.so"};
  for (const std::string& root :
       {env("CUDA_HOME"), env("CUDA_PATH"), std::string("/usr/local/cuda")}) {
    if (root.empty()) continue;
    candidates.push_back(root + "/lib64/libnvrtc.so.13");
    candidates.push_back(root + "/lib64/libnvrtc.so");
  }
  return candidates;
}

// The include directory of the toolkit that shipped the loaded NVRTC comes first: its headers
// match the compiler's version. Then $CUDA_HOME, $CUDA_PATH and /usr/local/cuda.
std::vector<std::string> find_include_dirs(const std::string& library_path) {
  std::vector<fs::path> roots;
  std::error_code error;
  const fs::path library = fs::canonical(library_path, error);
  if (!error) roots.push_back(library.parent_path().parent_path());  // <root>/lib/libnvrtc.so
  for (const std::string& root :
       {env("CUDA_HOME"), env("CUDA_PATH"), std::string("/usr/local/cuda")}) {
    if (!root.empty()) roots.emplace_back(root);
  }
  for (const fs::path& root : roots) {
    const fs::path include = root / "include";
    if (!fs::exists(include / "cuda_fp16.h", error)) continue;
    std::vector<std::string> dirs = {include.string()};
    // CUDA 13 moved libcu++ (cuda/std/*, cuda/barrier) under include/cccl.
    if (fs::exists(include / "cccl" / "cuda" / "std", error)) {
      dirs.push_back((include / "cccl").string());
    }
    return dirs;
  }
  return {};
}

void load(LoadedToolkit& loaded) {
  Toolkit& toolkit = loaded.toolkit;
  std::string errors;
  void* library = dynamic_library::open_first(library_candidates(), errors);
  if (library == nullptr) {
    toolkit.unavailable_reason =
        "NVRTC not found (" + errors + "); install the CUDA toolkit or set CUDA_HOME";
    return;
  }
  const std::string missing = resolve_all(library, loaded.table);
  if (!missing.empty()) {
    toolkit.unavailable_reason = "NVRTC lacks " + missing + " (flare needs NVRTC 12 or newer)";
    return;
  }
  // dladdr names the file the loader actually chose, even when found through a soname.
  Dl_info info{};
  void* version_symbol = nullptr;
  std::memcpy(&version_symbol, &loaded.table.nvrtcVersion, sizeof(version_symbol));
  if (dladdr(version_symbol, &info) != 0 && info.dli_fname != nullptr) {
    toolkit.library_path = info.dli_fname;
  }
  if (loaded.table.nvrtcVersion(&toolkit.version_major, &toolkit.version_minor) != kSuccess) {
    toolkit.unavailable_reason = "nvrtcVersion failed in " + toolkit.library_path;
    return;
  }
  toolkit.include_dirs = find_include_dirs(toolkit.library_path);
  toolkit.api = &loaded.table;
}

}  // namespace

const Toolkit& toolkit() {
  static LoadedToolkit loaded;
  static std::once_flag once;
  std::call_once(once, [] { load(loaded); });
  return loaded.toolkit;
}

std::string version_string() {
  const Toolkit& t = toolkit();
  if (t.api == nullptr) return "unavailable";
  return std::to_string(t.version_major) + "." + std::to_string(t.version_minor);
}

}  // namespace flare::jit::nvrtc
