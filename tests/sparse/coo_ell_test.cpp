// COO and ELL (flare/sparse/coo.h, ell.h): conversions from CSR keep every nonzero once in row
// order, CSR from a caller's COO triplets round-trips and names the bad array and entry, ELL
// pads every row to one width (the longest row's, or a given one) with weight-0 slots, and the
// SpMM / SDDMM references over each format equal CSR's on random matrices with empty rows, a
// single column and a very long row.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "flare/sparse/coo.h"
#include "flare/sparse/ell.h"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using sparse_testing::OwnedCsr;
using sparse_testing::random_csr;
using sparse_testing::random_dense;

// max |a - b| over two float32 tensors of one shape.
double max_diff(const HostTensor& a, const HostTensor& b) {
  double diff = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(double{a.data<float>()[i]} - b.data<float>()[i]));
  }
  return diff;
}

HostTensor spmm_of(const auto& format, int64_t rows, const HostTensor& x) {
  HostTensor y(DType::kF32, {rows, x.shape()[1]});
  y.fill(std::nanf(""));
  sparse::spmm_reference(format, x.view(), y.view());
  return y;
}

TEST(SparseCoo, FromCsrKeepsEveryNonzeroInRowOrderAndRoundTrips) {
  const OwnedCsr a = random_csr(120, 90, 0.05, 0.3, 7);
  const sparse::Coo coo = sparse::coo_from_csr(a.view());
  ASSERT_EQ(coo.nnz(), static_cast<int64_t>(a.indices.size()));
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int32_t e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
      EXPECT_EQ(coo.row[e], r);
      EXPECT_EQ(coo.col[e], a.indices[e]);
      EXPECT_EQ(coo.values[e], a.values[e]);
      EXPECT_EQ(coo.source[e], e);
    }
  }
  std::vector<float> values(coo.values.begin(), coo.values.end());
  const sparse::CsrStorage back = sparse::csr_from_coo(a.rows, a.cols, coo.row, coo.col, values);
  EXPECT_EQ(back.indptr, a.indptr);
  EXPECT_EQ(back.indices, a.indices);
  EXPECT_EQ(back.values, a.values);
  EXPECT_NO_THROW(sparse::validate_csr(back.view()));
}

TEST(SparseCoo, CsrFromCooNamesTheBadArrayAndEntry) {
  const std::vector<int32_t> row = {0, 1, 1, 3};
  const std::vector<int32_t> col = {2, 0, 4, 1};
  EXPECT_NO_THROW(sparse::csr_from_coo(4, 5, row, col));
  EXPECT_FLARE_ERROR(sparse::csr_from_coo(4, 5, row, std::vector<int32_t>{2, 0, 0, 1}),
                     ErrorCode::kInvalidArgument,
                     "coo.col[2] = 0 is not greater than coo.col[1] = 0 in row 1");
  EXPECT_FLARE_ERROR(sparse::csr_from_coo(4, 5, std::vector<int32_t>{0, 2, 1, 3}, col),
                     ErrorCode::kInvalidArgument, "coo.row[2] = 1 is less than coo.row[1] = 2");
  EXPECT_FLARE_ERROR(sparse::csr_from_coo(3, 5, row, col), ErrorCode::kInvalidArgument,
                     "coo.row[3] = 3 is outside [0, 3)");
  EXPECT_FLARE_ERROR(sparse::csr_from_coo(4, 4, row, col), ErrorCode::kInvalidArgument,
                     "coo.col[2] = 4 is outside [0, 4)");
  EXPECT_FLARE_ERROR(sparse::csr_from_coo(4, 5, row, col, std::vector<float>{1.0f}),
                     ErrorCode::kInvalidArgument, "coo.values 1");
}

TEST(SparseEll, PadsEveryRowToOneWidthWithWeightZeroSlots) {
  const OwnedCsr a = random_csr(64, 40, 0.1, 0.0, 3);
  int64_t longest = 0;
  for (int64_t r = 0; r < a.rows; ++r) longest = std::max<int64_t>(longest, a.indptr[r + 1] - a.indptr[r]);
  const sparse::Ell ell = sparse::ell_from_csr(a.view());
  ASSERT_EQ(ell.slots.width, longest);
  ASSERT_EQ(static_cast<int64_t>(ell.slots.rows.size()), a.rows);
  int64_t real = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int32_t begin = a.indptr[r], count = a.indptr[r + 1] - begin;
    for (int s = 0; s < ell.slots.width; ++s) {
      const size_t slot = static_cast<size_t>(r * ell.slots.width + s);
      if (s < count) {
        EXPECT_EQ(ell.slots.source[slot], begin + s);
        EXPECT_EQ(ell.slots.columns[slot], a.indices[begin + s]);
        ++real;
      } else {
        EXPECT_EQ(ell.slots.source[slot], -1);
        EXPECT_EQ(ell.slots.values[slot], 0.0);
        EXPECT_EQ(ell.slots.columns[slot], count > 0 ? a.indices[begin + count - 1] : 0);
      }
    }
  }
  EXPECT_EQ(real, static_cast<int64_t>(a.indices.size()));
  EXPECT_DOUBLE_EQ(ell.padding_ratio(), static_cast<double>(a.rows * longest) / real);
  EXPECT_EQ(sparse::ell_from_csr(a.view(), static_cast<int>(longest) + 3).slots.width,
            longest + 3);
  EXPECT_FLARE_ERROR(sparse::ell_from_csr(a.view(), static_cast<int>(longest) - 1),
                     ErrorCode::kInvalidArgument, "nonzeros, more than width");
  EXPECT_FLARE_ERROR(sparse::ell_from_csr(a.view(), -1), ErrorCode::kInvalidArgument,
                     "width must be >= 0");
}

TEST(SparseCooEll, SpmmAndSddmmEqualTheCsrReference) {
  for (const auto& [rows, cols, share, d] :
       {std::tuple{300, 200, 0.3, 32}, std::tuple{57, 1, 0.0, 7}, std::tuple{64, 500, 0.0, 1}}) {
    const OwnedCsr a = random_csr(rows, cols, 0.05, share, 11);
    const HostTensor x = random_dense(cols, d, 12);
    const HostTensor expected = spmm_of(a.view(), rows, x);
    EXPECT_LE(max_diff(spmm_of(sparse::coo_from_csr(a.view()), rows, x), expected), 1e-5);
    EXPECT_LE(max_diff(spmm_of(sparse::ell_from_csr(a.view()), rows, x), expected), 1e-5);
    const HostTensor q = random_dense(rows, d, 13);
    const HostTensor k = random_dense(cols, d, 14);
    const int64_t nnz = static_cast<int64_t>(a.indices.size());
    HostTensor csr_out(DType::kF32, {nnz}), coo_out(DType::kF32, {nnz});
    sparse::sddmm_reference(a.view(), q.view(), k.view(), csr_out.view());
    coo_out.fill(std::nanf(""));
    sparse::sddmm_reference(sparse::coo_from_csr(a.view()), q.view(), k.view(), coo_out.view());
    EXPECT_LE(max_diff(coo_out, csr_out), 1e-6);
  }
}

}  // namespace
}  // namespace flare
