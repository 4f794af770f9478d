// Loads libcuda with dlopen once per process, resolves the driver table and runs cuInit.
// Failure at any step leaves the driver unavailable with a reason instead of throwing.
#include <mutex>
#include <string>

#include "flare/core/error.h"
#include "src/jit/driver_api.h"
#include "src/jit/dynamic_library.h"

namespace flare::cuda {
namespace driver {
namespace {

struct DriverState {
  Api table{};
  bool loaded = false;  // libcuda opened, every symbol resolved, cuInit succeeded
  int device_count = 0;
  std::string unavailable_reason;
};

std::string error_text(const Api& table, CUresult result) {
  const char* text = nullptr;
  if (table.cuGetErrorString == nullptr || table.cuGetErrorString(result, &text) != kSuccess ||
      text == nullptr) {
    text = "unknown error";
  }
  return std::string(text) + " (error " + std::to_string(result) + ")";
}

// Returns the name of the first symbol the library lacks, or "" when all resolved.
std::string resolve_all(void* library, Api& t) {
  // The macro keeps each field and the symbol it is loaded from spelled identically: a _v2
  // field can never be filled from the unversioned (older ABI) symbol.
#define FLARE_RESOLVE(name) \
  if (!dynamic_library::resolve(library, #name, t.name)) return #name
  FLARE_RESOLVE(cuInit);
  FLARE_RESOLVE(cuDriverGetVersion);
  FLARE_RESOLVE(cuGetErrorString);
  FLARE_RESOLVE(cuDeviceGetCount);
  FLARE_RESOLVE(cuDeviceGet);
  FLARE_RESOLVE(cuDeviceGetAttribute);
  FLARE_RESOLVE(cuDeviceGetName);
  FLARE_RESOLVE(cuDeviceTotalMem_v2);
  FLARE_RESOLVE(cuDevicePrimaryCtxRetain);
  FLARE_RESOLVE(cuCtxSetCurrent);
  FLARE_RESOLVE(cuCtxGetCurrent);
  FLARE_RESOLVE(cuCtxGetDevice);
  FLARE_RESOLVE(cuCtxPushCurrent_v2);
  FLARE_RESOLVE(cuCtxPopCurrent_v2);
  FLARE_RESOLVE(cuCtxSynchronize);
  FLARE_RESOLVE(cuMemAlloc_v2);
  FLARE_RESOLVE(cuMemFree_v2);
  FLARE_RESOLVE(cuMemHostAlloc);
  FLARE_RESOLVE(cuMemFreeHost);
  FLARE_RESOLVE(cuMemcpyHtoDAsync_v2);
  FLARE_RESOLVE(cuMemcpyHtoD_v2);
  FLARE_RESOLVE(cuMemcpyDtoDAsync_v2);
  FLARE_RESOLVE(cuMemcpyDtoH_v2);
  FLARE_RESOLVE(cuMemsetD8Async);
  FLARE_RESOLVE(cuStreamSynchronize);
  FLARE_RESOLVE(cuStreamIsCapturing);
  FLARE_RESOLVE(cuThreadExchangeStreamCaptureMode);
  FLARE_RESOLVE(cuModuleLoadData);
  FLARE_RESOLVE(cuModuleGetFunction);
  FLARE_RESOLVE(cuLaunchKernel);
  FLARE_RESOLVE(cuLaunchKernelEx);
  FLARE_RESOLVE(cuFuncSetAttribute);
  FLARE_RESOLVE(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  FLARE_RESOLVE(cuTensorMapEncodeTiled);
#undef FLARE_RESOLVE
  return "";
}

void load(DriverState& state) {
  std::string dlopen_errors;
  void* library = dynamic_library::open_first({"libcuda.so.1", "libcuda.so"}, dlopen_errors);
  if (library == nullptr) {
    state.unavailable_reason = "CUDA driver not found (" + dlopen_errors + ")";
    return;
  }
  // The library stays open for the life of the process: modules and contexts outlive any scope.
  const std::string missing = resolve_all(library, state.table);
  if (!missing.empty()) {
    state.unavailable_reason = "the CUDA driver lacks " + missing + " (driver too old for flare)";
    return;
  }
  const CUresult init = state.table.cuInit(0);
  if (init == kErrorStubLibrary) {
    state.unavailable_reason =
        "cuInit failed: the CUDA toolkit's stub libcuda was loaded instead of a real driver "
        "(remove its stubs/ directory from LD_LIBRARY_PATH)";
    return;
  }
  if (init != kSuccess) {
    state.unavailable_reason = "cuInit failed: " + error_text(state.table, init);
    return;
  }
  int count = 0;
  const CUresult counted = state.table.cuDeviceGetCount(&count);
  if (counted != kSuccess) {
    state.unavailable_reason = "cuDeviceGetCount failed: " + error_text(state.table, counted);
    return;
  }
  if (count == 0) {
    state.unavailable_reason = "the CUDA driver reports no devices";
    return;
  }
  state.device_count = count;
  state.loaded = true;
}

const DriverState& state() {
  static DriverState driver_state;
  static std::once_flag once;
  std::call_once(once, [] { load(driver_state); });
  return driver_state;
}

}  // namespace

const Api* try_api() {
  const DriverState& loaded = state();
  return loaded.loaded ? &loaded.table : nullptr;
}

const Api& api() {
  const Api* table = try_api();
  if (table == nullptr) fail(ErrorCode::kNoCudaDevice, "no CUDA device: ", unavailable_reason());
  return *table;
}

std::string describe_error(CUresult result) { return error_text(state().table, result); }

}  // namespace driver

bool available() { return driver::try_api() != nullptr; }

int device_count() { return driver::state().device_count; }

std::string unavailable_reason() { return driver::state().unavailable_reason; }

void check(int result, const char* what) {
  if (result == driver::kSuccess) return;
  fail(ErrorCode::kCudaError, what, " failed: ", driver::describe_error(result));
}

}  // namespace flare::cuda
