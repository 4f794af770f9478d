// Known bit patterns of the float32 <-> f16 / bf16 / fp8 e4m3 / fp8 e5m2 conversions: exact
// values, extremes, ties to even (normal and subnormal), carries, overflow, inf, NaN, zeros.
#include "flare/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flare/core/error.h"

namespace flare {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float pow2(int exponent) { return std::ldexp(1.0f, exponent); }

// A float32 input, the code it must round to, and why.
struct EncodeCase {
  float input;
  uint32_t code;
  const char* what;
};

TEST(F16Test, KnownEncodings) {
  const EncodeCase cases[] = {
      {1.0f, 0x3C00, "one"},
      {-2.0f, 0xC000, "minus two"},
      {65504.0f, 0x7BFF, "max finite"},
      {pow2(-14), 0x0400, "min normal"},
      {pow2(-24), 0x0001, "min subnormal"},
      {0.0f, 0x0000, "zero"},
      {-0.0f, 0x8000, "negative zero"},
      {1.0f + pow2(-11), 0x3C00, "tie between 0x3C00 and 0x3C01 goes to even 0x3C00"},
      {1.0f + 3 * pow2(-11), 0x3C02, "tie between 0x3C01 and 0x3C02 goes to even 0x3C02"},
      {1.0f + pow2(-11) + pow2(-20), 0x3C01, "just above a tie rounds up"},
      {pow2(-25), 0x0000, "subnormal tie between 0 and 0x0001 goes to 0"},
      {-pow2(-25), 0x8000, "negative subnormal tie keeps the sign of zero"},
      {3 * pow2(-25), 0x0002, "subnormal tie between 0x0001 and 0x0002 goes to 0x0002"},
      {pow2(-25) + pow2(-40), 0x0001, "just above the smallest tie"},
      {2.0f - pow2(-11), 0x4000, "tie at the top of a binade carries into the exponent"},
      {pow2(-14) - pow2(-25), 0x0400, "largest subnormal tie carries into min normal"},
      {65519.0f, 0x7BFF, "just below the overflow tie"},
      {65520.0f, 0x7C00, "tie between max and 2^16 goes to even: inf"},
      {1e6f, 0x7C00, "overflow"},
      {-1e6f, 0xFC00, "negative overflow"},
      {kInf, 0x7C00, "inf"},
      {-kInf, 0xFC00, "minus inf"},
      {pow2(-126), 0x0000, "float32 min normal underflows to zero"},
  };
  for (const EncodeCase& c : cases) {
    EXPECT_EQ(float_to_f16_bits(c.input), c.code) << c.what << " (input " << c.input << ")";
  }
}

TEST(F16Test, KnownDecodings) {
  EXPECT_EQ(f16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_bits_to_float(0xC000), -2.0f);
  EXPECT_EQ(f16_bits_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0x0400), pow2(-14));
  EXPECT_EQ(f16_bits_to_float(0x0001), pow2(-24));
  EXPECT_EQ(f16_bits_to_float(0x03FF), pow2(-14) - pow2(-24));
  EXPECT_EQ(f16_bits_to_float(0x7C00), kInf);
  EXPECT_EQ(f16_bits_to_float(0xFC00), -kInf);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7C01)));
  EXPECT_TRUE(std::signbit(f16_bits_to_float(0x8000)));
  EXPECT_EQ(f16_bits_to_float(0x8000), 0.0f);
}

TEST(F16Test, NaNStaysNaNWithItsSign) {
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(kNaN))));
  const uint16_t negative_nan = float_to_f16_bits(-kNaN);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(negative_nan)));
  EXPECT_TRUE(negative_nan & 0x8000);
}

TEST(BF16Test, KnownEncodings) {
  const EncodeCase cases[] = {
      {1.0f, 0x3F80, "one"},
      {-2.0f, 0xC000, "minus two"},
      {std::bit_cast<float>(0x7F7F0000u), 0x7F7F, "max finite"},
      {pow2(-126), 0x0080, "min normal"},
      {pow2(-133), 0x0001, "min subnormal"},
      {-0.0f, 0x8000, "negative zero"},
      {1.0f + pow2(-8), 0x3F80, "tie goes to even 0x3F80"},
      {1.0f + 3 * pow2(-8), 0x3F82, "tie goes to even 0x3F82"},
      {1.0f + pow2(-8) + pow2(-20), 0x3F81, "just above a tie rounds up"},
      {pow2(-134), 0x0000, "subnormal tie goes to 0"},
      {3 * pow2(-134), 0x0002, "subnormal tie goes to 0x0002"},
      {2.0f - pow2(-8), 0x4000, "tie at the top of a binade carries into the exponent"},
      {pow2(-126) - pow2(-134), 0x0080, "largest subnormal tie carries into min normal"},
      {std::bit_cast<float>(0x7F7F7FFFu), 0x7F7F, "just below the overflow tie"},
      {std::numeric_limits<float>::max(), 0x7F80, "float32 max overflows to inf"},
      {kInf, 0x7F80, "inf"},
      {-kInf, 0xFF80, "minus inf"},
  };
  for (const EncodeCase& c : cases) {
    EXPECT_EQ(float_to_bf16_bits(c.input), c.code) << c.what << " (input " << c.input << ")";
  }
}

