// Device helpers of the decode and merge kernels: cp.async (with zero fill), L2-only loads,
// fast exp2/log2, and element conversions of 8-element vectors (f16, bf16, fp8 e4m3/e5m2 <->
// float32) in inline PTX and bit operations, so NVRTC needs no CUDA header.
#pragma once

#include "decode_params.cuh"
#include "nvfp4_codes.cuh"

namespace flare {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// fp8 -> f16: sm_89 and later convert pairs in hardware (cvt.rn.f16x2.e4m3x2); older GPUs
// shift the bits into an f16, where e4m3 then carries an exponent bias 8 too small (15 - 7):
// the decoded value is the f16 times 2^8, folded into k_scale / v_scale by the kernels.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define FLARE_FP8_HARDWARE_CVT 1
constexpr float kE4M3ViaF16Scale = 1.0f;
#else
#define FLARE_FP8_HARDWARE_CVT 0
constexpr float kE4M3ViaF16Scale = 256.0f;
#endif

struct alignas(16) Vec16 {
  unsigned int x, y, z, w;
};
struct alignas(8) Vec8 {
  unsigned int x, y;
};

// Programmatic dependent launch (sm_90+). A kernel launched with it may start while the
// previous kernel of its stream still runs: it waits here for that kernel's completion and
// memory before touching global memory. Without the launch attribute (or before sm_90) this is
// a no-op. Every flare kernel calls it first, then lets its own dependents launch: they wait
// in turn, so correctness never depends on when they start.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1; when !valid nothing is read and zeros are written
// (tail rows of a tile must hold finite values: their probabilities are 0, and 0 * NaN = NaN).
__device__ __forceinline__ void cp_async_16(unsigned shared_dst, const void* global_src,
                                            bool valid) {
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst), "l"(global_src),
               "r"(source_bytes)
               : "memory");
}
// 16 bytes global -> shared, bypassing L1, all of them read.
__device__ __forceinline__ void cp_async_16(unsigned shared_dst, const void* global_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_dst), "l"(global_src)
               : "memory");
}
// kBytes (4, 8 or 16) global -> shared through L1 (.ca: the only form below 16 bytes); zeros
// when !valid.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(unsigned shared_dst, const void* global_src,
                                            bool valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async sizes");
  const int source_bytes = valid ? kBytes : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_dst), "l"(global_src),
               "n"(kBytes), "r"(source_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Loads through L2 only (ld.global.cg): data other CTAs of the same launch wrote (partial
// states of split tiles) must not be served from this SM's L1. Ordered like any memory access
// (the clobber): they must stay after the arrival count that makes the data complete.
__device__ __forceinline__ float load_l2(const float* src) {
  float x;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(x) : "l"(src) : "memory");
  return x;
}

// The dynamic shared memory this launch has (run() may give a launch more than the minimum).
__device__ __forceinline__ unsigned dynamic_shared_bytes() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// --- 16-bit and fp8 pairs -> float32 ------------------------------------------------------

__device__ __forceinline__ void bf16x2_to_float2(unsigned bits, float& lo, float& hi) {
  lo = __uint_as_float(bits << 16);
  hi = __uint_as_float(bits & 0xffff0000u);
}

__device__ __forceinline__ void f16x2_to_float2(unsigned bits, float& lo, float& hi) {
  const unsigned short lo_bits = static_cast<unsigned short>(bits & 0xffffu);
  const unsigned short hi_bits = static_cast<unsigned short>(bits >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(lo_bits));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(hi_bits));
}

template <int kCode>  // kCodeBF16 or kCodeF16
__device__ __forceinline__ void pair16_to_float2(unsigned bits, float& lo, float& hi) {
  if constexpr (kCode == kCodeBF16) {
    bf16x2_to_float2(bits, lo, hi);
  } else {
    f16x2_to_float2(bits, lo, hi);
  }
}

// Four fp8 bytes -> two f16x2 words holding byte << 8 (exactly e5m2 as f16).
__device__ __forceinline__ void fp8x4_spread(unsigned bytes, unsigned& h01, unsigned& h23) {
  asm("prmt.b32 %0, %1, 0, 0x1404;" : "=r"(h01) : "r"(bytes));
  asm("prmt.b32 %0, %1, 0, 0x3424;" : "=r"(h23) : "r"(bytes));
}
// e4m3 byte << 8 -> the f16 with the same sign and bits (value / 2^8, kE4M3ViaF16Scale).
__device__ __forceinline__ unsigned e4m3_spread_to_f16x2(unsigned h) {
  return (h & 0x80008000u) | ((h >> 1) & 0x3f803f80u);
}

