// The tests' own float64 attention: plain loops over (request, token, head, key) written from
// the comment in attention_params.h, sharing no code with src/reference, so the reference
// backend is checked against an independent reading of the specification.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flare/variant/attention_params.h"

namespace flare::testing {

// Logical (dense, exact) inputs: q [total_q, H_qo, D_qk]; k [total_kv, H_kv, D_qk] and
// v [total_kv, H_kv, D_vo] ragged by kv_lens, holding stored values (before k/v scales).
struct NaiveInputs {
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim_qk = 0;
  int64_t head_dim_vo = 0;
  std::vector<double> q;
  std::vector<double> k;
  std::vector<double> v;
  AttentionParams params;  // scalar options; the tensors below replace its optional views
  std::vector<int32_t> rope_offsets;       // [batch] or empty (all 0)
  std::vector<double> alibi_slopes;        // [H_qo] or empty (the ALiBi paper's default slopes)
  std::vector<int32_t> prefix_len;         // [batch] or empty: prefix-LM under kCausal
  std::vector<double> relative_bias;       // [H_qo * 32] or empty: T5's relative position bias
  // [batch * document_columns] or empty: the document mask's per-position ids
  std::vector<int32_t> document_id;
  int64_t document_columns = 0;
  std::vector<std::vector<bool>> visible;  // kCustom: per request, q_len * kv_len row-major
};

struct NaiveOutputs {
  std::vector<double> o;    // [total_q, H_qo, D_vo]
  std::vector<double> lse;  // [total_q, H_qo]; -inf for rows that see no key
};

// The ALiBi paper's slopes: n = largest power of two <= H; heads h < n get 2^(-8(h+1)/n),
// the others every other slope of the 2n sequence, 2^(-8(2(h-n)+1)/(2n)).
inline double naive_alibi_slope(int64_t head, int64_t num_heads) {
  int64_t n = 1;
  while (2 * n <= num_heads) n *= 2;
  if (head < n) return std::pow(2.0, -8.0 * static_cast<double>(head + 1) / static_cast<double>(n));
  return std::pow(2.0, -8.0 * static_cast<double>(2 * (head - n) + 1) / static_cast<double>(2 * n));
}

// Rotate-half RoPE of x (length D) at `position`, in double.
inline std::vector<double> naive_rope(const std::vector<double>& x, double position, double theta,
                                      double scale) {
  const size_t half = x.size() / 2;
  std::vector<double> out(x.size());
  for (size_t d = 0; d < half; ++d) {
    const double frequency =
        std::pow(theta, -2.0 * static_cast<double>(d) / static_cast<double>(x.size()));
    const double angle = position / scale * frequency;
    out[d] = x[d] * std::cos(angle) - x[d + half] * std::sin(angle);
    out[d + half] = x[d + half] * std::cos(angle) + x[d] * std::sin(angle);
  }
  return out;
}

inline NaiveOutputs naive_attention(const NaiveInputs& in) {
  const AttentionParams& p = in.params;
  const int64_t hq = in.num_qo_heads, hk = in.num_kv_heads, dqk = in.head_dim_qk,
                dvo = in.head_dim_vo;
  const int64_t group = hq / hk;
  const double scale = p.sm_scale != 0.0f ? static_cast<double>(p.sm_scale)
                                          : 1.0 / std::sqrt(static_cast<double>(dqk));
  const bool rope = p.pos_encoding == PosEncoding::kRopeLlama;
  int64_t total_q = 0;
  for (int32_t len : in.q_lens) total_q += len;
  NaiveOutputs out;
  out.o.assign(static_cast<size_t>(total_q * hq * dvo), 0.0);
  out.lse.assign(static_cast<size_t>(total_q * hq), -std::numeric_limits<double>::infinity());

  int64_t q_start = 0;
  int64_t kv_start = 0;
  for (size_t r = 0; r < in.q_lens.size(); ++r) {
    const int64_t q_len = in.q_lens[r];
    const int64_t kv_len = in.kv_lens[r];
    const double offset = in.rope_offsets.empty() ? 0.0 : in.rope_offsets[r];
    // Keys of this request, scaled and (under RoPE) rotated: [kv_len][hk][dqk].
    std::vector<std::vector<double>> keys(static_cast<size_t>(kv_len * hk));
    for (int64_t j = 0; j < kv_len; ++j) {
      for (int64_t g = 0; g < hk; ++g) {
        std::vector<double> key(static_cast<size_t>(dqk));
        for (int64_t d = 0; d < dqk; ++d) {
          key[d] = in.k[static_cast<size_t>(((kv_start + j) * hk + g) * dqk + d)] * p.k_scale;
        }
        if (rope)
          key = naive_rope(key, static_cast<double>(j) + offset, p.rope_theta, p.rope_scale);
        keys[static_cast<size_t>(j * hk + g)] = key;
      }
    }
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t q_pos = kv_len - q_len + i;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / group;
        std::vector<double> query(static_cast<size_t>(dqk));
        for (int64_t d = 0; d < dqk; ++d) {
          query[d] = in.q[static_cast<size_t>(((q_start + i) * hq + h) * dqk + d)];
        }
        if (rope) {
          query =
              naive_rope(query, static_cast<double>(q_pos) + offset, p.rope_theta, p.rope_scale);
        }
        std::vector<int64_t> seen;
        std::vector<double> logits;
        for (int64_t j = 0; j < kv_len; ++j) {
          const bool in_prefix = !in.prefix_len.empty() && j < in.prefix_len[r];
          if (p.mask == MaskMode::kCausal && j > q_pos && !in_prefix) continue;
          if (p.window_left >= 0 && j < q_pos - p.window_left) continue;
          if (p.mask == MaskMode::kCustom && !in.visible[r][static_cast<size_t>(i * kv_len + j)]) {
            continue;
          }
          if (!in.document_id.empty() && j != q_pos) {
            const int64_t columns = in.document_columns;
            const int32_t* row = in.document_id.data() + r * columns;
            if (j >= columns || q_pos >= columns || row[j] != row[q_pos]) continue;
          }
          double s = 0.0;
          for (int64_t d = 0; d < dqk; ++d)
            s += query[d] * keys[static_cast<size_t>(j * hk + g)][d];
          s *= scale;
          if (p.pos_encoding == PosEncoding::kAlibi) {
            // Slopes are float32 numbers in the API (given or default), so round the default.
            const double slope = in.alibi_slopes.empty()
                                     ? static_cast<float>(naive_alibi_slope(h, hq))
                                     : in.alibi_slopes[h];
            s += slope * static_cast<double>(j - q_pos);
          }
          if (!in.relative_bias.empty()) {
            // T5's causal buckets, from transformers' _relative_position_bucket.
            const double n = static_cast<double>(std::max<int64_t>(q_pos - j, 0));
            int64_t bucket = static_cast<int64_t>(n);
            if (n >= 16) {
              bucket = 16 + static_cast<int64_t>(std::log(n / 16) /
                                                 std::log(p.relative_max_distance / 16.0) * 16);
              bucket = std::min<int64_t>(bucket, 31);
            }
            s += in.relative_bias[static_cast<size_t>(h * 32 + bucket)];
          }
          if (p.logits_soft_cap > 0.0f) s = p.logits_soft_cap * std::tanh(s / p.logits_soft_cap);
          seen.push_back(j);
          logits.push_back(s);
        }
        if (seen.empty()) continue;
        std::vector<double> weights(seen.size());
        if (p.use_softmax) {
          double max_logit = logits[0];
          for (double s : logits) max_logit = std::max(max_logit, s);
          double sum = 0.0;
          for (size_t n = 0; n < seen.size(); ++n) sum += std::exp(logits[n] - max_logit);
          for (size_t n = 0; n < seen.size(); ++n)
            weights[n] = std::exp(logits[n] - max_logit) / sum;
          out.lse[static_cast<size_t>((q_start + i) * hq + h)] = max_logit + std::log(sum);
        } else {
          for (size_t n = 0; n < seen.size(); ++n) {
            weights[n] = 1.0 / (1.0 + std::exp(-(logits[n] + p.sigmoid_bias)));
          }
        }
        for (size_t n = 0; n < seen.size(); ++n) {
          for (int64_t d = 0; d < dvo; ++d) {
            out.o[static_cast<size_t>(((q_start + i) * hq + h) * dvo + d)] +=
                weights[n] * in.v[static_cast<size_t>(((kv_start + seen[n]) * hk + g) * dvo + d)] *
                p.v_scale;
          }
        }
      }
    }
    q_start += q_len;
    kv_start += kv_len;
  }
  return out;
}

}  // namespace flare::testing
