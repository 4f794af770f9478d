// BSR from CSR and the BSR + CSR remainder split: every nonzero exactly once, blocks sorted and
// non-empty, dense-enough blocks in BSR and the rest in the remainder, and SpMM over either
// equal to SpMM over the CSR matrix; shapes that are not multiples of the block.
#include "flare/sparse/bsr.h"

#include <gtest/gtest.h>

#include <algorithm>
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

void expect_same_spmm(const OwnedCsr& a, const sparse::BsrWithRemainder& split) {
  const HostTensor x = random_dense(a.cols, 9, 21);
  HostTensor from_csr(DType::kF32, {a.rows, 9});
  HostTensor from_split(DType::kF32, {a.rows, 9});
  from_split.fill(std::nanf(""));
  sparse::spmm_reference(a.view(), x.view(), from_csr.view());
  sparse::spmm_reference(split, x.view(), from_split.view());
  for (int64_t i = 0; i < from_csr.numel(); ++i) {
    ASSERT_NEAR(from_split.data<float>()[i], from_csr.data<float>()[i],
                1e-5 * (1 + std::abs(from_csr.data<float>()[i])));
  }
}

void expect_exact_cover(const OwnedCsr& a, const sparse::BsrWithRemainder& split, double fill) {
  const sparse::Bsr& b = split.blocks;
  std::vector<int> seen(a.indices.size(), 0);
  const int64_t slots = int64_t{b.block_rows} * b.block_cols;
  ASSERT_EQ(b.indptr.size(), static_cast<size_t>((a.rows + b.block_rows - 1) / b.block_rows + 1));
  for (size_t br = 0; br + 1 < b.indptr.size(); ++br) {
    for (int64_t blk = b.indptr[br]; blk < b.indptr[br + 1]; ++blk) {
      if (blk > b.indptr[br]) {
        EXPECT_GT(b.block_col[blk], b.block_col[blk - 1]);
      }
      int filled = 0;
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t e = b.source[static_cast<size_t>(blk * slots + s)];
        if (e < 0) continue;
        ++filled;
        ++seen[static_cast<size_t>(e)];
        const int64_t row = static_cast<int64_t>(br) * b.block_rows + s / b.block_cols;
        const int64_t col = int64_t{b.block_col[blk]} * b.block_cols + s % b.block_cols;
        EXPECT_GE(e, a.indptr[row]);
        EXPECT_LT(e, a.indptr[row + 1]);
        EXPECT_EQ(a.indices[e], col);
        EXPECT_EQ(b.values[static_cast<size_t>(blk * slots + s)], a.values[e]);
      }
      EXPECT_GE(filled, std::max(1.0, fill * static_cast<double>(slots)));
    }
  }
  const sparse::CsrRemainder& rest = split.remainder;
  for (size_t i = 0; i < rest.rows.size(); ++i) {
    if (i > 0) {
      EXPECT_GT(rest.rows[i], rest.rows[i - 1]);
    }
    for (int64_t e = rest.indptr[i]; e < rest.indptr[i + 1]; ++e) {
      if (e > rest.indptr[i]) {
        EXPECT_GT(rest.columns[e], rest.columns[e - 1]);
      }
      ++seen[static_cast<size_t>(rest.source[static_cast<size_t>(e)])];
    }
  }
  for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e], 1) << "nonzero " << e;
}

TEST(SparseBsr, EveryNonzeroOnceAndSpmmIsExact) {
  for (const auto& [rows, cols, r, c] : {std::tuple{100, 70, 4, 4}, std::tuple{33, 1, 16, 1},
                                         std::tuple{50, 90, 1, 1}, std::tuple{77, 61, 8, 16}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " blocks " << r << "x" << c);
    const OwnedCsr a = random_csr(rows, cols, 0.08, 0.2, 22);
    sparse::BsrWithRemainder whole;
    whole.blocks = sparse::bsr_from_csr(a.view(), r, c);
    whole.remainder.indptr.push_back(0);
    whole.nnz = static_cast<int64_t>(a.indices.size());
    expect_exact_cover(a, whole, 0.0);
    expect_same_spmm(a, whole);
    if (r == 1 && c == 1) {
      EXPECT_DOUBLE_EQ(whole.padding_ratio(), 1.0);
    }
  }
}

TEST(SparseBsr, SplitKeepsDenseBlocksAndLeavesTheRestInCsr) {
  // A block-diagonal 64 x 64 matrix of dense 8 x 8 blocks plus scattered nonzeros.
  OwnedCsr a = random_csr(64, 64, 0.02, 0.0, 23);
  std::vector<std::vector<std::pair<int32_t, float>>> rows(64);
  for (int64_t r = 0; r < 64; ++r) {
    for (int32_t e = a.indptr[r]; e < a.indptr[r + 1]; ++e)
      rows[r].push_back({a.indices[e], a.values[e]});
    for (int32_t c = static_cast<int32_t>(r / 8 * 8); c < r / 8 * 8 + 8; ++c)
      rows[r].push_back({c, 1.0f});
  }
  a.indptr = {0};
  a.indices.clear();
  a.values.clear();
  for (auto& row : rows) {
    std::sort(row.begin(), row.end());
    row.erase(
        std::unique(row.begin(), row.end(), [](auto& x, auto& y) { return x.first == y.first; }),
        row.end());
    for (const auto& [c, v] : row) {
      a.indices.push_back(c);
      a.values.push_back(v);
    }
    a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
  }
  const sparse::BsrWithRemainder split = sparse::bsr_split(a.view(), 8, 8, 1.0);
  EXPECT_EQ(split.blocks.blocks(), 8);  // the diagonal blocks, full
  EXPECT_FALSE(split.remainder.rows.empty());
  expect_exact_cover(a, split, 1.0);
  expect_same_spmm(a, split);
  EXPECT_GE(split.padding_ratio(), 1.0);
}

TEST(SparseBsr, ArgumentsAreChecked) {
  const OwnedCsr a = random_csr(10, 8, 0.3, 0.0, 24);
  EXPECT_FLARE_ERROR(sparse::bsr_from_csr(a.view(), 0, 4), ErrorCode::kInvalidArgument,
                     "block_rows and block_cols must be in [1, 256], got 0 x 4");
  EXPECT_FLARE_ERROR(sparse::bsr_split(a.view(), 2, 2, 1.5), ErrorCode::kInvalidArgument,
                     "min_fill must be in [0, 1], got 1.5");
}

}  // namespace
}  // namespace flare
