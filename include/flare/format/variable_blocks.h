// FlashInfer's variable block-sparse layout (flashinfer.sparse.VariableBlockSparseAttention-
// Wrapper) as one paged batch of page size 1 and one KV head (composable formats, papers 001
// §3.1): KV head h partitions the query rows into row blocks (block_row_sz[h]) and the keys into
// column blocks (block_col_sz[h]); block_mask_map[h, i, j] lets row block i of head h see column
// block j. Request h * MB + i holds the query rows of row block i of head h (the rows
// [h * qo_len + row start, ...) of q viewed as [H_kv * qo_len] rows); its pages are the tokens of
// its visible column blocks in column order, page id h * kv_len + token (K and V viewed as
// [H_kv * kv_len] pages of one token).
#pragma once

#include <cstdint>
#include <vector>

#include "flare/core/tensor.h"

namespace flare {

struct VariableBlockBatch {
  int64_t qo_len = 0;                  // what every head's row sizes sum to
  int64_t kv_len = 0;                  // what every head's column sizes sum to
  std::vector<int32_t> qo_indptr;      // [H * MB + 1]
  std::vector<int32_t> kv_indptr;      // [H * MB + 1]
  std::vector<int32_t> indices;        // [kv_indptr.back()]
  std::vector<int32_t> last_page_len;  // [H * MB]: 1 for a request with pages, else 0
};

// Host tensors, any strides: mask uint8 (bool) [H, MB, NB], nonzero = visible; row_sizes and
// col_sizes int32 or int64 [H, MB] and [H, NB]. Throws kInvalidArgument naming block_mask_map,
// block_row_sz or block_col_sz (ranks, shapes, negative sizes, heads whose sizes sum
// differently), and kUnsupported when the batch's rows or page ids reach 2^31.
// O(H * MB * NB + visible tokens).
void variable_block_batch(const TensorView& mask, const TensorView& row_sizes,
                          const TensorView& col_sizes, VariableBlockBatch& out);

}  // namespace flare
