// SDDMM on a CSR pattern (issue 23, SparseTIR's sddmm without decomposition): out[e] = q_i . k_j
// for every nonzero e = (i, j) of A (int32 indptr / indices; A's values unused), with Q
// [rows, d] and K [cols, d] of one dtype (float32, float16 or bfloat16), row-major with any row
// stride, out [nnz] in A's nonzero order and Q's dtype (float32 dot products, rounded once).
//
// Work is split by nonzeros, not rows, so a power-law graph's hub rows do not hold one warp for
// the grid's tail: a warp takes kChunk consecutive nonzeros, finds the row of each by a binary
// search of indptr once, then walks forward. kLanes lanes share a nonzero (kVec floats each,
// kSlices times across d), so a warp computes 32 / kLanes nonzeros at once; each lane group
// keeps its current row of Q in registers while its nonzeros stay in that row, loads the
// nonzero's row of K coalesced, and sums the product over its lanes by shuffles. Every out[e]
// is written once, by one lane, in a fixed order of additions: deterministic, no atomics.
//
// Memory safety whatever the index arrays hold: indptr entries are read only in [0, rows], row
// searches are clamped into [0, rows), and a column outside [0, cols) reads no K row and gives
// out[e] = 0. Only a well-formed CSR (validate_csr) gives Q K^T sampled at its pattern.
//
// Compile-time defines: FLARE_SDDMM_FEATURES (d: a multiple of 32, or a power of two below 32),
// FLARE_SDDMM_VEC (elements a lane loads at once: at most 16 bytes, d / kVec a multiple or a
// divisor of 32; the host picks the widest that Q's and K's alignment allow), FLARE_SDDMM_DTYPE
// (kSparseF32, kCodeF16 or kCodeBF16).
#pragma once

#include "fixed_width_ints.cuh"
#include "sparse_vec.cuh"

namespace flare {

struct SddmmCsrParams {
  const int32_t* indptr;   // [rows + 1]
  const int32_t* indices;  // [nnz]
  const void* q;           // [rows, d], row stride q_stride elements
  const void* k;           // [cols, d], row stride k_stride elements, q's dtype
  void* out;               // [nnz], q's dtype
  int64_t rows;
  int64_t cols;
  int64_t nnz;
  int64_t q_stride;
  int64_t k_stride;
};

constexpr int kSddmmThreads = 256;
constexpr int kSddmmChunk = 128;  // nonzeros a warp takes at a time

}  // namespace flare

#ifdef __CUDACC_RTC__

