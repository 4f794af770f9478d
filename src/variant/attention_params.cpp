// AttentionParams' derived values: the softmax scale default, the default ALiBi slopes, RoPE's
// frequencies and T5's relative-position buckets.
#include "flare/variant/attention_params.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "flare/core/error.h"

namespace flare {

float AttentionParams::resolved_sm_scale(int64_t head_dim_qk) const {
  if (sm_scale != 0.0f) return sm_scale;
  FLARE_CHECK(head_dim_qk > 0, ErrorCode::kInvalidArgument,
              "resolved_sm_scale: head_dim_qk must be > 0, got ", head_dim_qk);
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim_qk)));
}

float default_alibi_slope(int64_t head, int64_t num_heads) {
  FLARE_CHECK(num_heads > 0, ErrorCode::kInvalidArgument,
              "default_alibi_slope: num_heads must be > 0, got ", num_heads);
  FLARE_CHECK(head >= 0 && head < num_heads, ErrorCode::kInvalidArgument,
              "default_alibi_slope: head must be in [0, ", num_heads, "), got ", head);
  // The ALiBi paper's rule (also FlashInfer's): with n the largest power of two <= num_heads,
  // the first n heads get 2^(-8 (h+1) / n); the rest take every other slope of the 2n-head
  // sequence, 2^(-4 (2 (h-n) + 1) / n).
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;
  const double exponent =
      head < n ? -8.0 * static_cast<double>(head + 1) / static_cast<double>(n)
               : -4.0 * static_cast<double>(2 * (head - n) + 1) / static_cast<double>(n);
  return static_cast<float>(std::exp2(exponent));
}

double rope_frequency(const AttentionParams& params, int64_t pair, int64_t head_dim) {
  const double base = std::pow(static_cast<double>(params.rope_theta),
                               -2.0 * static_cast<double>(pair) / static_cast<double>(head_dim));
  const double factor = params.rope_scale;
  if (!params.rope_llama31) return base / factor;
  const AttentionParams::Llama31Scaling& l = *params.rope_llama31;
  const double wavelength = 2.0 * std::numbers::pi / base;
  const double old_len = l.old_context_len;
  if (wavelength < old_len / l.high_freq_factor) return base;
  if (wavelength > old_len / l.low_freq_factor) return base / factor;
  const double smooth =
      (old_len / wavelength - l.low_freq_factor) / (l.high_freq_factor - l.low_freq_factor);
  return (1.0 - smooth) * base / factor + smooth * base;
}

void check_rope_params(const AttentionParams& params, const char* what) {
  FLARE_CHECK(!params.rope_llama31 || params.pos_encoding == PosEncoding::kRopeLlama,
              ErrorCode::kInvalidArgument, what,
              "rope_llama31 is given but pos_encoding is not PosEncoding::kRopeLlama");
  if (params.pos_encoding != PosEncoding::kRopeLlama) return;
  FLARE_CHECK(std::isfinite(params.rope_theta) && params.rope_theta > 0.0f,
              ErrorCode::kInvalidArgument, what, "rope_theta must be finite and > 0, got ",
              params.rope_theta);
  FLARE_CHECK(std::isfinite(params.rope_scale) && params.rope_scale > 0.0f,
              ErrorCode::kInvalidArgument, what, "rope_scale must be finite and > 0, got ",
              params.rope_scale);
  if (!params.rope_llama31) return;
  const AttentionParams::Llama31Scaling& l = *params.rope_llama31;
  FLARE_CHECK(std::isfinite(l.low_freq_factor) && std::isfinite(l.high_freq_factor) &&
                  l.low_freq_factor > 0.0f && l.high_freq_factor > l.low_freq_factor &&
                  std::isfinite(l.old_context_len) && l.old_context_len > 0.0f,
              ErrorCode::kInvalidArgument, what,
              "rope_llama31 needs finite 0 < low_freq_factor < high_freq_factor and "
              "old_context_len > 0, got ",
              l.low_freq_factor, ", ", l.high_freq_factor, " and ", l.old_context_len);
}

int relative_bias_bucket(int64_t n, double max_distance) {
  constexpr int kExact = kRelativeBiasBuckets / 2;
  if (n < kExact) return n < 0 ? 0 : static_cast<int>(n);
  const double scaled = std::log(static_cast<double>(n) / kExact) /
                        std::log(max_distance / kExact) * (kRelativeBiasBuckets - kExact);
  return kExact + static_cast<int>(std::min(std::max(scaled, 0.0), kExact - 1.0));
}

}  // namespace flare
