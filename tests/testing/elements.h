// Element-wise access to strided CPU TensorViews for tests: visit every element in row-major
// order, read or write it as float, carve padded sub-views out of a buffer, rebase views.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/tensor.h"

namespace flare::testing {

// Throws kInvalidArgument unless `t` lives on the CPU (the helpers dereference t.data).
inline void require_cpu(const TensorView& t, const char* what) {
  FLARE_CHECK(t.device.is_cpu(), ErrorCode::kInvalidArgument, what,
              " must be a CPU tensor for this test helper, got ", t.device.str());
}

// Number of elements of `t` (1 for a 0-d view), computed from the shape alone.
inline int64_t element_count(const TensorView& t) {
  int64_t count = 1;
  for (int d = 0; d < t.ndim; ++d) count *= t.shape[d];
  return count;
}

// Calls visit(linear, offset) for every element of `t`: `linear` runs 0, 1, ... in row-major
// order of the logical shape, `offset` is that element's strided offset (in elements) from
// t.data. Works for any strides, including 0 and padded ones.
template <class Visit>
void for_each_element(const TensorView& t, Visit&& visit) {
  if (element_count(t) == 0) return;
  std::array<int64_t, kMaxDims> index{};
  int64_t offset = 0;
  for (int64_t linear = 0;; ++linear) {
    visit(linear, offset);
    int d = t.ndim - 1;
    for (; d >= 0; --d) {
      if (++index[d] < t.shape[d]) {
        offset += t.strides[d];
        break;
      }
      offset -= (t.shape[d] - 1) * t.strides[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// The element at strided `offset` of a floating view, as float (exact for every dtype).
inline float element_at(const TensorView& t, int64_t offset) {
  return load_float(t.data, t.dtype, offset);
}

// Rounds x to t's floating dtype and stores it at strided `offset` of t.data.
inline void set_element_at(const TensorView& t, int64_t offset, float x) {
  store_float(t.data, t.dtype, offset, x);
}

// Row-major copy of any CPU view (any dtype, any strides) into a new contiguous HostTensor
// of the same dtype; bytes are copied, so no rounding happens.
inline HostTensor to_contiguous(const TensorView& t) {
  require_cpu(t, "to_contiguous input");
  HostTensor out(t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim));
  const size_t bytes = dtype_bytes(t.dtype);
  const auto* src = static_cast<const std::byte*>(t.data);
  auto* dst = out.data<std::byte>();
  for_each_element(t, [&](int64_t linear, int64_t offset) {
    std::memcpy(dst + linear * bytes, src + offset * bytes, bytes);
  });
  return out;
}

// Row-major values of a floating CPU view as double (for float64 references and comparisons).
inline std::vector<double> to_double_vector(const TensorView& t) {
  require_cpu(t, "to_double_vector input");
  FLARE_CHECK(is_floating(t.dtype), ErrorCode::kInvalidArgument,
              "to_double_vector needs a floating dtype, got ", dtype_name(t.dtype));
  std::vector<double> out(static_cast<size_t>(element_count(t)));
  for_each_element(t, [&](int64_t linear, int64_t offset) {
    out[static_cast<size_t>(linear)] = element_at(t, offset);
  });
  return out;
}

// A view of `shape` starting at element `begin` (one index per dimension) of a contiguous
// `storage` whose shape is at least begin + shape in every dimension; it keeps the storage's
// strides, so a storage larger than the view yields a padded, non-contiguous view.
inline TensorView sub_view(const HostTensor& storage, const std::vector<int64_t>& begin,
                           const std::vector<int64_t>& shape) {
  const std::vector<int64_t>& full = storage.shape();
  FLARE_CHECK(begin.size() == full.size() && shape.size() == full.size(),
              ErrorCode::kInvalidArgument, "sub_view: begin and shape need ", full.size(),
              " entries, got ", begin.size(), " and ", shape.size());
  TensorView view;
  view.dtype = storage.dtype();
  view.ndim = static_cast<int>(full.size());
  int64_t stride = 1;
  int64_t offset = 0;
  for (int d = view.ndim - 1; d >= 0; --d) {
    FLARE_CHECK(begin[d] >= 0 && shape[d] >= 0 && begin[d] + shape[d] <= full[d],
                ErrorCode::kInvalidArgument, "sub_view: dimension ", d, " range [", begin[d], ", ",
                begin[d] + shape[d], ") exceeds the storage size ", full[d]);
    view.shape[d] = shape[d];
    view.strides[d] = stride;
    offset += begin[d] * stride;
    stride *= full[d];
  }
  view.data = storage.data<std::byte>() + offset * static_cast<int64_t>(dtype_bytes(view.dtype));
  return view;
}

// `view` moved from a buffer starting at `old_base` to the same layout in a copy of that
// buffer starting at `new_base` (e.g. the device copy of a HostTensor's bytes).
inline TensorView rebase_view(const TensorView& view, const void* old_base, void* new_base,
                              Device device) {
  TensorView out = view;
  const auto byte_offset =
      static_cast<const std::byte*>(view.data) - static_cast<const std::byte*>(old_base);
  out.data = static_cast<std::byte*>(new_base) + byte_offset;
  out.device = device;
  return out;
}

}  // namespace flare::testing
