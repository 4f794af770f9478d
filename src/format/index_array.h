// Host reads of int32 index arrays (indptr, indices, last_page_len) for the format layer's
// accessors: one bounds- and device-checked element read, shared by its .cpp files.
#pragma once

#include <cstdint>

#include "flare/core/error.h"
#include "flare/core/tensor.h"

namespace flare::format_detail {

// Entry `i` of the 1-D int32 CPU array `array` (any stride), widened to 64-bit.
inline int64_t read_index(const TensorView& array, const char* name, int64_t i) {
  FLARE_CHECK(array.device.is_cpu(), ErrorCode::kInvalidArgument, name,
              " must be on the CPU for host access, got ", array.device.str());
  FLARE_CHECK(array.dtype == DType::kI32 && array.ndim == 1, ErrorCode::kInvalidArgument, name,
              " must be a 1-D int32 array, got ", dtype_name(array.dtype), " ", array.shape_str());
  FLARE_CHECK(i >= 0 && i < array.shape[0], ErrorCode::kInvalidArgument, name, " index ", i,
              " is out of range [0, ", array.shape[0], ")");
  return array.ptr<const int32_t>()[i * array.strides[0]];
}

}  // namespace flare::format_detail
