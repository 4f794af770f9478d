// 4-bit weight-only quantization (flare/model/int4_weights.h): the CPU reference of the format.
#include "flare/model/int4_weights.h"

#include <algorithm>
#include <cmath>

#include "flare/core/dtype.h"
#include "flare/core/error.h"

namespace flare::model {

Int4Weight quantize_int4(const float* weight, int64_t rows, int64_t cols) {
  FLARE_CHECK(rows > 0 && cols > 0 && cols % kInt4GroupSize == 0, ErrorCode::kInvalidArgument,
              "quantize_int4: the weight must be [rows, cols] with cols a positive multiple of ",
              kInt4GroupSize, ", got [", rows, ", ", cols, "]");
  Int4Weight w;
  w.rows = rows;
  w.cols = cols;
  w.codes.assign(static_cast<size_t>(rows * cols / 2), 0);
  w.scales.assign(static_cast<size_t>(rows * (cols / kInt4GroupSize)), 0);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t g = 0; g < cols / kInt4GroupSize; ++g) {
      const float* group = weight + n * cols + g * kInt4GroupSize;
      float largest = 0.f;
      for (int i = 0; i < kInt4GroupSize; ++i) {
        FLARE_CHECK(std::isfinite(group[i]), ErrorCode::kInvalidArgument, "quantize_int4: weight[",
                    n, "][", g * kInt4GroupSize + i, "] is not finite");
        largest = std::max(largest, std::fabs(group[i]));
      }
      const uint16_t scale_bits = float_to_bf16_bits(largest / 7.f);
      w.scales[static_cast<size_t>(n * (cols / kInt4GroupSize) + g)] = scale_bits;
      const float scale = bf16_bits_to_float(scale_bits);
      for (int i = 0; i < kInt4GroupSize; ++i) {
        const float q = scale > 0.f ? std::nearbyint(group[i] / scale) : 0.f;  // half to even
        const auto code = static_cast<uint8_t>(std::clamp(q, -8.f, 7.f) + 8.f);
        const int64_t k = g * kInt4GroupSize + i;
        uint8_t& byte = w.codes[static_cast<size_t>(n * cols / 2 + k / 2)];
        byte =
            static_cast<uint8_t>(k % 2 == 0 ? (byte & 0xF0u) | code : (byte & 0x0Fu) | (code << 4));
      }
    }
  }
  return w;
}

std::vector<float> dequantize_int4(const Int4Weight& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  const int64_t groups = w.cols / kInt4GroupSize;
  for (int64_t n = 0; n < w.rows; ++n) {
    for (int64_t k = 0; k < w.cols; ++k) {
      const uint8_t byte = w.codes[static_cast<size_t>(n * w.cols / 2 + k / 2)];
      const int code = k % 2 == 0 ? byte & 0x0F : byte >> 4;
      const float scale =
          bf16_bits_to_float(w.scales[static_cast<size_t>(n * groups + k / kInt4GroupSize)]);
      out[static_cast<size_t>(n * w.cols + k)] = scale * static_cast<float>(code - 8);
    }
  }
  return out;
}

}  // namespace flare::model
