// General sparse matrices (issue 23, SparseTIR: dissertation chapter 3): CSR, the format every
// decomposition starts from, its validation, and the float64 CPU reference of the two
// operators the GPU kernels will be checked against:
//   SpMM   Y = A X         A sparse [rows, cols], X dense [cols, d], Y dense [rows, d]
//   SDDMM  out_e = q_i . k_j  for each nonzero e = (i, j) of A (its values unused):
//          Q dense [rows, d], K dense [cols, d], out [nnz] in A's nonzero order
// Decompositions into sub-formats: flare/sparse/hyb.h.
#pragma once

#include <cstdint>
#include <optional>

#include "flare/core/tensor.h"

namespace flare::sparse {

// A CSR view (nothing owned). Index arrays are int32 on the CPU for the host functions here;
// values float32, float16 or bfloat16 (the references read them as float64).
struct Csr {
  int64_t rows = 0;
  int64_t cols = 0;
  TensorView indptr;   // int32 [rows + 1]: row i's nonzeros are [indptr[i], indptr[i + 1])
  TensorView indices;  // int32 [nnz]: columns, strictly increasing within a row
  std::optional<TensorView> values;  // [nnz]; SDDMM reads only the pattern

  int64_t nnz() const { return indices.ndim == 1 ? indices.shape[0] : 0; }
};

// Throws kInvalidArgument, naming `name` and the array (e.g. "A.indices[7] = 3 is not greater
// than A.indices[6] = 3 in row 2: columns must be sorted and unique"), unless: rows, cols >= 0;
// indptr is int32 [rows + 1] on the CPU, starts at 0, never decreases and ends at nnz; indices
// int32 [nnz] in [0, cols), strictly increasing within each row; values, when given, float32,
// float16 or bfloat16 [nnz].
void validate_csr(const Csr& a, const char* name = "A");

// Y = A X accumulated in float64, written to y rounded once to float32 and then, for 16-bit
// dtypes, to y's dtype (as a float32-accumulating kernel rounds). x [cols, d] and y [rows, d]
// on the CPU, any strides, one dtype: float32, float16 or bfloat16 (A's values may be any of
// the three). A validated first (needs values). Nothing is written on error. Every format's
// spmm_reference (coo.h, ell.h, hyb.h, bsr.h) takes the same operands.
void spmm_reference(const Csr& a, const TensorView& x, const TensorView& y);

// out[e] = q_i . k_j for nonzero e = (i, j), accumulated in float64 (rounded as spmm_reference's
// y). q [rows, d], k [cols, d], out [nnz] on the CPU, one dtype: float32, float16 or bfloat16.
// Nothing is written on error.
void sddmm_reference(const Csr& a, const TensorView& q, const TensorView& k, const TensorView& out);

}  // namespace flare::sparse
