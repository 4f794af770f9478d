// The kernels' VariantParams for BatchDecode and BatchPrefill, ALiBi slopes uploaded once.
#include "src/api/device_variant.h"

#include <vector>

namespace flare::api_detail {

VariantParams device_variant(const AttentionParams& p, int head_dim_qk, int num_qo_heads,
                             cuda::DeviceBuffer& alibi_slopes) {
  VariantParams variant{};
  variant.sm_scale = p.resolved_sm_scale(head_dim_qk);
  variant.logits_soft_cap = p.logits_soft_cap;
  variant.window_left = p.window_left;
  variant.sigmoid_bias = p.sigmoid_bias;
  if (p.pos_encoding == PosEncoding::kAlibi) {
    std::vector<float> slopes(static_cast<size_t>(num_qo_heads));
    for (int h = 0; h < num_qo_heads; ++h) {
      slopes[static_cast<size_t>(h)] =
          p.alibi_slopes ? p.alibi_slopes->ptr<const float>()[h * p.alibi_slopes->strides[0]]
                         : default_alibi_slope(h, num_qo_heads);
    }
    alibi_slopes = cuda::DeviceBuffer(slopes.size() * sizeof(float));
    cuda::memcpy_htod(alibi_slopes.data(), slopes.data(), slopes.size() * sizeof(float));
    variant.alibi_slopes = static_cast<const float*>(alibi_slopes.data());
  }
  return variant;
}

}  // namespace flare::api_detail
