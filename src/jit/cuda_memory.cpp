// Device and pinned host buffers, copies and memset through the driver. Buffers remember the
// context they were allocated in, so they can be freed from any thread.
#include <utility>

#include "flare/core/error.h"
#include "src/jit/driver_api.h"

namespace flare::cuda {
namespace {

using driver::api;

Context current_context(const driver::Api& d, const char* what) {
  Context context = nullptr;
  check(d.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  FLARE_CHECK(context != nullptr, ErrorCode::kNoCudaDevice, what,
              ": no CUDA context is current on this thread (call flare::cuda::set_device first)");
  return context;
}

// Runs `release` with `context` current, restoring the thread's context afterwards, in the
// relaxed stream-capture mode: a buffer may die while some stream of the process is being
// captured into a CUDA graph (a wrapper collected by Python's garbage collector inside a
// `torch.cuda.graph` block, which captures in the global mode), and in the global or
// thread-local mode the driver counts cuMemFree as an unsafe call and invalidates that capture
// ("operation failed due to a previous error during capture"). The freed memory is the dying
// object's own, which no capture in progress reads. Errors are ignored: destructors cannot
// report them, and at process exit the driver may be gone.
template <class Release>
void release_in_context(Context context, Release release) {
  const driver::Api* d = driver::try_api();
  if (d == nullptr) return;
  Context current = nullptr;
  const bool switch_context =
      d->cuCtxGetCurrent(&current) == driver::kSuccess && current != context;
  if (switch_context && d->cuCtxPushCurrent_v2(context) != driver::kSuccess) return;
  {
    const driver::RelaxedCaptureScope relaxed(d);
    release(*d);
  }
  if (switch_context) {
    Context popped = nullptr;
    d->cuCtxPopCurrent_v2(&popped);
  }
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes == 0) return;  // the driver rejects empty allocations; an empty buffer needs none
  const driver::Api& d = api();
  context_ = current_context(d, "DeviceBuffer");
  check(d.cuMemAlloc_v2(&ptr_, bytes), "cuMemAlloc");
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ == 0) return;
  release_in_context(context_, [this](const driver::Api& d) { d.cuMemFree_v2(ptr_); });
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      context_(std::exchange(other.context_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
  if (bytes == 0) return;
  const driver::Api& d = api();
  context_ = current_context(d, "PinnedBuffer");
  void* ptr = nullptr;
  // Portable: the plan buffer may be copied to any device, not only the allocating one.
  check(d.cuMemHostAlloc(&ptr, bytes, driver::kMemHostAllocPortable), "cuMemHostAlloc");
  ptr_ = static_cast<std::byte*>(ptr);
  bytes_ = bytes;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ == nullptr) return;
  release_in_context(context_, [this](const driver::Api& d) { d.cuMemFreeHost(ptr_); });
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      context_(std::exchange(other.context_, nullptr)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    PinnedBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

void memcpy_htod_async(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check(api().cuMemcpyHtoDAsync_v2(driver::device_ptr(dst), src, bytes, stream),
        "cuMemcpyHtoDAsync");
}

void memcpy_dtod_async(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check(api().cuMemcpyDtoDAsync_v2(driver::device_ptr(dst), driver::device_ptr(src), bytes, stream),
        "cuMemcpyDtoDAsync");
}

void memcpy_dtoh(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check(api().cuMemcpyDtoH_v2(dst, driver::device_ptr(src), bytes), "cuMemcpyDtoH");
}

void memcpy_htod(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check(api().cuMemcpyHtoD_v2(driver::device_ptr(dst), src, bytes), "cuMemcpyHtoD");
}

void memset_d8_async(void* dst, uint8_t value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  check(api().cuMemsetD8Async(driver::device_ptr(dst), value, bytes, stream), "cuMemsetD8Async");
}

}  // namespace flare::cuda
