// Host accessors of ragged tensors: batch size, row begin and row length from an indptr.
#include "flare/format/ragged.h"

#include "flare/core/error.h"
#include "index_array.h"

namespace flare {

int64_t ragged_batch(const TensorView& indptr) {
  FLARE_CHECK(indptr.ndim == 1 && indptr.shape[0] >= 1, ErrorCode::kInvalidArgument,
              "indptr must be 1-D with at least one entry (batch + 1), got shape ",
              indptr.shape_str());
  return indptr.shape[0] - 1;
}

int64_t ragged_begin(const TensorView& indptr, int64_t i) {
  return format_detail::read_index(indptr, "indptr", i);
}

int64_t ragged_length(const TensorView& indptr, int64_t i) {
  FLARE_CHECK(i >= 0 && i < ragged_batch(indptr), ErrorCode::kInvalidArgument, "request ", i,
              " is out of range [0, ", ragged_batch(indptr), ")");
  return format_detail::read_index(indptr, "indptr", i + 1) -
         format_detail::read_index(indptr, "indptr", i);
}

}  // namespace flare
