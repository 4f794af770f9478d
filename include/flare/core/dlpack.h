// DLPack interchange (the ABI of dlpack.h v0.8+/1.x, legacy DLManagedTensor): import a
// framework's tensor as a TensorView without copying, and export a TensorView to one.
#pragma once

#include <cstdint>
#include <functional>

#include "flare/core/tensor.h"

extern "C" {
// Layouts fixed by the DLPack specification; declared here so flare needs no extra header.
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 } DLDeviceType;
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;
typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
} DLDataTypeCode;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // NULL means compact row-major
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
}

namespace flare {

// The view of a DLTensor (byte_offset folded into data). Throws kInvalidArgument for dtypes,
// devices or ranks flare does not handle, naming the field.
TensorView from_dlpack(const DLTensor& tensor);

// A DLManagedTensor describing `view`; its deleter frees the shape/stride storage and then
// calls `release` (which keeps the owner of the memory alive until then).
DLManagedTensor* to_dlpack(const TensorView& view, std::function<void()> release = {});

}  // namespace flare
