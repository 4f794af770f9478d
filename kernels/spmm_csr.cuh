// SpMM on a CSR matrix (issue 23, SparseTIR's csrmm without decomposition): Y = A X with A
// sparse [rows, cols] (int32 indptr / indices, values in X's dtype) and X [cols, d], Y [rows, d]
// of one dtype (float32, float16 or bfloat16; sums in float32), row-major with any row stride.
//
// Work is split evenly over the merge of A's row ends and its nonzeros (merge-based, as
// Merrill and Garland's CSR SpMV): a warp takes `chunk` consecutive items of that merged list
// (a nonzero or a row's end each), found by a binary search along the merge path, so neither a
// power-law graph's hub row (its nonzeros are spread over as many warps as it has chunks) nor a
// run of empty rows (their ends count as items) holds one warp for the grid's tail. (A warp or
// a CTA a row, v1 and v2, left the hubs to a few warps: 0.2-0.3x cuSPARSE; chunks of nonzeros
// alone, v3's first cut, left a walk of up to 1,020 rows to one warp.) The warp reads 32 of its
// nonzeros at a time (one a lane, coalesced) and broadcasts them by shuffle, a batch at a time.
// A row of X is kRowLanes lanes' vectors of kVec elements (16 bytes where alignment allows);
// when that is fewer than 32 lanes (d below 128 in float32) the warp's kGroups lane groups
// take different nonzeros of the batch and their partial rows are summed by shuffles when a
// row ends (v4: at d 32, a lane a float and one nonzero a load left the warp issue-bound).
// Rows whose end falls in the chunk are written to Y (with `=`, empty rows as 0), except a first
// row that began in an earlier chunk: its part goes to the head workspace (head_row[c],
// head[c]); the row open at the chunk's end leaves its part in the carry workspace
// (carry_row[c], carry[c]). A second kernel sums a split row's carries, in chunk order, and
// the head of the chunk where it ends, in float32, and writes the row once. Every sum has a
// fixed order: deterministic, no atomics.
//
// Memory safety whatever the index arrays hold: indptr is read only in [0, rows], its entries
// clamped into [0, nnz]; a chunk writes only rows below its split's row (at most rows) and
// reads only nonzeros between its splits (within [0, nnz]); a column outside [0, cols) contributes
// nothing (its X row is not read); carries and heads are written only for rows in [0, rows). Only
// well-formed CSR (validate_csr) gives A X.
//
// Compile-time defines: FLARE_SPMM_FEATURES (d: a multiple of 32, or a power of two below 32),
// FLARE_SPMM_VEC (elements a lane loads at once: at most 16 bytes, d / kVec a multiple or a
// divisor of 32; the host picks the widest that X's and Y's alignment allow), FLARE_SPMM_DTYPE
// (kSparseF32, kCodeF16 or kCodeBF16); FLARE_SPMM_ROWS_MAPPED (default 0): 1 for a sub-matrix
// of a decomposition (spmm_hyb.cuh: hyb's CSR remainder), whose row i is Y's row row_ids[i]
// (one outside [0, y_rows) is not written) and, with `accumulate`, is added to Y's row.
#pragma once

#include "fixed_width_ints.cuh"
#include "sparse_vec.cuh"

namespace flare {

struct SpmmCsrParams {
  const int32_t* indptr;   // [rows + 1]
  const int32_t* indices;  // [nnz]
  const void* values;      // [nnz], X's dtype
  const void* x;           // [cols, d], row stride x_stride elements
  void* y;                 // [rows, d], row stride y_stride elements
  float* carry;            // [chunks, d]: the partial row a chunk leaves for its last row
  float* head;         // [chunks, d]: a chunk's part of its first row, begun in an earlier chunk
  int32_t* carry_row;  // [chunks]: that row, or -1 when the chunk's last row ends in it
  int32_t* head_row;   // [chunks]: that row, or -1 when the chunk's first row begins in it
  int64_t rows;
  int64_t cols;
  int64_t nnz;
  int64_t x_stride;
  int64_t y_stride;
  int64_t chunks;  // ceil((rows + nnz) / chunk)
  int32_t chunk;   // merge items (nonzeros and row ends) a warp takes
  // FLARE_SPMM_ROWS_MAPPED only (ignored otherwise):
  const int32_t* row_ids;  // [rows]: Y's row of each row
  int64_t y_rows;          // Y's rows
  int32_t accumulate;      // nonzero: Y's rows += the sums (else =)
};

constexpr int kSpmmThreads = 256;  // 8 warps, a chunk each

}  // namespace flare

#ifdef __CUDACC_RTC__

