// Rotate-half RoPE: out[d] = x[d] cos - x[d + D/2] sin, out[d + D/2] = x[d + D/2] cos + x[d] sin.
#include "src/reference/rope.h"

#include <cmath>

namespace flare::reference_detail {

RopeLlama::RopeLlama(int64_t head_dim, const AttentionParams& params)
    : half_dim_(head_dim / 2), frequency_(static_cast<size_t>(head_dim / 2)) {
  for (int64_t d = 0; d < half_dim_; ++d) frequency_[d] = rope_frequency(params, d, head_dim);
}

template <class T>
void RopeLlama::apply(T* x, int64_t position) const {
  for (int64_t d = 0; d < half_dim_; ++d) {
    const double angle = static_cast<double>(position) * frequency_[d];
    const double cos_angle = std::cos(angle);
    const double sin_angle = std::sin(angle);
    const double first = static_cast<double>(x[d]);
    const double second = static_cast<double>(x[d + half_dim_]);
    x[d] = static_cast<T>(first * cos_angle - second * sin_angle);
    x[d + half_dim_] = static_cast<T>(second * cos_angle + first * sin_angle);
  }
}

template void RopeLlama::apply<float>(float*, int64_t) const;
template void RopeLlama::apply<double>(double*, int64_t) const;

}  // namespace flare::reference_detail
