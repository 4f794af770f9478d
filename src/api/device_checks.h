// Checks of the device tensors that BatchDecode::run() and BatchPrefill::run() take: device,
// dtype, shape, non-negative strides and, for vectorized loads, unit rows and 16-byte alignment.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "flare/core/dtype.h"
#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"

namespace flare::api_detail {

// The alignment of the kernels' 16-byte vector loads and stores.
inline constexpr size_t kVectorAlignment = 16;

// Whether the data pointer and the byte strides of the first `outer_dims` dimensions are
// multiples of kVectorAlignment.
bool aligned(const TensorView& t, int outer_dims);

// `t` with the strides of its size-1 dimensions zeroed: they never move a pointer, so they
// cannot spoil the alignment (aligned) nor differ between two views of the same elements.
TensorView without_unit_strides(TensorView t);

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

// The page (or row), slot and head strides, in elements, of a K/V tensor the kernels address:
// 4-D pages in `layout` (NHD [pages, page_size, H, D], HND [pages, H, page_size, D]), or 3-D
// rows [rows, H, D] (slot 0).
struct KVStrides {
  int64_t unit = 0, slot = 0, head = 0;
};
KVStrides kv_strides(const TensorView& t, KVLayout layout);

// Throws kUnsupported unless a page's byte stride and the last slot's byte offset of a paged
// K or V tensor (`name`) fit int32: the kernels form them with 32-bit multiplies (the page id
// itself may address any pool size).
void check_page_strides_fit_int32(const char* what, const char* name, int64_t page_stride,
                                  int64_t slot_stride, int64_t page_size, int64_t element_bytes);

}  // namespace flare::api_detail