namespace flare::spmm_csr {

#ifndef FLARE_SPMM_ROWS_MAPPED
#define FLARE_SPMM_ROWS_MAPPED 0
#endif

constexpr int kDType = FLARE_SPMM_DTYPE;
constexpr bool kRowsMapped = FLARE_SPMM_ROWS_MAPPED != 0;
constexpr int kFeatures = FLARE_SPMM_FEATURES;
constexpr int kVec = FLARE_SPMM_VEC;
constexpr int kElementBytes = sparse_vec::element_bytes<kDType>();
constexpr int kRowLanes = kFeatures / kVec < 32 ? kFeatures / kVec : 32;  // lanes a row of X
constexpr int kGroups = 32 / kRowLanes;                                   // nonzeros a load
constexpr int kChunks = kFeatures / (kRowLanes * kVec);                   // vectors a lane
static_assert(kVec * kElementBytes <= 16, "a vector of at most 16 bytes");
static_assert(kRowLanes * kGroups == 32 && kChunks * kRowLanes * kVec == kFeatures,
              "the lanes must tile d: d / kVec a multiple or a divisor of 32");

using Stored = sparse_vec::Stored<kDType, kVec>;

// Loads of X a lane keeps in flight before any is summed (a warp otherwise waits a memory
// latency per batch): about 16 words of registers a lane (32 took 71 registers at d 128 on
// sm_90a: 24 warps an SM instead of 32), and a batch of at most 32 nonzeros.
constexpr int kBatchRaw = 16 / (kChunks * Stored::kWords);
constexpr int kBatchMax = 32 / kGroups < 8 ? 32 / kGroups : 8;
constexpr int kBatchClamped = kBatchRaw < 1 ? 1 : kBatchRaw > kBatchMax ? kBatchMax : kBatchRaw;
// A power of two (kSlots must divide 32): d 96 in float32 holds 3 vectors a lane, 5 would fit.
constexpr int kBatch = kBatchClamped >= 8 ? 8 : kBatchClamped >= 4 ? 4 : kBatchClamped >= 2 ? 2 : 1;
constexpr int kSlots = kBatch * kGroups;  // nonzeros a batch
static_assert(32 % kSlots == 0, "a batch's slots divide the 32 nonzeros read at a time");

using Row = float[kChunks][kVec];

// Rows and nonzeros are below 2^31 (checked on the host): 32-bit positions.
// indptr[i] for i in [0, rows], clamped into [0, nnz].
__device__ __forceinline__ int row_start(const flare::SpmmCsrParams& p, int i) {
  const int v = __ldg(p.indptr + i);
  const int nnz = static_cast<int>(p.nnz);
  return v < 0 ? 0 : v > nnz ? nnz : v;
}

// The merge path's splits at diagonals k0 (lanes 0-15) and k1 (lanes 16-31) of the merged list
// of row ends (indptr[1..rows]) and nonzeros (0..nnz - 1), row ends first on ties: the number of
// rows whose end comes before each (the nonzeros before it are k minus that), in lane 0 and lane
// 16. A 17-ary search: each step a half-warp probes 16 positions at once, so about 6 dependent
// loads instead of a binary search's 24 on a graph of 23M items (at d 32 the binary search's
// latency was most of a chunk's life: v4's larger chunks won for that reason). Whatever indptr
// holds, the range shrinks every step and the result stays in [max(k - nnz, 0), min(k, rows)].
// rows + nnz < 2^31 (checked on the host).
__device__ __forceinline__ int merge_splits(const flare::SpmmCsrParams& p, int k0, int k1,
                                            int lane) {
  const int half = lane >> 4, probe = lane & 15;
  const int k = half == 0 ? k0 : k1;
  const int nnz = static_cast<int>(p.nnz);
  const int first = k - nnz > 0 ? k - nnz : 0;
  const int last = k < p.rows ? k : static_cast<int>(p.rows);
  int lo = first, hi = last;  // the split is in [lo, hi]
  for (;;) {
    const int span = hi - lo;
    const bool active = span > 0;
    if (!__any_sync(0xffffffffu, active)) break;
    // Probes lo + (i + 1) * span / 17: non-decreasing in i, all in [lo, hi).
    const int mid = lo + static_cast<int>(static_cast<long long>(probe + 1) * span / 17);
    const bool before = active && row_start(p, mid + 1) <= k - mid - 1;
    const unsigned mine = (__ballot_sync(0xffffffffu, before) >> (16 * half)) & 0xffffu;
    // For a monotone indptr the probes before the split are a prefix of the half-warp's.
    const int count = __popc(mine);
    const int below = __shfl_sync(0xffffffffu, mid, 16 * half + (count > 0 ? count - 1 : 0));
    const int above = __shfl_sync(0xffffffffu, mid, 16 * half + (count < 16 ? count : 15));
    if (active) {
      if (count > 0) lo = below + 1;
      if (count < 16) hi = above;
      if (hi < lo) hi = lo;  // a non-monotone indptr: stop here
    }
  }
  return lo < first ? first : lo > last ? last : lo;
}

__device__ __forceinline__ void clear(Row& acc) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[c][i] = 0.0f;
  }
}

