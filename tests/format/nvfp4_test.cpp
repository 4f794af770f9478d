// NVFP4 element conversions (include/flare/format/nvfp4.h): every E2M1 code, rounding at and
// between the grid points (ties to even), signs, NaN, and block quantization: the scale that
// maps the block's largest magnitude to 6, zero blocks, the round trip's error bound.
#include "flare/format/nvfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "flare/core/dtype.h"
#include "kernels/nvfp4_codes.cuh"

namespace flare {
namespace {

TEST(Nvfp4, EveryCodeDecodes) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    const float want = (code & 8) ? -magnitudes[code & 7] : magnitudes[code & 7];
    EXPECT_EQ(e2m1_to_float(code), want) << int(code);
    if (code != 8) {  // -0 codes 8, checked below
      EXPECT_EQ(float_to_e2m1(want), code) << want;
    }
  }
  EXPECT_EQ(float_to_e2m1(-0.0f), 8);
}

TEST(Nvfp4, RoundsToNearestTiesToEven) {
  // Ties go to the value with an even code (0, 1, 2, 4 and 6 of the grid's magnitudes).
  EXPECT_EQ(float_to_e2m1(0.25f), 0);  // 0 | 0.5: to 0
  EXPECT_EQ(float_to_e2m1(0.75f), 2);  // 0.5 | 1: to 1
  EXPECT_EQ(float_to_e2m1(1.25f), 2);  // 1 | 1.5: to 1
  EXPECT_EQ(float_to_e2m1(1.75f), 4);  // 1.5 | 2: to 2
  EXPECT_EQ(float_to_e2m1(2.5f), 4);   // 2 | 3: to 2
  EXPECT_EQ(float_to_e2m1(3.5f), 6);   // 3 | 4: to 4
  EXPECT_EQ(float_to_e2m1(5.0f), 6);   // 4 | 6: to 4
  EXPECT_EQ(float_to_e2m1(5.01f), 7);
  EXPECT_EQ(float_to_e2m1(1e30f), 7);  // saturates
  EXPECT_EQ(float_to_e2m1(0.26f), 1);
  EXPECT_EQ(float_to_e2m1(-1.3f), 8 | 3);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(float_to_e2m1(-std::numeric_limits<float>::infinity()), 8 | 7);
}

TEST(Nvfp4, BlockScaleMapsTheLargestMagnitudeToSix) {
  float x[16] = {};
  x[3] = -12.0f;  // amax 12, global 0.5: scale 12 / (6 * 0.5) = 4 (exact in e4m3)
  x[4] = 3.0f;    // 3 / (4 * 0.5) = 1.5
  x[15] = 0.9f;   // 0.45: to 0.5
  uint8_t packed[8], scale;
  nvfp4_quantize_block(x, 0.5f, packed, &scale);
  EXPECT_EQ(e4m3_bits_to_float(scale), 4.0f);
  EXPECT_EQ(packed[1] >> 4, 8 | 7);  // element 3: -6
  EXPECT_EQ(packed[2] & 0xF, 3);     // element 4: 1.5
  EXPECT_EQ(packed[7] >> 4, 1);      // element 15: 0.5
  float back[16];
  nvfp4_dequantize_block(packed, scale, 0.5f, back);
  EXPECT_EQ(back[3], -12.0f);
  EXPECT_EQ(back[4], 3.0f);
  EXPECT_EQ(back[15], 1.0f);
  EXPECT_EQ(back[0], 0.0f);
}

TEST(Nvfp4, ZeroBlockStoresZeros) {
  float x[16] = {};
  uint8_t packed[8], scale = 0xAA;
  nvfp4_quantize_block(x, 1.0f, packed, &scale);
  EXPECT_EQ(scale, 0);
  for (uint8_t b : packed) EXPECT_EQ(b, 0);
}

