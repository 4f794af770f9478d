// hyb(c, k) decomposition of a CSR matrix and its SpMM reference (flare/sparse/hyb.h).
#include "flare/sparse/hyb.h"

#include <algorithm>
#include <string>

#include "flare/core/error.h"
#include "src/sparse/dense_access.h"
#include "src/sparse/ell_rows.h"
#include "src/sparse/remainder.h"

namespace flare::sparse {
namespace {

// The bucket (log2 of its width) of a row holding `count` nonzeros of a partition: the smallest
// i with 2^i >= count; -1 when count exceeds 2^max_log2 (the remainder).
int bucket_of(int64_t count, int max_log2) {
  for (int i = 0; i <= max_log2; ++i) {
    if (count <= (int64_t{1} << i)) return i;
  }
  return -1;
}

}  // namespace

double Hyb::padding_ratio() const {
  if (nnz == 0) return 1.0;
  int64_t stored = 0;
  for (const HybPartition& part : partitions) {
    for (const EllBucket& bucket : part.buckets)
      stored += static_cast<int64_t>(bucket.columns.size());
    stored += static_cast<int64_t>(part.remainder.columns.size());
  }
  return static_cast<double>(stored) / static_cast<double>(nnz);
}

Hyb hyb_from_csr(const Csr& a, int column_parts, int max_log2_width) {
  validate_csr(a);
  FLARE_CHECK(a.values.has_value(), ErrorCode::kInvalidArgument,
              "hyb_from_csr: A.values is required");
  FLARE_CHECK(column_parts >= 1 && (a.cols == 0 || column_parts <= a.cols),
              ErrorCode::kInvalidArgument,
              "hyb_from_csr: column_parts must be in [1, cols = ", a.cols, "], got ", column_parts);
  FLARE_CHECK(max_log2_width >= 0 && max_log2_width <= 16, ErrorCode::kInvalidArgument,
              "hyb_from_csr: max_log2_width must be in [0, 16], got ", max_log2_width);
  Hyb hyb;
  hyb.rows = a.rows;
  hyb.cols = a.cols;
  hyb.nnz = a.nnz();
  // Partition p holds columns [p * cols / c, (p + 1) * cols / c): equal up to one column.
  for (int p = 0; p < column_parts; ++p) {
    HybPartition part;
    part.col_begin = a.cols * p / column_parts;
    part.col_end = a.cols * (p + 1) / column_parts;
    for (int i = 0; i <= max_log2_width; ++i)
      part.buckets.push_back(EllBucket{1 << i, {}, {}, {}, {}});
    part.remainder.indptr.push_back(0);
    hyb.partitions.push_back(std::move(part));
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    int64_t e = sparse_detail::index_at(a.indptr, r);
    const int64_t row_end = sparse_detail::index_at(a.indptr, r + 1);
    for (HybPartition& part : hyb.partitions) {
      // The row's columns are sorted: its nonzeros in this partition are one run.
      const int64_t begin = e;
      while (e < row_end && sparse_detail::index_at(a.indices, e) < part.col_end) ++e;
      if (e == begin) continue;
      const int bucket = bucket_of(e - begin, max_log2_width);
      if (bucket >= 0) {
        sparse_detail::append_ell_row(a, static_cast<int32_t>(r), begin, e,
                                      part.buckets[static_cast<size_t>(bucket)]);
        continue;
      }
      std::vector<int64_t> nonzeros(static_cast<size_t>(e - begin));
      for (int64_t i = begin; i < e; ++i) nonzeros[static_cast<size_t>(i - begin)] = i;
      sparse_detail::append_remainder_row(a, static_cast<int32_t>(r), nonzeros, part.remainder);
    }
  }
  return hyb;
}

void spmm_reference(const Hyb& a, const TensorView& x, const TensorView& y) {
  const int64_t d = sparse_detail::check_dense(x, "X", a.cols, -1);
  sparse_detail::check_dense(y, "Y", a.rows, d, &x, "X");
  std::vector<double> sum(static_cast<size_t>(a.rows * d), 0.0);
  const auto add = [&](int32_t row, int32_t col, double value) {
    for (int64_t f = 0; f < d; ++f)
      sum[static_cast<size_t>(row * d + f)] += value * sparse_detail::load(x, col, f);
  };
  for (const HybPartition& part : a.partitions) {
    for (const EllBucket& bucket : part.buckets) sparse_detail::for_each_ell_slot(bucket, add);
    sparse_detail::for_each_remainder_nonzero(part.remainder, add);
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t f = 0; f < d; ++f)
      sparse_detail::store(y, r, f, sum[static_cast<size_t>(r * d + f)]);
  }
}

}  // namespace flare::sparse