// Every lane group's partial row summed into every lane (a fixed butterfly: deterministic).
__device__ __forceinline__ void sum_groups(Row& acc) {
#pragma unroll
  for (int o = kRowLanes; o < 32; o *= 2) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[c][i] += __shfl_xor_sync(0xffffffffu, acc[c][i], o);
    }
  }
}

// The element offset of a lane's vector c within a row of d.
__device__ __forceinline__ int feature_of(int c, int row_lane) {
  return (c * kRowLanes + row_lane) * kVec;
}

// Writes a lane's part of a row of Y (at `y_row`, a row of Y: checked by the caller), rounded
// to Y's dtype; added to what Y holds when `accumulate` (a decomposition's later parts).
__device__ __forceinline__ void write_y_row(const void* y, int64_t y_stride, int64_t y_row,
                                            int row_lane, bool accumulate, const Row& acc) {
  char* y_bytes = static_cast<char*>(const_cast<void*>(y)) + y_row * y_stride * kElementBytes;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    char* at = y_bytes + feature_of(c, row_lane) * kElementBytes;
    float out[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = acc[c][i];
    if (accumulate) {
      float old[kVec];
      sparse_vec::to_float<kDType, kVec>(sparse_vec::load<kDType, kVec, true>(at), old);
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] += old[i];
    }
    sparse_vec::store<kDType, kVec>(at, out);
  }
}

// Y's row of the walk's row `row` (in [0, rows)): itself, or for a mapped sub-matrix
// row_ids[row], -1 when that lies outside Y.
__device__ __forceinline__ int64_t y_row_of(const flare::SpmmCsrParams& p, int row) {
  if constexpr (!kRowsMapped) {
    return row;
  } else {
    const int mapped = __ldg(p.row_ids + row);
    return static_cast<unsigned>(mapped) < static_cast<unsigned long long>(p.y_rows) ? mapped : -1;
  }
}

// A batch of kBatch loads of X's rows a lane: load i reads the row of the nonzero in slot
// slot_of(i) of the 32 the warp read (its column in `col`, -1 for none or one outside the
// matrix, and its value in `value`, in that slot's lane). A slot without a column loads X's
// row 0 and is marked invalid, so the sums skip it (an inf in row 0 stays out of other rows).
// x_lane is the lane's first element of X's row 0; rows are x_row_bytes apart (< 2^32).
struct Batch {
  Stored xs[kBatch][kChunks];
  float v[kBatch];
  bool valid[kBatch];
};

template <class SlotOf>
__device__ __forceinline__ void load_batch(int col, float value, const char* x_lane,
                                           unsigned x_row_bytes, SlotOf slot_of, Batch& batch) {
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const int slot = slot_of(i);
    const int c_i = __shfl_sync(0xffffffffu, col, slot);
    batch.v[i] = __shfl_sync(0xffffffffu, value, slot);
    batch.valid[i] = c_i >= 0;
    const unsigned row = batch.valid[i] ? static_cast<unsigned>(c_i) : 0u;
    const char* x_row = x_lane + static_cast<unsigned long long>(row) * x_row_bytes;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      batch.xs[i][c] = sparse_vec::load<kDType, kVec>(x_row + c * kRowLanes * kVec * kElementBytes);
  }
}

// acc += load i's weighted row of X (a valid one).
__device__ __forceinline__ void add_load(const Batch& batch, int i, Row& acc) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float xf[kVec];
    sparse_vec::to_float<kDType, kVec>(batch.xs[i][c], xf);
#pragma unroll
    for (int f = 0; f < kVec; ++f) acc[c][f] = fmaf(batch.v[i], xf[f], acc[c][f]);
  }
}

// A row of d floats of a workspace, from the first lane group (whose lanes hold the row).
__device__ __forceinline__ void store_partial(float* row, int lane, const Row& acc) {
  if (lane >= kRowLanes) return;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    sparse_vec::store_floats<kVec>(row + feature_of(c, lane), acc[c]);
}

