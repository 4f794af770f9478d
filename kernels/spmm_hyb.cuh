// SpMM over a hyb(c, k) decomposition (issue 23, SparseTIR §3.4): Y = A X where A is stored as
// column partitions, each a set of ELL buckets (rows of 2^i slots, padding slots holding column
// -1) and a CSR remainder of the rows too long for the widest bucket. The host
// (src/sparse/hyb_gpu.cpp) launches, partition after partition on one stream,
//   flare_spmm_ell: every bucket of the partition in one grid (a warp takes whole rows of one
//     bucket: no row structure to search, no row split between warps), and
//   flare_spmm_csr / flare_spmm_csr_carries: the remainder through spmm_csr.cuh's merge path,
//     compiled with FLARE_SPMM_ROWS_MAPPED (the remainder's rows are Y's rows row_ids[i]).
// Within a partition every row of Y lies in at most one bucket or the remainder; partition 0
// also lists the rows it does not hold as padding rows of its width-1 bucket, so that its
// launches write every row of Y with `=` and the later partitions add to them (`accumulate`).
// No atomics: the same decomposition gives the same bits on every run. 16-bit Y is rounded
// once per partition.
//
// The ELL schedule: a warp takes rows_per_warp rows of a bucket of width w (both powers of
// two), i.e. rows_per_warp * w consecutive slots; it reads 32 slots at a time (a column and a
// value a lane, coalesced) and, as the CSR kernel, lane groups of kRowLanes lanes load rows of
// X, kBatch a group in flight. Here a group takes kBatch consecutive slots of a batch, so a
// row of w <= kBatch slots is summed by one group alone, and a longer row by the w / kBatch
// groups that share it (a shuffle butterfly over those groups when it ends).
//
// Memory safety whatever the arrays hold: the slots and rows a warp reads are the bucket's
// (the host checks each bucket's extent against the arrays' sizes), a column outside
// [0, cols) contributes nothing (X's row 0 is read instead and skipped in the sums), and a row
// id outside [0, y_rows) is not written.
//
// Compile-time defines: those of spmm_csr.cuh, with FLARE_SPMM_ROWS_MAPPED 1.
#pragma once

#include "spmm_csr.cuh"

namespace flare {

// The buckets one flare_spmm_ell launch covers (a partition holds at most 17: widths 2^0..2^16).
constexpr int kSpmmEllMaxBuckets = 17;

struct SpmmEllBucket {
  int64_t first_warp;   // the launch's first warp on this bucket
  int64_t row_offset;   // the bucket's first row in `rows`
  int64_t slot_offset;  // its first slot in `columns` / `values`
  int32_t rows;         // bucket rows
  int32_t log2_width;   // slots a row: 2^log2_width
  int32_t log2_rows_per_warp;
  int32_t unused;
};

struct SpmmEllParams {
  const int32_t* rows;     // bucket row -> Y's row
  const int32_t* columns;  // slots, -1 for padding
  const void* values;      // slots, X's dtype
  const void* x;           // [cols, d], row stride x_stride elements
  void* y;                 // [y_rows, d], row stride y_stride elements
  int64_t cols;
  int64_t y_rows;
  int64_t x_stride;
  int64_t y_stride;
  int64_t warps;  // the launch's warps (the last bucket's first_warp plus its warps)
  int32_t buckets;
  int32_t accumulate;  // nonzero: Y's rows += the sums (else =)
  SpmmEllBucket bucket[kSpmmEllMaxBuckets];
};

}  // namespace flare

#ifdef __CUDACC_RTC__

static_assert(flare::spmm_csr::kRowsMapped, "spmm_hyb.cuh needs FLARE_SPMM_ROWS_MAPPED 1");

// CTAs an SM: 4 (at most 64 registers) but for 16-bit rows of 512 and more, whose 16 floats of
// sums a lane, converted 16-bit loads and the bucket's row ids need 78 (64 spilled 60 bytes).
namespace flare::spmm_hyb {
constexpr int kEllBlocksPerSm = spmm_csr::kElementBytes == 2 && spmm_csr::kFeatures >= 512 ? 3 : 4;
}  // namespace flare::spmm_hyb

extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads, flare::spmm_hyb::kEllBlocksPerSm)
    flare_spmm_ell(const __grid_constant__ flare::SpmmEllParams p) {
  using namespace flare::spmm_csr;
  namespace vec = flare::sparse_vec;
  const int lane = threadIdx.x % 32, group = lane / kRowLanes, row_lane = lane % kRowLanes;
  const int64_t warp = int64_t{blockIdx.x} * (flare::kSpmmThreads / 32) + threadIdx.x / 32;
  if (warp >= p.warps) return;
  int b = 0;
  while (b + 1 < p.buckets && warp >= p.bucket[b + 1].first_warp) ++b;
  const flare::SpmmEllBucket& bucket = p.bucket[b];
  const int log2_width = bucket.log2_width;
  const int width = 1 << log2_width;
  const int per_warp = 1 << bucket.log2_rows_per_warp;
  const int first_row = static_cast<int>(warp - bucket.first_warp) * per_warp;
  const int rows_here = bucket.rows - first_row < per_warp ? bucket.rows - first_row : per_warp;
  const int slots = rows_here << log2_width;
  const int32_t* row_ids = p.rows + bucket.row_offset + first_row;
  const int64_t slot0 = bucket.slot_offset + (int64_t{first_row} << log2_width);

  // The lane's first element of X's row 0 (rows x_row_bytes apart, below 2^32: checked).
  const char* x_lane = static_cast<const char*>(p.x) + feature_of(0, row_lane) * kElementBytes;
  const unsigned x_row_bytes = static_cast<unsigned>(p.x_stride) * kElementBytes;
  const bool accumulate = p.accumulate != 0;
  // Groups sharing a row of more than kBatch slots (a power of two, at most kGroups).
  const int share = width <= kBatch ? 1 : width / kBatch < kGroups ? width / kBatch : kGroups;
  // Writes a row of Y from the calling group's lanes (nothing for a row id outside Y).
  const auto write = [&](int row_id, const Row& acc) {
    if (static_cast<unsigned>(row_id) < static_cast<unsigned long long>(p.y_rows))
      write_y_row(p.y, p.y_stride, row_id, row_lane, accumulate, acc);
  };
  Row acc;
  clear(acc);
  for (int base = 0; base < slots; base += 32) {
    const int s = base + lane;
    int col = -1;
    float value = 0.0f;
    if (s < slots) {
      col = __ldg(p.columns + slot0 + s);
      value = vec::load_scalar<kDType>(static_cast<const char*>(p.values) +
                                       (slot0 + s) * kElementBytes);
    }
    if (static_cast<unsigned>(col) >= static_cast<unsigned long long>(p.cols)) col = -1;
    // Y's row of each row that starts among these 32 slots (lane i: the i-th), -1 past the
    // warp's rows.
    const int row_in_block = (base >> log2_width) + lane;
    const int rows_starting = log2_width >= 5 ? 1 : 32 >> log2_width;
    const int row_id =
        lane < rows_starting && row_in_block < rows_here ? __ldg(row_ids + row_in_block) : -1;
    const int count = slots - base < 32 ? slots - base : 32;
    for (int j0 = 0; j0 < count; j0 += kSlots) {
      Batch batch;
      load_batch(
          col, value, x_lane, x_row_bytes, [&](int i) { return j0 + group * kBatch + i; }, batch);
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (batch.valid[i]) add_load(batch, i, acc);
        // Rows of at most kBatch slots end inside a group's slots (at the same i in every
        // group: warp-uniform, so the row id's shuffle is too).
        if (width <= kBatch && ((i + 1) & (width - 1)) == 0) {
          const int slot = j0 + group * kBatch + i;
          const int id = __shfl_sync(0xffffffffu, row_id, slot >> log2_width);
          write(id, acc);
          clear(acc);
        }
      }
      // A longer row ends with the batch when the batch holds several rows or ends its row.
      if (width > kBatch && (width < kSlots || ((base + j0 + kSlots) & (width - 1)) == 0)) {
        for (int o = kRowLanes; o < kRowLanes * share; o *= 2) {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int f = 0; f < kVec; ++f) acc[c][f] += __shfl_xor_sync(0xffffffffu, acc[c][f], o);
          }
        }
        const int id = __shfl_sync(0xffffffffu, row_id, (j0 + group * kBatch) >> log2_width);
        if (group % share == 0) write(id, acc);
        clear(acc);
      }
    }
  }
}

#endif  // __CUDACC_RTC__
