// DLPack import (DLTensor -> TensorView, no copy) and export (TensorView -> DLManagedTensor
// owning its shape/strides storage).
#include "flare/core/dlpack.h"

#include <array>
#include <cstddef>
#include <utility>

#include "flare/core/error.h"

namespace flare {
namespace {

DType dtype_from_dlpack(DLDataType type) {
  FLARE_CHECK(type.lanes == 1, ErrorCode::kInvalidArgument,
              "from_dlpack: dtype.lanes must be 1, got ", type.lanes);
  const int code = type.code;
  const int bits = type.bits;
  if (code == kDLFloat && bits == 32) return DType::kF32;
  if (code == kDLFloat && bits == 16) return DType::kF16;
  if (code == kDLBfloat && bits == 16) return DType::kBF16;
  if (code == kDLFloat8_e4m3fn && bits == 8) return DType::kE4M3;
  if (code == kDLFloat8_e5m2 && bits == 8) return DType::kE5M2;
  if (code == kDLInt && bits == 32) return DType::kI32;
  if (code == kDLInt && bits == 64) return DType::kI64;
  if ((code == kDLUInt || code == kDLBool) && bits == 8) return DType::kU8;
  fail(ErrorCode::kInvalidArgument, "from_dlpack: unsupported dtype (code ", code, ", bits ", bits,
       "); expected float16/32, bfloat16, float8_e4m3fn, float8_e5m2, int32, int64, uint8 or "
       "bool");
}

DLDataType dtype_to_dlpack(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF16:
      return {kDLFloat, 16, 1};
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kE4M3:
      return {kDLFloat8_e4m3fn, 8, 1};
    case DType::kE5M2:
      return {kDLFloat8_e5m2, 8, 1};
    case DType::kI32:
      return {kDLInt, 32, 1};
    case DType::kI64:
      return {kDLInt, 64, 1};
    case DType::kU8:
      return {kDLUInt, 8, 1};
  }
  fail(ErrorCode::kInternal, "to_dlpack: unknown dtype ", static_cast<int>(dtype));
}

Device device_from_dlpack(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: the CPU reads it directly
      return Device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged:  // unified memory: owned by (and fastest on) its GPU
      FLARE_CHECK(device.device_id >= 0, ErrorCode::kInvalidArgument,
                  "from_dlpack: device.device_id must be >= 0, got ", device.device_id);
      return Device::cuda(device.device_id);
  }
  fail(ErrorCode::kInvalidArgument, "from_dlpack: unsupported device.device_type ",
       static_cast<int>(device.device_type),
       "; expected kDLCPU (1), kDLCUDA (2), kDLCUDAHost (3) "
       "or kDLCUDAManaged (13)");
}

// What to_dlpack allocates: the managed tensor, the arrays its DLTensor points to, and the
// caller's release callback.
struct ExportedTensor {
  DLManagedTensor managed;
  std::array<int64_t, kMaxDims> shape;
  std::array<int64_t, kMaxDims> strides;
  std::function<void()> release;
};

void delete_exported(DLManagedTensor* self) {
  auto* exported = static_cast<ExportedTensor*>(self->manager_ctx);
  std::function<void()> release = std::move(exported->release);
  delete exported;
  if (release) release();
}

}  // namespace

TensorView from_dlpack(const DLTensor& tensor) {
  FLARE_CHECK(tensor.ndim >= 0 && tensor.ndim <= kMaxDims, ErrorCode::kInvalidArgument,
              "from_dlpack: ndim must be in [0, ", kMaxDims, "], got ", tensor.ndim);
  TensorView view;
  view.dtype = dtype_from_dlpack(tensor.dtype);
  view.device = device_from_dlpack(tensor.device);
  view.ndim = tensor.ndim;
  FLARE_CHECK(tensor.ndim == 0 || tensor.shape != nullptr, ErrorCode::kInvalidArgument,
              "from_dlpack: shape is null for ndim ", tensor.ndim);
  for (int d = 0; d < tensor.ndim; ++d) {
    FLARE_CHECK(tensor.shape[d] >= 0, ErrorCode::kInvalidArgument, "from_dlpack: shape[", d,
                "] must be >= 0, got ", tensor.shape[d]);
    view.shape[d] = tensor.shape[d];
  }
  int64_t row_major_stride = 1;
  for (int d = tensor.ndim - 1; d >= 0; --d) {
    if (tensor.strides == nullptr) {
      view.strides[d] = row_major_stride;
      row_major_stride *= view.shape[d];
    } else {
      FLARE_CHECK(tensor.strides[d] >= 0, ErrorCode::kInvalidArgument, "from_dlpack: strides[", d,
                  "] must be >= 0, got ", tensor.strides[d]);
      view.strides[d] = tensor.strides[d];
    }
  }
  FLARE_CHECK(tensor.data != nullptr || view.numel() == 0, ErrorCode::kInvalidArgument,
              "from_dlpack: data is null for a tensor of shape ", view.shape_str());
  view.data = tensor.data == nullptr
                  ? nullptr
                  : static_cast<void*>(static_cast<std::byte*>(tensor.data) + tensor.byte_offset);
  return view;
}

DLManagedTensor* to_dlpack(const TensorView& view, std::function<void()> release) {
  const DLDataType dtype = dtype_to_dlpack(view.dtype);
  auto* exported = new ExportedTensor{};
  exported->release = std::move(release);
  for (int d = 0; d < view.ndim; ++d) {
    exported->shape[d] = view.shape[d];
    exported->strides[d] = view.strides[d];
  }
  DLTensor& tensor = exported->managed.dl_tensor;
  tensor.data = view.data;
  tensor.device =
      view.device.is_cuda() ? DLDevice{kDLCUDA, view.device.index} : DLDevice{kDLCPU, 0};
  tensor.ndim = view.ndim;
  tensor.dtype = dtype;
  tensor.shape = exported->shape.data();
  tensor.strides = exported->strides.data();
  tensor.byte_offset = 0;
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = delete_exported;
  return &exported->managed;
}

}  // namespace flare
