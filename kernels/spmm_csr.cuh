// SpMM on a CSR matrix (issue 23, SparseTIR's csrmm without decomposition): Y = A X with A
// sparse [rows, cols] (int32 indptr / indices, float32 values) and X [cols, d], Y [rows, d]
// float32, row-major with any row stride.
//
// Work is split evenly over the merge of A's row ends and its nonzeros (merge-based, as
// Merrill and Garland's CSR SpMV): a warp takes `chunk` consecutive items of that merged list
// (a nonzero or a row's end each), found by a binary search along the merge path, so neither a
// power-law graph's hub row (its nonzeros are spread over as many warps as it has chunks) nor a
// run of empty rows (their ends count as items) holds one warp for the grid's tail. (A warp or
// a CTA a row, v1 and v2, left the hubs to a few warps: 0.2-0.3x cuSPARSE; chunks of nonzeros
// alone, v3's first cut, left a walk of up to 1,020 rows to one warp.) The warp reads 32 of its
// nonzeros at a time (one a lane, coalesced) and broadcasts them by shuffle, a batch at a time:
// the batch's rows of X load together, then every lane accumulates kVec consecutive features
// of each 32 * kVec chunk of d in float32 registers. Rows whose end falls in the chunk are
// written to Y (with `=`, empty rows as 0); the row open at the chunk's end leaves its partial
// row in the carry workspace (carry_row[c], carry[c]). A second kernel adds each row's carries,
// in chunk order, to the part of the row its last chunk wrote. Every sum has a fixed order:
// deterministic, no atomics.
//
// Memory safety whatever the index arrays hold: indptr is read only in [0, rows], its entries
// clamped into [0, nnz]; a chunk writes only rows below its split's row (at most rows) and
// reads only nonzeros between its splits (within [0, nnz]); a column outside [0, cols) contributes nothing
// (its X row is not read); carries are written only for rows in [0, rows). Only well-formed CSR
// (validate_csr) gives A X.
//
// Compile-time defines: FLARE_SPMM_FEATURES (d, a multiple of 32), FLARE_SPMM_VEC (features
// per lane per chunk of d: 4, 2 or 1, dividing d / 32; the host picks the widest that X's and
// Y's alignment allow).
#pragma once

#include "fixed_width_ints.cuh"

namespace flare {

struct SpmmCsrParams {
  const int32_t* indptr;   // [rows + 1]
  const int32_t* indices;  // [nnz]
  const float* values;     // [nnz]
  const float* x;          // [cols, d], row stride x_stride elements
  float* y;                // [rows, d], row stride y_stride elements
  float* carry;            // [chunks, d]: the partial row a chunk leaves for its last row
  int32_t* carry_row;      // [chunks]: that row, or -1 when the chunk's last row ends in it
  int64_t rows;
  int64_t cols;
  int64_t nnz;
  int64_t x_stride;
  int64_t y_stride;
  int64_t chunks;  // ceil((rows + nnz) / chunk)
  int32_t chunk;   // merge items (nonzeros and row ends) a warp takes
};

constexpr int kSpmmThreads = 256;  // 8 warps, a chunk each

}  // namespace flare

#ifdef __CUDACC_RTC__

namespace flare::spmm_csr {

constexpr int kFeatures = FLARE_SPMM_FEATURES;
constexpr int kVec = FLARE_SPMM_VEC;
constexpr int kChunks = kFeatures / (32 * kVec);
static_assert(kFeatures % 32 == 0 && kFeatures > 0, "d must be a positive multiple of 32");
static_assert(kVec == 1 || kVec == 2 || kVec == 4, "vector of 1, 2 or 4 floats");
static_assert(kFeatures % (32 * kVec) == 0, "the vector must divide d / 32");

template <int kN>
struct FloatVec {
  float v[kN];
};

template <int kN>
__device__ __forceinline__ FloatVec<kN> load_vec(const float* src) {
  FloatVec<kN> out;
  if constexpr (kN == 4) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(src));
    out.v[0] = f.x, out.v[1] = f.y, out.v[2] = f.z, out.v[3] = f.w;
  } else if constexpr (kN == 2) {
    const float2 f = __ldg(reinterpret_cast<const float2*>(src));
    out.v[0] = f.x, out.v[1] = f.y;
  } else {
    out.v[0] = __ldg(src);
  }
  return out;
}

template <int kN>
__device__ __forceinline__ void store_vec(float* dst, const float (&values)[kN]) {
  if constexpr (kN == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(values[0], values[1], values[2], values[3]);
  } else if constexpr (kN == 2) {
    *reinterpret_cast<float2*>(dst) = make_float2(values[0], values[1]);
  } else {
    *dst = values[0];
  }
}

