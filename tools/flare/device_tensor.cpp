// Device copies of the flare tool's host tensors (see device_tensor.h).
#include "tools/flare/device_tensor.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "flare/core/error.h"

namespace flare::cli {
namespace {

constexpr uint8_t kNanBytes = 0xFF;  // every float format reads all-ones bits as NaN
// Empty tensors still get a buffer: kernels check their pointers against null.
constexpr size_t kMinBytes = 16;

size_t bytes_of(const TensorView& view) {
  return static_cast<size_t>(view.numel()) * dtype_bytes(view.dtype);
}

}  // namespace

void use_cuda_device(int device) {
  FLARE_CHECK(cuda::available(), ErrorCode::kNoCudaDevice, "cuda:", device,
              ": no usable CUDA device (", cuda::unavailable_reason(), ")");
  FLARE_CHECK(device >= 0 && device < cuda::device_count(), ErrorCode::kNoCudaDevice,
              "cuda:", device, ": no such device, this machine has ", cuda::device_count());
  cuda::set_device(device);
}

std::string cuda_device_label(int device) {
  return "cuda:" + std::to_string(device) + " (" + cuda::device_properties(device).name + ")";
}

DeviceTensor upload(const TensorView& host, int device, const char* name) {
  FLARE_CHECK(host.device.is_cpu() && host.is_contiguous(), ErrorCode::kInvalidArgument, name,
              " must be a contiguous CPU tensor to copy to the GPU");
  const size_t bytes = bytes_of(host);
  DeviceTensor copy{cuda::DeviceBuffer(std::max(bytes, kMinBytes)), host};
  if (bytes > 0) cuda::memcpy_htod(copy.buffer.data(), host.data, bytes);
  copy.view.data = copy.buffer.data();
  copy.view.device = Device::cuda(device);
  return copy;
}

DeviceTensor allocate_poisoned(DType dtype, std::initializer_list<int64_t> shape, int device) {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  const size_t bytes = static_cast<size_t>(numel) * dtype_bytes(dtype);
  DeviceTensor tensor{cuda::DeviceBuffer(std::max(bytes, kMinBytes)), {}};
  tensor.view = TensorView::contiguous(tensor.buffer.data(), dtype, shape, Device::cuda(device));
  cuda::memset_d8_async(tensor.buffer.data(), kNanBytes, tensor.buffer.bytes(), nullptr);
  cuda::stream_synchronize(nullptr);
  return tensor;
}

HostTensor download(const DeviceTensor& tensor, cuda::Stream writer) {
  cuda::stream_synchronize(writer);
  const TensorView& v = tensor.view;
  HostTensor host(v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim));
  const size_t bytes = bytes_of(v);
  if (bytes > 0) cuda::memcpy_dtoh(host.data<std::byte>(), tensor.buffer.data(), bytes);
  return host;
}

}  // namespace flare::cli
