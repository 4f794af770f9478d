// Attention variants (papers 001 §3.2.3): the functor struct a kernel template calls at fixed
// points, and flare's built-in StandardVariant (soft-cap, sliding window, ALiBi by flag).
//
// A variant source defines `struct Variant` before the family header is included; the decode
// kernel needs from it (all __device__, called per query row r of a work item):
//   static constexpr bool use_softmax;
//   static float query_scale(const VariantParams&)  factor folded into q, so that q.k lands in
//                                                    the units logits_transform takes
//   static int visible_begin(const VariantParams&, int q_pos)  first KV position any row of
//                                                    the item may see (a pure speed hint)
//   void init(const VariantParams&, int qo_head, int q_pos)    per-row state
//   float logits_transform(const VariantParams&, float s, int kv_pos) const
//                                                    -> the logit in log2 units (exp2 softmax)
//   bool logits_mask(int kv_pos) const              false excludes the key
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"

#ifndef FLARE_VARIANT_SOFT_CAP
#define FLARE_VARIANT_SOFT_CAP 0
#endif
#ifndef FLARE_VARIANT_WINDOW
#define FLARE_VARIANT_WINDOW 0
#endif
#ifndef FLARE_VARIANT_ALIBI
#define FLARE_VARIANT_ALIBI 0
#endif

namespace flare {

// tanh through exp2: absolute error ~1e-7 everywhere (the logit is cap * tanh, so absolute
// error is what reaches the softmax), saturates to +-1 without NaN for |x| -> inf.
__device__ __forceinline__ float tanh_via_exp2(float x) {
  const float e = fast_exp2(2.0f * kLog2e * x);
  return 1.0f - 2.0f * fast_rcp(1.0f + e);
}

// AttentionParams semantics (include/flare/variant/attention_params.h), in log2 units:
//   s = q.k * sm_scale;  s += slope * (j - q_pos);  s = cap * tanh(s / cap);  mask window.
// With soft-cap, q carries sm_scale / cap and ALiBi slope / cap, so tanh takes its argument
// directly; otherwise q carries sm_scale * log2e and ALiBi slope * log2e.
struct StandardVariant {
  static constexpr bool kSoftCap = FLARE_VARIANT_SOFT_CAP != 0;
  static constexpr bool kWindow = FLARE_VARIANT_WINDOW != 0;
  static constexpr bool kAlibi = FLARE_VARIANT_ALIBI != 0;
  static constexpr bool use_softmax = true;

  float alibi_step;       // added per KV position, in query_scale units
  int first_visible;      // window: smallest visible KV position
  int q_pos;

  __device__ static float query_scale(const VariantParams& p) {
    return kSoftCap ? p.sm_scale / p.logits_soft_cap : p.sm_scale * kLog2e;
  }
  __device__ static int visible_begin(const VariantParams& p, int query_pos) {
    if (!kWindow || p.window_left < 0) return 0;
    const int first = query_pos - p.window_left;
    return first > 0 ? first : 0;
  }
  __device__ void init(const VariantParams& p, int qo_head, int query_pos) {
    q_pos = query_pos;
    first_visible = visible_begin(p, query_pos);
    alibi_step = 0.0f;
    if (kAlibi) {
      const float slope = p.alibi_slopes[qo_head];
      alibi_step = kSoftCap ? slope / p.logits_soft_cap : slope * kLog2e;
    }
  }
  __device__ float logits_transform(const VariantParams& p, float s, int kv_pos) const {
    if (kAlibi) s += alibi_step * static_cast<float>(kv_pos - q_pos);
    if (kSoftCap) s = p.logits_soft_cap * kLog2e * tanh_via_exp2(s);
    return s;
  }
  __device__ bool logits_mask(int kv_pos) const { return !kWindow || kv_pos >= first_visible; }
};

}  // namespace flare
