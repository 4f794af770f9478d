// Llama-style rotary position embedding (rotate-half) for the reference backend: the pairs
// (d, d + D/2) of a head vector rotate by position * rope_frequency(params, d, D) radians
// (position / rope_scale * rope_theta^(-2d/D), or Llama 3.1's scaled frequencies).
#pragma once

#include <cstdint>
#include <vector>

#include "flare/variant/attention_params.h"

namespace flare::reference_detail {

class RopeLlama {
 public:
  RopeLlama(int64_t head_dim, const AttentionParams& params);

  // x[0 .. head_dim) rotated in place to `position`. Angles, sines and the rotation are
  // computed in double and rounded to T once, so float results are as exact as floats allow.
  template <class T>
  void apply(T* x, int64_t position) const;

 private:
  int64_t half_dim_;
  std::vector<double> frequency_;  // [half_dim]: radians per position (rope_frequency)
};

}  // namespace flare::reference_detail
