// NVFP4 element conversions (include/flare/format/nvfp4.h).
#include "flare/format/nvfp4.h"

#include <algorithm>
#include <cmath>

#include "flare/core/dtype.h"
#include "kernels/nvfp4_codes.cuh"

namespace flare {

namespace {
constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}  // namespace

float e2m1_to_float(uint8_t code) {
  const float magnitude = kMagnitudes[code & 7];
  return (code & 8) != 0 ? -magnitude : magnitude;
}

uint8_t float_to_e2m1(float x) { return static_cast<uint8_t>(nvfp4::e2m1_code(x)); }

void nvfp4_quantize_block(const float* x, float global_scale, uint8_t* packed, uint8_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < kNvfp4BlockSize; ++i) amax = std::max(amax, std::fabs(x[i]));
  // The same float32 operations as the kernel: amax / (6 * g), then 1 / (scale * g).
  const float block_scale = amax > 0.0f ? amax / (kE2M1Max * global_scale) : 0.0f;
  *scale = float_to_e4m3_bits(block_scale, Fp8Overflow::kSaturate);
  const float rounded = e4m3_bits_to_float(*scale);
  const float inverse = amax > 0.0f && rounded > 0.0f ? 1.0f / (rounded * global_scale) : 0.0f;
  for (int i = 0; i < kNvfp4BlockSize / 2; ++i) {
    const uint8_t lo = float_to_e2m1(x[2 * i] * inverse);
    const uint8_t hi = float_to_e2m1(x[2 * i + 1] * inverse);
    packed[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void nvfp4_dequantize_block(const uint8_t* packed, uint8_t scale, float global_scale, float* out) {
  // e2m1 x e4m3 is exact in float32 (at most 2 and 4 significant bits); one rounding after.
  const float block_scale = e4m3_bits_to_float(scale);
  for (int i = 0; i < kNvfp4BlockSize / 2; ++i) {
    out[2 * i] = e2m1_to_float(packed[i] & 0xF) * block_scale * global_scale;
    out[2 * i + 1] = e2m1_to_float(packed[i] >> 4) * block_scale * global_scale;
  }
}

}  // namespace flare
