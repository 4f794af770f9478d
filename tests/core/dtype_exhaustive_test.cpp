// Every code of f16, bf16, fp8 e4m3 and e5m2 decodes to the value an independent decoder gives
// and re-encodes to itself; encoding a dense sweep of float32 (every tie and its neighbours,
// plus a strided walk over all exponents) matches an independent nearest-even reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flare/core/dtype.h"

namespace flare {
namespace {

// A format described from its definition only, plus flare's functions under test.
struct Format {
  std::string name;
  int exponent_bits;
  int mantissa_bits;
  bool has_inf;  // IEEE-like top exponent; false: only S.1111.111 is NaN (e4m3fn)
  uint32_t (*encode)(float, Fp8Overflow);
  float (*decode)(uint32_t);
  bool can_saturate;  // fp8 only; f16/bf16 overflow to inf

  uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  uint32_t top_exponent() const { return (1u << exponent_bits) - 1; }
  uint32_t max_finite_code() const {
    const uint32_t first_special = has_inf ? top_exponent() << mantissa_bits : sign_bit() - 1;
    return first_special - 1;
  }
};

// The value of `code` straight from the format's definition, in double.
double reference_decode(const Format& f, uint32_t code) {
  const bool negative = code & f.sign_bit();
  const uint32_t exponent = (code >> f.mantissa_bits) & f.top_exponent();
  const uint32_t mantissa = code & ((1u << f.mantissa_bits) - 1);
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  double magnitude;
  if (f.has_inf && exponent == f.top_exponent()) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && exponent == f.top_exponent() &&
             mantissa == (1u << f.mantissa_bits) - 1) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -f.mantissa_bits),
                           static_cast<int>(exponent) - bias);
  }
  return negative ? -magnitude : magnitude;
}

// The non-negative finite values by code (codes 0..max_finite), then one value past the largest:
// where the next code would sit if the exponent range went on. Rounding to it is overflow.
std::vector<double> magnitude_ladder(const Format& f) {
  std::vector<double> ladder;
  for (uint32_t code = 0; code <= f.max_finite_code(); ++code) {
    ladder.push_back(reference_decode(f, code));
  }
  const double top_ulp = ladder[ladder.size() - 1] - ladder[ladder.size() - 2];
  ladder.push_back(ladder.back() + top_ulp);
  return ladder;
}

// The code for x by round-to-nearest-even, found from the ladder by distance alone.
uint32_t reference_encode(const Format& f, const std::vector<double>& ladder, float x,
                          Fp8Overflow overflow) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0;
  const uint32_t nan_code = f.sign_bit() - 1;  // all ones
  if (std::isnan(x)) return sign | nan_code;
  const double magnitude = std::fabs(static_cast<double>(x));
  const uint32_t overflow_code = f.can_saturate && overflow == Fp8Overflow::kSaturate
                                     ? f.max_finite_code()
                                     : (f.has_inf ? f.top_exponent() << f.mantissa_bits : nan_code);
  if (magnitude > ladder.back()) return sign | overflow_code;
  const auto upper = std::lower_bound(ladder.begin(), ladder.end(), magnitude);
  uint32_t code = static_cast<uint32_t>(upper - ladder.begin());
  if (*upper != magnitude) {
    const double lower = *(upper - 1);
    const double midpoint = (lower + *upper) / 2;  // exact: both have few significant bits
    if (magnitude < midpoint || (magnitude == midpoint && (code - 1) % 2 == 0)) --code;
  }
  if (code > f.max_finite_code()) return sign | overflow_code;
  return sign | code;
}

std::vector<Format> all_formats() {
  return {
      {"float16", 5, 10, true,
       [](float x, Fp8Overflow) -> uint32_t { return float_to_f16_bits(x); },
       [](uint32_t c) { return f16_bits_to_float(static_cast<uint16_t>(c)); }, false},
      {"bfloat16", 8, 7, true,
       [](float x, Fp8Overflow) -> uint32_t { return float_to_bf16_bits(x); },
       [](uint32_t c) { return bf16_bits_to_float(static_cast<uint16_t>(c)); }, false},
      {"float8_e4m3", 4, 3, false,
       [](float x, Fp8Overflow o) -> uint32_t { return float_to_e4m3_bits(x, o); },
       [](uint32_t c) { return e4m3_bits_to_float(static_cast<uint8_t>(c)); }, true},
      {"float8_e5m2", 5, 2, true,
       [](float x, Fp8Overflow o) -> uint32_t { return float_to_e5m2_bits(x, o); },
       [](uint32_t c) { return e5m2_bits_to_float(static_cast<uint8_t>(c)); }, true},
  };
}

constexpr Fp8Overflow kBothModes[] = {Fp8Overflow::kSaturate, Fp8Overflow::kNoSaturate};

