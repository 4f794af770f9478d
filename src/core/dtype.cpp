// Element types: names, sizes, and exact float32 <-> f16/bf16/fp8 conversions built on one
// generic minifloat encoder/decoder parameterized by exponent and mantissa widths.
#include "flare/core/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "flare/core/error.h"

namespace flare {
namespace {

// A binary floating-point format narrower than float32 with a normal range inside float32's.
struct MinifloatFormat {
  int exponent_bits;
  int mantissa_bits;
  // true: IEEE-like, the top exponent holds inf (mantissa 0) and NaNs.
  // false ("fn" formats): no inf; only the all-ones code (per sign) is NaN.
  bool has_inf;

  constexpr int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  constexpr int min_exponent() const { return 1 - bias(); }  // of the smallest normal
  constexpr uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  constexpr uint32_t magnitude_mask() const { return sign_bit() - 1; }
  constexpr uint32_t inf_code() const { return ((1u << exponent_bits) - 1) << mantissa_bits; }
  constexpr uint32_t nan_code() const { return magnitude_mask(); }  // all ones, quiet
  constexpr uint32_t max_finite_code() const { return has_inf ? inf_code() - 1 : nan_code() - 1; }
};

constexpr MinifloatFormat kF16Format{5, 10, true};
constexpr MinifloatFormat kE4M3Format{4, 3, false};
constexpr MinifloatFormat kE5M2Format{5, 2, true};

constexpr int kF32MantissaBits = 23;
constexpr int kF32Bias = 127;
constexpr uint32_t kF32SignBit = 0x80000000u;
constexpr uint32_t kF32ExponentMask = 0x7F800000u;
constexpr uint32_t kF32MantissaMask = 0x007FFFFFu;

// Rounds float32 x to `format` (nearest, ties to even), returning the code. NaN -> NaN with x's
// sign. Magnitudes beyond the largest finite value (inf included) become the largest finite value
// when `saturate`, else inf (IEEE-like formats) or NaN (fn formats).
uint32_t encode_minifloat(float x, const MinifloatFormat& format, bool saturate) {
  const uint32_t x_bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (x_bits & kF32SignBit) ? format.sign_bit() : 0;
  const uint32_t x_exponent_field = (x_bits & kF32ExponentMask) >> kF32MantissaBits;
  const uint32_t x_mantissa = x_bits & kF32MantissaMask;
  const uint32_t overflow_code = saturate
                                     ? format.max_finite_code()
                                     : (format.has_inf ? format.inf_code() : format.nan_code());

  if (x_exponent_field == 0xFF) {
    if (x_mantissa != 0) return sign | format.nan_code();
    return sign | overflow_code;
  }
  // |x| = significand * 2^(exponent - 23) exactly, with a 24-bit integer significand.
  const uint64_t significand =
      x_exponent_field ? (x_mantissa | (1u << kF32MantissaBits)) : x_mantissa;
  const int exponent = (x_exponent_field ? static_cast<int>(x_exponent_field) : 1) - kF32Bias;
  // The result's exponent: x's own, or the format's smallest normal one for its subnormals
  // (float32 subnormals lie far below every format's subnormal range, so they land there too).
  const int result_exponent = std::max(exponent, format.min_exponent());
  // Keep mantissa_bits fraction bits at result_exponent: drop `shift` (>= 23 - mantissa_bits > 0)
  // low bits of the significand, rounding to nearest even. The clamp keeps the shifts defined;
  // from 26 on nothing reaches half an ulp anyway.
  const int shift =
      std::min(result_exponent - exponent + kF32MantissaBits - format.mantissa_bits, 40);
  uint64_t rounded = significand >> shift;
  const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (remainder > half || (remainder == half && (rounded & 1))) ++rounded;
  // `rounded` counts ulps of 2^(result_exponent - mantissa_bits); it includes the implicit bit
  // for normals, so adding it to the exponent field's base also carries a mantissa overflow into
  // the exponent and turns the largest subnormal into the smallest normal.
  const uint64_t code =
      (static_cast<uint64_t>(result_exponent - format.min_exponent()) << format.mantissa_bits) +
      rounded;
  if (code > format.max_finite_code()) return sign | overflow_code;
  return sign | static_cast<uint32_t>(code);
}

float decode_minifloat(uint32_t code, const MinifloatFormat& format) {
  const uint32_t sign = (code & format.sign_bit()) ? kF32SignBit : 0;
  const uint32_t magnitude = code & format.magnitude_mask();
  const uint32_t exponent_field = magnitude >> format.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << format.mantissa_bits) - 1);
  if (format.has_inf ? magnitude >= format.inf_code() : magnitude == format.nan_code()) {
    const float special = magnitude == format.inf_code() ? std::numeric_limits<float>::infinity()
                                                         : std::numeric_limits<float>::quiet_NaN();
    return std::bit_cast<float>(std::bit_cast<uint32_t>(special) | sign);
  }
  uint32_t bits;
  if (exponent_field == 0) {
    // Subnormal: mantissa * 2^(min_exponent - mantissa_bits), a float32 normal product (exact).
    const float ulp = std::bit_cast<float>(
        static_cast<uint32_t>(kF32Bias + format.min_exponent() - format.mantissa_bits)
        << kF32MantissaBits);
    bits = std::bit_cast<uint32_t>(static_cast<float>(mantissa) * ulp);
  } else {
    const uint32_t f32_exponent_field = exponent_field - format.bias() + kF32Bias;
    bits = (f32_exponent_field << kF32MantissaBits) |
           (mantissa << (kF32MantissaBits - format.mantissa_bits));
  }
  return std::bit_cast<float>(bits | sign);
}

