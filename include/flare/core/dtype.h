// Element types and exact host conversions between float32 and f16, bf16, fp8 e4m3/e5m2
// (round to nearest even; the fp8 NaN/inf/saturation rules of the OCP FP8 formats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace flare {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kE4M3,  // fp8 e4m3fn: no infinities, one NaN pattern per sign (S.1111.111), max 448
  kE5M2,  // fp8 e5m2: IEEE-like, infinities and NaNs, max finite 57344
  kI32,
  kI64,
  kU8,  // bytes: packed bit masks, boolean masks
};

size_t dtype_bytes(DType dtype);
std::string_view dtype_name(DType dtype);  // "float32", "float16", "bfloat16", "float8_e4m3", ...
// Accepts the names dtype_name gives plus the short ones "f32", "f16", "bf16", "e4m3", "e5m2",
// "fp8_e4m3", "fp8_e5m2", "int32", "int64", "uint8". Throws kInvalidArgument otherwise.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);
bool is_fp8(DType dtype);

// What happens to a finite float32 beyond the fp8 format's largest finite value.
enum class Fp8Overflow : uint8_t {
  kSaturate,  // clamp to +-max finite; +-inf also clamps (CUDA's __NV_SATFINITE)
  kNoSaturate,  // e4m3 -> NaN, e5m2 -> +-inf (CUDA's __NV_NOSAT)
};

uint16_t float_to_f16_bits(float x);
float f16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t bits);
uint8_t float_to_e4m3_bits(float x, Fp8Overflow overflow = Fp8Overflow::kSaturate);
float e4m3_bits_to_float(uint8_t bits);
uint8_t float_to_e5m2_bits(float x, Fp8Overflow overflow = Fp8Overflow::kSaturate);
float e5m2_bits_to_float(uint8_t bits);

// Element `index` of a buffer of floating dtype, as float32 (exact for every dtype here).
float load_float(const void* data, DType dtype, int64_t index);
// Rounds x to dtype (nearest even; fp8 saturates) and stores it at element `index`.
void store_float(void* data, DType dtype, int64_t index, float x);

}  // namespace flare
