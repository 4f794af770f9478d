// NVFP4's element conversions (include/flare/format/nvfp4.h) in integer and float steps every
// GPU has (sm_80 has no fp8 or fp4 conversion instruction): the E2M1 rounding, one definition
// for the host quantizer (src/format/nvfp4.cpp) and the GPU append
// (kernels/append_paged_kv_nvfp4.cuh); decoding codes and e4m3 block scales for every NVFP4
// load (kernels/decode_utils.cuh load_nvfp4_8: decode, the prefill's conversion and staging).
#pragma once

#ifdef __CUDACC_RTC__
#define FLARE_NVFP4_FN __device__ __forceinline__
#else
#include <math.h>
#include <string.h>
#define FLARE_NVFP4_FN inline
#endif

namespace flare::nvfp4 {

// The float operations the conversions need, as device intrinsics or their host equivalents
// (the host rounds in the default round-to-nearest-even mode).
#ifdef __CUDACC_RTC__
FLARE_NVFP4_FN unsigned float_bits(float x) { return __float_as_uint(x); }
FLARE_NVFP4_FN float bits_float(unsigned b) { return __uint_as_float(b); }
FLARE_NVFP4_FN int round_to_int(float x) { return __float2int_rn(x); }
#else
inline unsigned float_bits(float x) {
  unsigned b;
  memcpy(&b, &x, sizeof(b));
  return b;
}
inline float bits_float(unsigned b) {
  float x;
  memcpy(&x, &b, sizeof(x));
  return x;
}
inline int round_to_int(float x) { return static_cast<int>(nearbyintf(x)); }
#endif

// Round to the nearest E2M1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to even, saturating;
// bit 3 the sign (-0 codes 8); NaN codes 0.
FLARE_NVFP4_FN unsigned e2m1_code(float x) {
  if (x != x) return 0u;
  const unsigned sign = copysignf(1.0f, x) < 0.0f ? 8u : 0u;
  const float m = fabsf(x);
  unsigned code;
  if (!(m > 0.25f)) {
    code = 0;
  } else if (m < 0.75f) {
    code = 1;
  } else if (m <= 1.25f) {
    code = 2;
  } else if (m < 1.75f) {
    code = 3;
  } else if (m <= 2.5f) {
    code = 4;
  } else if (m < 3.5f) {
    code = 5;
  } else if (m <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return sign | code;
}

// float -> e4m3 bits for x >= 0 and finite: round to nearest even, saturating to 448 (as the
// host's float_to_e4m3_bits with Fp8Overflow::kSaturate, which the host tests check it
// against); in integer steps, so every GPU (sm_80 has no fp8 conversion) computes the same bits.
FLARE_NVFP4_FN unsigned e4m3_bits(float x) {
  constexpr float kMinNormal = 0.015625f;  // 2^-6
  if (x >= 448.0f) return 0x7Eu;
  if (x < kMinNormal) return static_cast<unsigned>(round_to_int(x * 512.0f));  // 2^-9 steps
  int exponent = static_cast<int>((float_bits(x) >> 23) & 0xFFu) - 127;
  const float mantissa = bits_float((float_bits(x) & 0x807FFFFFu) | 0x3F800000u);
  int fraction = round_to_int((mantissa - 1.0f) * 8.0f);  // an exact product; ties to even
  if (fraction == 8) {
    fraction = 0;
    ++exponent;
  }
  const unsigned bits = static_cast<unsigned>(((exponent + 7) << 3) | fraction);
  return bits > 0x7Eu ? 0x7Eu : bits;
}

// E2M1 codes as fp16 bits, for decoding without a per-value lookup or conversion: a code's
// magnitude bits in fp16's two lowest exponent bits and top mantissa bit, its sign in the sign
// bit, are its value x 2^-14 exactly (exponent field 0: fp16's subnormal 0.5 x 2^-14; 1..3:
// 2^(e - 15) (1 + m / 2)). Two codes a word: the nibbles at bits 0-3 and 16-19 of x >> shift
// go to the low and the high half.
constexpr float kE2M1AsF16Scale = 16384.0f;  // 2^14
FLARE_NVFP4_FN unsigned e2m1x2_as_f16x2(unsigned x, int shift) {
  x >>= shift;
  return ((x << 9) & 0x0E000E00u) | ((x << 12) & 0x80008000u);
}

// The same for bf16: the magnitude bits in bf16's two lowest exponent bits and top mantissa
// bit give the value x 2^-126 exactly (exponent field 0: bf16's subnormal 0.5 x 2^-126).
FLARE_NVFP4_FN unsigned e2m1x2_as_bf16x2(unsigned x, int shift) {
  x >>= shift;
  return ((x << 6) & 0x01C001C0u) | ((x << 12) & 0x80008000u);
}

// e4m3 bits as fp16 bits: the value x 2^-8 exactly (exponent biases 7 and 15; e4m3's subnormals
// land on fp16's).
constexpr float kE4M3AsF16Scale = 256.0f;  // 2^8
FLARE_NVFP4_FN unsigned e4m3_as_f16(unsigned bits) {
  return ((bits & 0x80u) << 8) | ((bits & 0x7Fu) << 7);
}

// The value of e4m3 bits (finite: 0x7F / 0xFF, NaN, are not produced by the appends).
FLARE_NVFP4_FN float e4m3_value(unsigned bits) {
  const int exponent = static_cast<int>((bits >> 3) & 0xFu);
  const int fraction = static_cast<int>(bits & 7u);
  const float magnitude = exponent == 0 ? ldexpf(static_cast<float>(fraction), -9)
                                        : ldexpf(static_cast<float>(8 + fraction), exponent - 10);
  return (bits & 0x80u) != 0 ? -magnitude : magnitude;
}

}  // namespace flare::nvfp4

#undef FLARE_NVFP4_FN
