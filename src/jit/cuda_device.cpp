// Devices and contexts: properties (queried once per device), the primary context made
// current per thread, synchronization and stream-capture state.
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "flare/core/error.h"
#include "src/jit/driver_api.h"

namespace flare::cuda {
namespace {

using driver::api;

// Validates `device` against the driver's count; throws kNoCudaDevice otherwise.
driver::CUdevice device_handle(const driver::Api& d, int device) {
  const int count = device_count();
  FLARE_CHECK(device >= 0 && device < count, ErrorCode::kNoCudaDevice, "device index ", device,
              " out of range: the driver reports ", count, " CUDA device(s)");
  driver::CUdevice handle = 0;
  check(d.cuDeviceGet(&handle, device), "cuDeviceGet");
  return handle;
}

int attribute(const driver::Api& d, driver::DeviceAttribute which, driver::CUdevice handle) {
  int value = 0;
  check(d.cuDeviceGetAttribute(&value, which, handle), "cuDeviceGetAttribute");
  return value;
}

DeviceProperties query_properties(const driver::Api& d, int device) {
  const driver::CUdevice handle = device_handle(d, device);
  DeviceProperties props;
  char name[256] = {};
  check(d.cuDeviceGetName(name, sizeof(name) - 1, handle), "cuDeviceGetName");
  props.name = name;
  props.index = device;
  props.cc_major = attribute(d, driver::kAttrComputeCapabilityMajor, handle);
  props.cc_minor = attribute(d, driver::kAttrComputeCapabilityMinor, handle);
  props.num_sms = attribute(d, driver::kAttrMultiprocessorCount, handle);
  props.max_threads_per_sm = attribute(d, driver::kAttrMaxThreadsPerMultiprocessor, handle);
  props.max_shared_bytes_per_block_optin =
      attribute(d, driver::kAttrMaxSharedMemoryPerBlockOptin, handle);
  props.max_shared_bytes_per_sm =
      attribute(d, driver::kAttrMaxSharedMemoryPerMultiprocessor, handle);
  props.registers_per_sm = attribute(d, driver::kAttrMaxRegistersPerMultiprocessor, handle);
  props.l2_bytes = attribute(d, driver::kAttrL2CacheSize, handle);
  const double memory_khz = attribute(d, driver::kAttrMemoryClockRate, handle);
  const double bus_bits = attribute(d, driver::kAttrGlobalMemoryBusWidth, handle);
  props.memory_peak_bytes_per_us = memory_khz * 1e-3 * 2.0 * bus_bits / 8.0;
  size_t total = 0;
  check(d.cuDeviceTotalMem_v2(&total, handle), "cuDeviceTotalMem");
  props.global_bytes = static_cast<int64_t>(total);
  return props;
}

}  // namespace

DeviceProperties device_properties(int device) {
  const driver::Api& d = api();
  // Planning asks for properties on every call; the driver's answers never change.
  static std::mutex mutex;
  static std::vector<std::optional<DeviceProperties>> cache(device_count());
  device_handle(d, device);  // range check before indexing the cache
  std::lock_guard<std::mutex> lock(mutex);
  if (!cache[device]) cache[device] = query_properties(d, device);
  return *cache[device];
}

namespace {

// `device`'s primary context, retained once and kept for the life of the process (as the
// runtime API does), so modules loaded into them stay valid. After the first call per device
// a lookup is one atomic load.
Context primary_context(const driver::Api& d, int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<Context> contexts[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices) {
    const Context known = contexts[device].load(std::memory_order_acquire);
    if (known != nullptr) return known;
  }
  static std::mutex mutex;
  const driver::CUdevice handle = device_handle(d, device);  // range check
  FLARE_CHECK(device < kMaxDevices, ErrorCode::kUnsupported, "device index ", device,
              ": flare handles at most ", kMaxDevices, " devices");
  std::lock_guard<std::mutex> lock(mutex);
  Context context = contexts[device].load(std::memory_order_acquire);
  if (context == nullptr) {
    check(d.cuDevicePrimaryCtxRetain(&context, handle), "cuDevicePrimaryCtxRetain");
    contexts[device].store(context, std::memory_order_release);
  }
  return context;
}

}  // namespace

void set_device(int device) {
  const driver::Api& d = api();
  check(d.cuCtxSetCurrent(primary_context(d, device)), "cuCtxSetCurrent");
}

DeviceScope::DeviceScope(int device) {
  const driver::Api& d = api();
  const Context context = primary_context(d, device);
  check(d.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != context) {
    check(d.cuCtxSetCurrent(context), "cuCtxSetCurrent");
    switched_ = true;
  }
}

DeviceScope::~DeviceScope() {
  // Restoring the caller's context cannot fail for a context that was current a moment ago;
  // a destructor could not report it anyway.
  if (switched_) api().cuCtxSetCurrent(previous_);
}

int current_device() {
  const driver::Api& d = api();
  driver::CUdevice handle = 0;
  const driver::CUresult result = d.cuCtxGetDevice(&handle);
  if (result == driver::kErrorInvalidContext) {
    fail(ErrorCode::kNoCudaDevice,
         "no CUDA context is current on this thread (call flare::cuda::set_device first)");
  }
  check(result, "cuCtxGetDevice");
  return handle;  // a CUdevice is its ordinal
}

bool is_capturing(Stream stream) {
  int status = driver::kStreamCaptureStatusNone;
  check(api().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  // An invalidated capture is still a capture: work issued now would be lost, not executed.
  return status != driver::kStreamCaptureStatusNone;
}

void stream_synchronize(Stream stream) {
  check(api().cuStreamSynchronize(stream), "cuStreamSynchronize");
}

void device_synchronize() { check(api().cuCtxSynchronize(), "cuCtxSynchronize"); }

}  // namespace flare::cuda
