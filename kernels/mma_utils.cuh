// Warp-level tensor-core helpers of the prefill kernel: ldmatrix (plain and transposed),
// mma.sync m16n8k16 with f16/bf16 inputs and fp32 accumulators, and the swizzled shared rows.
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"

namespace flare::mma {

// Shared rows of 16-bit elements are whole 128-byte lines (row bytes a multiple of 128), and
// 16-byte chunk c of row r is stored at chunk c ^ (r % 8): the 8 rows one ldmatrix phase reads
// (same logical chunk, 8 consecutive rows) land in 8 distinct bank groups, and every row starts
// line-aligned, so a row's 16-byte cp.async writes fill whole 32-byte sectors (16-byte padded
// rows made every odd row straddle sectors: 2.6x the ideal shared wavefronts per copy).
// Rows of 64 bytes (fp8 K/V at head dim 64, kernels/decode_mma.cuh) share a line two by two:
// chunk c of row r goes to chunk c ^ ((r / 2) % 4) of its half line, which again puts the 8
// rows of one ldmatrix phase in 8 distinct bank groups.
template <int kRowBytes>
__device__ __forceinline__ unsigned swizzled_offset(int row, int chunk) {
  static_assert(kRowBytes % 128 == 0 || kRowBytes == 64, "rows of whole 128-byte lines, or 64");
  if constexpr (kRowBytes == 64) {
    return static_cast<unsigned>(row * 64 + ((chunk ^ ((row >> 1) & 3)) * 16));
  }
  return static_cast<unsigned>(row * kRowBytes + ((chunk ^ (row % 8)) * 16));
}

// The address of logical chunk c + step of a row, from the address of its chunk c where c is
// 0 or 1 and step even (ldmatrix fragments: c from the lane, step from the k-step or n-tile):
// with x = c ^ (row % 8) < 8 in address bits 4-6 (rows and tiles start 128-byte aligned), chunk
// (c + step) ^ (row % 8) = (x ^ (step % 8)) + (step & ~7). One XOR with an immediate.
// `step` is a constant after unrolling (even).
__device__ __forceinline__ unsigned chunk_step(unsigned address, int step) {
  return (address ^ static_cast<unsigned>((step % 8) * 16)) +
         static_cast<unsigned>((step & ~7) * 16);
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, which lands in r[i].
__device__ __forceinline__ void ldmatrix_x4(unsigned address, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned address, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a (16x16, row) * b (16x8, col), fp32 accumulators. Fragment ownership (g = lane / 4,
// t = lane % 4): a[0] (g, 2t..2t+1), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..);
// b[0] (k 2t..2t+1, n g), b[1] (k 2t+8.., n g); d[0..1] (g, 2t..2t+1), d[2..3] (g+8, 2t..).
template <int kCode>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (kCode == kCodeBF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace flare::mma
