// CSR validation and the float64 CPU references of SpMM and SDDMM (flare/sparse/csr.h).
#include "flare/sparse/csr.h"

#include <algorithm>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "src/sparse/dense_access.h"

namespace flare::sparse {
namespace {

void check_index_array(const TensorView& t, const std::string& what, int64_t size) {
  FLARE_CHECK(t.device.is_cpu(), ErrorCode::kInvalidArgument, what, " must be on the CPU, got ",
              t.device.str());
  FLARE_CHECK(t.dtype == DType::kI32 && t.ndim == 1, ErrorCode::kInvalidArgument, what,
              " must be a 1-D int32 array, got ", dtype_name(t.dtype), " ", t.shape_str());
  FLARE_CHECK(size < 0 || t.shape[0] == size, ErrorCode::kInvalidArgument, what, " must have ",
              size, " entries, got ", t.shape[0]);
  FLARE_CHECK(t.data != nullptr || t.shape[0] == 0, ErrorCode::kInvalidArgument, what,
              " has no data");
}

}  // namespace

void validate_csr(const Csr& a, const char* name) {
  const std::string n(name);
  FLARE_CHECK(a.rows >= 0 && a.cols >= 0, ErrorCode::kInvalidArgument, n,
              ": rows and cols must be >= 0, got ", a.rows, " x ", a.cols);
  FLARE_CHECK(a.rows < (int64_t{1} << 31) && a.cols < (int64_t{1} << 31),
              ErrorCode::kInvalidArgument, n, ": rows and cols must fit int32, got ", a.rows, " x ",
              a.cols);
  check_index_array(a.indptr, n + ".indptr", a.rows + 1);
  check_index_array(a.indices, n + ".indices", -1);
  const int64_t nnz = a.nnz();
  FLARE_CHECK(sparse_detail::index_at(a.indptr, 0) == 0, ErrorCode::kInvalidArgument, n,
              ".indptr[0] must be 0, got ", sparse_detail::index_at(a.indptr, 0));
  // The row structure first, so that an index error below names a real row.
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t begin = sparse_detail::index_at(a.indptr, r),
                  end = sparse_detail::index_at(a.indptr, r + 1);
    FLARE_CHECK(end >= begin, ErrorCode::kInvalidArgument, n, ".indptr must be non-decreasing: ", n,
                ".indptr[", r + 1, "] = ", end, " < ", n, ".indptr[", r, "] = ", begin);
    FLARE_CHECK(end <= nnz, ErrorCode::kInvalidArgument, n, ".indptr[", r + 1, "] = ", end,
                " exceeds the ", nnz, " entries of ", n, ".indices");
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t begin = sparse_detail::index_at(a.indptr, r),
                  end = sparse_detail::index_at(a.indptr, r + 1);
    for (int64_t e = begin; e < end; ++e) {
      const int32_t col = sparse_detail::index_at(a.indices, e);
      FLARE_CHECK(col >= 0 && col < a.cols, ErrorCode::kInvalidArgument, n, ".indices[", e,
                  "] = ", col, " is outside [0, ", a.cols, ") in row ", r);
      FLARE_CHECK(e == begin || col > sparse_detail::index_at(a.indices, e - 1),
                  ErrorCode::kInvalidArgument, n, ".indices[", e, "] = ", col,
                  " is not greater than ", n, ".indices[", e - 1,
                  "] = ", sparse_detail::index_at(a.indices, e - 1), " in row ", r,
                  ": columns must be sorted and unique within a row");
    }
  }
  FLARE_CHECK(sparse_detail::index_at(a.indptr, a.rows) == nnz, ErrorCode::kInvalidArgument, n,
              ".indptr[", a.rows, "] = ", sparse_detail::index_at(a.indptr, a.rows),
              " must equal the ", nnz, " entries of ", n, ".indices");
  if (a.values) {
    const TensorView& v = *a.values;
    FLARE_CHECK(v.device.is_cpu() && v.ndim == 1 && v.shape[0] == nnz &&
                    sparse_detail::value_dtype(v.dtype),
                ErrorCode::kInvalidArgument, n, ".values must be float32, float16 or bfloat16 [",
                nnz, "] on the CPU, got ", dtype_name(v.dtype), " ", v.shape_str(), " on ",
                v.device.str());
  }
}

void spmm_reference(const Csr& a, const TensorView& x, const TensorView& y) {
  validate_csr(a);
  FLARE_CHECK(a.values.has_value(), ErrorCode::kInvalidArgument,
              "spmm_reference: A.values is required");
  const int64_t d = sparse_detail::check_dense(x, "X", a.cols, -1);
  sparse_detail::check_dense(y, "Y", a.rows, d, &x, "X");
  std::vector<double> row(static_cast<size_t>(d));
  for (int64_t r = 0; r < a.rows; ++r) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t e = sparse_detail::index_at(a.indptr, r);
         e < sparse_detail::index_at(a.indptr, r + 1); ++e) {
      const double value = sparse_detail::load(*a.values, e);
      const int64_t col = sparse_detail::index_at(a.indices, e);
      for (int64_t f = 0; f < d; ++f) row[f] += value * sparse_detail::load(x, col, f);
    }
    for (int64_t f = 0; f < d; ++f) sparse_detail::store(y, r, f, row[f]);
  }
}

void sddmm_reference(const Csr& a, const TensorView& q, const TensorView& k,
                     const TensorView& out) {
  validate_csr(a);
  const int64_t d = sparse_detail::check_dense(q, "Q", a.rows, -1);
  sparse_detail::check_dense(k, "K", a.cols, d, &q, "Q");
  sparse_detail::check_sddmm_out(out, a.nnz(), q);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t e = sparse_detail::index_at(a.indptr, r);
         e < sparse_detail::index_at(a.indptr, r + 1); ++e) {
      const int64_t col = sparse_detail::index_at(a.indices, e);
      double dot = 0.0;
      for (int64_t f = 0; f < d; ++f) {
        dot += sparse_detail::load(q, r, f) * sparse_detail::load(k, col, f);
      }
      sparse_detail::store(out, e, dot);
    }
  }
}

}  // namespace flare::sparse