// The walk's position: the current row and where it ends (indptr[row + 1] clamped; nnz for the
// last row); whether the row is the chunk's head (begun in an earlier chunk) and whether any
// lane group added to it since it was last written.
struct RowCursor {
  int row;
  int end;
  bool head;
  bool touched;
};

__device__ __forceinline__ int row_end(const flare::SpmmCsrParams& p, int row) {
  return row < static_cast<int>(p.rows) ? row_start(p, row + 1) : static_cast<int>(p.nnz);
}

// Writes the current row, to the head workspace when it is the chunk's head, else to Y, and
// moves to the next. Warp-uniform (the shuffles of sum_groups).
__device__ __forceinline__ void finish_row(const flare::SpmmCsrParams& p, int64_t chunk_id,
                                           int lane, RowCursor& at, Row& acc) {
  if (kGroups > 1 && at.touched) sum_groups(acc);
  if (at.head) {
    store_partial(p.head + chunk_id * kFeatures, lane, acc);
  } else if (lane < kRowLanes) {
    const int64_t y_row = y_row_of(p, at.row);
    if (y_row >= 0) write_y_row(p.y, p.y_stride, y_row, lane, kRowsMapped && p.accumulate, acc);
  }
  clear(acc);
  at.head = false;
  at.touched = false;
  ++at.row;
  at.end = row_end(p, at.row);
}

// Finishes rows while the current one ends at or before `e`; stops at `open_row` (the chunk's
// last, open row).
__device__ __forceinline__ void finish_rows_before(const flare::SpmmCsrParams& p, int64_t chunk_id,
                                                   int e, int open_row, int lane, RowCursor& at,
                                                   Row& acc) {
  while (at.row < open_row && at.end <= e) finish_row(p, chunk_id, lane, at, acc);
}

}  // namespace flare::spmm_csr

// One warp a chunk of merge items [k0, k1): between its splits (row0, e0) and (row1, e1) it
// reads nonzeros [e0, e1) and writes rows [row0, row1); row1's nonzeros in the chunk (when
// row1 < rows) are its carry. At most 64 registers: 4 CTAs (32 warps) an SM.
extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads, 4)
    flare_spmm_csr(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  namespace vec = flare::sparse_vec;
  const int lane = threadIdx.x % 32, group = lane / kRowLanes, row_lane = lane % kRowLanes;
  const int64_t chunk_id = int64_t{blockIdx.x} * (flare::kSpmmThreads / 32) + threadIdx.x / 32;
  if (chunk_id >= p.chunks) return;
  const int64_t total = p.rows + p.nnz;
  const int k0 = static_cast<int>(chunk_id * p.chunk < total ? chunk_id * p.chunk : total);
  const int k1 =
      static_cast<int>((chunk_id + 1) * p.chunk < total ? (chunk_id + 1) * p.chunk : total);
  const int split = merge_splits(p, k0, k1, lane);
  const int row0 = __shfl_sync(0xffffffffu, split, 0);
  const int row1 = __shfl_sync(0xffffffffu, split, 16);
  const int e0 = k0 - row0, e1 = k1 - row1;
  RowCursor at;
  at.row = row0;
  at.end = row_end(p, row0);
  at.head = row0 < row1 && row_start(p, row0) < e0;
  at.touched = false;
  if (lane == 0) p.head_row[chunk_id] = at.head ? row0 : -1;
  Row acc;
  clear(acc);
  // The lane's first element of X's row 0; rows are x_row_bytes apart (below 2^32, checked on
  // the host): a row's address is one 32 x 32 -> 64-bit multiply-add.
  const char* x_lane = static_cast<const char*>(p.x) + feature_of(0, row_lane) * kElementBytes;
  const unsigned x_row_bytes = static_cast<unsigned>(p.x_stride) * kElementBytes;
  for (int base = e0; base < e1; base += 32) {
    const int e = base + lane;
    int col = -1;
    float value = 0.0f;
    if (e < e1) {
      col = __ldg(p.indices + e);
      value =
          vec::load_scalar<kDType>(static_cast<const char*>(p.values) + int64_t{e} * kElementBytes);
    }
    if (static_cast<unsigned>(col) >= static_cast<unsigned long long>(p.cols)) col = -1;
    const int count = e1 - base < 32 ? e1 - base : 32;
    for (int j0 = 0; j0 < count; j0 += kSlots) {
      // Lane group g takes the batch's slots g, g + kGroups, ...: one load a lane brings
      // kGroups nonzeros' rows. A batch of kSlots (dividing 32) starting at a multiple of
      // kSlots stays within the 32 slots read above, so a slot past the chunk holds column -1
      // (as does a column outside the matrix; the host passes no nonzeros for a matrix without
      // columns, whose row 0 does not exist).
      Batch batch;
      load_batch(
          col, value, x_lane, x_row_bytes, [&](int b) { return j0 + b * kGroups + group; }, batch);
      // The batch's slots [s, n) are summed a row at a time: slots [s, stop) are the current
      // row's, then the row is written and the walk moves on (one pass over the batch's
      // registers a row that ends in it; a select, not a zero weight, so that an inf in X stays
      // in its row). Every pass takes at least one slot, whatever indptr holds.
      const int at_batch = base + j0;
      const int n = count - j0 < kSlots ? count - j0 : kSlots;
      finish_rows_before(p, chunk_id, at_batch, row1, lane, at, acc);
      for (int s = 0; s < n;) {
        int stop = at.row == row1 ? n : at.end - at_batch;
        stop = stop < s + 1 ? s + 1 : stop > n ? n : stop;
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int slot = b * kGroups + group;
          if (batch.valid[b] && slot >= s && slot < stop) add_load(batch, b, acc);
        }
        at.touched = true;
        s = stop;
        if (s < n) finish_rows_before(p, chunk_id, at_batch + s, row1, lane, at, acc);
      }
    }
  }
  // Every row before row1 ends in this chunk; row1's nonzeros here (if any) are its carry.
  while (at.row < row1) finish_row(p, chunk_id, lane, at, acc);
  const bool carries = row1 < p.rows && e1 > e0 && e1 > row_start(p, row1);
  if (carries) {
    if (kGroups > 1 && at.touched) sum_groups(acc);
    store_partial(p.carry + chunk_id * kFeatures, lane, acc);
  }
  if (lane == 0) p.carry_row[chunk_id] = carries ? row1 : -1;
}

