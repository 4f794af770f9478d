// Process-wide table of loaded modules keyed by (cache key, device): each configuration is
// compiled (or read from the disk cache) and loaded once per device, then its functions reused.
#include "flare/jit/module.h"

#include <map>
#include <memory>
#include <mutex>
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

}  // namespace

cuda::Function get_kernel(const KernelSpec& spec, const std::string& entry, int device) {
  cuda::set_device(device);  // throws kNoCudaDevice without a driver or device
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

}  // namespace flare::jit
