// Block sparse row (BSR) matrices of R x C blocks converted from CSR, and the composable "BSR +
// CSR remainder" decomposition (issue 23): the blocks dense enough for tensor-core tiles go to
// BSR, the scattered nonzeros stay CSR. Deterministic; every nonzero lands in exactly one place.
#pragma once

#include <cstdint>
#include <vector>

#include "flare/sparse/csr.h"
#include "flare/sparse/hyb.h"

namespace flare::sparse {

// Block row b covers rows [b R, b R + R) and block column j columns [j C, j C + C); the last
// ones may stick out past the matrix (their outside slots are padding).
struct Bsr {
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 1;              // R
  int block_cols = 1;              // C
  std::vector<int64_t> indptr;     // [ceil(rows / R) + 1]: block row b's blocks
  std::vector<int32_t> block_col;  // [blocks], increasing within a block row
  std::vector<double> values;      // [blocks][R][C], padding 0
  std::vector<int64_t> source;     // [blocks][R][C]: the nonzero's index in A, -1 for padding

  int64_t blocks() const { return static_cast<int64_t>(block_col.size()); }
};

// The blocks of `a` that hold at least one nonzero. R, C in [1, 256]; `a` validated first
// (values needed). Throws kInvalidArgument naming the bad argument.
Bsr bsr_from_csr(const Csr& a, int block_rows, int block_cols);

// BSR + CSR remainder: the blocks holding at least min_fill * R * C nonzeros, and every other
// nonzero in CSR (rows in increasing order, the rows without one omitted). min_fill in [0, 1]
// (0: every nonzero in blocks).
struct BsrWithRemainder {
  Bsr blocks;
  CsrRemainder remainder;
  int64_t nnz = 0;

  // Stored slots (R * C per block, plus the remainder's nonzeros) over nnz; 1 when empty.
  double padding_ratio() const;
};
BsrWithRemainder bsr_split(const Csr& a, int block_rows, int block_cols, double min_fill);

// Y = A X over the format, accumulated in float64 (shapes as spmm_reference of CSR).
void spmm_reference(const Bsr& a, const TensorView& x, const TensorView& y);
void spmm_reference(const BsrWithRemainder& a, const TensorView& x, const TensorView& y);

}  // namespace flare::sparse