namespace flare::sddmm_csr {

constexpr int kDType = FLARE_SDDMM_DTYPE;
constexpr int kFeatures = FLARE_SDDMM_FEATURES;
constexpr int kVec = FLARE_SDDMM_VEC;
constexpr int kElementBytes = sparse_vec::element_bytes<kDType>();
static_assert(kVec * kElementBytes <= 16, "a vector of at most 16 bytes");
constexpr int kLanes = kFeatures / kVec < 32 ? kFeatures / kVec : 32;  // lanes a nonzero
constexpr int kSlices = kFeatures / (kVec * kLanes);                   // vectors a lane
constexpr int kPerWarp = 32 / kLanes;                                  // nonzeros at once
static_assert(kSlices * kVec * kLanes == kFeatures && kLanes * kPerWarp == 32,
              "the lanes must tile d: d / kVec a multiple or a divisor of 32");

// kVec elements of row `row` (stride `stride` elements) at vector `slot` of a lane, widened.
__device__ __forceinline__ void load_vec(const void* base, int64_t row, int64_t stride, int slot,
                                         float (&out)[kVec]) {
  const char* src = static_cast<const char*>(base) + (row * stride + slot * kVec) * kElementBytes;
  sparse_vec::to_float<kDType, kVec>(sparse_vec::load<kDType, kVec>(src), out);
}

// Rows and nonzeros are below 2^31 (checked on the host): 32-bit indices.
// indptr[i] for i in [0, rows], clamped into [0, nnz].
__device__ __forceinline__ int row_start(const flare::SddmmCsrParams& p, int i) {
  const int v = __ldg(p.indptr + i);
  const int nnz = static_cast<int>(p.nnz);
  return v < 0 ? 0 : v > nnz ? nnz : v;
}

// The row holding nonzero e: the last row r in [lo, rows) with indptr[r] <= e (lo if none).
__device__ __forceinline__ int row_of(const flare::SddmmCsrParams& p, int e, int lo = 0) {
  int hi = static_cast<int>(p.rows) - 1;
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

}  // namespace flare::sddmm_csr

extern "C" __global__ void __launch_bounds__(flare::kSddmmThreads)
    flare_sddmm_csr(const flare::SddmmCsrParams p) {
  using namespace flare::sddmm_csr;
  const int lane = threadIdx.x % 32, group = lane / kLanes, member = lane % kLanes;
  const unsigned group_mask =
      kLanes == 32 ? 0xffffffffu : ((1u << (kLanes % 32)) - 1u) << (group * kLanes);
  const int rows = static_cast<int>(p.rows), nnz = static_cast<int>(p.nnz);
  const int warps = static_cast<int>(gridDim.x) * (flare::kSddmmThreads / 32);
  const int tasks = nnz / flare::kSddmmChunk + (nnz % flare::kSddmmChunk != 0);
  for (int task = static_cast<int>(blockIdx.x) * (flare::kSddmmThreads / 32) + threadIdx.x / 32;
       task < tasks; task += warps) {
    // Nonzero positions in 64 bits: first + kSddmmChunk and e + kPerWarp may pass 2^31.
    const int64_t first = int64_t{task} * flare::kSddmmChunk;
    const int64_t last = first + flare::kSddmmChunk < nnz ? first + flare::kSddmmChunk : nnz;
    int64_t e = first + group;
    if (e >= last) continue;  // the whole lane group (shuffles below stay within it)
    int row = row_of(p, static_cast<int>(e));
    int row_end = row + 1 < rows ? row_start(p, row + 1) : nnz;
    int loaded = -1;
    float q[kSlices][kVec];
    for (; e < last; e += kPerWarp) {
      // The next row, or (past empty rows: 44% of an arxiv-sized R-MAT graph's, up to a
      // thousand in one task) a binary search from it, so a warp never walks a run of them.
      if (e >= row_end && row + 1 < rows) {
        ++row;
        row_end = row + 1 < rows ? row_start(p, row + 1) : nnz;
        if (e >= row_end && row + 1 < rows) {
          row = row_of(p, static_cast<int>(e), row + 1);
          row_end = row + 1 < rows ? row_start(p, row + 1) : nnz;
        }
      }
      if (row != loaded) {
#pragma unroll
        for (int s = 0; s < kSlices; ++s) {
          load_vec(p.q, row, p.q_stride, s * kLanes + member, q[s]);
        }
        loaded = row;
      }
      const int32_t col = __ldg(p.indices + e);
      float dot = 0.f;
      if (col >= 0 && col < p.cols) {
        float k[kSlices][kVec];
#pragma unroll
        for (int s = 0; s < kSlices; ++s) {
          load_vec(p.k, col, p.k_stride, s * kLanes + member, k[s]);
        }
#pragma unroll
        for (int s = 0; s < kSlices; ++s) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) dot = fmaf(q[s][i], k[s][i], dot);
        }
      }
#pragma unroll
      for (int o = kLanes / 2; o >= 1; o /= 2) dot += __shfl_xor_sync(group_mask, dot, o);
      if (member == 0) {
        const float out[1] = {dot};
        flare::sparse_vec::store<kDType, 1>(static_cast<char*>(p.out) + e * kElementBytes, out);
      }
    }
  }
}

#endif  // __CUDACC_RTC__