TEST(BF16Test, NaNIsQuietedNotTurnedIntoInf) {
  // Payload only in the low half: plain truncation would give inf (0x7F80).
  const float low_payload_nan = std::bit_cast<float>(0x7F800001u);
  ASSERT_TRUE(std::isnan(low_payload_nan));
  const uint16_t bits = float_to_bf16_bits(low_payload_nan);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(bits))) << std::hex << bits;
  const uint16_t negative = float_to_bf16_bits(std::bit_cast<float>(0xFF800001u));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(negative)));
  EXPECT_TRUE(negative & 0x8000);
  // Rounding must not carry a NaN whose mantissa is all ones into the sign bit.
  EXPECT_TRUE(
      std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7FFFFFFFu)))));
}

TEST(BF16Test, KnownDecodings) {
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0xC000), -2.0f);
  EXPECT_EQ(bf16_bits_to_float(0x0001), pow2(-133));
  EXPECT_EQ(bf16_bits_to_float(0x7F80), kInf);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(0x7FC0)));
}

// One fp8 case: input, code under kSaturate, code under kNoSaturate.
struct Fp8Case {
  float input;
  uint8_t saturated;
  uint8_t unsaturated;
  const char* what;
};

TEST(E4M3Test, KnownEncodings) {
  const Fp8Case cases[] = {
      {1.0f, 0x38, 0x38, "one"},
      {-2.0f, 0xC0, 0xC0, "minus two"},
      {448.0f, 0x7E, 0x7E, "max finite"},
      {-448.0f, 0xFE, 0xFE, "minus max finite"},
      {pow2(-6), 0x08, 0x08, "min normal"},
      {pow2(-9), 0x01, 0x01, "min subnormal"},
      {0.0f, 0x00, 0x00, "zero"},
      {-0.0f, 0x80, 0x80, "negative zero"},
      {1.0625f, 0x38, 0x38, "tie between 1 and 1.125 goes to even 1"},
      {1.1875f, 0x3A, 0x3A, "tie between 1.125 and 1.25 goes to even 1.25"},
      {pow2(-10), 0x00, 0x00, "subnormal tie between 0 and 2^-9 goes to 0"},
      {3 * pow2(-10), 0x02, 0x02, "subnormal tie goes to even 0x02"},
      {5 * pow2(-10), 0x02, 0x02, "subnormal tie goes to even 0x02 from above"},
      {pow2(-10) + pow2(-20), 0x01, 0x01, "just above the smallest tie"},
      {1.9375f, 0x40, 0x40, "tie at the top of a binade carries into the exponent"},
      {15 * pow2(-10), 0x08, 0x08, "largest subnormal tie carries into min normal"},
      {464.0f, 0x7E, 0x7E, "tie between 448 and the NaN code rounds to 448"},
      {-464.0f, 0xFE, 0xFE, "negative tie rounds to -448"},
      {465.0f, 0x7E, 0x7F, "just above the tie overflows"},
      {1e4f, 0x7E, 0x7F, "overflow"},
      {-1e4f, 0xFE, 0xFF, "negative overflow"},
      {kInf, 0x7E, 0x7F, "inf"},
      {-kInf, 0xFE, 0xFF, "minus inf"},
  };
  for (const Fp8Case& c : cases) {
    EXPECT_EQ(float_to_e4m3_bits(c.input, Fp8Overflow::kSaturate), c.saturated)
        << c.what << " (input " << c.input << ", saturate)";
    EXPECT_EQ(float_to_e4m3_bits(c.input, Fp8Overflow::kNoSaturate), c.unsaturated)
        << c.what << " (input " << c.input << ", no saturate)";
  }
  EXPECT_EQ(float_to_e4m3_bits(1e4f), 0x7E) << "saturation is the default";
}

TEST(E4M3Test, KnownDecodings) {
  EXPECT_EQ(e4m3_bits_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_bits_to_float(0xC0), -2.0f);
  EXPECT_EQ(e4m3_bits_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_bits_to_float(0x78), 256.0f) << "the top exponent holds finite values";
  EXPECT_EQ(e4m3_bits_to_float(0x08), pow2(-6));
  EXPECT_EQ(e4m3_bits_to_float(0x01), pow2(-9));
  EXPECT_EQ(e4m3_bits_to_float(0x07), 7 * pow2(-9));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0xFF)));
  EXPECT_TRUE(std::signbit(e4m3_bits_to_float(0x80)));
}

