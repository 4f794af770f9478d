// NVFP4 test caches (include/flare/format/nvfp4.h): the codes and e4m3 block scales of a float32
// tensor of rows, which is overwritten with the dequantized values, so a reference reads exactly
// what a kernel decodes.
#pragma once

#include <cstdint>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/format/nvfp4.h"

namespace flare::gpu_testing {

struct Nvfp4Tensors {
  HostTensor codes;   // uint8, values' shape with D / 2 last
  HostTensor scales;  // e4m3, values' shape with D / 16 last
};

// values: float32 of 3 or 4 dimensions, rows of D (a multiple of 16) along the last, any strides.
inline Nvfp4Tensors quantize_rows(const TensorView& values, float global) {
  std::vector<int64_t> code_shape(values.shape.begin(), values.shape.begin() + values.ndim);
  std::vector<int64_t> scale_shape = code_shape;
  const int64_t d = code_shape.back();
  code_shape.back() = d / 2;
  scale_shape.back() = d / kNvfp4BlockSize;
  Nvfp4Tensors out{HostTensor(DType::kU8, code_shape), HostTensor(DType::kE4M3, scale_shape)};
  int64_t rows = 1;
  for (int i = 0; i + 1 < values.ndim; ++i) rows *= values.shape[i];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0, rest = r;
    for (int i = values.ndim - 2; i >= 0; --i) {
      offset += (rest % values.shape[i]) * values.strides[i];
      rest /= values.shape[i];
    }
    float* row = static_cast<float*>(values.data) + offset;
    uint8_t* codes = out.codes.data<uint8_t>() + r * (d / 2);
    uint8_t* scales = out.scales.data<uint8_t>() + r * (d / kNvfp4BlockSize);
    for (int64_t b = 0; b < d / kNvfp4BlockSize; ++b) {
      float block[kNvfp4BlockSize];
      for (int i = 0; i < kNvfp4BlockSize; ++i) {
        block[i] = row[(b * kNvfp4BlockSize + i) * values.strides[values.ndim - 1]];
      }
      nvfp4_quantize_block(block, global, codes + b * 8, scales + b);
      nvfp4_dequantize_block(codes + b * 8, scales[b], global, block);
      for (int i = 0; i < kNvfp4BlockSize; ++i) {
        row[(b * kNvfp4BlockSize + i) * values.strides[values.ndim - 1]] = block[i];
      }
    }
  }
  return out;
}

}  // namespace flare::gpu_testing
