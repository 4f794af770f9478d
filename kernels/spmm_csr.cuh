// SpMM on a CSR matrix (issue 23, SparseTIR's csrmm without decomposition): Y = A X with A
// sparse [rows, cols] (int32 indptr / indices, float32 values) and X [cols, d], Y [rows, d]
// float32, row-major with any row stride.
//
// A warp per row, rows in groups of 8 per CTA, strided over the grid. The warp reads 32 of the
// row's nonzeros at a time (one per lane, coalesced), then broadcasts them by shuffle, a batch
// at a time: the batch's rows of X load together, then every lane accumulates kVec
// consecutive features of each 32 * kVec chunk, in float32 registers, and writes its features
// of Y once. Rows of more than kLongRow nonzeros are shared by the CTA's 8 warps and their
// partial rows added in shared memory in warp order. Every sum has a fixed order:
// deterministic, no atomics.
//
// Memory safety whatever the index arrays hold: a row's range is clamped into [0, nnz], and a
// column outside [0, cols) contributes nothing (its X row is not read).
//
// Compile-time defines: FLARE_SPMM_FEATURES (d, a multiple of 32), FLARE_SPMM_VEC (features
// per lane per chunk: 4, 2 or 1, dividing d / 32; the host picks the widest that X's and Y's
// alignment allow).
#pragma once

#include "fixed_width_ints.cuh"

namespace flare {

struct SpmmCsrParams {
  const int32_t* indptr;  // [rows + 1]
  const int32_t* indices;  // [nnz]
  const float* values;     // [nnz]
  const float* x;          // [cols, d], row stride x_stride elements
  float* y;                // [rows, d], row stride y_stride elements
  int64_t rows;
  int64_t cols;
  int64_t nnz;
  int64_t x_stride;
  int64_t y_stride;
};

constexpr int kSpmmThreads = 256;  // 8 warps, a row each at a time

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

constexpr int kWarps = flare::kSpmmThreads / 32;
// Rows of more nonzeros are shared by the CTA's warps (a power-law graph's hubs: one warp
// would hold the grid's tail for the whole row).
constexpr int kLongRow = 256;
// Nonzeros whose X rows are loaded before any is summed: the loads of a batch are in flight
// together (one warp per row otherwise waits a memory latency per nonzero). About 16 floats
// of registers a lane (32 took 71 registers at d 128 on sm_90a: 24 warps an SM instead of 32).
constexpr int kBatchRaw = 16 / (kChunks * kVec);
constexpr int kBatch = kBatchRaw < 1 ? 1 : kBatchRaw > 8 ? 8 : kBatchRaw;

// The nonzero range of `row`, clamped into [0, nnz].
__device__ __forceinline__ void row_range(const flare::SpmmCsrParams& p, int64_t row,
                                          int64_t& begin, int64_t& end) {
  begin = __ldg(p.indptr + row);
  end = __ldg(p.indptr + row + 1);
  begin = begin < 0 ? 0 : begin > p.nnz ? p.nnz : begin;
  end = end < begin ? begin : end > p.nnz ? p.nnz : end;
}

// acc += the row's nonzeros in chunks of 32: chunk `first_chunk`, then every `chunk_step`-th.
__device__ __forceinline__ void accumulate(const flare::SpmmCsrParams& p, int64_t begin,
                                           int64_t end, int first_chunk, int chunk_step,
                                           int lane, float (&acc)[kChunks][kVec]) {
  for (int64_t first = begin + int64_t{first_chunk} * 32; first < end;
       first += int64_t{chunk_step} * 32) {
    const int64_t e = first + lane;
    int col = -1;
    float value = 0.0f;
    if (e < end) {
      col = __ldg(p.indices + e);
      value = __ldg(p.values + e);
    }
    if (static_cast<unsigned>(col) >= static_cast<unsigned long long>(p.cols)) col = -1;
    const int count = end - first < 32 ? static_cast<int>(end - first) : 32;
    for (int j0 = 0; j0 < count; j0 += kBatch) {
      FloatVec<kVec> x[kBatch][kChunks];
      float v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        // Lanes past the row hold column -1: their batch slots load nothing and weigh 0.
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
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[c][i] = fmaf(v[b], x[b][c].v[i], acc[c][i]);
        }
      }
    }
  }
}

__device__ __forceinline__ void clear(float (&acc)[kChunks][kVec]) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[c][i] = 0.0f;
  }
}

}  // namespace flare::spmm_csr

// Each CTA takes groups of kWarps consecutive rows: a warp sums each short row of the group by
// itself, then the CTA's warps share each long row (warp w its chunks w, w + kWarps, ...) and
// add their partial rows in shared memory in warp order: the same order for every run.
extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads)
    flare_spmm_csr(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  __shared__ float partial[kWarps][kFeatures];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int64_t group = static_cast<int64_t>(blockIdx.x) * kWarps; group < p.rows;
       group += static_cast<int64_t>(gridDim.x) * kWarps) {
    float acc[kChunks][kVec];
    const int64_t row = group + warp;
    if (row < p.rows) {
      int64_t begin, end;
      row_range(p, row, begin, end);
      if (end - begin <= kLongRow) {
        clear(acc);
        accumulate(p, begin, end, 0, 1, lane, acc);
        float* y_row = p.y + row * p.y_stride + lane * kVec;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) store_vec<kVec>(y_row + c * 32 * kVec, acc[c]);
      }
    }
    for (int w = 0; w < kWarps && group + w < p.rows; ++w) {  // CTA-uniform
      int64_t begin, end;
      row_range(p, group + w, begin, end);
      if (end - begin <= kLongRow) continue;
      clear(acc);
      accumulate(p, begin, end, warp, kWarps, lane, acc);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) partial[warp][c * 32 * kVec + lane * kVec + i] = acc[c][i];
      }
      __syncthreads();
      float* y_row = p.y + (group + w) * p.y_stride;
      for (int f = threadIdx.x; f < kFeatures; f += flare::kSpmmThreads) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < kWarps; ++k) sum += partial[k][f];
        y_row[f] = sum;
      }
      __syncthreads();  // the partial rows are rewritten by the next long row
    }
  }
}

#endif  // __CUDACC_RTC__
