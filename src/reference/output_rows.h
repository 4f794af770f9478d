// Writing float32 attention rows into a caller's output, shared by the plan executors
// (execute_plan.cpp, execute_cascade.cpp).
#pragma once

#include <cstdint>

#include "flare/core/dtype.h"
#include "flare/reference/attention.h"

namespace flare::reference_detail {

// Packed rows [row_begin, row_end) of a request whose first query token is first_token, under
// kv_head (packed row r: token r / group, query head kv_head * group + r % group): o [rows,
// head_dim] float32 stored in out.o's dtype, and lse [rows] into out.lse when write_lse and
// out.lse is given.
inline void write_output_rows(const AttentionOutput& out, int64_t group, int64_t head_dim,
                              int64_t first_token, int64_t kv_head, int64_t row_begin,
                              int64_t row_end, const float* o, const float* lse, bool write_lse) {
  const TensorView& o_view = out.o;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t token = first_token + row / group;
    const int64_t head = kv_head * group + row % group;
    const float* source = o + (row - row_begin) * head_dim;
    const int64_t base = token * o_view.strides[0] + head * o_view.strides[1];
    for (int64_t d = 0; d < head_dim; ++d) {
      store_float(o_view.data, o_view.dtype, base + d * o_view.strides[2], source[d]);
    }
    if (write_lse && out.lse) {
      const TensorView& lse_view = *out.lse;
      lse_view.ptr<float>()[token * lse_view.strides[0] + head * lse_view.strides[1]] =
          lse[row - row_begin];
    }
  }
}

}  // namespace flare::reference_detail
