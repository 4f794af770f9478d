// Warp-level tensor-core helpers of the prefill kernel: ldmatrix (plain and transposed),
// mma.sync m16n8k16 with f16/bf16 inputs and fp32 accumulators, and the padded shared rows.
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"

namespace flare::mma {

// Shared rows of 16-bit elements are padded by one 16-byte chunk: the 8 rows one ldmatrix
// phase reads (same chunk, consecutive rows) then start in 8 distinct 16-byte bank groups
// (row stride = 1 mod 8 chunks), and every later k-step or n-tile of a fragment is the same
// per-thread address plus an immediate (an XOR swizzle needs one register per XOR pattern).
template <int kRowBytes>
constexpr int kPaddedRowBytes = kRowBytes + 16;

template <int kRowBytes>
__device__ __forceinline__ unsigned padded_offset(int row, int chunk) {
  static_assert(kRowBytes % 16 == 0, "rows of whole 16-byte chunks");
  return static_cast<unsigned>(row * kPaddedRowBytes<kRowBytes> + chunk * 16);
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