// One warp a chunk: the first chunk of each run of chunks carrying the same row sums their
// partials in chunk order (lane group g the run's chunks g, g + kGroups, ..., then the groups'
// sums), adds the head of the chunk where the row ends, and writes the row.
// (Bounds of 256 threads alone made ptxas stop at 32 registers and spill on sm_80.)
extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads, 1)
    flare_spmm_csr_carries(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  namespace vec = flare::sparse_vec;
  const int lane = threadIdx.x % 32, group = lane / kRowLanes, row_lane = lane % kRowLanes;
  const int64_t chunk_id = int64_t{blockIdx.x} * (flare::kSpmmThreads / 32) + threadIdx.x / 32;
  if (chunk_id >= p.chunks) return;
  const int row = p.carry_row[chunk_id];
  if (row < 0 || row >= p.rows || (chunk_id > 0 && p.carry_row[chunk_id - 1] == row)) return;
  // The run's chunks 32 at a time (a lane each reads whether its chunk carries the row), their
  // partial rows loaded up to 4 a lane at a time (32 floats of registers).
  constexpr int kInFlightRaw = 32 / (kChunks * kVec);
  constexpr int kInFlight = kInFlightRaw < 1 ? 1 : kInFlightRaw > 4 ? 4 : kInFlightRaw;
  Row sum;
  clear(sum);
  int64_t end = chunk_id;  // the chunk after the run
  for (int64_t base = chunk_id;; base += 32) {
    const int64_t mine = base + lane;
    const bool same = mine < p.chunks && p.carry_row[mine] == row;
    const unsigned run = __ballot_sync(0xffffffffu, same);
    const int length = run == 0xffffffffu ? 32 : __ffs(~run) - 1;  // lane 0's is the run's
    end = base + length;
    for (int j = 0; j < length; j += kInFlight * kGroups) {
      float part[kInFlight][kChunks][kVec];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int at = j + u * kGroups + group;
        const float* carry = p.carry + (base + (at < length ? at : 0)) * kFeatures;
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          vec::load_floats<kVec>(carry + feature_of(c, row_lane), part[u][c]);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (j + u * kGroups + group < length) {
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int i = 0; i < kVec; ++i) sum[c][i] += part[u][c][i];
          }
        }
      }
    }
    if (length < 32) break;
  }
  if (kGroups > 1) sum_groups(sum);
  if (lane >= kRowLanes) return;
  // The row's last part: the head of the chunk where it ends (there for a well-formed CSR).
  if (end < p.chunks && p.head_row[end] == row) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      float head[kVec];
      vec::load_floats<kVec>(p.head + end * kFeatures + feature_of(c, row_lane), head);
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum[c][i] += head[i];
    }
  }
  const int64_t y_row = y_row_of(p, row);
  if (y_row >= 0) write_y_row(p.y, p.y_stride, y_row, row_lane, kRowsMapped && p.accumulate, sum);
}

#endif  // __CUDACC_RTC__