// Four fp8 bytes b0..b3 of one register -> two f16x2 words, exactly (e5m2 is an f16's upper
// byte; e4m3 comes out divided by kE4M3ViaF16Scale): (b0, b1) and (b2, b3) with kAdjacent,
// else (b0, b2) and (b1, b3). The tensor-core loop's fragments (kernels/decode_mma.cuh).
template <int kCode, bool kAdjacent>
__device__ __forceinline__ void fp8x4_to_f16x2_pairs(unsigned bytes, unsigned& first,
                                                     unsigned& second) {
  if constexpr (kCode == kCodeE4M3 && FLARE_FP8_HARDWARE_CVT) {
    unsigned x = bytes;
    if constexpr (!kAdjacent) asm("prmt.b32 %0, %1, 0, 0x3120;" : "=r"(x) : "r"(bytes));
    const unsigned short lo = static_cast<unsigned short>(x & 0xffffu);
    const unsigned short hi = static_cast<unsigned short>(x >> 16);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(first) : "h"(lo));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(second) : "h"(hi));
  } else {
    if constexpr (kAdjacent) {
      fp8x4_spread(bytes, first, second);
    } else {
      asm("prmt.b32 %0, %1, 0, 0x2404;" : "=r"(first) : "r"(bytes));
      asm("prmt.b32 %0, %1, 0, 0x3414;" : "=r"(second) : "r"(bytes));
    }
    if constexpr (kCode == kCodeE4M3) {
      first = e4m3_spread_to_f16x2(first);
      second = e4m3_spread_to_f16x2(second);
    }
  }
}

// An e4m3 block scale x 2^-8 in float32: its bits placed as fp16 (nvfp4_codes.cuh
// e4m3_as_f16), converted by cvt. Exact.
__device__ __forceinline__ float nvfp4_block_scale_over_256(unsigned char scale_bits) {
  float scale;
  asm("cvt.f32.f16 %0, %1;"
      : "=f"(scale)
      : "h"(static_cast<unsigned short>(nvfp4::e4m3_as_f16(scale_bits))));
  return scale;
}

// 8 NVFP4 values: 4 bytes of E2M1 pairs (the even element in the low nibble) times their block's
// e4m3 scale (kernels/nvfp4_codes.cuh): exact in float32.
__device__ __forceinline__ void load_nvfp4_8(const unsigned char* codes, unsigned char scale_bits,
                                             float (&out)[8]) {
  const unsigned word = *reinterpret_cast<const unsigned*>(codes);
  // Codes and scale as fp16 bits (nvfp4_codes.cuh: bit placements, exact), converted by cvt; the
  // two placements' powers of two and the scale fold into one factor. Bytes 0 / 1 of the word
  // (codes 0-3) spread to bytes 0 / 2, then bytes 2 / 3 (codes 4-7): each spread word gives
  // codes (0, 2) at shift 0 and (1, 3) at shift 4 of its four.
  const float factor = nvfp4_block_scale_over_256(scale_bits) *
                       (nvfp4::kE4M3AsF16Scale * nvfp4::kE2M1AsF16Scale);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const unsigned spread = __byte_perm(word, 0u, half == 0 ? 0x4140u : 0x4342u);
    float even[2], odd[2];
    f16x2_to_float2(nvfp4::e2m1x2_as_f16x2(spread, 0), even[0], even[1]);
    f16x2_to_float2(nvfp4::e2m1x2_as_f16x2(spread, 4), odd[0], odd[1]);
    out[4 * half + 0] = even[0] * factor;
    out[4 * half + 1] = odd[0] * factor;
    out[4 * half + 2] = even[1] * factor;
    out[4 * half + 3] = odd[1] * factor;
  }
}