TEST(Nvfp4, RoundTripErrorWithinHalfAStepOfTheScaledGrid) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int block = 0; block < 2000; ++block) {
    float x[16], back[16];
    for (float& v : x) v = normal(rng);
    const float global = block % 2 ? 1.0f : 0.01f;
    uint8_t packed[8], scale;
    nvfp4_quantize_block(x, global, packed, &scale);
    nvfp4_dequantize_block(packed, scale, global, back);
    const float step = e4m3_bits_to_float(scale) * global;  // the grid's unit
    float amax = 0;
    for (float v : x) amax = std::fmax(amax, std::fabs(v));
    for (int i = 0; i < 16; ++i) {
      // Grid spacing is at most 2 units (between 4 and 6); the e4m3 rounding of the scale can
      // push the largest value past 6 units (saturated): at most amax / 6 * 2^-3 relative.
      EXPECT_LE(std::fabs(back[i] - x[i]), step * 1.0f + amax * 0.0625f) << block << " " << i;
    }
  }
}

// The kernels' integer-step conversions (kernels/nvfp4_codes.cuh, compiled here for the host)
// against the host's definitions: e4m3 encoding on every float of a dense grid, the midpoints
// between e4m3 values and one float either side, and random floats; decoding on every finite
// e4m3 byte and E2M1 code.
TEST(Nvfp4, KernelConversionsMatchTheHostFormats) {
  int64_t checked = 0;
  const auto check = [&](float x) {
    ASSERT_EQ(nvfp4::e4m3_bits(x), float_to_e4m3_bits(x, Fp8Overflow::kSaturate)) << x;
    ++checked;
  };
  for (int i = 0; i <= 1 << 20; ++i) check(static_cast<float>(i) * (1.0f / 2048));      // [0, 512]
  for (int i = 0; i < 1 << 16; ++i) check(static_cast<float>(i) * (1.0f / (1 << 24)));  // tiny
  for (uint8_t bits = 0; bits < 0x7E; ++bits) {
    const float lo = e4m3_bits_to_float(bits), hi = e4m3_bits_to_float(bits + 1);
    const float mid = 0.5f * (lo + hi);
    check(mid);
    check(std::nextafter(mid, 0.0f));
    check(std::nextafter(mid, 1e9f));
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-30.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) check(std::exp2(exponent(rng)));
  EXPECT_GT(checked, 1000000);
  for (unsigned bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(nvfp4::e4m3_value(bits), e4m3_bits_to_float(static_cast<uint8_t>(bits))) << bits;
  }
}

// The decode kernel's bit placements (kernels/decode_utils.cuh load_nvfp4_8): every E2M1 code in
// each of the four nibble positions a word decodes, with any neighbours, and every finite e4m3
// byte, exactly.
TEST(Nvfp4KernelCodes, BitPlacementsAsFp16AreExact) {
  std::mt19937 rng(5);
  for (unsigned code = 0; code < 16; ++code) {
    const float want = e2m1_to_float(static_cast<uint8_t>(code));
    for (int trial = 0; trial < 64; ++trial) {
      const unsigned noise = static_cast<unsigned>(rng());
      for (const int shift : {0, 4}) {
        for (const int half : {0, 1}) {
          const int nibble = shift + 16 * half;
          const unsigned word = (noise & ~(0xFu << nibble)) | (code << nibble);
          const unsigned f16x2 = nvfp4::e2m1x2_as_f16x2(word, shift);
          const auto bits = static_cast<uint16_t>(f16x2 >> (16 * half));
          ASSERT_EQ(f16_bits_to_float(bits) * nvfp4::kE2M1AsF16Scale, want)
              << "code " << code << " nibble " << nibble << " word " << word;
        }
      }
    }
  }
  for (unsigned bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(
        f16_bits_to_float(static_cast<uint16_t>(nvfp4::e4m3_as_f16(bits))) * nvfp4::kE4M3AsF16Scale,
        e4m3_bits_to_float(static_cast<uint8_t>(bits)))
        << bits;
  }
}

}  // namespace
}  // namespace flare
