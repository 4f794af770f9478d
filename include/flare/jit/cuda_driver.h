// The CUDA driver, reached at run time through dlopen("libcuda.so.1") (DESIGN decision 2):
// the library loads on machines without a GPU or driver, and "no CUDA device" is an error
// value. RAII wrappers for the few driver objects flare uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flare::cuda {

// Opaque driver handles (identical to CUstream etc., without including cuda.h).
using Stream = struct CUstream_st*;
using Function = struct CUfunc_st*;
using Module = struct CUmod_st*;
using DevicePtr = unsigned long long;
using Context = struct CUctx_st*;

// True when libcuda loads, cuInit succeeds and at least one device exists. Never throws.
bool available();
// 0 when the driver is absent. Never throws.
int device_count();
// Why available() is false, for `flare info` and error messages ("libcuda.so.1 not found").
std::string unavailable_reason();

struct DeviceProperties {
  std::string name;
  int index = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int num_sms = 0;
  int max_threads_per_sm = 0;
  int max_shared_bytes_per_block_optin = 0;
  int max_shared_bytes_per_sm = 0;
  int registers_per_sm = 0;
  int64_t l2_bytes = 0;
  int64_t global_bytes = 0;
  // DRAM's peak bandwidth, bytes a microsecond: memory clock x 2 (double data rate) x bus
  // width; 0 where the driver reports no clock or width.
  double memory_peak_bytes_per_us = 0;
};
// Throws kNoCudaDevice when the driver or the device is missing.
DeviceProperties device_properties(int device);

// Makes `device`'s primary context current on this thread (retained once per process).
// Every API entry point calls this for the device of its tensors.
void set_device(int device);

// Makes `device`'s primary context current for the scope and restores the caller's after, so
// a framework that shares the thread (PyTorch's current device) sees no change. run() paths
// use it: when the context already is current it costs one cuCtxGetCurrent.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Context previous_ = nullptr;
  bool switched_ = false;
};
// The device whose context is current (throws kNoCudaDevice when none).
int current_device();

// Throws kCudaError naming `what` and the driver's error string when result != 0.
void check(int result, const char* what);

// True while `stream` is being captured into a CUDA graph.
bool is_capturing(Stream stream);

// Device memory (cuMemAlloc) in the calling thread's current context (set_device first),
// freed on destruction from any thread. Zero bytes allocate nothing and need no device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  DevicePtr ptr_ = 0;
  size_t bytes_ = 0;
  Context context_ = nullptr;  // freed under the context it was allocated in, from any thread
};

// Page-locked host memory (cuMemHostAlloc, portable across devices) for asynchronous plan
// copies; needs a current context like DeviceBuffer.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::byte* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  std::byte* ptr_ = nullptr;
  size_t bytes_ = 0;
  Context context_ = nullptr;
};

void memcpy_htod_async(void* dst, const void* src, size_t bytes, Stream stream);
void memcpy_dtod_async(void* dst, const void* src, size_t bytes, Stream stream);
void memcpy_dtoh(void* dst, const void* src, size_t bytes);  // synchronous
void memcpy_htod(void* dst, const void* src, size_t bytes);  // synchronous
void memset_d8_async(void* dst, uint8_t value, size_t bytes, Stream stream);
void stream_synchronize(Stream stream);
void device_synchronize();

// Kernel launch with the driver's parameter array (pointers to each argument).
// `programmatic`: programmatic dependent launch (sm_90+, cuLaunchKernelEx with programmatic
// stream serialization): the kernel may start while the stream's previous kernel finishes and
// must execute griddepcontrol.wait before reading what that kernel wrote (flare's kernels do,
// first thing: kernels/decode_utils.cuh wait_for_prior_grids). Callers pass it only for
// devices of compute capability 9.0 or more.
void launch(Function function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
            unsigned block_y, unsigned block_z, unsigned shared_bytes, Stream stream, void** args,
            bool programmatic = false);
// Raises the dynamic shared-memory limit of `function` (needed above 48 KiB).
void set_max_dynamic_shared(Function function, int bytes);
// Blocks of `function` that fit on one SM at this block size and dynamic shared memory.
int max_active_blocks_per_sm(Function function, int block_size, size_t dynamic_shared);

// A tensor map for bulk tensor copies (sm_90): a CUtensorMap's 128 opaque bytes.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};
// Encodes a 3-D tiled map of 16-bit elements (bf16 or else f16) at `address`: dims innermost
// first, the byte strides of dims 1 and 2 (multiples of 16), a box in elements whose innermost
// extent is 128 bytes, 128-byte swizzle (the layout kernels/wgmma.cuh reads), zeros outside.
void encode_tensor_map_3d(TensorMap& map, bool bf16, const void* address, const uint64_t (&dims)[3],
                          const uint64_t (&strides)[2], const uint32_t (&box)[3]);
// The same in 4-D (strides of dims 1 to 3).
void encode_tensor_map_4d(TensorMap& map, bool bf16, const void* address, const uint64_t (&dims)[4],
                          const uint64_t (&strides)[3], const uint32_t (&box)[4]);

}  // namespace flare::cuda
