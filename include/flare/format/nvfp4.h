// NVFP4, the 4-bit KV-cache element format FlashInfer's NVFP4 caches use: E2M1 values (a sign
// bit and magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; code bit 3 is the sign), packed two a byte with
// the even element in the low nibble; one float8 e4m3 scale per block of 16 consecutive values
// of a row; one float32 global decode scale per tensor. A value is
//   x = e2m1(code) * e4m3(block scale) * global_scale.
// A cache row of D values is D / 2 bytes of codes and D / 16 bytes of scales (a head dim must be
// a multiple of 16). Quantizing a block (nvfp4_quantize_block) picks the block scale that maps
// its largest magnitude to 6, rounded to e4m3 (saturating), and rounds each value scaled by
// 1 / (scale * global_scale) to the nearest E2M1 value, ties to even; an all-zero block (or a
// scale that rounds to 0) stores scale 0 and codes 0. These are the host's exact definitions:
// the GPU append kernel (kernels/append_paged_kv_nvfp4.cuh) computes the same bits.
#pragma once

#include <cstdint>

namespace flare {

inline constexpr int kNvfp4BlockSize = 16;  // values per e4m3 block scale
inline constexpr float kE2M1Max = 6.0f;

float e2m1_to_float(uint8_t code);  // code in [0, 16): the low 4 bits are read
// Round to the nearest E2M1 value, ties to even (|x| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1,
// < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3, <= 5 -> 4, else 6: saturating); the sign is kept (-0
// codes 8); NaN codes 0.
uint8_t float_to_e2m1(float x);

// Quantizes x[0..16) with `global_scale` (> 0, finite): packed[0..8) and the block's e4m3 scale
// bits.
void nvfp4_quantize_block(const float* x, float global_scale, uint8_t* packed, uint8_t* scale);
// The 16 values of one block.
void nvfp4_dequantize_block(const uint8_t* packed, uint8_t scale, float global_scale, float* out);

}  // namespace flare
