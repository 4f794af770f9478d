// Benchmark inputs: n pseudo-random 16-bit values of a unit normal on the device (never zeros),
// one chunk of 2^22 drawn on the host and repeated, as bf16 (scripts/bench_prefill.cpp,
// bench_cascade.cpp) or fp16 (scripts/bench_prefill_nvfp4.cpp) bits; contiguous device views
// and int32 index arrays on the device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/jit/cuda_driver.h"

namespace bench_inputs {

// float -> 16-bit bits: bf16 by truncation, fp16 by truncating the mantissa of |x| < 8
// (subnormals flushed): exact enough for timing inputs.
inline uint16_t to_16bit(float f, bool fp16) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (!fp16) return static_cast<uint16_t>(bits >> 16);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  return exponent <= 0 ? static_cast<uint16_t>(sign)
                       : static_cast<uint16_t>(sign | (exponent << 10) | ((bits >> 13) & 0x3FF));
}

inline flare::cuda::DeviceBuffer random_16bit(int64_t n, uint32_t seed, bool fp16) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<uint16_t> host(static_cast<size_t>(std::min(n, kChunk)));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (uint16_t& x : host) x = to_16bit(std::clamp(normal(rng), -7.9f, 7.9f), fp16);
  flare::cuda::DeviceBuffer buffer(static_cast<size_t>(n) * 2);
  for (int64_t offset = 0; offset < n; offset += kChunk) {
    const int64_t count = std::min(kChunk, n - offset);
    flare::cuda::memcpy_htod(static_cast<uint16_t*>(buffer.data()) + offset, host.data(),
                             static_cast<size_t>(count) * 2);
  }
  return buffer;
}

// A contiguous view of device 0's memory.
inline flare::TensorView view(void* data, flare::DType dtype, std::vector<int64_t> shape) {
  return flare::TensorView::contiguous(data, dtype, shape, flare::Device::cuda(0));
}

// Host int32 values copied to the device, and their 1-D view.
struct DeviceInts {
  flare::cuda::DeviceBuffer buffer;
  flare::TensorView tensor;
  explicit DeviceInts(const std::vector<int32_t>& values)
      : buffer(std::max<size_t>(values.size(), 1) * 4) {
    flare::cuda::memcpy_htod(buffer.data(), values.data(), values.size() * 4);
    tensor = view(buffer.data(), flare::DType::kI32, {static_cast<int64_t>(values.size())});
  }
};

}  // namespace bench_inputs
