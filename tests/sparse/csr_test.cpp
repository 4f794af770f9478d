// CSR validation (errors name the array, the entry and the rule) and the float64 CPU references
// of SpMM and SDDMM against a dense computation written here.
#include "flare/sparse/csr.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "sparse/random_csr.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using sparse_testing::OwnedCsr;
using sparse_testing::random_csr;
using sparse_testing::random_dense;

// The dense [rows, cols] matrix of `a`, in double.
std::vector<double> dense_of(const OwnedCsr& a) {
  std::vector<double> dense(static_cast<size_t>(a.rows * a.cols), 0.0);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int32_t e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
      dense[static_cast<size_t>(r * a.cols + a.indices[e])] = a.values[e];
    }
  }
  return dense;
}

TEST(SparseCsr, RandomMatricesValidate) {
  for (const auto& [rows, cols, share] : {std::tuple{1, 1, 0.0}, std::tuple{57, 1, 0.0},
                                          std::tuple{300, 200, 0.3}, std::tuple{0, 5, 0.0}}) {
    const OwnedCsr a = random_csr(rows, cols, 0.05, share, 1);
    EXPECT_NO_THROW(sparse::validate_csr(a.view())) << rows << "x" << cols;
  }
}

TEST(SparseCsr, ErrorsNameTheArrayAndTheEntry) {
  OwnedCsr a;
  a.rows = 3;
  a.cols = 4;
  a.indptr = {0, 2, 2, 4};
  a.indices = {1, 3, 0, 2};
  a.values = {1, 2, 3, 4};
  EXPECT_NO_THROW(sparse::validate_csr(a.view()));
  OwnedCsr bad = a;
  bad.indices = {3, 1, 0, 2};  // unsorted in row 0
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view(), "adj"), ErrorCode::kInvalidArgument,
                     "adj.indices[1] = 1 is not greater than adj.indices[0] = 3 in row 0");
  bad = a;
  bad.indices = {1, 1, 0, 2};  // duplicate
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view()), ErrorCode::kInvalidArgument,
                     "columns must be sorted and unique");
  bad = a;
  bad.indptr = {0, 3, 2, 4};
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view()), ErrorCode::kInvalidArgument,
                     "A.indptr must be non-decreasing: A.indptr[2] = 2 < A.indptr[1] = 3");
  bad = a;
  bad.indices = {1, 3, 0, 4};  // column 4 of 4
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view()), ErrorCode::kInvalidArgument,
                     "A.indices[3] = 4 is outside [0, 4) in row 2");
  bad = a;
  bad.indptr = {0, 2, 2};  // rows + 1 = 4 entries expected
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view()), ErrorCode::kInvalidArgument,
                     "A.indptr must have 4 entries, got 3");
  bad = a;
  bad.indptr = {0, 2, 2, 3};
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view()), ErrorCode::kInvalidArgument,
                     "A.indptr[3] = 3 must equal the 4 entries of A.indices");
  bad = a;
  bad.values.pop_back();
  EXPECT_FLARE_ERROR(sparse::validate_csr(bad.view()), ErrorCode::kInvalidArgument,
                     "A.values must be float32, float16 or bfloat16 [4]");
}

TEST(SparseCsr, SpmmAndSddmmMatchDenseFloat64) {
  for (const auto& [rows, cols, share, d] :
       {std::tuple{300, 200, 0.3, 32}, std::tuple{57, 1, 0.0, 7}, std::tuple{64, 500, 0.0, 1}}) {
    const OwnedCsr a = random_csr(rows, cols, 0.05, share, 2);
    const HostTensor x = random_dense(cols, d, 3);
    HostTensor y(DType::kF32, {rows, d});
    y.fill(std::nanf(""));
    sparse::spmm_reference(a.view(), x.view(), y.view());
    const std::vector<double> dense = dense_of(a);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t f = 0; f < d; ++f) {
        double expected = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          expected += dense[static_cast<size_t>(r * cols + c)] * x.data<float>()[c * d + f];
        }
        ASSERT_NEAR(y.data<float>()[r * d + f], expected, 1e-5 * (1 + std::abs(expected)))
            << r << "," << f;
      }
    }
    const HostTensor q = random_dense(rows, d, 4);
    const HostTensor k = random_dense(cols, d, 5);
    HostTensor out(DType::kF32, {static_cast<int64_t>(a.indices.size())});
    out.fill(std::nanf(""));
    sparse::sddmm_reference(a.view(), q.view(), k.view(), out.view());
    for (int64_t r = 0; r < rows; ++r) {
      for (int32_t e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
        double expected = 0.0;
        for (int64_t f = 0; f < d; ++f) {
          expected += double{q.data<float>()[r * d + f]} * k.data<float>()[a.indices[e] * d + f];
        }
        ASSERT_NEAR(out.data<float>()[e], expected, 1e-5 * (1 + std::abs(expected))) << e;
      }
    }
  }
}

TEST(SparseCsr, ReferencesWriteNothingOnBadShapes) {
  const OwnedCsr a = random_csr(10, 8, 0.3, 0.0, 6);
  const HostTensor x = random_dense(7, 4, 7);  // cols is 8
  HostTensor y(DType::kF32, {10, 4});
  y.fill(std::nanf(""));
  EXPECT_FLARE_ERROR(sparse::spmm_reference(a.view(), x.view(), y.view()),
                     ErrorCode::kInvalidArgument, "X must have shape [8, d], got [7, 4]");
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(std::isnan(y.data<float>()[i]));
  const HostTensor q = random_dense(10, 4, 8);
  const HostTensor k = random_dense(8, 3, 9);  // d mismatch
  HostTensor out(DType::kF32, {static_cast<int64_t>(a.indices.size())});
  EXPECT_FLARE_ERROR(sparse::sddmm_reference(a.view(), q.view(), k.view(), out.view()),
                     ErrorCode::kInvalidArgument, "K must have shape [8, 4], got [8, 3]");
}

}  // namespace
}  // namespace flare
