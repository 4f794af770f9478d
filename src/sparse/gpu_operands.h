// The GPU sparse operators' shared argument checks (spmm_gpu.cpp, sddmm_gpu.cpp): index and value
// arrays, dense operands (float32, float16 or bfloat16), the feature sizes the kernels take and
// the widest vector load the operands' alignment allows. Errors name the operator (`what`) and
// the argument.
#pragma once

#include <cstdint>
#include <string>

#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "src/sparse/dense_access.h"

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

// A float32 / float16 / bfloat16 [rows, d] tensor on `device`, unit stride along d, rows any
// stride of at least d.
inline void check_dense(const char* what, const TensorView& t, const char* name, int64_t rows,
                        int64_t d, const Device& device) {
  FLARE_CHECK(t.ndim == 2 && t.shape[0] == rows && t.shape[1] == d &&
                  sparse_detail::value_dtype(t.dtype) && t.device == device &&
                  (d <= 1 || t.strides[1] == 1) && (rows <= 1 || t.strides[0] >= d),
              ErrorCode::kInvalidArgument, what, ": ", name,
              " must be a float32, float16 or bfloat16 [", rows, ", ", d, "] tensor on ",
              device.str(), " with unit stride along its last dimension, got ", dtype_name(t.dtype),
              " ", t.shape_str(), " on ", t.device.str());
}

// SpMM's dense operands: x [cols, d] on a CUDA device and y [rows, d] there, one float32 /
// float16 / bfloat16 dtype, unit stride along d (check_dense); returns d.
inline int64_t check_spmm_operands(const char* what, const TensorView& x, const TensorView& y,
                                   int64_t rows, int64_t cols) {
  FLARE_CHECK(x.device.is_cuda(), ErrorCode::kInvalidArgument, what,
              ": x must be a CUDA tensor (the CPU operator is spmm_reference), got x on ",
              x.device.str());
  const int64_t d = x.ndim == 2 ? x.shape[1] : -1;
  check_dense(what, x, "x", cols, d, x.device);
  check_dense(what, y, "y", rows, d, x.device);
  FLARE_CHECK(y.dtype == x.dtype, ErrorCode::kInvalidArgument, what, ": y must have x's dtype ",
              dtype_name(x.dtype), ", got ", dtype_name(y.dtype));
  return d;
}

// A decomposition's CSR remainder on the device (HybGpu's, BsrGpu's rest_* views) against its
// layout's host arrays: int32 rows, indptr and columns, values in `dtype`, on `device`.
template <class DeviceArrays, class Layout>
void check_remainder_arrays(const char* what, const DeviceArrays& a, const Layout& layout,
                            DType dtype, const Device& device) {
  const auto size = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  check_array(what, a.rest_rows, "A.rest_rows", DType::kI32, size(layout.rest_rows), device);
  check_array(what, a.rest_indptr, "A.rest_indptr", DType::kI32, size(layout.rest_indptr), device);
  check_array(what, a.rest_columns, "A.rest_columns", DType::kI32, size(layout.rest_columns),
              device);
  check_array(what, a.rest_values, "A.rest_values", dtype, size(layout.rest_columns), device);
}

// A workspace of at least `bytes` bytes (any when 0): a contiguous 1-D tensor of any dtype on
// `device`, 16-byte aligned; `sized_by` says which function sizes it, for the error.
inline void check_workspace(const char* what, const TensorView& workspace, size_t bytes,
                            const Device& device, const std::string& sized_by) {
  const int64_t size = workspace.ndim == 1
                           ? workspace.shape[0] * static_cast<int64_t>(dtype_bytes(workspace.dtype))
                           : 0;
  FLARE_CHECK(bytes == 0 || (workspace.ndim == 1 && workspace.device == device &&
                             (workspace.shape[0] <= 1 || workspace.strides[0] == 1) &&
                             size >= static_cast<int64_t>(bytes) &&
                             reinterpret_cast<uintptr_t>(workspace.data) % 16 == 0),
              ErrorCode::kInvalidArgument, what, ": workspace must be a contiguous 1-D tensor on ",
              device.str(), " of at least ", bytes, " bytes (", sized_by,
              "), 16-byte aligned; got ", dtype_name(workspace.dtype), " ", workspace.shape_str(),
              " (", size, " bytes) on ", workspace.device.str());
}

// Whether the kernels' lanes tile a row of d elements in vectors of `vec`: d / vec lanes, a
// multiple of 32 (a lane takes several vectors) or a divisor of 32 (a warp takes several rows).
inline bool lanes_tile(int64_t d, int vec) {
  if (d % vec != 0) return false;
  const int64_t lanes = d / vec;
  return lanes % 32 == 0 || 32 % lanes == 0;
}

// Feature sizes the kernels take: a positive multiple of 32 or a power of two below 32.
inline bool feature_size_supported(int64_t d) { return d > 0 && lanes_tile(d, 1); }

// A kernel configuration the sparse kernels compile: a supported feature size (kUnsupported
// otherwise), float32 / float16 / bfloat16 (kUnsupported), and a vector of `vec` elements, a
// power of two of at most 16 bytes whose lanes tile d (kInvalidArgument).
inline void check_kernel_spec(const char* what, int features, int vec, DType dtype) {
  FLARE_CHECK(feature_size_supported(features), ErrorCode::kUnsupported, what,
              ": the GPU kernel takes feature sizes that are positive multiples of 32 or powers "
              "of two below 32, got ",
              features);
  FLARE_CHECK(sparse_detail::value_dtype(dtype), ErrorCode::kUnsupported, what,
              ": the GPU kernel takes float32, float16 or bfloat16, got ", dtype_name(dtype));
  FLARE_CHECK(vec >= 1 && vec * static_cast<int>(dtype_bytes(dtype)) <= 16 &&
                  (vec & (vec - 1)) == 0 && lanes_tile(features, vec),
              ErrorCode::kInvalidArgument, what, ": vector width ", vec,
              " must be a power of two of at most 16 bytes whose lanes tile d = ", features);
}

// The widest vector (at most 16 bytes) of elements of the two tensors' dtype whose lanes tile d
// and that both tensors' addresses and row strides are aligned to.
inline int vector_width(int64_t d, const TensorView& a, const TensorView& b) {
  const int element = static_cast<int>(dtype_bytes(a.dtype));
  for (int vec = 16 / element; vec > 1; vec /= 2) {
    const int64_t bytes = int64_t{vec} * element;
    const auto aligned = [bytes](const TensorView& t) {
      return reinterpret_cast<uintptr_t>(t.data) % bytes == 0 &&
             (t.shape[0] <= 1 ||
              t.strides[0] * static_cast<int64_t>(dtype_bytes(t.dtype)) % bytes == 0);
    };
    if (lanes_tile(d, vec) && aligned(a) && aligned(b)) return vec;
  }
  return 1;
}

}  // namespace flare::sparse::gpu_operands
