// Host int32 index arrays for tests: a HostTensor from a list of values, an indptr from
// per-request lengths (qo_indptr, ragged kv_indptr), and reading an int32 array back.
#pragma once

#include <cstdint>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/tensor.h"

namespace flare::testing {

// int32 [values.size()] holding `values`.
inline HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor out(DType::kI32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) out.data<int32_t>()[i] = values[i];
  return out;
}

// Exclusive prefix sum of `lengths`: int32 [lengths.size() + 1], starting at 0.
inline std::vector<int32_t> indptr_values(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> indptr(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) indptr[i + 1] = indptr[i] + lengths[i];
  return indptr;
}

// int32 [batch + 1] indptr of per-request `lengths` (e.g. qo_indptr from query lengths).
inline HostTensor indptr_tensor(const std::vector<int32_t>& lengths) {
  return int32_tensor(indptr_values(lengths));
}

// The entries of a 1-D int32 CPU view (any stride).
inline std::vector<int32_t> int32_values(const TensorView& t) {
  FLARE_CHECK(t.dtype == DType::kI32 && t.ndim == 1 && t.device.is_cpu(),
              ErrorCode::kInvalidArgument, "int32_values needs a 1-D int32 CPU tensor, got ",
              dtype_name(t.dtype), " with ", t.ndim, " dimensions on ", t.device.str());
  std::vector<int32_t> out(static_cast<size_t>(t.shape[0]));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.ptr<int32_t>()[static_cast<int64_t>(i) * t.strides[0]];
  }
  return out;
}

}  // namespace flare::testing