TEST(E4M3Test, NaNStaysNaN) {
  for (Fp8Overflow mode : {Fp8Overflow::kSaturate, Fp8Overflow::kNoSaturate}) {
    EXPECT_EQ(float_to_e4m3_bits(kNaN, mode), 0x7F);
    EXPECT_EQ(float_to_e4m3_bits(-kNaN, mode), 0xFF);
  }
}

TEST(E5M2Test, KnownEncodings) {
  const Fp8Case cases[] = {
      {1.0f, 0x3C, 0x3C, "one"},
      {-2.0f, 0xC0, 0xC0, "minus two"},
      {57344.0f, 0x7B, 0x7B, "max finite"},
      {pow2(-14), 0x04, 0x04, "min normal"},
      {pow2(-16), 0x01, 0x01, "min subnormal"},
      {-0.0f, 0x80, 0x80, "negative zero"},
      {1.125f, 0x3C, 0x3C, "tie between 1 and 1.25 goes to even 1"},
      {1.375f, 0x3E, 0x3E, "tie between 1.25 and 1.5 goes to even 1.5"},
      {pow2(-17), 0x00, 0x00, "subnormal tie goes to 0"},
      {3 * pow2(-17), 0x02, 0x02, "subnormal tie goes to even 0x02"},
      {1.875f, 0x40, 0x40, "tie at the top of a binade carries into the exponent"},
      {7 * pow2(-17), 0x04, 0x04, "largest subnormal tie carries into min normal"},
      {61439.0f, 0x7B, 0x7B, "just below the overflow tie"},
      {61440.0f, 0x7B, 0x7C, "tie between max and 2^16 goes to even: overflow"},
      {1e6f, 0x7B, 0x7C, "overflow"},
      {-1e6f, 0xFB, 0xFC, "negative overflow"},
      {kInf, 0x7B, 0x7C, "inf"},
      {-kInf, 0xFB, 0xFC, "minus inf"},
  };
  for (const Fp8Case& c : cases) {
    EXPECT_EQ(float_to_e5m2_bits(c.input, Fp8Overflow::kSaturate), c.saturated)
        << c.what << " (input " << c.input << ", saturate)";
    EXPECT_EQ(float_to_e5m2_bits(c.input, Fp8Overflow::kNoSaturate), c.unsaturated)
        << c.what << " (input " << c.input << ", no saturate)";
  }
}

TEST(E5M2Test, KnownDecodings) {
  EXPECT_EQ(e5m2_bits_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_bits_to_float(0xC0), -2.0f);
  EXPECT_EQ(e5m2_bits_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_bits_to_float(0x04), pow2(-14));
  EXPECT_EQ(e5m2_bits_to_float(0x01), pow2(-16));
  EXPECT_EQ(e5m2_bits_to_float(0x7C), kInf);
  EXPECT_EQ(e5m2_bits_to_float(0xFC), -kInf);
  for (uint8_t nan_code : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) {
    EXPECT_TRUE(std::isnan(e5m2_bits_to_float(nan_code))) << int{nan_code};
  }
}

TEST(E5M2Test, NaNStaysNaNWithItsSign) {
  for (Fp8Overflow mode : {Fp8Overflow::kSaturate, Fp8Overflow::kNoSaturate}) {
    const uint8_t positive = float_to_e5m2_bits(kNaN, mode);
    const uint8_t negative = float_to_e5m2_bits(-kNaN, mode);
    EXPECT_TRUE(std::isnan(e5m2_bits_to_float(positive)));
    EXPECT_TRUE(std::isnan(e5m2_bits_to_float(negative)));
    EXPECT_FALSE(positive & 0x80);
    EXPECT_TRUE(negative & 0x80);
  }
}

TEST(DTypeTest, NamesRoundTrip) {
  const DType all[] = {DType::kF32,  DType::kF16, DType::kBF16, DType::kE4M3,
                       DType::kE5M2, DType::kI32, DType::kI64,  DType::kU8};
  const char* names[] = {"float32",     "float16", "bfloat16", "float8_e4m3",
                         "float8_e5m2", "int32",   "int64",    "uint8"};
  const size_t bytes[] = {4, 2, 2, 1, 1, 4, 8, 1};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(dtype_name(all[i]), names[i]);
    EXPECT_EQ(parse_dtype(names[i]), all[i]);
    EXPECT_EQ(dtype_bytes(all[i]), bytes[i]) << names[i];
  }
}

TEST(DTypeTest, ShortNames) {
  EXPECT_EQ(parse_dtype("f32"), DType::kF32);
  EXPECT_EQ(parse_dtype("f16"), DType::kF16);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("e4m3"), DType::kE4M3);
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::kE4M3);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kE4M3);
  EXPECT_EQ(parse_dtype("e5m2"), DType::kE5M2);
  EXPECT_EQ(parse_dtype("fp8_e5m2"), DType::kE5M2);
}

