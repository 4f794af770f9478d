// COO (coordinate) matrices (issue 23): one (row, column, value) per nonzero in row-major order,
// the format an element-parallel kernel reads (one thread per nonzero, no row structure), and
// the conversions between it and CSR. Deterministic.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flare/sparse/csr.h"

namespace flare::sparse {

struct Coo {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int32_t> row;     // [nnz], non-decreasing
  std::vector<int32_t> col;     // [nnz], increasing within a row
  std::vector<double> values;   // [nnz]; empty when A had none (SDDMM's pattern)
  std::vector<int64_t> source;  // [nnz]: the nonzero's index in A (the identity from CSR)

  int64_t nnz() const { return static_cast<int64_t>(row.size()); }
};

// A's nonzeros as COO (`a` validated first; values copied when A has them).
Coo coo_from_csr(const Csr& a);

// A CSR matrix that owns its arrays; view() is the Csr the references and conversions take.
struct CsrStorage {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int32_t> indptr;
  std::vector<int32_t> indices;
  std::vector<float> values;  // empty when the COO had none
  Csr view() const;
};

// CSR of a caller's COO triplets: rows, cols >= 0; row and col of one length nnz, sorted by
// (row, col) without duplicates, row in [0, rows), col in [0, cols); values empty or [nnz].
// Throws kInvalidArgument naming the array and the entry (e.g. "coo.col[5] = 2 is not greater
// than coo.col[4] = 2 in row 1: entries must be sorted by (row, col) and unique").
CsrStorage csr_from_coo(int64_t rows, int64_t cols, std::span<const int32_t> row,
                        std::span<const int32_t> col, std::span<const float> values = {});

// Y = A X and SDDMM over COO, accumulated in float64 (shapes as the CSR references; out in the
// COO's nonzero order).
void spmm_reference(const Coo& a, const TensorView& x, const TensorView& y);
void sddmm_reference(const Coo& a, const TensorView& q, const TensorView& k, const TensorView& out);

}  // namespace flare::sparse
