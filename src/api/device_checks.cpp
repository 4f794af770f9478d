// Checks of the device tensors that BatchDecode::run() and BatchPrefill::run() take (the
// messages name the caller, the tensor, and the expected and actual values).
#include "src/api/device_checks.h"

#include <limits>
#include <string>

#include "flare/core/error.h"

namespace flare::api_detail {

bool aligned(const TensorView& t, int outer_dims) {
  if (reinterpret_cast<uintptr_t>(t.data) % kVectorAlignment != 0) return false;
  const size_t bytes = dtype_bytes(t.dtype);
  for (int d = 0; d < outer_dims; ++d) {
    if ((static_cast<size_t>(t.strides[d]) * bytes) % kVectorAlignment != 0) return false;
  }
  return true;
}

TensorView without_unit_strides(TensorView t) {
  for (int dim = 0; dim < t.ndim; ++dim) {
    if (t.shape[dim] == 1) t.strides[dim] = 0;
  }
  return t;
}

void check_device_tensor(const char* what, const TensorView& t, const char* name, int device,
                         DType dtype, std::span<const int64_t> shape, bool vectorized) {
  FLARE_CHECK(t.data != nullptr, ErrorCode::kInvalidArgument, what, ": ", name, " is null");
  FLARE_CHECK(t.device == Device::cuda(device), ErrorCode::kInvalidArgument, what, ": ", name,
              " must be on cuda:", device, ", got ", t.device.str());
  FLARE_CHECK(t.dtype == dtype, ErrorCode::kInvalidArgument, what, ": ", name, " must be ",
              dtype_name(dtype), ", got ", dtype_name(t.dtype));
  bool same = t.ndim == static_cast<int>(shape.size());
  for (size_t d = 0; same && d < shape.size(); ++d) same = t.shape[d] == shape[d];
  if (!same) {
    std::string expected;
    for (const int64_t extent : shape)
      expected += (expected.empty() ? "" : ", ") + std::to_string(extent);
    fail(ErrorCode::kInvalidArgument, what, ": ", name, " must have shape [", expected, "], got ",
         t.shape_str());
  }
  for (int i = 0; i < t.ndim; ++i) {
    FLARE_CHECK(t.strides[i] >= 0, ErrorCode::kInvalidArgument, what, ": ", name,
                " strides must be >= 0, got ", t.strides[i], " in dimension ", i);
  }
  if (vectorized) {
    FLARE_CHECK(t.strides[t.ndim - 1] == 1, ErrorCode::kInvalidArgument, what, ": ", name,
                " must have a unit innermost stride, got ", t.strides[t.ndim - 1]);
    FLARE_CHECK(aligned(t, t.ndim - 1), ErrorCode::kInvalidArgument, what, ": ", name,
                " needs a 16-byte aligned data pointer and outer strides that are multiples of "
                "16 bytes");
  }
}

KVStrides kv_strides(const TensorView& t, KVLayout layout) {
  if (t.ndim == 3) return {t.strides[0], 0, t.strides[1]};
  const bool nhd = layout == KVLayout::kNHD;
  return {t.strides[0], nhd ? t.strides[1] : t.strides[2], nhd ? t.strides[2] : t.strides[1]};
}

void check_page_strides_fit_int32(const char* what, const char* name, int64_t page_stride,
                                  int64_t slot_stride, int64_t page_size, int64_t element_bytes) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  FLARE_CHECK(
      page_stride * element_bytes <= kMax && (page_size - 1) * slot_stride * element_bytes <= kMax,
      ErrorCode::kUnsupported, what, ": ", name, " page stride ", page_stride, " and slot stride ",
      slot_stride, " elements: a page must span under 2^31 bytes");
}

}  // namespace flare::api_detail
