// Process-wide table of loaded modules keyed by (cache key, device): each configuration is
// compiled (or read from the disk cache) and loaded once per device, then its functions reused.
#include "flare/jit/module.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "flare/core/error.h"
#include "src/jit/driver_api.h"

namespace flare::jit {
namespace {

struct LoadedModule {
  std::mutex mutex;  // held while compiling and loading: one load per (key, device)
  cuda::Module module = nullptr;
  std::map<std::string, cuda::Function> functions;
};

std::shared_ptr<LoadedModule> module_slot(const std::string& key, int device) {
  static std::mutex table_mutex;
  // Modules stay loaded for the life of the process, like the primary contexts they live in.
  static std::map<std::pair<std::string, int>, std::shared_ptr<LoadedModule>> table;
  std::lock_guard<std::mutex> lock(table_mutex);
  std::shared_ptr<LoadedModule>& slot = table[{key, device}];
  if (!slot) slot = std::make_shared<LoadedModule>();
  return slot;
}

// What identifies a loaded function without hashing: the spec's fields, the entry and the
// device (one architecture per device). cache_key() hashes the translation unit and the
// compiler options (tens of microseconds: the Python merge_state_in_place spent 30 us of host
// time a call there, H200); launches that resolve their kernel per call (merge_state,
// append_paged_kv_cache) find it here instead. The JIT's environment (FLARE_JIT_LINEINFO) is
// read once per kernel, at its first load.
std::string loaded_key(const KernelSpec& spec, const std::string& entry, int device) {
  std::string key = std::to_string(device);
  const auto add = [&key](const std::string& field) {  // length-prefixed: no two keys collide
    key += ' ';
    key += std::to_string(field.size());
    key += ':';
    key += field;
  };
  for (const std::string* field : {&spec.family_header, &spec.entry, &entry, &spec.variant_source}) {
    add(*field);
  }
  for (const auto& [name, value] : spec.defines) {
    add(name);
    add(value);
  }
  return key;
}

struct LoadedFunctions {
  std::mutex mutex;
  std::unordered_map<std::string, cuda::Function> functions;
};

LoadedFunctions& loaded_functions() {
  static LoadedFunctions loaded;  // for the life of the process, like the modules
  return loaded;
}

cuda::Function load_function(const KernelSpec& spec, const std::string& entry, int device) {
  const cuda::DeviceProperties props = cuda::device_properties(device);
  const std::string arch = arch_for(props.cc_major, props.cc_minor);
  const std::shared_ptr<LoadedModule> slot = module_slot(cache_key(spec, arch), device);

  std::lock_guard<std::mutex> lock(slot->mutex);
  if (slot->module == nullptr) {
    const CompiledKernel compiled = compile_cached(spec, arch);
    cuda::Module module = nullptr;
    cuda::check(cuda::driver::api().cuModuleLoadData(&module, compiled.cubin.data()),
                "cuModuleLoadData");
    slot->module = module;
  }
  const auto found = slot->functions.find(entry);
  if (found != slot->functions.end()) return found->second;
  cuda::Function function = nullptr;
  const std::string what = "cuModuleGetFunction(" + entry + ")";
  cuda::check(cuda::driver::api().cuModuleGetFunction(&function, slot->module, entry.c_str()),
              what.c_str());
  slot->functions.emplace(entry, function);
  return function;
}

}  // namespace

cuda::Function get_kernel(const KernelSpec& spec, const std::string& entry, int device) {
  cuda::set_device(device);  // throws kNoCudaDevice without a driver or device
  const std::string key = loaded_key(spec, entry, device);
  LoadedFunctions& loaded = loaded_functions();
  {
    std::lock_guard<std::mutex> lock(loaded.mutex);
    const auto found = loaded.functions.find(key);
    if (found != loaded.functions.end()) return found->second;
  }
  const cuda::Function function = load_function(spec, entry, device);
  std::lock_guard<std::mutex> lock(loaded.mutex);
  loaded.functions.emplace(key, function);
  return function;
}

}  // namespace flare::jit
