// COO from and to CSR, and the float64 COO references (flare/sparse/coo.h).
#include "flare/sparse/coo.h"

#include <vector>

#include "flare/core/error.h"
#include "src/sparse/dense_access.h"

namespace flare::sparse {

Coo coo_from_csr(const Csr& a) {
  validate_csr(a);
  Coo coo;
  coo.rows = a.rows;
  coo.cols = a.cols;
  const int64_t nnz = a.nnz();
  coo.row.reserve(static_cast<size_t>(nnz));
  coo.col.reserve(static_cast<size_t>(nnz));
  coo.source.reserve(static_cast<size_t>(nnz));
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t e = sparse_detail::index_at(a.indptr, r);
         e < sparse_detail::index_at(a.indptr, r + 1); ++e) {
      coo.row.push_back(static_cast<int32_t>(r));
      coo.col.push_back(sparse_detail::index_at(a.indices, e));
      if (a.values) coo.values.push_back(sparse_detail::load(*a.values, e));
      coo.source.push_back(e);
    }
  }
  return coo;
}

Csr CsrStorage::view() const {
  Csr a;
  a.rows = rows;
  a.cols = cols;
  // Views of storage the Csr's readers never write.
  a.indptr = TensorView::contiguous(const_cast<int32_t*>(indptr.data()), DType::kI32,
                                    {static_cast<int64_t>(indptr.size())});
  a.indices = TensorView::contiguous(const_cast<int32_t*>(indices.data()), DType::kI32,
                                     {static_cast<int64_t>(indices.size())});
  if (!values.empty() || indices.empty()) {
    a.values = TensorView::contiguous(const_cast<float*>(values.data()), DType::kF32,
                                      {static_cast<int64_t>(values.size())});
  }
  return a;
}

CsrStorage csr_from_coo(int64_t rows, int64_t cols, std::span<const int32_t> row,
                        std::span<const int32_t> col, std::span<const float> values) {
  FLARE_CHECK(rows >= 0 && cols >= 0 && rows < (int64_t{1} << 31) && cols < (int64_t{1} << 31),
              ErrorCode::kInvalidArgument, "csr_from_coo: rows and cols must be in [0, 2^31), got ",
              rows, " x ", cols);
  const size_t nnz = row.size();
  FLARE_CHECK(col.size() == nnz && (values.empty() || values.size() == nnz),
              ErrorCode::kInvalidArgument, "csr_from_coo: coo.row has ", nnz, " entries, coo.col ",
              col.size(), " and coo.values ", values.size(), " (values may be empty)");
  FLARE_CHECK(nnz < (size_t{1} << 31), ErrorCode::kInvalidArgument,
              "csr_from_coo: nnz must fit int32, got ", nnz);
  CsrStorage out;
  out.rows = rows;
  out.cols = cols;
  out.indptr.assign(static_cast<size_t>(rows + 1), 0);
  for (size_t e = 0; e < nnz; ++e) {
    FLARE_CHECK(row[e] >= 0 && row[e] < rows, ErrorCode::kInvalidArgument, "csr_from_coo: coo.row[",
                e, "] = ", row[e], " is outside [0, ", rows, ")");
    FLARE_CHECK(col[e] >= 0 && col[e] < cols, ErrorCode::kInvalidArgument, "csr_from_coo: coo.col[",
                e, "] = ", col[e], " is outside [0, ", cols, ")");
    if (e > 0) {
      FLARE_CHECK(row[e] >= row[e - 1], ErrorCode::kInvalidArgument, "csr_from_coo: coo.row[", e,
                  "] = ", row[e], " is less than coo.row[", e - 1, "] = ", row[e - 1],
                  ": entries must be sorted by (row, col) and unique");
      FLARE_CHECK(row[e] > row[e - 1] || col[e] > col[e - 1], ErrorCode::kInvalidArgument,
                  "csr_from_coo: coo.col[", e, "] = ", col[e], " is not greater than coo.col[",
                  e - 1, "] = ", col[e - 1], " in row ", row[e],
                  ": entries must be sorted by (row, col) and unique");
    }
    ++out.indptr[static_cast<size_t>(row[e]) + 1];
  }
  for (int64_t r = 0; r < rows; ++r) {
    out.indptr[static_cast<size_t>(r) + 1] += out.indptr[static_cast<size_t>(r)];
  }
  out.indices.assign(col.begin(), col.end());
  out.values.assign(values.begin(), values.end());
  return out;
}

void spmm_reference(const Coo& a, const TensorView& x, const TensorView& y) {
  FLARE_CHECK(static_cast<int64_t>(a.values.size()) == a.nnz(), ErrorCode::kInvalidArgument,
              "spmm_reference: the COO matrix has no values");
  const int64_t d = sparse_detail::check_dense(x, "X", a.cols, -1);
  sparse_detail::check_dense(y, "Y", a.rows, d, &x, "X");
  std::vector<double> sum(static_cast<size_t>(a.rows * d), 0.0);
  for (int64_t e = 0; e < a.nnz(); ++e) {
    const size_t i = static_cast<size_t>(e);
    for (int64_t f = 0; f < d; ++f) {
      sum[static_cast<size_t>(a.row[i] * d + f)] +=
          a.values[i] * sparse_detail::load(x, a.col[i], f);
    }
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t f = 0; f < d; ++f)
      sparse_detail::store(y, r, f, sum[static_cast<size_t>(r * d + f)]);
  }
}

void sddmm_reference(const Coo& a, const TensorView& q, const TensorView& k,
                     const TensorView& out) {
  const int64_t d = sparse_detail::check_dense(q, "Q", a.rows, -1);
  sparse_detail::check_dense(k, "K", a.cols, d, &q, "Q");
  sparse_detail::check_sddmm_out(out, a.nnz(), q);
  for (int64_t e = 0; e < a.nnz(); ++e) {
    const size_t i = static_cast<size_t>(e);
    double dot = 0.0;
    for (int64_t f = 0; f < d; ++f) {
      dot += sparse_detail::load(q, a.row[i], f) * sparse_detail::load(k, a.col[i], f);
    }
    sparse_detail::store(out, e, dot);
  }
}

}  // namespace flare::sparse
