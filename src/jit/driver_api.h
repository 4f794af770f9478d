// The CUDA driver's function table, resolved with dlsym from libcuda at first use, and the
// few driver types and enum values flare needs (declared here so no CUDA header is required).
#pragma once

#include <cstddef>
#include <string>

#include "flare/jit/cuda_driver.h"

namespace flare::cuda::driver {

using CUresult = int;
using CUdevice = int;
using CUcontext = Context;
using CUdeviceptr = DevicePtr;

// Values from cuda.h (stable across driver versions: the driver ABI never renumbers them).
inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorStubLibrary = 34;
inline constexpr CUresult kErrorInvalidContext = 201;
enum DeviceAttribute : int {
  kAttrMultiprocessorCount = 16,
  kAttrMemoryClockRate = 36,       // kHz
  kAttrGlobalMemoryBusWidth = 37,  // bits
  kAttrL2CacheSize = 38,
  kAttrMaxThreadsPerMultiprocessor = 39,
  kAttrComputeCapabilityMajor = 75,
  kAttrComputeCapabilityMinor = 76,
  kAttrMaxSharedMemoryPerMultiprocessor = 81,
  kAttrMaxRegistersPerMultiprocessor = 82,
  kAttrMaxSharedMemoryPerBlockOptin = 97,
};
inline constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
inline constexpr unsigned kMemHostAllocPortable = 0x01;
inline constexpr int kStreamCaptureStatusNone = 0;
inline constexpr int kStreamCaptureModeRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
inline constexpr int kLaunchAttributeProgrammaticStreamSerialization = 6;

// CUlaunchAttribute and CUlaunchConfig (cuda.h), as cuLaunchKernelEx reads them.
struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute");
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_bytes;
  Stream stream;
  LaunchAttribute* attributes;
  unsigned num_attributes;
};
static_assert(sizeof(LaunchConfig) == 56, "CUlaunchConfig");

// Entry points by their exported (versioned) symbol names; see driver_loader.cpp.
struct Api {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int* version);
  CUresult (*cuGetErrorString)(CUresult error, const char** text);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuDeviceGetName)(char* name, int length, CUdevice device);
  CUresult (*cuDeviceTotalMem_v2)(size_t* bytes, CUdevice device);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* context, CUdevice device);
  CUresult (*cuCtxSetCurrent)(CUcontext context);
  CUresult (*cuCtxGetCurrent)(CUcontext* context);
  CUresult (*cuCtxGetDevice)(CUdevice* device);
  CUresult (*cuCtxPushCurrent_v2)(CUcontext context);
  CUresult (*cuCtxPopCurrent_v2)(CUcontext* context);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuMemAlloc_v2)(CUdeviceptr* ptr, size_t bytes);
  CUresult (*cuMemFree_v2)(CUdeviceptr ptr);
  CUresult (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned flags);
  CUresult (*cuMemFreeHost)(void* ptr);
  CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr dst, const void* src, size_t bytes, Stream stream);
  CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr dst, const void* src, size_t bytes);
  CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, Stream stream);
  CUresult (*cuMemcpyDtoH_v2)(void* dst, CUdeviceptr src, size_t bytes);
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t bytes, Stream stream);
  CUresult (*cuStreamSynchronize)(Stream stream);
  CUresult (*cuStreamIsCapturing)(Stream stream, int* status);
  CUresult (*cuThreadExchangeStreamCaptureMode)(int* mode);
  CUresult (*cuModuleLoadData)(Module* module, const void* image);
  CUresult (*cuModuleGetFunction)(Function* function, Module module, const char* name);
  CUresult (*cuLaunchKernel)(Function function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                             unsigned block_x, unsigned block_y, unsigned block_z,
                             unsigned shared_bytes, Stream stream, void** params, void** extra);
  CUresult (*cuLaunchKernelEx)(const LaunchConfig* config, Function function, void** params,
                               void** extra);
  CUresult (*cuFuncSetAttribute)(Function function, int attribute, int value);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int* blocks, Function function,
                                                          int block_size, size_t dynamic_shared);
  // CUtensorMap* map, CUtensorMapDataType, rank, address, dims, strides (rank - 1, bytes), box,
  // element strides, interleave, swizzle, L2 promotion, out-of-bounds fill.
  CUresult (*cuTensorMapEncodeTiled)(void* map, int data_type, unsigned rank, void* address,
                                     const unsigned long long* dims,
                                     const unsigned long long* strides, const unsigned* box,
                                     const unsigned* element_strides, int interleave, int swizzle,
                                     int l2_promotion, int oob_fill);
};

// The calling thread in the relaxed stream-capture mode while it lives, the thread's mode back
// after: for destructors, whose driver calls (frees, destruction) the global and thread-local
// modes may count as unsafe during a capture in progress and answer by invalidating that
// capture, as they do cuMemFree (src/jit/cuda_memory.cpp, release_in_context; the GPU test
// BatchDecodeErrors.DestructorsDuringAGlobalCaptureLeaveItValid). Does nothing without a
// driver.
class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(const Api* d) : d_(d) {
    if (d_ != nullptr && d_->cuThreadExchangeStreamCaptureMode(&mode_) != kSuccess) d_ = nullptr;
  }
  ~RelaxedCaptureScope() {
    if (d_ != nullptr) d_->cuThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  const Api* d_;
  int mode_ = kStreamCaptureModeRelaxed;  // then the thread's own, to restore
};

// The loaded table after a successful cuInit with at least one device, else nullptr (the
// reason is in unavailable_reason()). Loads once, thread-safe, never throws.
const Api* try_api();
// The table, or throws kNoCudaDevice carrying unavailable_reason().
const Api& api();

// "out of memory (error 2)": the driver's text for `result`, or just the number without a driver.
std::string describe_error(CUresult result);

// Converts host-visible pointers of the public API to the driver's integer device pointers.
inline CUdeviceptr device_ptr(const void* ptr) { return reinterpret_cast<CUdeviceptr>(ptr); }

}  // namespace flare::cuda::driver
