// The GPU sparse operators' shared argument checks (spmm_gpu.cpp, sddmm_gpu.cpp): index and value
// arrays, float32 dense operands, and the widest vector load their alignment allows. Errors name
// the operator (`what`) and the argument.
#pragma once

#include <cstdint>

#include "flare/core/error.h"
#include "flare/core/tensor.h"

namespace flare::sparse::gpu_operands {

// A contiguous `dtype` [size] tensor on `device`.
inline void check_array(const char* what, const TensorView& t, const char* name, DType dtype,
                        int64_t size, const Device& device) {
  FLARE_CHECK(t.ndim == 1 && t.shape[0] == size && t.dtype == dtype && t.device == device &&
                  (size <= 1 || t.strides[0] == 1) && (size == 0 || t.data != nullptr),
              ErrorCode::kInvalidArgument, what, ": ", name, " must be a contiguous ",
              dtype_name(dtype), " [", size, "] tensor on ", device.str(), ", got ",
              dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str());
}

// A float32 [rows, d] tensor on `device`, unit stride along d, rows any stride of at least d.
inline void check_dense(const char* what, const TensorView& t, const char* name, int64_t rows,
                        int64_t d, const Device& device) {
  FLARE_CHECK(t.ndim == 2 && t.shape[0] == rows && t.shape[1] == d && t.dtype == DType::kF32 &&
                  t.device == device && (d <= 1 || t.strides[1] == 1) &&
                  (rows <= 1 || t.strides[0] >= d),
              ErrorCode::kInvalidArgument, what, ": ", name, " must be a float32 [", rows, ", ", d,
              "] tensor on ", device.str(), " with unit stride along its last dimension, got ",
              dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str());
}

// The widest vector of 4, 2 or 1 floats that divides `floats` (a lane's share of a row) and that
// both float32 row-major tensors' addresses and row strides are aligned to.
inline int vector_width(int64_t floats, const TensorView& a, const TensorView& b) {
  for (int vec : {4, 2, 1}) {
    const auto aligned = [vec](const TensorView& t) {
      const int64_t bytes = vec * 4;
      return reinterpret_cast<uintptr_t>(t.data) % bytes == 0 &&
             (t.shape[0] <= 1 || t.strides[0] * 4 % bytes == 0);
    };
    if (floats % vec == 0 && aligned(a) && aligned(b)) return vec;
  }
  return 1;
}

}  // namespace flare::sparse::gpu_operands
