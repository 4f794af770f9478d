// Seeded randomness for tests: an mt19937_64 wrapper, random tensors rounded to their dtype,
// and per-request length lists (constant, uniform, zipf-skewed) for batches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "testing/elements.h"

namespace flare::testing {

// Every random choice of a test goes through one of these, built from a fixed seed, so a
// failure reproduces exactly (same seed, same standard library => same values).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  double normal() { return std::normal_distribution<double>(0.0, 1.0)(engine_); }
  double uniform(double lo = 0.0, double hi = 1.0) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  // Uniform integer in [lo, hi], both ends included.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  template <class T>
  void shuffle(std::vector<T>& values) {
    std::shuffle(values.begin(), values.end(), engine_);
  }
  // A random permutation of 0, 1, ..., n - 1.
  std::vector<int32_t> permutation(int32_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    shuffle(ids);
    return ids;
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

// Fills every element of the floating CPU view `t` (any strides) with normal(0, 1) * scale
// rounded to t.dtype (fp8 saturates), drawn in row-major order of the logical shape: a view
// and a contiguous tensor of the same shape and seed get the same values.
inline void fill_random(const TensorView& t, uint64_t seed, float scale = 1.0f) {
  require_cpu(t, "fill_random target");
  FLARE_CHECK(is_floating(t.dtype), ErrorCode::kInvalidArgument,
              "fill_random needs a floating dtype, got ", dtype_name(t.dtype));
  Rng rng(seed);
  for_each_element(t, [&](int64_t, int64_t offset) {
    set_element_at(t, offset, static_cast<float>(rng.normal() * scale));
  });
}

// A contiguous tensor of `shape` with normal(0, 1) * scale values rounded to `dtype`
// (floating dtypes only; kInvalidArgument otherwise).
inline HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed,
                                float scale = 1.0f) {
  HostTensor out(dtype, shape);
  fill_random(out.view(), seed, scale);
  return out;
}

enum class LengthDistribution {
  kConstant,  // every length is max_len
  kUniform,   // uniform in [min_len, max_len]
  kZipf,      // max(min_len, max_len / r), rank r ~ Zipf(exponent) on 1..max_len: a few long
              // requests and many short ones (the skewed batches of the FlashInfer paper)
};

// `batch` request lengths drawn from `distribution` (0 <= min_len <= max_len; a min_len of 0
// allows empty requests). Deterministic for a given seed.
inline std::vector<int32_t> random_lengths(int64_t batch, LengthDistribution distribution,
                                           int32_t min_len, int32_t max_len, uint64_t seed,
                                           double zipf_exponent = 1.2) {
  FLARE_CHECK(batch >= 0 && 0 <= min_len && min_len <= max_len, ErrorCode::kInvalidArgument,
              "random_lengths needs batch >= 0 and 0 <= min_len <= max_len, got batch=", batch,
              " min_len=", min_len, " max_len=", max_len);
  std::vector<int32_t> lengths(static_cast<size_t>(batch), max_len);
  Rng rng(seed);
  switch (distribution) {
    case LengthDistribution::kConstant:
      break;
    case LengthDistribution::kUniform:
      for (int32_t& length : lengths)
        length = static_cast<int32_t>(rng.uniform_int(min_len, max_len));
      break;
    case LengthDistribution::kZipf: {
      if (max_len == 0) break;
      std::vector<double> weights(static_cast<size_t>(max_len));
      for (size_t r = 0; r < weights.size(); ++r) {
        weights[r] = 1.0 / std::pow(static_cast<double>(r + 1), zipf_exponent);
      }
      std::discrete_distribution<int32_t> rank(weights.begin(), weights.end());
      for (int32_t& length : lengths) {
        length = std::max(min_len, max_len / (rank(rng.engine()) + 1));
      }
      break;
    }
  }
  return lengths;
}

}  // namespace flare::testing
