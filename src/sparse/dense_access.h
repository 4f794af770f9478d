// Element access to the CPU tensors of the sparse references (float64 arithmetic): strided
// reads and writes, and the shape checks of their dense operands.
#pragma once

#include <cstdint>
#include <string>

#include "flare/core/error.h"
#include "flare/core/tensor.h"

namespace flare::sparse_detail {

// `t` is a float32 [rows, d] CPU tensor (d == expected_d when that is >= 0); returns d.
inline int64_t check_dense(const TensorView& t, const char* name, int64_t rows,
                           int64_t expected_d) {
  FLARE_CHECK(t.device.is_cpu() && t.ndim == 2 && t.dtype == DType::kF32,
              ErrorCode::kInvalidArgument, name, " must be a 2-D float32 CPU tensor, got ",
              dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str());
  FLARE_CHECK(t.shape[0] == rows && (expected_d < 0 || t.shape[1] == expected_d),
              ErrorCode::kInvalidArgument, name, " must have shape [", rows, ", ",
              expected_d < 0 ? std::string("d") : std::to_string(expected_d), "], got ",
              t.shape_str());
  FLARE_CHECK(t.data != nullptr || t.numel() == 0, ErrorCode::kInvalidArgument, name,
              " has no data");
  return t.shape[1];
}

// `out` is SDDMM's output: float32 [nnz] on the CPU.
inline void check_sddmm_out(const TensorView& out, int64_t nnz) {
  FLARE_CHECK(out.device.is_cpu() && out.ndim == 1 && out.shape[0] == nnz &&
                  out.dtype == DType::kF32,
              ErrorCode::kInvalidArgument, "out must be float32 [", nnz, "] on the CPU, got ",
              dtype_name(out.dtype), " ", out.shape_str());
}

// Entry i of a 1-D int32 index array (validated by the caller).
inline int32_t index_at(const TensorView& t, int64_t i) {
  return t.ptr<const int32_t>()[i * t.strides[0]];
}

inline double load(const TensorView& t, int64_t i) {
  return t.ptr<const float>()[i * t.strides[0]];
}
inline double load(const TensorView& t, int64_t i, int64_t j) {
  return t.ptr<const float>()[i * t.strides[0] + j * t.strides[1]];
}
inline void store(const TensorView& t, int64_t i, double x) {
  t.ptr<float>()[i * t.strides[0]] = static_cast<float>(x);
}
inline void store(const TensorView& t, int64_t i, int64_t j, double x) {
  t.ptr<float>()[i * t.strides[0] + j * t.strides[1]] = static_cast<float>(x);
}

}  // namespace flare::sparse_detail