TEST(DtypeExhaustiveTest, LadderIsTheKnownRange) {
  // Guards the reference itself against a wrong format description.
  const double expected_max[] = {65504.0, std::ldexp(255.0, 120), 448.0, 57344.0};
  const double expected_min_subnormal[] = {std::ldexp(1.0, -24), std::ldexp(1.0, -133),
                                           std::ldexp(1.0, -9), std::ldexp(1.0, -16)};
  const std::vector<Format> formats = all_formats();
  for (size_t i = 0; i < formats.size(); ++i) {
    const std::vector<double> ladder = magnitude_ladder(formats[i]);
    EXPECT_EQ(ladder[ladder.size() - 2], expected_max[i]) << formats[i].name;
    EXPECT_EQ(ladder[1], expected_min_subnormal[i]) << formats[i].name;
    EXPECT_TRUE(std::is_sorted(ladder.begin(), ladder.end())) << formats[i].name;
  }
}

TEST(DtypeExhaustiveTest, EveryCodeDecodesToItsDefinedValue) {
  for (const Format& f : all_formats()) {
    for (uint32_t code = 0; code < 2 * f.sign_bit(); ++code) {
      const double expected = reference_decode(f, code);
      const float actual = f.decode(code);
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(actual)) << f.name << " code 0x" << std::hex << code;
      } else {
        ASSERT_EQ(static_cast<double>(actual), expected)
            << f.name << " code 0x" << std::hex << code;
        ASSERT_EQ(std::signbit(actual), std::signbit(expected))
            << f.name << " code 0x" << std::hex << code;
      }
    }
  }
}

TEST(DtypeExhaustiveTest, EveryCodeRoundTrips) {
  for (const Format& f : all_formats()) {
    for (uint32_t code = 0; code < 2 * f.sign_bit(); ++code) {
      const float value = f.decode(code);
      for (Fp8Overflow mode : kBothModes) {
        const uint32_t again = f.encode(value, mode);
        if (std::isnan(value)) {
          ASSERT_TRUE(std::isnan(f.decode(again))) << f.name << " code 0x" << std::hex << code;
        } else if (std::isinf(value) && f.can_saturate && mode == Fp8Overflow::kSaturate) {
          ASSERT_EQ(again, (code & f.sign_bit()) | f.max_finite_code())
              << f.name << ": saturation clamps inf, code 0x" << std::hex << code;
        } else {
          ASSERT_EQ(again, code) << f.name << " code 0x" << std::hex << code;
        }
      }
    }
  }
}

// Checks encode(x) == reference for x and -x under both overflow modes; returns false (after
// recording the failure) on the first mismatch so a broken encoder reports once, not millions.
bool matches_reference(const Format& f, const std::vector<double>& ladder, float x) {
  for (float signed_x : {x, -x}) {
    for (Fp8Overflow mode : kBothModes) {
      const uint32_t expected = reference_encode(f, ladder, signed_x, mode);
      const uint32_t actual = f.encode(signed_x, mode);
      // NaN payloads are free; a NaN must stay a NaN of the same sign.
      const bool both_nan_same_sign = std::isnan(reference_decode(f, expected)) &&
                                      std::isnan(reference_decode(f, actual)) &&
                                      (expected & f.sign_bit()) == (actual & f.sign_bit());
      if (actual != expected && !both_nan_same_sign) {
        ADD_FAILURE() << f.name << " encode(" << signed_x << " = 0x" << std::hex
                      << std::bit_cast<uint32_t>(signed_x) << ", "
                      << (mode == Fp8Overflow::kSaturate ? "saturate" : "no saturate") << ") = 0x"
                      << actual << ", expected 0x" << expected;
        return false;
      }
    }
  }
  return true;
}

TEST(DtypeExhaustiveTest, EncodingAtEveryTieAndItsNeighboursMatchesReference) {
  for (const Format& f : all_formats()) {
    const std::vector<double> ladder = magnitude_ladder(f);
    for (size_t i = 0; i + 1 < ladder.size(); ++i) {
      const float tie = static_cast<float>((ladder[i] + ladder[i + 1]) / 2);
      ASSERT_EQ(static_cast<double>(tie), (ladder[i] + ladder[i + 1]) / 2) << "tie not a float";
      const float exact = static_cast<float>(ladder[i]);
      const float points[] = {exact,
                              std::nextafter(exact, 0.0f),
                              std::nextafter(exact, std::numeric_limits<float>::infinity()),
                              tie,
                              std::nextafter(tie, 0.0f),
                              std::nextafter(tie, std::numeric_limits<float>::infinity()),
                              static_cast<float>((3 * ladder[i] + ladder[i + 1]) / 4)};
      for (float x : points) {
        if (!matches_reference(f, ladder, x)) return;
      }
    }
  }
}

TEST(DtypeExhaustiveTest, EncodingOfAStridedSweepOverAllFloatsMatchesReference) {
  // A prime stride visits every exponent and a spread of mantissa bit patterns: ~2M floats.
  constexpr uint32_t kStride = 1021;
  const uint32_t inf_bits = std::bit_cast<uint32_t>(std::numeric_limits<float>::infinity());
  for (const Format& f : all_formats()) {
    const std::vector<double> ladder = magnitude_ladder(f);
    for (uint64_t bits = 0; bits <= inf_bits; bits += kStride) {
      if (!matches_reference(f, ladder, std::bit_cast<float>(static_cast<uint32_t>(bits)))) return;
    }
    const float specials[] = {0.0f,
                              std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::min(),
                              std::nanf("")};
    for (float x : specials) {
      if (!matches_reference(f, ladder, x)) return;
    }
  }
}

}  // namespace
}  // namespace flare
