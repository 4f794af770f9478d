// FlashInfer's variable block-sparse layout as one paged batch (flare/format/variable_blocks.h):
// one pass over the mask, page ids written run by run. The Python wrapper's array operations for
// the same cost ~100-250 us of host time at 16 requests (docs/perf.md, forty-ninth session).
#include "flare/format/variable_blocks.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "flare/core/error.h"

namespace flare {
namespace {

constexpr auto kInvalid = ErrorCode::kInvalidArgument;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Entry (h, i) of a 2-D int32 or int64 host tensor.
int64_t size_at(const TensorView& t, int64_t h, int64_t i) {
  const int64_t offset = h * t.strides[0] + i * t.strides[1];
  return t.dtype == DType::kI32 ? static_cast<const int32_t*>(t.data)[offset]
                                : static_cast<const int64_t*>(t.data)[offset];
}

void check_sizes(const TensorView& t, const char* name, int64_t heads, int64_t blocks,
                 const char* blocks_name) {
  FLARE_CHECK(t.ndim == 2 && t.shape[0] == heads && t.shape[1] == blocks, kInvalid, name,
              " must have shape [num_kv_heads, ", blocks_name, "] = [", heads, ", ", blocks,
              "] (from block_mask_map), got ", t.shape_str());
  FLARE_CHECK(t.dtype == DType::kI32 || t.dtype == DType::kI64, kInvalid, name,
              " must hold int32 or int64, got ", dtype_name(t.dtype));
  FLARE_CHECK(!t.device.is_cuda(), kInvalid, name, " must be on the host here");
}

// What every head's sizes sum to; kInvalidArgument for a negative size or heads that differ.
int64_t common_length(const TensorView& sizes, const char* name, const char* length_name) {
  int64_t first = 0;
  for (int64_t h = 0; h < sizes.shape[0]; ++h) {
    int64_t sum = 0;
    for (int64_t b = 0; b < sizes.shape[1]; ++b) {
      const int64_t size = size_at(sizes, h, b);
      FLARE_CHECK(size >= 0, kInvalid, name, "[", h, ", ", b, "] is ", size, "; sizes are >= 0");
      sum += size;
      FLARE_CHECK(sum <= kInt32Max, ErrorCode::kUnsupported, name, "[", h, "] sums past 2^31 - 1");
    }
    if (h == 0) first = sum;
    FLARE_CHECK(sum == first, kInvalid, "every KV head's ", name, " must sum to one ", length_name,
                ": head 0 sums to ", first, ", head ", h, " to ", sum);
  }
  return first;
}

}  // namespace

void variable_block_batch(const TensorView& mask, const TensorView& row_sizes,
                          const TensorView& col_sizes, VariableBlockBatch& out) {
  FLARE_CHECK(mask.ndim == 3, kInvalid,
              "block_mask_map must have rank 3 [num_kv_heads, MB, NB], got ", mask.shape_str());
  FLARE_CHECK(mask.dtype == DType::kU8, kInvalid, "block_mask_map must be bool (or uint8), got ",
              dtype_name(mask.dtype));
  FLARE_CHECK(!mask.device.is_cuda(), kInvalid, "block_mask_map must be on the host here");
  const int64_t heads = mask.shape[0], row_blocks = mask.shape[1], col_blocks = mask.shape[2];
  check_sizes(row_sizes, "block_row_sz", heads, row_blocks, "MB");
  check_sizes(col_sizes, "block_col_sz", heads, col_blocks, "NB");
  out.qo_len = common_length(row_sizes, "block_row_sz", "qo_len");
  out.kv_len = common_length(col_sizes, "block_col_sz", "kv_len");
  FLARE_CHECK(heads * out.qo_len <= kInt32Max && heads * out.kv_len <= kInt32Max,
              ErrorCode::kUnsupported,
              "num_kv_heads x qo_len and num_kv_heads x kv_len must stay "
              "below 2^31, got ",
              heads, " x ", out.qo_len, " and ", heads, " x ", out.kv_len);

  const int64_t requests = heads * row_blocks;
  out.qo_indptr.assign(static_cast<size_t>(requests + 1), 0);
  out.kv_indptr.assign(static_cast<size_t>(requests + 1), 0);
  out.last_page_len.assign(static_cast<size_t>(requests), 0);
  out.indices.clear();
  std::vector<int64_t> col_start(static_cast<size_t>(col_blocks));
  const auto* visible = static_cast<const uint8_t*>(mask.data);
  int64_t rows = 0;
  for (int64_t h = 0; h < heads; ++h) {
    int64_t start = h * out.kv_len;  // page id of the head's token 0
    for (int64_t j = 0; j < col_blocks; ++j) {
      col_start[static_cast<size_t>(j)] = start;
      start += size_at(col_sizes, h, j);
    }
    for (int64_t i = 0; i < row_blocks; ++i) {
      const int64_t request = h * row_blocks + i;
      rows += size_at(row_sizes, h, i);
      for (int64_t j = 0; j < col_blocks; ++j) {
        if (visible[h * mask.strides[0] + i * mask.strides[1] + j * mask.strides[2]] == 0) {
          continue;
        }
        const int64_t first = col_start[static_cast<size_t>(j)];
        const int64_t count = size_at(col_sizes, h, j);
        FLARE_CHECK(static_cast<int64_t>(out.indices.size()) + count <= kInt32Max,
                    ErrorCode::kUnsupported,
                    "the visible blocks list 2^31 or more tokens (page ids) in all");
        for (int64_t t = 0; t < count; ++t) out.indices.push_back(static_cast<int32_t>(first + t));
      }
      out.qo_indptr[static_cast<size_t>(request + 1)] = static_cast<int32_t>(rows);
      out.kv_indptr[static_cast<size_t>(request + 1)] = static_cast<int32_t>(out.indices.size());
      out.last_page_len[static_cast<size_t>(request)] =
          out.kv_indptr[static_cast<size_t>(request + 1)] >
                  out.kv_indptr[static_cast<size_t>(request)]
              ? 1
              : 0;
    }
  }
}

}  // namespace flare
