// The hyb GPU layout built the long way, for the tests: from hyb_from_csr's decomposition (hyb.h),
// bucket by bucket, with partition 0's rows it holds nothing of merged into its width-1 bucket
// as padding rows. An oracle independent of flare/sparse/hyb_gpu.h's two-pass builder: the two
// must give the same arrays.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "flare/sparse/hyb.h"
#include "flare/sparse/hyb_gpu.h"

namespace flare::sparse_testing {

// Appends one ELL row to the layout's arrays: `columns` / `source` of a bucket row, or (empty)
// `width` padding slots.
inline void append_slots(sparse::HybGpuLayout& out, int32_t row, const int32_t* columns,
                         const int64_t* source, int width) {
  out.ell_rows.push_back(row);
  for (int s = 0; s < width; ++s) {
    const bool real = source != nullptr && source[s] >= 0;
    out.ell_columns.push_back(real ? columns[s] : -1);
    out.ell_source.push_back(real ? source[s] : -1);
  }
}

inline sparse::HybGpuLayout layout_via_hyb(const sparse::Hyb& hyb) {
  sparse::HybGpuLayout out;
  out.rows = hyb.rows;
  out.cols = hyb.cols;
  out.nnz = hyb.nnz;
  for (size_t p = 0; p < hyb.partitions.size(); ++p) {
    const sparse::HybPartition& part = hyb.partitions[p];
    // Partition 0's rows of A without a nonzero in it, which its width-1 bucket takes as padding.
    std::vector<int32_t> absent;
    if (p == 0) {
      std::vector<bool> held(static_cast<size_t>(hyb.rows), false);
      for (const sparse::EllBucket& bucket : part.buckets) {
        for (const int32_t r : bucket.rows) held[static_cast<size_t>(r)] = true;
      }
      for (const int32_t r : part.remainder.rows) held[static_cast<size_t>(r)] = true;
      for (int64_t r = 0; r < hyb.rows; ++r) {
        if (!held[static_cast<size_t>(r)]) absent.push_back(static_cast<int32_t>(r));
      }
    }
    sparse::HybGpuLayout::Partition laid;
    for (const sparse::EllBucket& bucket : part.buckets) {
      const bool takes_absent = bucket.width == 1 && !absent.empty();
      if (bucket.rows.empty() && !takes_absent) continue;
      sparse::HybGpuLayout::Bucket b;
      b.row_offset = static_cast<int64_t>(out.ell_rows.size());
      b.slot_offset = static_cast<int64_t>(out.ell_columns.size());
      b.log2_width = 0;
      while ((1 << b.log2_width) < bucket.width) ++b.log2_width;
      // The bucket's rows merged with the absent rows (both increasing): Y's rows in order.
      size_t next_absent = takes_absent ? 0 : absent.size();
      for (size_t i = 0; i < bucket.rows.size(); ++i) {
        for (; next_absent < absent.size() && absent[next_absent] < bucket.rows[i]; ++next_absent)
          append_slots(out, absent[next_absent], nullptr, nullptr, bucket.width);
        const size_t slot = i * static_cast<size_t>(bucket.width);
        append_slots(out, bucket.rows[i], bucket.columns.data() + slot, bucket.source.data() + slot,
                     bucket.width);
      }
      for (; next_absent < absent.size(); ++next_absent)
        append_slots(out, absent[next_absent], nullptr, nullptr, bucket.width);
      b.rows = static_cast<int64_t>(out.ell_rows.size()) - b.row_offset;
      laid.buckets.push_back(b);
    }
    const sparse::CsrRemainder& rest = part.remainder;
    sparse::HybGpuLayout::Remainder& r = laid.remainder;
    r.row_offset = static_cast<int64_t>(out.rest_rows.size());
    r.rows = static_cast<int64_t>(rest.rows.size());
    r.indptr_offset = static_cast<int64_t>(out.rest_indptr.size());
    r.nnz_offset = static_cast<int64_t>(out.rest_columns.size());
    r.nnz = static_cast<int64_t>(rest.columns.size());
    out.rest_rows.insert(out.rest_rows.end(), rest.rows.begin(), rest.rows.end());
    for (const int64_t e : rest.indptr) out.rest_indptr.push_back(static_cast<int32_t>(e));
    out.rest_columns.insert(out.rest_columns.end(), rest.columns.begin(), rest.columns.end());
    out.rest_source.insert(out.rest_source.end(), rest.source.begin(), rest.source.end());
    out.partitions.push_back(std::move(laid));
  }
  return out;
}

}  // namespace flare::sparse_testing