// Nonzeros whose X rows are loaded before any is summed: the loads of a batch are in flight
// together (a warp otherwise waits a memory latency per nonzero). About 16 floats of registers
// a lane (32 took 71 registers at d 128 on sm_90a: 24 warps an SM instead of 32).
constexpr int kBatchRaw = 16 / (kChunks * kVec);
constexpr int kBatch = kBatchRaw < 1 ? 1 : kBatchRaw > 8 ? 8 : kBatchRaw;

using Row = float[kChunks][kVec];

// Rows and nonzeros are below 2^31 (checked on the host): 32-bit positions.
// indptr[i] for i in [0, rows], clamped into [0, nnz].
__device__ __forceinline__ int row_start(const flare::SpmmCsrParams& p, int i) {
  const int v = __ldg(p.indptr + i);
  const int nnz = static_cast<int>(p.nnz);
  return v < 0 ? 0 : v > nnz ? nnz : v;
}

// The merge path's split at diagonal k of the merged list of row ends (indptr[1..rows]) and
// nonzeros (0..nnz - 1), row ends first on ties: the number of rows whose end comes before it
// (the nonzeros before it are k minus that). rows + nnz < 2^31 (checked on the host).
__device__ __forceinline__ int merge_split(const flare::SpmmCsrParams& p, int k) {
  const int nnz = static_cast<int>(p.nnz);
  int lo = k - nnz > 0 ? k - nnz : 0;
  int hi = k < p.rows ? k : static_cast<int>(p.rows);
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (row_start(p, mid + 1) <= k - mid - 1) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__device__ __forceinline__ void clear(Row& acc) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[c][i] = 0.0f;
  }
}

// The lane's features of a row of d floats at `row`.
__device__ __forceinline__ void store_row(float* row, int lane, const Row& acc) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) store_vec<kVec>(row + c * 32 * kVec + lane * kVec, acc[c]);
}

// The walk's position: the current row and where it ends (indptr[row + 1] clamped; nnz for the
// last row).
struct RowCursor {
  int row;
  int end;
};

__device__ __forceinline__ int row_end(const flare::SpmmCsrParams& p, int row) {
  return row < static_cast<int>(p.rows) ? row_start(p, row + 1) : static_cast<int>(p.nnz);
}

// Writes the current row (acc, then zeros for the empty rows after it) while the row ends at or
// before `e`, and moves to the next; stops at `open_row` (the chunk's last, open row).
__device__ __forceinline__ void finish_rows_before(const flare::SpmmCsrParams& p, int e,
                                                   int open_row, int lane, RowCursor& at,
                                                   Row& acc) {
  while (at.row < open_row && at.end <= e) {
    store_row(p.y + int64_t{at.row} * p.y_stride, lane, acc);
    clear(acc);
    ++at.row;
    at.end = row_end(p, at.row);
  }
}

}  // namespace flare::spmm_csr

