// The device layout of a hyb(c, k) decomposition (flare/sparse/hyb_gpu.h), straight from the CSR
// matrix in two passes over it (no Hyb in between: the host cost of SpmmPlan(format="hyb" /
// "auto")).
#include <algorithm>
#include <string>

#include "flare/core/error.h"
#include "flare/sparse/hyb_gpu.h"
#include "src/sparse/dense_access.h"

namespace flare::sparse {
namespace {

constexpr const char* kWhat = "flare::sparse::hyb_gpu_layout";

// The remainder's limit of the kernels: rows + nonzeros of a partition's remainder below 2^31.
void check_remainder(size_t p, int64_t rows, int64_t nnz) {
  FLARE_CHECK(rows + nnz < (int64_t{1} << 31), ErrorCode::kUnsupported, kWhat, ": partition ", p,
              "'s remainder holds ", rows, " rows and ", nnz,
              " nonzeros; the GPU kernels take rows + nonzeros below 2^31");
}

}  // namespace

double HybGpuLayout::padding_ratio() const {
  if (nnz == 0) return 1.0;
  return static_cast<double>(ell_columns.size() + rest_columns.size()) / static_cast<double>(nnz);
}

HybGpuLayout hyb_gpu_layout(const Csr& a, int column_parts, int max_log2_width) {
  validate_csr(a);
  FLARE_CHECK(column_parts >= 1 && (a.cols == 0 || column_parts <= a.cols),
              ErrorCode::kInvalidArgument, kWhat, ": column_parts must be in [1, cols = ", a.cols,
              "], got ", column_parts);
  FLARE_CHECK(max_log2_width >= 0 && max_log2_width <= 16, ErrorCode::kInvalidArgument, kWhat,
              ": max_log2_width must be in [0, 16], got ", max_log2_width);
  const auto parts = static_cast<size_t>(column_parts);
  const int buckets = max_log2_width + 1;
  const int kRest = buckets;  // a row's "bucket" when it goes to the remainder
  std::vector<int64_t> col_end(parts);
  for (size_t p = 0; p < parts; ++p)
    col_end[p] = a.cols * static_cast<int64_t>(p + 1) / column_parts;
  const auto start = [&a](int64_t r) { return sparse_detail::index_at(a.indptr, r); };
  const auto column = [&a](int64_t e) { return sparse_detail::index_at(a.indices, e); };
  // Visits row r's runs: visit(p, begin, end) for each partition, in order (columns sorted).
  const auto for_each_run = [&](int64_t r, auto visit) {
    int64_t e = start(r);
    const int64_t row_end = start(r + 1);
    for (size_t p = 0; p < parts; ++p) {
      const int64_t begin = e;
      while (e < row_end && column(e) < col_end[p]) ++e;
      visit(p, begin, e);
    }
  };
  // The bucket of a run: -1 for none (an empty run outside partition 0), 0 for an empty run of
  // partition 0 (a padding row), the smallest i with 2^i >= count, or kRest.
  const auto bucket_of = [&](size_t p, int64_t count) {
    if (count == 0) return p == 0 ? 0 : -1;
    int i = 0;
    while (i <= max_log2_width && (int64_t{1} << i) < count) ++i;
    return i <= max_log2_width ? i : kRest;
  };

  // Pass 1: rows per (partition, bucket), the remainders' nonzeros.
  std::vector<int64_t> rows_in(parts * static_cast<size_t>(buckets + 1), 0);
  std::vector<int64_t> rest_nnz(parts, 0);
  const auto slot = [buckets](size_t p, int b) { return p * static_cast<size_t>(buckets + 1) + b; };
  for (int64_t r = 0; r < a.rows; ++r) {
    for_each_run(r, [&](size_t p, int64_t begin, int64_t end) {
      const int b = bucket_of(p, end - begin);
      if (b < 0) return;
      ++rows_in[slot(p, b)];
      if (b == kRest) rest_nnz[p] += end - begin;
    });
  }

  // The layout's table and array sizes; cursors at each bucket's and remainder's first entry.
  HybGpuLayout out;
  out.rows = a.rows;
  out.cols = a.cols;
  out.nnz = a.nnz();
  std::vector<int64_t> row_cursor(rows_in.size()), slot_cursor(rows_in.size());
  int64_t ell_rows = 0, ell_slots = 0, rest_rows = 0, rest_indptr = 0, rest_columns = 0;
  for (size_t p = 0; p < parts; ++p) {
    HybGpuLayout::Partition part;
    for (int b = 0; b < buckets; ++b) {
      const int64_t n = rows_in[slot(p, b)];
      row_cursor[slot(p, b)] = ell_rows;
      slot_cursor[slot(p, b)] = ell_slots;
      if (n == 0) continue;
      part.buckets.push_back({ell_rows, n, ell_slots, b});
      ell_rows += n;
      ell_slots += n << b;
    }
    HybGpuLayout::Remainder& rest = part.remainder;
    rest = {rest_rows, rows_in[slot(p, kRest)], rest_indptr, rest_columns, rest_nnz[p]};
    check_remainder(p, rest.rows, rest.nnz);
    row_cursor[slot(p, kRest)] = rest_rows;
    slot_cursor[slot(p, kRest)] = rest_columns;
    rest_rows += rest.rows;
    rest_indptr += rest.rows + 1;
    rest_columns += rest.nnz;
    out.partitions.push_back(std::move(part));
  }
  out.ell_rows.resize(static_cast<size_t>(ell_rows));
  out.ell_columns.resize(static_cast<size_t>(ell_slots));
  out.ell_source.resize(static_cast<size_t>(ell_slots));
  out.rest_rows.resize(static_cast<size_t>(rest_rows));
  out.rest_indptr.assign(static_cast<size_t>(rest_indptr), 0);
  out.rest_columns.resize(static_cast<size_t>(rest_columns));
  out.rest_source.resize(static_cast<size_t>(rest_columns));

  // Pass 2: rows in increasing order, so every bucket and remainder lists its rows in order
  // (partition 0's padding rows among its width-1 rows).
  for (int64_t r = 0; r < a.rows; ++r) {
    for_each_run(r, [&](size_t p, int64_t begin, int64_t end) {
      const int b = bucket_of(p, end - begin);
      if (b < 0) return;
      const auto row = static_cast<size_t>(row_cursor[slot(p, b)]++);
      if (b == kRest) {
        out.rest_rows[row] = static_cast<int32_t>(r);
        const HybGpuLayout::Remainder& rest = out.partitions[p].remainder;
        auto at = static_cast<size_t>(slot_cursor[slot(p, b)]);
        for (int64_t e = begin; e < end; ++e, ++at) {
          out.rest_columns[at] = column(e);
          out.rest_source[at] = e;
        }
        slot_cursor[slot(p, b)] = static_cast<int64_t>(at);
        const auto local = row - static_cast<size_t>(rest.row_offset);
        out.rest_indptr[static_cast<size_t>(rest.indptr_offset) + local + 1] =
            static_cast<int32_t>(static_cast<int64_t>(at) - rest.nnz_offset);
        return;
      }
      out.ell_rows[row] = static_cast<int32_t>(r);
      auto at = static_cast<size_t>(slot_cursor[slot(p, b)]);
      for (int64_t s = 0; s < (int64_t{1} << b); ++s, ++at) {
        const bool real = begin + s < end;
        out.ell_columns[at] = real ? column(begin + s) : -1;
        out.ell_source[at] = real ? begin + s : -1;
      }
      slot_cursor[slot(p, b)] = static_cast<int64_t>(at);
    });
  }
  return out;
}

}  // namespace flare::sparse
