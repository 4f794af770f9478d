// CSR -> BSR conversion, the BSR + CSR remainder split, and their SpMM references
// (flare/sparse/bsr.h).
#include "flare/sparse/bsr.h"

#include <algorithm>
#include <map>
#include <vector>

#include "flare/core/error.h"
#include "src/sparse/dense_access.h"
#include "src/sparse/remainder.h"

namespace flare::sparse {
namespace {

void check_blocks(const Csr& a, int block_rows, int block_cols, const char* what) {
  validate_csr(a);
  FLARE_CHECK(a.values.has_value(), ErrorCode::kInvalidArgument, what, ": A.values is required");
  FLARE_CHECK(block_rows >= 1 && block_rows <= 256 && block_cols >= 1 && block_cols <= 256,
              ErrorCode::kInvalidArgument, what,
              ": block_rows and block_cols must be in [1, 256], got ", block_rows, " x ",
              block_cols);
}

// A nonzero of a block row: its row within the block row and its index in A.
struct BlockNonzero {
  int32_t row;
  int64_t e;
};

// For block row b: block column -> its nonzeros, in row-major order of (row, column) since rows
// are visited in order and columns are sorted.
std::map<int32_t, std::vector<BlockNonzero>> blocks_of_row(const Csr& a, int64_t b, int block_rows,
                                                           int block_cols) {
  std::map<int32_t, std::vector<BlockNonzero>> blocks;
  const int64_t row_end = std::min<int64_t>(a.rows, (b + 1) * block_rows);
  for (int64_t r = b * block_rows; r < row_end; ++r) {
    for (int64_t e = sparse_detail::index_at(a.indptr, r);
         e < sparse_detail::index_at(a.indptr, r + 1); ++e) {
      blocks[static_cast<int32_t>(sparse_detail::index_at(a.indices, e) / block_cols)].push_back(
          {static_cast<int32_t>(r - b * block_rows), e});
    }
  }
  return blocks;
}

void append_block(const Csr& a, int32_t block_col, const std::vector<BlockNonzero>& nonzeros,
                  Bsr& out) {
  const size_t base = out.values.size();
  const size_t slots = static_cast<size_t>(out.block_rows) * static_cast<size_t>(out.block_cols);
  out.block_col.push_back(block_col);
  out.values.resize(base + slots, 0.0);
  out.source.resize(base + slots, -1);
  for (const auto& [r, e] : nonzeros) {
    const int64_t c = sparse_detail::index_at(a.indices, e) % out.block_cols;
    const size_t slot = base + static_cast<size_t>(r * out.block_cols + c);
    out.values[slot] = sparse_detail::load(*a.values, e);
    out.source[slot] = e;
  }
}

Bsr empty_bsr(const Csr& a, int block_rows, int block_cols) {
  Bsr out;
  out.rows = a.rows;
  out.cols = a.cols;
  out.block_rows = block_rows;
  out.block_cols = block_cols;
  out.indptr.push_back(0);
  return out;
}

}  // namespace

Bsr bsr_from_csr(const Csr& a, int block_rows, int block_cols) {
  return bsr_split(a, block_rows, block_cols, 0.0).blocks;
}

double BsrWithRemainder::padding_ratio() const {
  if (nnz == 0) return 1.0;
  const int64_t stored =
      static_cast<int64_t>(blocks.values.size()) + static_cast<int64_t>(remainder.columns.size());
  return static_cast<double>(stored) / static_cast<double>(nnz);
}

BsrWithRemainder bsr_split(const Csr& a, int block_rows, int block_cols, double min_fill) {
  check_blocks(a, block_rows, block_cols, "bsr_split");
  FLARE_CHECK(min_fill >= 0.0 && min_fill <= 1.0, ErrorCode::kInvalidArgument,
              "bsr_split: min_fill must be in [0, 1], got ", min_fill);
  BsrWithRemainder out;
  out.blocks = empty_bsr(a, block_rows, block_cols);
  out.nnz = a.nnz();
  out.remainder.indptr.push_back(0);
  const double needed = min_fill * block_rows * block_cols;
  std::vector<std::vector<int64_t>> rest_of_row(static_cast<size_t>(block_rows));
  const int64_t block_row_count = (a.rows + block_rows - 1) / block_rows;
  for (int64_t b = 0; b < block_row_count; ++b) {
    for (auto& row : rest_of_row) row.clear();
    for (const auto& [block_col, nonzeros] : blocks_of_row(a, b, block_rows, block_cols)) {
      if (static_cast<double>(nonzeros.size()) >= needed) {
        append_block(a, block_col, nonzeros, out.blocks);
        continue;
      }
      for (const auto& [r, e] : nonzeros) rest_of_row[static_cast<size_t>(r)].push_back(e);
    }
    out.blocks.indptr.push_back(out.blocks.blocks());
    // The remainder's rows in order, each row's nonzeros in column order.
    for (int r = 0; r < block_rows; ++r) {
      std::vector<int64_t>& row = rest_of_row[static_cast<size_t>(r)];
      if (row.empty()) continue;
      // Ascending already: block columns are visited in order, and a row's nonzeros in a block
      // in column order.
      sparse_detail::append_remainder_row(a, static_cast<int32_t>(b * block_rows + r), row,
                                          out.remainder);
    }
  }
  return out;
}

namespace {

// Y = A X over the blocks of `b` and, when given, a remainder.
void spmm_blocks(const Bsr& b, const CsrRemainder* remainder, const TensorView& x,
                 const TensorView& y) {
  const int64_t d = sparse_detail::check_dense(x, "X", b.cols, -1);
  sparse_detail::check_dense(y, "Y", b.rows, d, &x, "X");
  std::vector<double> sum(static_cast<size_t>(b.rows * d), 0.0);
  const auto add = [&](int64_t row, int64_t col, double value) {
    for (int64_t f = 0; f < d; ++f) {
      sum[static_cast<size_t>(row * d + f)] += value * sparse_detail::load(x, col, f);
    }
  };
  for (int64_t br = 0; br + 1 < static_cast<int64_t>(b.indptr.size()); ++br) {
    for (int64_t blk = b.indptr[static_cast<size_t>(br)];
         blk < b.indptr[static_cast<size_t>(br + 1)]; ++blk) {
      for (int r = 0; r < b.block_rows; ++r) {
        for (int c = 0; c < b.block_cols; ++c) {
          const size_t slot = static_cast<size_t>((blk * b.block_rows + r) * b.block_cols + c);
          if (b.source[slot] < 0) continue;  // padding (possibly outside the matrix)
          add(br * b.block_rows + r,
              int64_t{b.block_col[static_cast<size_t>(blk)]} * b.block_cols + c, b.values[slot]);
        }
      }
    }
  }
  if (remainder != nullptr) sparse_detail::for_each_remainder_nonzero(*remainder, add);
  for (int64_t r = 0; r < b.rows; ++r) {
    for (int64_t f = 0; f < d; ++f) {
      sparse_detail::store(y, r, f, sum[static_cast<size_t>(r * d + f)]);
    }
  }
}

}  // namespace

void spmm_reference(const Bsr& a, const TensorView& x, const TensorView& y) {
  spmm_blocks(a, nullptr, x, y);
}

void spmm_reference(const BsrWithRemainder& a, const TensorView& x, const TensorView& y) {
  spmm_blocks(a.blocks, &a.remainder, x, y);
}

}  // namespace flare::sparse
