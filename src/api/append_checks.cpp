// The paged-KV appends' shared host checks (src/api/append_checks.h).
#include "src/api/append_checks.h"

#include "flare/core/error.h"
#include "flare/format/validate.h"

namespace flare::api_detail {

namespace {
constexpr auto kInvalid = ErrorCode::kInvalidArgument;
}  // namespace

int64_t host_index_entry(const TensorView& array, int64_t i) {
  return array.ptr<const int32_t>()[i * array.strides[0]];
}

void check_append_tokens(const TensorView& batch_indices, const TensorView& positions,
                         const BlockSparseIndex& table, int64_t page_size) {
  const int64_t batch = table.num_rows();
  for (int64_t i = 0; i < batch_indices.shape[0]; ++i) {
    const int64_t request = host_index_entry(batch_indices, i);
    if (request < 0) continue;
    FLARE_CHECK(request < batch, kInvalid, "batch_indices[", i, "]=", request,
                " is out of range [0, ", batch, ") (the batch size)");
    const int64_t pos = host_index_entry(positions, i);
    const int64_t capacity = table.num_blocks(request) * page_size;
    FLARE_CHECK(pos >= 0 && pos < capacity, kInvalid, "positions[", i, "]=", pos,
                " is outside request ", request, "'s pages: must be in [0, ", capacity, ") (",
                table.num_blocks(request), " pages of ", page_size, ")");
  }
}

int64_t append_page(const BlockSparseIndex& table, int64_t request, int64_t pos,
                    int64_t page_size) {
  return host_index_entry(table.indices, host_index_entry(table.indptr, request) + pos / page_size);
}

void check_contiguous_index(const TensorView& array, const char* name) {
  validate_dtype(array, name, DType::kI32);
  FLARE_CHECK(array.ndim == 1, kInvalid, name, " must be 1-D, got shape ", array.shape_str());
  FLARE_CHECK(array.shape[0] <= 1 || array.strides[0] == 1, kInvalid, name,
              " must be contiguous (stride 1) on the GPU, got stride ", array.strides[0]);
}

}  // namespace flare::api_detail
