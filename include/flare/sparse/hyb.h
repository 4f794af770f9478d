// The composable hyb(c, k) decomposition of a CSR matrix (SparseTIR §3.4, Figure 3.11): the
// columns split into c equal partitions; within each partition every row's nonzeros go to the
// ELL bucket of the smallest width 2^i >= their count (i <= k), each bucket a dense
// [bucket rows, 2^i] block that one kernel schedule fits, and rows with more than 2^k nonzeros
// in the partition to a CSR remainder. Every nonzero lands in exactly one place; padding slots
// hold value 0 and source -1. Deterministic: buckets list rows in increasing order.
#pragma once

#include <cstdint>
#include <vector>

#include "flare/sparse/csr.h"

namespace flare::sparse {

// One ELL sub-matrix: `rows.size()` rows of `width` slots each, row-major.
struct EllBucket {
  int width = 0;                 // 2^i
  std::vector<int32_t> rows;     // the original row of each bucket row
  std::vector<int32_t> columns;  // [rows x width]: padding repeats the row's last column
  std::vector<double> values;    // [rows x width]: padding 0
  std::vector<int64_t> source;   // [rows x width]: the nonzero's index in A, -1 for padding
};

// The remainder of a partition: the rows too long for the widest bucket, in CSR (kept rows
// only, with their original row ids).
struct CsrRemainder {
  std::vector<int32_t> rows;     // original row ids
  std::vector<int64_t> indptr;   // [rows.size() + 1]
  std::vector<int32_t> columns;  // [indptr.back()]
  std::vector<double> values;
  std::vector<int64_t> source;
};

struct HybPartition {
  int64_t col_begin = 0;  // the partition's columns [col_begin, col_end)
  int64_t col_end = 0;
  std::vector<EllBucket> buckets;  // widths 1, 2, 4, ... 2^k; empty buckets kept
  CsrRemainder remainder;
};

struct Hyb {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nnz = 0;
  std::vector<HybPartition> partitions;

  // Slots stored (ELL slots, padding included, plus remainder nonzeros) over nnz: the extra
  // work and traffic the decomposition buys regularity with (1 = none). 1 for an empty matrix.
  double padding_ratio() const;
};

// hyb(c, k) of `a` (validated first; values needed): column_parts c >= 1 (at most cols when
// cols > 0), max_log2_width k in [0, 16]. Throws kInvalidArgument naming the bad argument.
Hyb hyb_from_csr(const Csr& a, int column_parts, int max_log2_width);

// Y = A X from the decomposition, accumulated in float64: the sum of every bucket's and
// remainder's products (checks that the decomposition is exact; the GPU kernels' reference
// per sub-format). Shapes as spmm_reference.
void spmm_reference(const Hyb& a, const TensorView& x, const TensorView& y);

}  // namespace flare::sparse
