// ELL from CSR and its float64 SpMM reference (flare/sparse/ell.h).
#include "flare/sparse/ell.h"

#include <algorithm>
#include <vector>

#include "flare/core/error.h"
#include "src/sparse/dense_access.h"
#include "src/sparse/ell_rows.h"

namespace flare::sparse {

double Ell::padding_ratio() const {
  if (nnz == 0) return 1.0;
  return static_cast<double>(slots.columns.size()) / static_cast<double>(nnz);
}

Ell ell_from_csr(const Csr& a, int width) {
  validate_csr(a);
  FLARE_CHECK(width >= 0, ErrorCode::kInvalidArgument, "ell_from_csr: width must be >= 0 (0: the ",
              "longest row's length), got ", width);
  int64_t longest = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t length =
        sparse_detail::index_at(a.indptr, r + 1) - sparse_detail::index_at(a.indptr, r);
    FLARE_CHECK(width == 0 || length <= width, ErrorCode::kInvalidArgument, "ell_from_csr: row ", r,
                " holds ", length, " nonzeros, more than width = ", width);
    longest = std::max(longest, length);
  }
  FLARE_CHECK(width == 0 || a.cols > 0, ErrorCode::kInvalidArgument,
              "ell_from_csr: width = ", width, " needs a column to pad with, and A has none");
  Ell ell;
  ell.rows = a.rows;
  ell.cols = a.cols;
  ell.nnz = a.nnz();
  ell.slots.width = width > 0 ? width : static_cast<int>(longest);
  const size_t slots = static_cast<size_t>(a.rows) * static_cast<size_t>(ell.slots.width);
  ell.slots.columns.reserve(slots);
  ell.slots.values.reserve(slots);
  ell.slots.source.reserve(slots);
  for (int64_t r = 0; r < a.rows; ++r) {
    sparse_detail::append_ell_row(a, static_cast<int32_t>(r), sparse_detail::index_at(a.indptr, r),
                                  sparse_detail::index_at(a.indptr, r + 1), ell.slots);
  }
  return ell;
}

void spmm_reference(const Ell& a, const TensorView& x, const TensorView& y) {
  const int64_t d = sparse_detail::check_dense(x, "X", a.cols, -1);
  sparse_detail::check_dense(y, "Y", a.rows, d, &x, "X");
  std::vector<double> sum(static_cast<size_t>(a.rows * d), 0.0);
  sparse_detail::for_each_ell_slot(a.slots, [&](int32_t row, int32_t col, double value) {
    for (int64_t f = 0; f < d; ++f)
      sum[static_cast<size_t>(row * d + f)] += value * sparse_detail::load(x, col, f);
  });
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t f = 0; f < d; ++f)
      sparse_detail::store(y, r, f, sum[static_cast<size_t>(r * d + f)]);
  }
}

}  // namespace flare::sparse
