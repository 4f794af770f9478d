// hyb(c, k): every nonzero lands in exactly one slot (the source map), each row of a partition
// in the smallest bucket that fits it or the remainder, the padding ratio counts the stored
// slots, and SpMM over the decomposition equals SpMM over the CSR matrix.
#include "flare/sparse/hyb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "sparse/random_csr.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using sparse_testing::OwnedCsr;
using sparse_testing::random_csr;
using sparse_testing::random_dense;

void expect_exact_cover(const OwnedCsr& a, const sparse::Hyb& h, int max_log2) {
  std::vector<int> seen(a.indices.size(), 0);
  int64_t stored = 0;
  for (const sparse::HybPartition& part : h.partitions) {
    for (size_t b = 0; b < part.buckets.size(); ++b) {
      const sparse::EllBucket& bucket = part.buckets[b];
      ASSERT_EQ(bucket.width, 1 << b);
      ASSERT_EQ(bucket.columns.size(), bucket.rows.size() * static_cast<size_t>(bucket.width));
      stored += static_cast<int64_t>(bucket.columns.size());
      for (size_t i = 0; i < bucket.rows.size(); ++i) {
        int real = 0;
        for (int s = 0; s < bucket.width; ++s) {
          const size_t slot = i * static_cast<size_t>(bucket.width) + static_cast<size_t>(s);
          const int64_t e = bucket.source[slot];
          if (e < 0) {
            EXPECT_EQ(bucket.values[slot], 0.0);
            continue;
          }
          ++real;
          ++seen[static_cast<size_t>(e)];
          EXPECT_EQ(bucket.columns[slot], a.indices[static_cast<size_t>(e)]);
          EXPECT_GE(bucket.columns[slot], part.col_begin);
          EXPECT_LT(bucket.columns[slot], part.col_end);
          EXPECT_GE(e, a.indptr[bucket.rows[i]]);
          EXPECT_LT(e, a.indptr[bucket.rows[i] + 1]);
        }
        // The smallest bucket that fits: more than half full (width 1: full).
        EXPECT_GT(real, bucket.width / 2) << "width " << bucket.width;
      }
    }
    const sparse::CsrRemainder& rest = part.remainder;
    stored += static_cast<int64_t>(rest.columns.size());
    for (size_t i = 0; i < rest.rows.size(); ++i) {
      EXPECT_GT(rest.indptr[i + 1] - rest.indptr[i], int64_t{1} << max_log2);
      for (int64_t e = rest.indptr[i]; e < rest.indptr[i + 1]; ++e) {
        ++seen[static_cast<size_t>(rest.source[static_cast<size_t>(e)])];
      }
    }
  }
  for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e], 1) << "nonzero " << e;
  if (!a.indices.empty()) {
    EXPECT_DOUBLE_EQ(h.padding_ratio(),
                     static_cast<double>(stored) / static_cast<double>(a.indices.size()));
  }
}

TEST(SparseHyb, EveryNonzeroOnceInTheSmallestFittingBucketAndSpmmIsExact) {
  for (const auto& [rows, cols, share, parts, max_log2] :
       {std::tuple{300, 200, 0.3, 1, 4}, std::tuple{300, 200, 0.3, 3, 2},
        std::tuple{57, 1, 0.0, 1, 0}, std::tuple{100, 700, 0.0, 7, 3},
        std::tuple{40, 40, 0.0, 40, 5}}) {
    SCOPED_TRACE(::testing::Message()
                 << rows << "x" << cols << " hyb(" << parts << ", " << max_log2 << ")");
    const OwnedCsr a = random_csr(rows, cols, 0.05, share, 10);
    const sparse::Hyb h = sparse::hyb_from_csr(a.view(), parts, max_log2);
    ASSERT_EQ(h.partitions.size(), static_cast<size_t>(parts));
    EXPECT_EQ(h.partitions.front().col_begin, 0);
    EXPECT_EQ(h.partitions.back().col_end, cols);
    expect_exact_cover(a, h, max_log2);
    const HostTensor x = random_dense(cols, 16, 11);
    HostTensor from_csr(DType::kF32, {rows, 16});
    HostTensor from_hyb(DType::kF32, {rows, 16});
    from_hyb.fill(std::nanf(""));
    sparse::spmm_reference(a.view(), x.view(), from_csr.view());
    sparse::spmm_reference(h, x.view(), from_hyb.view());
    for (int64_t i = 0; i < from_csr.numel(); ++i) {
      ASSERT_NEAR(from_hyb.data<float>()[i], from_csr.data<float>()[i],
                  1e-5 * (1 + std::abs(from_csr.data<float>()[i])));
    }
  }
}

TEST(SparseHyb, TheLongRowGoesToTheRemainder) {
  // One row holds 30% of the nonzeros, far past 2^3: it alone is in the remainder.
  const OwnedCsr a = random_csr(200, 400, 0.02, 0.3, 12);
  const sparse::Hyb h = sparse::hyb_from_csr(a.view(), 1, 3);
  const sparse::CsrRemainder& rest = h.partitions[0].remainder;
  ASSERT_FALSE(rest.rows.empty());
  EXPECT_NE(std::find(rest.rows.begin(), rest.rows.end(), 100), rest.rows.end());
  EXPECT_GE(h.padding_ratio(), 1.0);
}

TEST(SparseHyb, ArgumentsAreChecked) {
  const OwnedCsr a = random_csr(10, 8, 0.3, 0.0, 13);
  EXPECT_FLARE_ERROR(sparse::hyb_from_csr(a.view(), 0, 2), ErrorCode::kInvalidArgument,
                     "column_parts must be in [1, cols = 8], got 0");
  EXPECT_FLARE_ERROR(sparse::hyb_from_csr(a.view(), 9, 2), ErrorCode::kInvalidArgument,
                     "column_parts");
  EXPECT_FLARE_ERROR(sparse::hyb_from_csr(a.view(), 2, 17), ErrorCode::kInvalidArgument,
                     "max_log2_width must be in [0, 16], got 17");
  const OwnedCsr empty = random_csr(0, 0, 0.0, 0.0, 14);
  EXPECT_EQ(sparse::hyb_from_csr(empty.view(), 1, 2).padding_ratio(), 1.0);
}

}  // namespace
}  // namespace flare
