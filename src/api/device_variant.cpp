// The kernels' VariantParams for BatchDecode and BatchPrefill, their tables uploaded once.
#include "src/api/device_variant.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace flare::api_detail {

std::vector<float> rope_turns(const AttentionParams& p, int rotary_dim) {
  std::vector<float> turns;
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const double exact = rope_frequency(p, i, rotary_dim) / (2.0 * std::numbers::pi);
    const float hi = static_cast<float>(exact);
    turns.push_back(hi);
    turns.push_back(static_cast<float>(exact - static_cast<double>(hi)));
  }
  return turns;
}

VariantParams device_variant(const AttentionParams& p, int head_dim_qk, int num_qo_heads,
                             cuda::DeviceBuffer& tables) {
  VariantParams variant{};
  variant.sm_scale = p.resolved_sm_scale(head_dim_qk);
  variant.logits_soft_cap = p.logits_soft_cap;
  variant.window_left = p.window_left;
  variant.sigmoid_bias = p.sigmoid_bias;
  // One upload: the ALiBi slopes (float [H_qo]), then the RoPE turns ([D / 2][2], 16-byte
  // aligned).
  std::vector<float> host;
  if (p.pos_encoding == PosEncoding::kAlibi) {
    for (int h = 0; h < num_qo_heads; ++h) {
      host.push_back(p.alibi_slopes
                         ? p.alibi_slopes->ptr<const float>()[h * p.alibi_slopes->strides[0]]
                         : default_alibi_slope(h, num_qo_heads));
    }
  }
  const size_t turns_at = (host.size() + 3) / 4 * 4;  // 16-byte aligned
  if (p.pos_encoding == PosEncoding::kRopeLlama) {
    host.resize(turns_at);
    const std::vector<float> turns = rope_turns(p, head_dim_qk);
    host.insert(host.end(), turns.begin(), turns.end());
  }
  if (host.empty()) return variant;
  tables = cuda::DeviceBuffer(host.size() * sizeof(float));
  cuda::memcpy_htod(tables.data(), host.data(), host.size() * sizeof(float));
  const float* device = static_cast<const float*>(tables.data());
  if (p.pos_encoding == PosEncoding::kAlibi) variant.alibi_slopes = device;
  if (p.pos_encoding == PosEncoding::kRopeLlama) {
    variant.rope_turns = device + turns_at;
  }
  return variant;
}

}  // namespace flare::api_detail
