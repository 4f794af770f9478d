// Checks of the device tensors that BatchDecode::run() and BatchPrefill::run() take: device,
// dtype, shape, non-negative strides and, for vectorized loads, unit rows and 16-byte alignment.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "flare/core/dtype.h"
#include "flare/core/tensor.h"

namespace flare::api_detail {

// The alignment of the kernels' 16-byte vector loads and stores.
inline constexpr size_t kVectorAlignment = 16;

// Whether the data pointer and the byte strides of the first `outer_dims` dimensions are
// multiples of kVectorAlignment.
bool aligned(const TensorView& t, int outer_dims);

// Throws kInvalidArgument, messages prefixed with `what` (the caller's class name), unless `t`
// is a non-null tensor of `dtype` and `shape` on cuda:`device` with strides >= 0; a
// `vectorized` tensor also needs a unit innermost stride and aligned(t, ndim - 1).
void check_device_tensor(const char* what, const TensorView& t, const char* name, int device,
                         DType dtype, std::span<const int64_t> shape, bool vectorized);

inline void check_device_tensor(const char* what, const TensorView& t, const char* name, int device,
                                DType dtype, std::initializer_list<int64_t> shape,
                                bool vectorized) {
  check_device_tensor(what, t, name, device, dtype,
                      std::span<const int64_t>(shape.begin(), shape.size()), vectorized);
}

}  // namespace flare::api_detail
