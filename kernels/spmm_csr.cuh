// SpMM on a CSR matrix (issue 23, SparseTIR's csrmm without decomposition): Y = A X with A
// sparse [rows, cols] (int32 indptr / indices, float32 values) and X [cols, d], Y [rows, d]
// float32, row-major with any row stride.
//
// Work is split by nonzeros, not rows (merge-based, as Merrill and Garland's CSR SpMV): a warp
// takes `chunk` consecutive nonzeros, finds the row of the first by a binary search of indptr,
// then walks forward. A power-law graph's hub row is spread over as many warps as it has
// chunks, so no warp holds the grid's tail (a warp or a CTA a row, v1 and v2, left the hubs to
// a few warps: 0.2-0.3x cuSPARSE). The warp reads 32 of its nonzeros at a time (one a lane,
// coalesced) and broadcasts them by shuffle, a batch at a time: the batch's rows of X load
// together, then every lane accumulates kVec consecutive features of each 32 * kVec chunk of d
// in float32 registers. Rows that end inside the chunk are written to Y (with `=`); the row
// that continues past the chunk's end leaves its partial row in the carry workspace
// (carry_row[c], carry[c]). A second kernel adds each row's carries, in chunk order, to the
// part its last chunk wrote. Every sum has a fixed order: deterministic, no atomics.
//
// Which chunk writes a row: the one whose nonzero range (first, last] holds the row's end
// indptr[r + 1] (chunk 0 also every leading row that ends at 0), so empty rows are written 0
// by exactly one chunk, and a matrix without nonzeros runs as one empty chunk.
//
// Memory safety whatever the index arrays hold: indptr is read only in [0, rows], its entries
// clamped into [0, nnz]; row walks stop at rows; a column outside [0, cols) contributes nothing
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
  int64_t chunks;  // max(1, ceil(nnz / chunk))
  int32_t chunk;   // nonzeros a warp takes
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

// The row holding nonzero e: the last row r in [0, rows) with indptr[r] <= e (0 if none).
__device__ __forceinline__ int row_of(const flare::SpmmCsrParams& p, int e) {
  int lo = 0, hi = static_cast<int>(p.rows) - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (row_start(p, mid) <= e) {
      lo = mid;
    } else {
      hi = mid - 1;
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
  return row + 1 < static_cast<int>(p.rows) ? row_start(p, row + 1) : static_cast<int>(p.nnz);
}

// Writes the current row (acc, then zeros for the empty rows after it) while the row ends at or
// before `e`, and moves to the next; stops at the last row.
__device__ __forceinline__ void finish_rows_before(const flare::SpmmCsrParams& p, int e, int lane,
                                                   RowCursor& at, Row& acc) {
  while (at.end <= e && at.row + 1 < static_cast<int>(p.rows)) {
    store_row(p.y + int64_t{at.row} * p.y_stride, lane, acc);
    clear(acc);
    ++at.row;
    at.end = row_end(p, at.row);
  }
}

}  // namespace flare::spmm_csr

// One warp a chunk of nonzeros [first, last): rows that end in (first, last] are written to Y;
// the row that runs on past `last` leaves its partial in carry[chunk].
extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads, 1)
    flare_spmm_csr(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  const int lane = threadIdx.x % 32;
  const int64_t chunk_id = int64_t{blockIdx.x} * (flare::kSpmmThreads / 32) + threadIdx.x / 32;
  if (chunk_id >= p.chunks) return;
  const int nnz = static_cast<int>(p.nnz);
  // 64-bit products: chunk_id * chunk may pass 2^31 for the grid's last warps.
  const int first = static_cast<int>(chunk_id * p.chunk < nnz ? chunk_id * p.chunk : nnz);
  const int last = static_cast<int>((chunk_id + 1) * p.chunk < nnz ? (chunk_id + 1) * p.chunk : nnz);
  // Chunk 0 starts at row 0 (the leading rows that end at 0 are its own); the others at the
  // row holding their first nonzero (rows before it end at or before `first`).
  RowCursor at;
  at.row = chunk_id == 0 ? 0 : row_of(p, first);
  at.end = row_end(p, at.row);
  Row acc;
  clear(acc);
  for (int base = first; base < last; base += 32) {
    const int e = base + lane;
    int col = -1;
    float value = 0.0f;
    if (e < last) {
      col = __ldg(p.indices + e);
      value = __ldg(p.values + e);
    }
    if (static_cast<unsigned>(col) >= static_cast<unsigned long long>(p.cols)) col = -1;
    const int count = last - base < 32 ? last - base : 32;
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
      // in its row).
      const int at_batch = base + j0;
      const int n = count - j0 < kBatch ? count - j0 : kBatch;
      finish_rows_before(p, at_batch, lane, at, acc);
      for (int s = 0; s < n;) {
        const int stop = at.end - at_batch < n ? at.end - at_batch : n;
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
        if (s < n) finish_rows_before(p, at_batch + s, lane, at, acc);
      }
    }
  }
  // Rows ending at `last` are this chunk's (empty rows there included); a row still open that
  // started before `last` carries its partial to the next chunk's fix-up.
  finish_rows_before(p, last, lane, at, acc);
  if (at.end <= last) {  // the last row of the matrix, ending here
    store_row(p.y + int64_t{at.row} * p.y_stride, lane, acc);
    if (lane == 0) p.carry_row[chunk_id] = -1;
  } else if (row_start(p, at.row) < last) {
    store_row(p.carry + chunk_id * kFeatures, lane, acc);
    if (lane == 0) p.carry_row[chunk_id] = at.row;
  } else if (lane == 0) {
    p.carry_row[chunk_id] = -1;  // the open row starts in the next chunk
  }
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
  Row sum;
  clear(sum);
  for (int64_t c = chunk_id; c < p.chunks && p.carry_row[c] == row; ++c) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const FloatVec<kVec> part = load_vec<kVec>(p.carry + c * kFeatures + k * 32 * kVec + lane * kVec);
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum[k][i] += part.v[i];
    }
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
