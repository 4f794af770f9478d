// Host accessors of the block-sparse (BSR) KV index: blocks per row, valid columns per row,
// and the pool position (block * block_size + slot) of a row's column.
#include "flare/format/block_sparse.h"

#include "flare/core/error.h"
#include "index_array.h"

namespace flare {

using format_detail::read_index;

int64_t BlockSparseIndex::num_blocks(int64_t row) const {
  FLARE_CHECK(row >= 0 && row < num_rows(), ErrorCode::kInvalidArgument, "row ", row,
              " is out of range [0, ", num_rows(), ")");
  return read_index(indptr, "indptr", row + 1) - read_index(indptr, "indptr", row);
}

int64_t BlockSparseIndex::row_length(int64_t row) const {
  const int64_t blocks = num_blocks(row);
  if (blocks == 0) return 0;  // last_block_len is ignored for an empty row
  return (blocks - 1) * block_size + read_index(last_block_len, "last_block_len", row);
}

int64_t BlockSparseIndex::block_of(int64_t row, int64_t col) const {
  const int64_t length = row_length(row);
  FLARE_CHECK(col >= 0 && col < length, ErrorCode::kInvalidArgument, "column ", col, " of row ",
              row, " is out of range [0, ", length, ")");
  const int64_t block =
      read_index(indices, "indices", read_index(indptr, "indptr", row) + col / block_size);
  return block * block_size + col % block_size;
}

}  // namespace flare
