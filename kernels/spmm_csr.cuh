// SpMM on a CSR matrix (issue 23, SparseTIR's csrmm without decomposition): Y = A X with A
// sparse [rows, cols] (int32 indptr / indices, float32 values) and X [cols, d], Y [rows, d]
// float32, row-major with any row stride.
//
// One warp per row, rows strided over the grid. The warp reads 32 of the row's nonzeros at a
// time (one per lane, coalesced), then broadcasts each by shuffle; every lane accumulates
// kVec consecutive features of each 32 * kVec chunk of the row of X it names, in float32
// registers, and writes its features of Y once. The order of the sum is the row's nonzero
// order: deterministic, no atomics.
//
// Memory safety whatever the index arrays hold: a row's range is clamped into [0, nnz], and a
// column outside [0, cols) contributes nothing (its X row is not read).
//
// Compile-time defines: FLARE_SPMM_FEATURES (d, a multiple of 32), FLARE_SPMM_VEC (features
// per lane per chunk: 4, 2 or 1, dividing d / 32; the host picks the widest that X's and Y's
// alignment allow).
#pragma once

#ifdef __CUDACC_RTC__
typedef int int32_t;
typedef long long int64_t;
#else
#include <cstdint>
#endif

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

}  // namespace flare::spmm_csr

extern "C" __global__ void __launch_bounds__(flare::kSpmmThreads)
    flare_spmm_csr(const __grid_constant__ flare::SpmmCsrParams p) {
  using namespace flare::spmm_csr;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (flare::kSpmmThreads / 32);
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * flare::kSpmmThreads + threadIdx.x) / 32;
       row < p.rows; row += warps) {
    int64_t begin = __ldg(p.indptr + row);
    int64_t end = __ldg(p.indptr + row + 1);
    begin = begin < 0 ? 0 : begin > p.nnz ? p.nnz : begin;
    end = end < begin ? begin : end > p.nnz ? p.nnz : end;
    float acc[kChunks][kVec];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[c][i] = 0.0f;
    }
    for (int64_t first = begin; first < end; first += 32) {
      const int64_t e = first + lane;
      int col = -1;
      float value = 0.0f;
      if (e < end) {
        col = __ldg(p.indices + e);
        value = __ldg(p.values + e);
      }
      if (static_cast<unsigned>(col) >= static_cast<unsigned long long>(p.cols)) col = -1;
      const int count = end - first < 32 ? static_cast<int>(end - first) : 32;
      for (int j = 0; j < count; ++j) {
        const int c_j = __shfl_sync(0xffffffffu, col, j);
        const float v_j = __shfl_sync(0xffffffffu, value, j);
        if (c_j < 0) continue;  // warp-uniform: the same j for every lane
        const float* x_row = p.x + static_cast<int64_t>(c_j) * p.x_stride + lane * kVec;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const FloatVec<kVec> x = load_vec<kVec>(x_row + c * 32 * kVec);
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[c][i] = fmaf(v_j, x.v[i], acc[c][i]);
        }
      }
    }
    float* y_row = p.y + row * p.y_stride + lane * kVec;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) store_vec<kVec>(y_row + c * 32 * kVec, acc[c]);
  }
}

#endif  // __CUDACC_RTC__
