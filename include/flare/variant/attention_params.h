// What one attention call computes beyond plain softmax(QK^T * scale)V: masks, positional
// encodings, logits transforms, fp8 scales. Shared by the CPU reference and the GPU kernels
// (which receive the same fields through their Variant functor's parameters).
#pragma once

#include <cstdint>
#include <optional>

#include "flare/core/tensor.h"

namespace flare {

enum class MaskMode : uint8_t {
  kNone,
  kCausal,  // bottom-right aligned: query i of a request sees kv j <= kv_len - q_len + i
  kCustom,  // packed bits per request (custom_mask + mask_indptr)
};

enum class PosEncoding : uint8_t {
  kNone,
  kRopeLlama,  // rotate-half RoPE applied to q and k at their positions
  kAlibi,      // logits += slope[h] * (j - q_pos); on the GPU requests of at most 2^22 query
               // and KV tokens (kernels/decode_params.cuh kAlibiMaxKvLen, checked at plan())
};

// The logits of query row i (position q_pos = kv_len - q_len + i) against key j are, in order:
//   s = (f_q(q_i) . f_k(k_j)) * sm_scale          f = RoPE when pos == kRopeLlama
//   s += slope[h] * (j - q_pos)                    when pos == kAlibi
//   s += relative_bias[h][bucket(q_pos - j)]       when relative_bias is given (T5)
//   s = cap * tanh(s / cap)                        when logits_soft_cap > 0
//   masked (causal, window, custom, document_id) -> excluded; under kCausal with prefix_len,
//   keys j < prefix_len[request] stay visible (prefix-LM)
// softmax:  o = sum_j exp(s_j - lse) v_j,  lse = ln sum_j exp(s_j)   (natural log)
// sigmoid (use_softmax = false): o = sum_j sigmoid(s_j + sigmoid_bias) v_j, no lse.
// Empty or fully masked rows: o = 0, lse = -inf.
struct AttentionParams {
  float sm_scale = 0.0f;  // 0 means 1 / sqrt(head_dim_qk)
  MaskMode mask = MaskMode::kNone;
  int32_t window_left = -1;  // >= 0: query at q_pos sees kv j >= q_pos - window_left
  float logits_soft_cap = 0.0f;  // 0 = off
  bool use_softmax = true;
  float sigmoid_bias = 0.0f;

  PosEncoding pos_encoding = PosEncoding::kNone;
  float rope_theta = 1e4f;
  float rope_scale = 1.0f;  // positions are divided by rope_scale (Llama 3.1: see below)
  // kRopeLlama with Llama 3.1's frequency scaling (rope_frequency below): rope_scale is then
  // its `factor`, which divides the low frequencies only, and positions are not divided.
  struct Llama31Scaling {
    float low_freq_factor = 1.0f;
    float high_freq_factor = 4.0f;
    float old_context_len = 8192.0f;  // original_max_position_embeddings
  };
  std::optional<Llama31Scaling> rope_llama31;
  // int32 [batch] (CPU), optional: added to every q and k position of the request.
  std::optional<TensorView> rope_offsets;
  // float32 [H_qo] (CPU), optional for kAlibi: default slopes default_alibi_slope(h, H_qo),
  // the ALiBi paper's rule (as in FlashInfer): with n the largest power of two <= H_qo, heads
  // h < n get 2^(-8 (h+1) / n), the others 2^(-4 (2 (h-n) + 1) / n).
  std::optional<TensorView> alibi_slopes;

  // kCustom: uint8 packed bits, little bit order; request i's q_len x kv_len row-major bits
  // start at byte mask_indptr[i] and take ceil(q_len * kv_len / 8) bytes. Bit set = visible.
  std::optional<TensorView> custom_mask;
  std::optional<TensorView> mask_indptr;  // int32 [batch + 1]

  // Prefix-LM: int32 [batch] (CPU), with kCausal only. The CPU reference's; on the GPU it is
  // flare::variants::prefix_lm() (flare/variant/library.h), the same rule.
  std::optional<TensorView> prefix_len;
  // T5's relative position bias: float32 [H_qo, 32] (CPU), natural-log units, T5's 32 causal
  // buckets of n = max(q_pos - j, 0): n below 16 exactly, then 16 + floor(ln(n / 16) /
  // ln(relative_max_distance / 16) * 16), at most 31. The CPU reference's; on the GPU it is
  // flare::variants::relative_position_bias(), the same rule.
  std::optional<TensorView> relative_bias;
  float relative_max_distance = 128.0f;  // > 16
  // Document mask: int32 [batch, L] (CPU, rows contiguous); key j is visible to the query at
  // q_pos only when document_id[request][j] == document_id[request][q_pos] (a position >= L is
  // a document of its own), on top of the mask mode. The CPU reference's; on the GPU it is
  // flare::variants::document_mask() (flare/variant/library.h), with kCausal and ids
  // nondecreasing along each row (contiguous documents).
  std::optional<TensorView> document_id;

  // fp8 KV: the stored value times the scale is the real value (per tensor).
  float k_scale = 1.0f;
  float v_scale = 1.0f;

  float resolved_sm_scale(int64_t head_dim_qk) const;
};

// Default ALiBi slope of head h of num_heads.
float default_alibi_slope(int64_t head, int64_t num_heads);

// kRopeLlama: radians per position of dims (pair, pair + head_dim / 2), in double:
// theta^(-2 pair / D) / rope_scale, or with rope_llama31 Llama 3.1's rule on f = theta^(-2 pair /
// D) with wavelength w = 2 pi / f: f where w < old_context_len / high_freq_factor, f / factor
// where w > old_context_len / low_freq_factor, else (1 - s) f / factor + s f with s =
// (old_context_len / w - low_freq_factor) / (high_freq_factor - low_freq_factor). Shared by the
// CPU reference and the GPU kernels' table.
double rope_frequency(const AttentionParams& params, int64_t pair, int64_t head_dim);

// kInvalidArgument for rope_llama31 without kRopeLlama, and under kRopeLlama unless rope_theta
// and rope_scale are finite and > 0 and rope_llama31's factors are finite with 0 <
// low_freq_factor < high_freq_factor and old_context_len > 0; `what` prefixes the message.
void check_rope_params(const AttentionParams& params, const char* what);

inline constexpr int kRelativeBiasBuckets = 32;
// T5's causal bucket (above) of n = q_pos - j.
int relative_bias_bucket(int64_t n, double max_distance);

}  // namespace flare