// One warp a chunk of merge items [k0, k1): between its splits (row0, e0) and (row1, e1) it
// reads nonzeros [e0, e1) and writes rows [row0, row1); row1's nonzeros in the chunk (when
// row1 < rows) are its carry.
extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads, 1)
    flare_spmm_csr(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  const int lane = threadIdx.x % 32;
  const int64_t chunk_id = int64_t{blockIdx.x} * (flare::kSpmmThreads / 32) + threadIdx.x / 32;
  if (chunk_id >= p.chunks) return;
  const int64_t total = p.rows + p.nnz;
  const int k0 = static_cast<int>(chunk_id * p.chunk < total ? chunk_id * p.chunk : total);
  const int k1 = static_cast<int>((chunk_id + 1) * p.chunk < total ? (chunk_id + 1) * p.chunk : total);
  // Lanes 0 and 1 search the two splits at once.
  int split = 0;
  if (lane < 2) split = merge_split(p, lane == 0 ? k0 : k1);
  const int row0 = __shfl_sync(0xffffffffu, split, 0);
  const int row1 = __shfl_sync(0xffffffffu, split, 1);
  const int e0 = k0 - row0, e1 = k1 - row1;
  RowCursor at;
  at.row = row0;
  at.end = row_end(p, row0);
  Row acc;
  clear(acc);
  for (int base = e0; base < e1; base += 32) {
    const int e = base + lane;
    int col = -1;
    float value = 0.0f;
    if (e < e1) {
      col = __ldg(p.indices + e);
      value = __ldg(p.values + e);
    }
    if (static_cast<unsigned>(col) >= static_cast<unsigned long long>(p.cols)) col = -1;
    const int count = e1 - base < 32 ? e1 - base : 32;
    for (int j0 = 0; j0 < count; j0 += kBatch) {
      FloatVec<kVec> x[kBatch][kChunks];
      float v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        // Slots past the chunk and columns outside the matrix load nothing and weigh 0.
        const int c_b = __shfl_sync(0xffffffffu, col, (j0 + b) & 31);
        v[b] = __shfl_sync(0xffffffffu, value, (j0 + b) & 31);
        const bool valid = j0 + b < count && c_b >= 0;
        if (!valid) v[b] = 0.0f;
        const float* x_row = p.x + static_cast<int64_t>(valid ? c_b : 0) * p.x_stride + lane * kVec;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          if (valid) {
            x[b][c] = load_vec<kVec>(x_row + c * 32 * kVec);
          } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i) x[b][c].v[i] = 0.0f;
          }
        }
      }
      // The batch's slots [s, n) are summed a row at a time: slots [s, stop) are the current
      // row's, then the row is written and the walk moves on (one pass over the batch's
      // registers a row that ends in it; a select, not a zero weight, so that an inf in X stays
      // in its row). Every pass takes at least one slot, whatever indptr holds.
      const int at_batch = base + j0;
      const int n = count - j0 < kBatch ? count - j0 : kBatch;
      finish_rows_before(p, at_batch, row1, lane, at, acc);
      for (int s = 0; s < n;) {
        int stop = at.row == row1 ? n : at.end - at_batch;
        stop = stop < s + 1 ? s + 1 : stop > n ? n : stop;
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (b >= s && b < stop) {
#pragma unroll
            for (int c = 0; c < kChunks; ++c) {
#pragma unroll
              for (int i = 0; i < kVec; ++i) acc[c][i] = fmaf(v[b], x[b][c].v[i], acc[c][i]);
            }
          }
        }
        s = stop;
        if (s < n) finish_rows_before(p, at_batch + s, row1, lane, at, acc);
      }
    }
  }
  // Every row before row1 ends in this chunk; row1's nonzeros here (if any) are its carry.
  while (at.row < row1) {
    store_row(p.y + int64_t{at.row} * p.y_stride, lane, acc);
    clear(acc);
    ++at.row;
  }
  const bool carries = row1 < p.rows && e1 > e0 && e1 > row_start(p, row1);
  if (carries) store_row(p.carry + chunk_id * kFeatures, lane, acc);
  if (lane == 0) p.carry_row[chunk_id] = carries ? row1 : -1;
}

// One warp a chunk: the first chunk of each run of chunks carrying the same row adds their
// partials, in chunk order, to the part of the row its last chunk wrote.
extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads)
    flare_spmm_csr_carries(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  const int lane = threadIdx.x % 32;
  const int64_t chunk_id = int64_t{blockIdx.x} * (flare::kSpmmThreads / 32) + threadIdx.x / 32;
  if (chunk_id >= p.chunks) return;
  const int row = p.carry_row[chunk_id];
  if (row < 0 || row >= p.rows || (chunk_id > 0 && p.carry_row[chunk_id - 1] == row)) return;
  // The run's chunks 32 at a time (a lane each reads whether its chunk carries the row), their
  // partial rows loaded 4 at a time and added in chunk order.
  constexpr int kInFlight = 4;
  Row sum;
  clear(sum);
  for (int64_t base = chunk_id;; base += 32) {
    const int64_t mine = base + lane;
    const bool same = mine < p.chunks && p.carry_row[mine] == row;
    const unsigned run = __ballot_sync(0xffffffffu, same);
    const int length = run == 0xffffffffu ? 32 : __ffs(~run) - 1;  // lane 0's is the run's
    for (int j = 0; j < length; j += kInFlight) {
      FloatVec<kVec> part[kInFlight][kChunks];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const float* carry = p.carry + (base + j + (j + u < length ? u : 0)) * kFeatures;
#pragma unroll
        for (int k = 0; k < kChunks; ++k) part[u][k] = load_vec<kVec>(carry + k * 32 * kVec + lane * kVec);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (j + u < length) {
#pragma unroll
          for (int k = 0; k < kChunks; ++k) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) sum[k][i] += part[u][k].v[i];
          }
        }
      }
    }
    if (length < 32) break;
  }
  float* y_row = p.y + int64_t{row} * p.y_stride;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    float out[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = y_row[k * 32 * kVec + lane * kVec + i] + sum[k][i];
    store_vec<kVec>(y_row + k * 32 * kVec + lane * kVec, out);
  }
}

#endif  // __CUDACC_RTC__