bool saturates(Fp8Overflow overflow) { return overflow == Fp8Overflow::kSaturate; }

template <class T>
T load_as(const void* data, int64_t index) {
  T value;
  std::memcpy(&value, static_cast<const std::byte*>(data) + index * sizeof(T), sizeof(T));
  return value;
}

template <class T>
void store_as(void* data, int64_t index, T value) {
  std::memcpy(static_cast<std::byte*>(data) + index * sizeof(T), &value, sizeof(T));
}

// Integer dtypes take only integral values they represent exactly.
template <class T>
void store_integer(void* data, int64_t index, float x, DType dtype) {
  // max() + 1 is a power of two, exact in double, unlike max() itself for int64.
  const double upper_bound = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  const bool representable = std::trunc(x) == x &&
                             x >= static_cast<double>(std::numeric_limits<T>::min()) &&
                             x < upper_bound;
  FLARE_CHECK(representable, ErrorCode::kInvalidArgument, "store_float: value ", x,
              " is not an integer representable as ", dtype_name(dtype));
  store_as<T>(data, index, static_cast<T>(x));
}

}  // namespace

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kE4M3:
      return 1;
    case DType::kE5M2:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  fail(ErrorCode::kInternal, "dtype_bytes: unknown dtype ", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kE4M3:
      return "float8_e4m3";
    case DType::kE5M2:
      return "float8_e5m2";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
  }
  fail(ErrorCode::kInternal, "dtype_name: unknown dtype ", static_cast<int>(dtype));
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float32", DType::kF32},      {"f32", DType::kF32},
      {"float16", DType::kF16},      {"f16", DType::kF16},
      {"bfloat16", DType::kBF16},    {"bf16", DType::kBF16},
      {"float8_e4m3", DType::kE4M3}, {"fp8_e4m3", DType::kE4M3},
      {"e4m3", DType::kE4M3},        {"float8_e4m3fn", DType::kE4M3},
      {"float8_e5m2", DType::kE5M2}, {"fp8_e5m2", DType::kE5M2},
      {"e5m2", DType::kE5M2},        {"int32", DType::kI32},
      {"int64", DType::kI64},        {"uint8", DType::kU8},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  fail(ErrorCode::kInvalidArgument, "parse_dtype: unknown dtype name '", name,
       "' (expected float32, float16, bfloat16, float8_e4m3, float8_e5m2, int32, int64, uint8 "
       "or f32, f16, bf16, e4m3, e5m2, fp8_e4m3, fp8_e5m2)");
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 || is_fp8(dtype);
}

bool is_fp8(DType dtype) { return dtype == DType::kE4M3 || dtype == DType::kE5M2; }

uint16_t float_to_f16_bits(float x) {
  return static_cast<uint16_t>(encode_minifloat(x, kF16Format, /*saturate=*/false));
}

float f16_bits_to_float(uint16_t bits) { return decode_minifloat(bits, kF16Format); }

uint16_t float_to_bf16_bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // Quiet the NaN in the kept half: truncating its payload alone could leave an infinity.
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // bf16 is float32's upper half: round the lower half to nearest even (a carry into the
  // exponent, up to inf, is the correct result).
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint8_t float_to_e4m3_bits(float x, Fp8Overflow overflow) {
  return static_cast<uint8_t>(encode_minifloat(x, kE4M3Format, saturates(overflow)));
}

float e4m3_bits_to_float(uint8_t bits) { return decode_minifloat(bits, kE4M3Format); }

uint8_t float_to_e5m2_bits(float x, Fp8Overflow overflow) {
  return static_cast<uint8_t>(encode_minifloat(x, kE5M2Format, saturates(overflow)));
}

float e5m2_bits_to_float(uint8_t bits) { return decode_minifloat(bits, kE5M2Format); }

float load_float(const void* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kF32:
      return load_as<float>(data, index);
    case DType::kF16:
      return f16_bits_to_float(load_as<uint16_t>(data, index));
    case DType::kBF16:
      return bf16_bits_to_float(load_as<uint16_t>(data, index));
    case DType::kE4M3:
      return e4m3_bits_to_float(load_as<uint8_t>(data, index));
    case DType::kE5M2:
      return e5m2_bits_to_float(load_as<uint8_t>(data, index));
    case DType::kI32:
      return static_cast<float>(load_as<int32_t>(data, index));
    case DType::kI64:
      return static_cast<float>(load_as<int64_t>(data, index));
    case DType::kU8:
      return static_cast<float>(load_as<uint8_t>(data, index));
  }
  fail(ErrorCode::kInternal, "load_float: unknown dtype ", static_cast<int>(dtype));
}

void store_float(void* data, DType dtype, int64_t index, float x) {
  switch (dtype) {
    case DType::kF32:
      return store_as<float>(data, index, x);
    case DType::kF16:
      return store_as<uint16_t>(data, index, float_to_f16_bits(x));
    case DType::kBF16:
      return store_as<uint16_t>(data, index, float_to_bf16_bits(x));
    case DType::kE4M3:
      return store_as<uint8_t>(data, index, float_to_e4m3_bits(x));
    case DType::kE5M2:
      return store_as<uint8_t>(data, index, float_to_e5m2_bits(x));
    case DType::kI32:
      return store_integer<int32_t>(data, index, x, dtype);
    case DType::kI64:
      return store_integer<int64_t>(data, index, x, dtype);
    case DType::kU8:
      return store_integer<uint8_t>(data, index, x, dtype);
  }
  fail(ErrorCode::kInternal, "store_float: unknown dtype ", static_cast<int>(dtype));
}

}  // namespace flare
