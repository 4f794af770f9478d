// ELL (ELLPACK) matrices (issue 23): every row padded to one width, a dense [rows, width] block of
// columns and values that one kernel schedule reads with no row structure; the hyb(c, k)
// decomposition (hyb.h) is ELL buckets per row length plus a CSR remainder. Deterministic.
#pragma once

#include <cstdint>

#include "flare/sparse/csr.h"
#include "flare/sparse/hyb.h"

namespace flare::sparse {

struct Ell {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nnz = 0;
  EllBucket slots;  // every row of A in order (slots.rows = 0 .. rows - 1), width slots each

  // Slots (rows * width) over nnz: the padding the regular layout costs (1 = none; 1 when
  // empty).
  double padding_ratio() const;
};

// `a` as ELL of `width` slots per row (0: the longest row's length). Throws kInvalidArgument
// naming the row when one holds more than `width` nonzeros, for width < 0, and for width > 0
// with cols = 0 (padding needs a column). `a` validated first; values copied when it has them.
Ell ell_from_csr(const Csr& a, int width = 0);

// Y = A X over ELL, accumulated in float64 (shapes as the CSR reference).
void spmm_reference(const Ell& a, const TensorView& x, const TensorView& y);

}  // namespace flare::sparse
