// Device copies of the flare tool's host tensors for its GPU backends (gpu_decode, gpu_prefill):
// uploads of contiguous CPU tensors, NaN-poisoned outputs, downloads, and the device checks.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "flare/core/tensor.h"
#include "flare/jit/cuda_driver.h"

namespace flare::cli {

// A contiguous device buffer and the view of it.
struct DeviceTensor {
  cuda::DeviceBuffer buffer;
  TensorView view;
};

// Throws kNoCudaDevice (naming `cuda:device` and why) unless `device` is a usable CUDA device;
// makes it current.
void use_cuda_device(int device);

// "cuda:0 (NVIDIA H100 80GB HBM3)".
std::string cuda_device_label(int device);

// A device copy of a contiguous CPU tensor (synchronous), same shape and dtype. `name` names
// the tensor in the error for a non-contiguous one.
DeviceTensor upload(const TensorView& host, int device, const char* name);

// A contiguous device tensor whose bytes are all 0xFF: NaN in f16, bf16 and f32, so an element
// a kernel never writes reads back as NaN.
DeviceTensor allocate_poisoned(DType dtype, std::initializer_list<int64_t> shape, int device);

// A host copy (synchronous) once `writer`, the stream that writes the tensor, has finished.
HostTensor download(const DeviceTensor& tensor, cuda::Stream writer);

}  // namespace flare::cli
