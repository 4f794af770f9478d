// 4-bit weight-only quantization for the decode megakernel (issue 22): the storage format,
// round-to-nearest quantization and the exact dequantization the kernel and the PyTorch reference
// share.
//
// Format (GPTQ-style, symmetric, group size 128 along the input dimension), for a weight
// W [N, K] (nn.Linear's [out, in]) with K a multiple of 128:
//   codes  uint8 [N, K / 2]: byte j of row n holds column 2j in its low nibble and column 2j + 1
//          in its high nibble; a code q in [0, 15] stands for q - 8;
//   scales bf16 [N, K / 128]: one per row and group of 128 columns;
//   W'[n][k] = float(scales[n][k / 128]) * (code(n, k) - 8), exactly (a product of a bf16 and a
//   small integer is exact in float32; the kernel multiplies by code - 8 on the tensor cores
//   and by the scale in float32, so it uses W' unrounded).
// Round-to-nearest quantization: scale = bf16(max |W| over the group / 7) (a zero group gets
// scale 0), q = clamp(round_half_even(W / scale), -8, 7) + 8. A GPTQ-calibrated checkpoint in
// this layout (symmetric, no zero points, no activation reordering) loads the same way.
#pragma once

#include <cstdint>
#include <vector>

namespace flare::model {

inline constexpr int kInt4GroupSize = 128;

struct Int4Weight {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;    // [rows, cols / 2]
  std::vector<uint16_t> scales;  // [rows, cols / 128], bf16 bits
};

// Quantizes a float32 [rows, cols] row-major matrix. Throws kInvalidArgument when cols is not a
// positive multiple of 128, rows is not positive, or a value is not finite (naming the index).
Int4Weight quantize_int4(const float* weight, int64_t rows, int64_t cols);

// W' as float32 [rows, cols] (exact: see the format above).
std::vector<float> dequantize_int4(const Int4Weight& w);

// Bytes a decode step reads for this matrix (codes + scales): 4.125 bits a weight.
inline int64_t int4_bytes(int64_t rows, int64_t cols) {
  return rows * cols / 2 + rows * (cols / kInt4GroupSize) * 2;
}

}  // namespace flare::model
