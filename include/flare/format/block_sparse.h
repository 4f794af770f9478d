// The block-sparse row (BSR) index that every KV layout reduces to (papers 001 §3.1):
// row r of the matrix owns the column blocks indices[indptr[r] .. indptr[r+1]), each
// `block_size` columns wide, the last one holding only last_block_len[r] valid columns.
#pragma once

#include <cstdint>

#include "flare/core/tensor.h"

namespace flare {

// Rows are requests (or groups of requests sharing a prefix, for cascade levels); columns
// are KV slots. A paged KV cache is this index with block_size = page_size, a ragged KV
// cache is the same idea with one block per request. All arrays int32, 1-D; offsets that
// derive from them are computed in 64-bit.
struct BlockSparseIndex {
  int64_t block_size = 1;     // B_c >= 1 (the page size)
  TensorView indptr;          // int32 [num_rows + 1], non-decreasing, indptr[0] = 0
  TensorView indices;         // int32 [>= indptr[num_rows]], each in [0, num_blocks)
  TensorView last_block_len;  // int32 [num_rows]; in [1, block_size] when the row has blocks,
                              // ignored when it has none

  int64_t num_rows() const { return indptr.ndim == 1 ? indptr.shape[0] - 1 : 0; }
  // Host-only accessors (the arrays must be on the CPU).
  int64_t num_blocks(int64_t row) const;  // indptr[row + 1] - indptr[row]
  int64_t row_length(int64_t row) const;  // valid columns: (blocks - 1) * B_c + last, or 0
  // Block id and slot inside the block of column `col` of `row` (col < row_length(row)),
  // packed as block * block_size + slot (so block = result / B_c, slot = result % B_c).
  int64_t block_of(int64_t row, int64_t col) const;
};

// A block-sparse matrix: query rows (ragged, qo_indptr) x KV columns (BlockSparseIndex).
// Block row r covers queries [qo_indptr[r], qo_indptr[r+1]); B_r is the query tile chosen by
// the planner. Cascade levels reuse this with one block row spanning many requests.
struct BlockSparseMatrix {
  TensorView qo_indptr;  // int32 [num_rows + 1]
  BlockSparseIndex kv;
};

}  // namespace flare