TEST(DTypeTest, UnknownNameThrowsNamingIt) {
  for (const char* bad : {"float64", "", "F32", "float8"}) {
    try {
      parse_dtype(bad);
      FAIL() << "no error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(DTypeTest, Classification) {
  EXPECT_TRUE(is_floating(DType::kF32));
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_TRUE(is_floating(DType::kE5M2));
  EXPECT_FALSE(is_floating(DType::kI32));
  EXPECT_FALSE(is_floating(DType::kU8));
  EXPECT_TRUE(is_fp8(DType::kE4M3));
  EXPECT_TRUE(is_fp8(DType::kE5M2));
  EXPECT_FALSE(is_fp8(DType::kF16));
}

TEST(LoadStoreTest, FloatingDtypesRoundAndRead) {
  // Every dtype keeps a different part of x.
  const float x = 1.0f + pow2(-4) + pow2(-9) + pow2(-12);
  struct Expected {
    DType dtype;
    float stored;
  };
  const Expected expected[] = {
      {DType::kF32, x},
      {DType::kF16, 1.0f + pow2(-4) + pow2(-9)},  // ulp 2^-10: 2^-12 is a quarter ulp
      {DType::kBF16, 1.0f + pow2(-4)},            // ulp 2^-7: the rest is under half an ulp
      {DType::kE4M3, 1.125f},                     // just above the 1.0625 tie
      {DType::kE5M2, 1.0f},
  };
  for (const Expected& e : expected) {
    std::vector<std::byte> buffer(3 * dtype_bytes(e.dtype), std::byte{0x5A});
    store_float(buffer.data(), e.dtype, 1, x);
    EXPECT_EQ(load_float(buffer.data(), e.dtype, 1), e.stored) << dtype_name(e.dtype);
  }
}

TEST(LoadStoreTest, StoreTouchesOnlyItsElement) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    std::vector<std::byte> buffer(3 * dtype_bytes(dtype), std::byte{0});
    store_float(buffer.data(), dtype, 1, -2.0f);
    EXPECT_EQ(load_float(buffer.data(), dtype, 0), 0.0f) << dtype_name(dtype);
    EXPECT_EQ(load_float(buffer.data(), dtype, 1), -2.0f) << dtype_name(dtype);
    EXPECT_EQ(load_float(buffer.data(), dtype, 2), 0.0f) << dtype_name(dtype);
  }
}

TEST(LoadStoreTest, Fp8StoreSaturates) {
  uint8_t byte = 0;
  store_float(&byte, DType::kE4M3, 0, 1e6f);
  EXPECT_EQ(byte, 0x7E);
  store_float(&byte, DType::kE5M2, 0, -kInf);
  EXPECT_EQ(byte, 0xFB);
}

TEST(LoadStoreTest, IntegerDtypes) {
  const int32_t i32[] = {7, -3};
  const int64_t i64[] = {int64_t{1} << 40, -5};
  const uint8_t u8[] = {0, 255};
  EXPECT_EQ(load_float(i32, DType::kI32, 1), -3.0f);
  EXPECT_EQ(load_float(i64, DType::kI64, 0), pow2(40));
  EXPECT_EQ(load_float(u8, DType::kU8, 1), 255.0f);

  int32_t out32[2] = {0, 0};
  store_float(out32, DType::kI32, 1, -12.0f);
  EXPECT_EQ(out32[1], -12);
  uint8_t out8 = 0;
  store_float(&out8, DType::kU8, 0, 255.0f);
  EXPECT_EQ(out8, 255);
  int64_t out64 = 0;
  store_float(&out64, DType::kI64, 0, -pow2(63));
  EXPECT_EQ(out64, std::numeric_limits<int64_t>::min());
}

TEST(LoadStoreTest, IntegerStoreRejectsUnrepresentableValues) {
  int32_t i32 = 0;
  int64_t i64 = 0;
  uint8_t u8 = 0;
  EXPECT_THROW(store_float(&i32, DType::kI32, 0, 1.5f), Error);
  EXPECT_THROW(store_float(&i32, DType::kI32, 0, kNaN), Error);
  EXPECT_THROW(store_float(&i32, DType::kI32, 0, pow2(31)), Error);
  EXPECT_THROW(store_float(&i64, DType::kI64, 0, pow2(63)), Error);
  EXPECT_THROW(store_float(&u8, DType::kU8, 0, 256.0f), Error);
  EXPECT_THROW(store_float(&u8, DType::kU8, 0, -1.0f), Error);
  EXPECT_EQ(i32, 0);
  EXPECT_EQ(u8, 0);
}

}  // namespace
}  // namespace flare
