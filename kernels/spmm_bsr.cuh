// SpMM on BSR blocks of 16 x 16 with tensor cores (issue 23: "tensor cores for BSR blocks"):
// Y = A X where A's blocks are dense 16 x 16 tiles (float16 or bfloat16, row-major, zeros where
// A has no nonzero) and X [cols, d], Y [rows, d] are row-major in the same dtype, sums in float32.
//
// A warp takes one block row and 32 features (a feature tile): for each block of the row it
// stages the block's 16 rows of X (its 32 features: 1 KB) in its own shared tile, reads them as
// the mma's B operand by ldmatrix.trans (X's rows are the k dimension), reads the block as the
// A operand straight from global memory (four 32-bit loads a lane), and accumulates 16 rows x
// 32 features in mma.sync m16n8k16 (four n-tiles). The next block's loads are issued before the
// current block's MMAs. The four warps of a CTA take the feature tiles of one block row (the
// block's A fragments hit L1 after the first). Every row of Y the launch covers is written once
// with `=` (block rows without blocks as zeros): deterministic, no atomics.
//
// Memory safety whatever the arrays hold: indptr entries are clamped into [0, blocks] (a
// decreasing pair gives no blocks); a block whose column lies outside the matrix contributes
// nothing (nothing of it is read); X's rows past `cols` read as zeros; rows past `rows` are not
// written. A's zeros multiply X's rows like any value: an inf or NaN in a row of X that a block
// covers reaches that block's rows (the CSR kernels skip absent nonzeros instead).
//
// Compile-time define: FLARE_SPMM_DTYPE (kCodeF16 or kCodeBF16). The host checks that X and Y
// are 16-byte aligned with row strides of multiples of 16 bytes and that d is a multiple of 32.
#pragma once

#include "fixed_width_ints.cuh"
#include "sparse_vec.cuh"

namespace flare {

struct SpmmBsrParams {
  const int32_t* indptr;     // [block_rows + 1]
  const int32_t* block_col;  // [blocks]
  const void* values;        // [blocks][16][16], X's dtype
  const void* x;             // [cols, d], row stride x_stride elements
  void* y;                   // [rows, d], row stride y_stride elements
  int64_t rows;
  int64_t cols;
  int64_t blocks;
  int64_t block_rows;  // ceil(rows / 16)
  int64_t x_stride;
  int64_t y_stride;
  int32_t feature_tiles;  // d / 32
};

constexpr int kSpmmBsrThreads = 128;  // 4 warps
constexpr int kSpmmBsrBlock = 16;     // R = C = 16
constexpr int kSpmmBsrFeatures = 32;  // features a warp

}  // namespace flare

#ifdef __CUDACC_RTC__

#include "mma_utils.cuh"

namespace flare::spmm_bsr {

constexpr int kDType = FLARE_SPMM_DTYPE;
static_assert(kDType == kCodeF16 || kDType == kCodeBF16, "tensor cores take float16 or bfloat16");
constexpr int kRowBytes = kSpmmBsrFeatures * 2;  // a staged row of X: 64 bytes, 4 chunks of 16

// One block's operands in registers: its two chunks of X a lane stages and its A fragment.
struct BlockLoads {
  uint4 x[2];
  unsigned a[4];
};

// The loads of block e (its column bc in [0, ceil(cols / 16)) when `valid`; else zeros).
__device__ __forceinline__ BlockLoads load_block(const flare::SpmmBsrParams& p, int64_t e, int f0,
                                                 int lane) {
  BlockLoads out;
  const int bc = __ldg(p.block_col + e);
  const bool valid = bc >= 0 && int64_t{bc} * kSpmmBsrBlock < p.cols;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = lane + 32 * i;  // chunk q: row q / 4 of the block, 8 features (q % 4) * 8
    const int64_t row = int64_t{bc} * kSpmmBsrBlock + q / 4;
    out.x[i] = make_uint4(0u, 0u, 0u, 0u);
    if (valid && row < p.cols) {
      const char* src = static_cast<const char*>(p.x) + (row * p.x_stride + f0 + (q % 4) * 8) * 2;
      out.x[i] = __ldg(reinterpret_cast<const uint4*>(src));
    }
  }
  // A's fragment (g = lane / 4, t = lane % 4): (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8).
  const int g = lane / 4, t = lane % 4;
  const unsigned* block =
      reinterpret_cast<const unsigned*>(static_cast<const char*>(p.values) + e * 512);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i % 2), c = 2 * t + 8 * (i / 2);
    out.a[i] = valid ? __ldg(block + (r * 16 + c) / 2) : 0u;
  }
  return out;
}

}  // namespace flare::spmm_bsr

extern "C" __global__ void __launch_bounds__(flare::kSpmmBsrThreads)
    flare_spmm_bsr(const __grid_constant__ flare::SpmmBsrParams p) {
  using namespace flare::spmm_bsr;
  __shared__ alignas(128) unsigned char stage[flare::kSpmmBsrThreads / 32][16 * kRowBytes];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t task = int64_t{blockIdx.x} * (flare::kSpmmBsrThreads / 32) + warp;
  if (task >= p.block_rows * p.feature_tiles) return;
  const int64_t block_row = task / p.feature_tiles;
  const int f0 = static_cast<int>(task % p.feature_tiles) * flare::kSpmmBsrFeatures;
  const auto clamp = [&p](int v) -> int64_t { return v < 0 ? 0 : v > p.blocks ? p.blocks : v; };
  const int64_t e0 = clamp(__ldg(p.indptr + block_row));
  int64_t e1 = clamp(__ldg(p.indptr + block_row + 1));
  if (e1 < e0) e1 = e0;

  unsigned char* tile = stage[warp];
  const unsigned tile_address = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  // This lane's ldmatrix row address for n-tiles (2j, 2j + 1): matrix i = lane / 8 holds k rows
  // (lane % 8) + 8 (i % 2) of chunk 2j + i / 2.
  const int matrix = lane / 8, k_row = lane % 8 + 8 * (matrix % 2);
  float acc[4][4] = {};
  BlockLoads next = e0 < e1 ? load_block(p, e0, f0, lane) : BlockLoads{};
  for (int64_t e = e0; e < e1; ++e) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = lane + 32 * i;
      *reinterpret_cast<uint4*>(tile + flare::mma::swizzled_offset<kRowBytes>(q / 4, q % 4)) =
          next.x[i];
    }
    unsigned a[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = next.a[i];
    __syncwarp();
    if (e + 1 < e1) next = load_block(p, e + 1, f0, lane);  // in flight during the MMAs
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      unsigned b[4];
      flare::mma::ldmatrix_x4_trans(
          tile_address + flare::mma::swizzled_offset<kRowBytes>(k_row, 2 * j + matrix / 2), b);
      flare::mma::mma_16816<kDType>(acc[2 * j], a, b[0], b[1]);
      flare::mma::mma_16816<kDType>(acc[2 * j + 1], a, b[2], b[3]);
    }
    __syncwarp();  // the tile is read before the next block's rows overwrite it
  }
  // acc[n][0..1]: row g, features 8n + 2t, +1; acc[n][2..3]: row g + 8.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = block_row * flare::kSpmmBsrBlock + g + 8 * half;
    if (row >= p.rows) continue;
    char* y_row = static_cast<char*>(p.y) + row * p.y_stride * 2;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const unsigned pair = flare::float2_to_16bit2<kDType>(acc[n][2 * half], acc[n][2 * half + 1]);
      *reinterpret_cast<unsigned*>(y_row + (f0 + 8 * n + 2 * t) * 2) = pair;
    }
  }
}

#endif  // __CUDACC_RTC__
