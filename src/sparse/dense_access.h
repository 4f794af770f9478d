// Element access to the CPU tensors of the sparse references (float64 arithmetic): strided
// reads and writes of float32, float16 and bfloat16 elements (a store rounds once, to nearest
// even), and the shape and dtype checks of their dense operands.
#pragma once

#include <cstdint>
#include <string>

#include "flare/core/dtype.h"
#include "flare/core/error.h"
#include "flare/core/tensor.h"

namespace flare::sparse_detail {

// The element types of sparse values and dense operands, on the CPU and the GPU: float32,
// float16 and bfloat16.
inline bool value_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// `t` is a 2-D CPU tensor [rows, d] (d == expected_d when that is >= 0) of float32, float16 or
// bfloat16, and of `like`'s dtype when `like` is given (the operation's first dense operand,
// named `like_name`); returns d.
inline int64_t check_dense(const TensorView& t, const char* name, int64_t rows, int64_t expected_d,
                           const TensorView* like = nullptr, const char* like_name = nullptr) {
  FLARE_CHECK(t.device.is_cpu() && t.ndim == 2 && value_dtype(t.dtype), ErrorCode::kInvalidArgument,
              name, " must be a 2-D float32, float16 or bfloat16 CPU tensor, got ",
              dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str());
  FLARE_CHECK(like == nullptr || t.dtype == like->dtype, ErrorCode::kInvalidArgument, name,
              " must have ", like_name, "'s dtype ",
              dtype_name(like != nullptr ? like->dtype : t.dtype), ", got ", dtype_name(t.dtype));
  FLARE_CHECK(t.shape[0] == rows && (expected_d < 0 || t.shape[1] == expected_d),
              ErrorCode::kInvalidArgument, name, " must have shape [", rows, ", ",
              expected_d < 0 ? std::string("d") : std::to_string(expected_d), "], got ",
              t.shape_str());
  FLARE_CHECK(t.data != nullptr || t.numel() == 0, ErrorCode::kInvalidArgument, name,
              " has no data");
  return t.shape[1];
}

// `out` is SDDMM's output: [nnz] on the CPU, of Q's dtype.
inline void check_sddmm_out(const TensorView& out, int64_t nnz, const TensorView& q) {
  FLARE_CHECK(out.device.is_cpu() && out.ndim == 1 && out.shape[0] == nnz && out.dtype == q.dtype,
              ErrorCode::kInvalidArgument, "out must be ", dtype_name(q.dtype), " [", nnz,
              "] (Q's dtype) on the CPU, got ", dtype_name(out.dtype), " ", out.shape_str());
}

// Entry i of a 1-D int32 index array (validated by the caller).
inline int32_t index_at(const TensorView& t, int64_t i) {
  return t.ptr<const int32_t>()[i * t.strides[0]];
}

// Element `offset` (in elements) of a float32 / float16 / bfloat16 tensor (checked by the caller).
inline double load_at(const TensorView& t, int64_t offset) {
  switch (t.dtype) {
    case DType::kF16:
      return f16_bits_to_float(t.ptr<const uint16_t>()[offset]);
    case DType::kBF16:
      return bf16_bits_to_float(t.ptr<const uint16_t>()[offset]);
    default:
      return t.ptr<const float>()[offset];
  }
}
// Rounds x to float32, then (16-bit dtypes) to the element type: float32 first, as the GPU
// kernels' float32 accumulators do.
inline void store_at(const TensorView& t, int64_t offset, double x) {
  const auto v = static_cast<float>(x);
  switch (t.dtype) {
    case DType::kF16:
      t.ptr<uint16_t>()[offset] = float_to_f16_bits(v);
      break;
    case DType::kBF16:
      t.ptr<uint16_t>()[offset] = float_to_bf16_bits(v);
      break;
    default:
      t.ptr<float>()[offset] = v;
  }
}

inline double load(const TensorView& t, int64_t i) { return load_at(t, i * t.strides[0]); }
inline double load(const TensorView& t, int64_t i, int64_t j) {
  return load_at(t, i * t.strides[0] + j * t.strides[1]);
}
inline void store(const TensorView& t, int64_t i, double x) { store_at(t, i * t.strides[0], x); }
inline void store(const TensorView& t, int64_t i, int64_t j, double x) {
  store_at(t, i * t.strides[0] + j * t.strides[1], x);
}

}  // namespace flare::sparse_detail