// Eight stored KV elements of type kCode at `src` (shared memory) -> float32, unscaled
// (e4m3 values come out divided by kE4M3ViaF16Scale).
template <int kCode>
__device__ __forceinline__ void load_kv8(const unsigned char* src, float (&out)[8]) {
  if constexpr (kCode == kCodeE4M3 && FLARE_FP8_HARDWARE_CVT) {
    const Vec8 raw = *reinterpret_cast<const Vec8*>(src);
    const unsigned bytes[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned short pair = static_cast<unsigned short>(bytes[i / 2] >> (16 * (i % 2)));
      unsigned word;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(word) : "h"(pair));
      f16x2_to_float2(word, out[2 * i], out[2 * i + 1]);
    }
  } else if constexpr (kCode == kCodeE4M3 || kCode == kCodeE5M2) {
    const Vec8 raw = *reinterpret_cast<const Vec8*>(src);
    unsigned words[4];
    fp8x4_spread(raw.x, words[0], words[1]);
    fp8x4_spread(raw.y, words[2], words[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (kCode == kCodeE4M3) words[i] = e4m3_spread_to_f16x2(words[i]);
      f16x2_to_float2(words[i], out[2 * i], out[2 * i + 1]);
    }
  } else {
    const Vec16 raw = *reinterpret_cast<const Vec16*>(src);
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) pair16_to_float2<kCode>(words[i], out[2 * i], out[2 * i + 1]);
  }
}

// --- float32 -> 16-bit, round to nearest even ---------------------------------------------

template <int kCode>
__device__ __forceinline__ unsigned float2_to_16bit2(float lo, float hi) {
  unsigned packed;
  if constexpr (kCode == kCodeBF16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  }
  return packed;
}

// Eight NVFP4 values (the code word's nibbles, lowest first) times `factor2` as four kCode pairs
// in order, in 16-bit arithmetic: each pair of codes placed as 16-bit bits (nvfp4_codes.cuh:
// the value x 2^-14 in fp16, x 2^-126 in bf16) times factor2 (both halves; with
// nvfp4_scale2's factor the block scale x 2^-8 after the placement's power of two). Exact: code x
// scale x 2^-8 has at most 6 significant bits, its lowest at 2^-18 or above (fp16 keeps bits
// to 2^-24) and magnitude at most 10.5; the fma's -0 addend keeps -0 codes' sign. Pairs
// (v_i, v_i+4) come from shifts 4i of the word and are interleaved last.
template <int kCode>
__device__ __forceinline__ void nvfp4_word_to_16bit(unsigned word, unsigned factor2,
                                                    unsigned (&out)[4]) {
  unsigned pairs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kCode == kCodeBF16) {
      asm("fma.rn.bf16x2 %0, %1, %2, %3;"
          : "=r"(pairs[i])
          : "r"(nvfp4::e2m1x2_as_bf16x2(word, 4 * i)), "r"(factor2), "r"(0x80008000u));
    } else {
      asm("fma.rn.f16x2 %0, %1, %2, %3;"
          : "=r"(pairs[i])
          : "r"(nvfp4::e2m1x2_as_f16x2(word, 4 * i)), "r"(factor2), "r"(0x80008000u));
    }
  }
  out[0] = __byte_perm(pairs[0], pairs[1], 0x5410);
  out[1] = __byte_perm(pairs[2], pairs[3], 0x5410);
  out[2] = __byte_perm(pairs[0], pairs[1], 0x7632);
  out[3] = __byte_perm(pairs[2], pairs[3], 0x7632);
}

// NVFP4 values converted by nvfp4_word_to_16bit are 2^-8 of code x block scale: whoever reads
// them takes this factor back (exact, a power of two).
constexpr float kNvfp4ConvertedInverse = 256.0f;

// An e4m3 block scale as nvfp4_word_to_16bit's factor in both kCode halves: the scale x 2^-8
// divided by the placement's power of two (fp16: scale x 2^6 <= 28672; bf16: scale x 2^118 <
// 2^127), exact (e4m3 values are fp16 and bf16 values; powers of two within range).
template <int kCode>
__device__ __forceinline__ unsigned nvfp4_scale2(unsigned char scale_bits) {
  // The scale x 2^-8, times 2^14 (fp16: 2^6 after 2^-8) or 2^126 (bf16: 2^118).
  const float scale =
      nvfp4_block_scale_over_256(scale_bits) *
      (kCode == kCodeBF16 ? 8.507059173023462e37f /* 2^126 */ : 16384.0f /* 2^14 */);
  return float2_to_16bit2<kCode>(scale, scale);
}

// Four float32 -> four 16-bit elements at `dst` (8-byte aligned).
template <int kCode>
__device__ __forceinline__ void store_16bit4(void* dst, const float (&in)[4]) {
  Vec8 packed;
  packed.x = float2_to_16bit2<kCode>(in[0], in[1]);
  packed.y = float2_to_16bit2<kCode>(in[2], in[3]);
  *reinterpret_cast<Vec8*>(dst) = packed;
}

}  // namespace flare
