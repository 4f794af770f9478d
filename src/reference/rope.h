// Llama-style rotary position embedding (rotate-half) for the reference backend: the pairs
// (d, d + D/2) of a head vector rotate by position / rope_scale * rope_theta^(-2d/D).
#pragma once

#include <cstdint>
#include <vector>

namespace flare::reference_detail {

class RopeLlama {
 public:
  RopeLlama(int64_t head_dim, float rope_theta, float rope_scale);

  // x[0 .. head_dim) rotated in place to `position`. Angles, sines and the rotation are
  // computed in double and rounded to T once, so float results are as exact as floats allow.
  template <class T>
  void apply(T* x, int64_t position) const;

 private:
  int64_t half_dim_;
  double rope_scale_;
  std::vector<double> inverse_frequency_;  // [half_dim]: theta^(-2d / head_dim)
};

}  // namespace flare::reference_detail
