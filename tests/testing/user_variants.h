// User variants the tests compile and run: the same math as built-ins (so the CPU reference
// checks them) written through the user interface (flare/variant/user_variant.h).
#pragma once

#include <string>

#include "flare/variant/library.h"
#include "flare/variant/user_variant.h"

namespace flare::testing {

// logits = cap * tanh(q.k * sm_scale / cap), cap a run() scalar: the built-in soft-cap. Bounded
// (a cap of at most 54.7), it declares its logits within +-cap (kernels/variant.cuh
// has_logits_bound: the built-in's fixed-offset softmax); otherwise the softmax keeps a running
// max.
inline UserVariant user_soft_cap(bool bounded = true) {
  UserVariant v;
  v.name = bounded ? "user_soft_cap" : "user_soft_cap_running_max";
  v.scalars = {"cap"};
  v.source = R"(
struct Variant : flare::VariantBase {
  __device__ static float query_scale(const flare::VariantParams& p) {
    return p.sm_scale / Scalars::cap(p);
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return Scalars::cap(p) * flare::kLog2e * flare::fast_tanh(s);
  }
)";
  if (bounded) {
    v.source += R"(
  static constexpr bool kLogitsBounded = true;
  __device__ static float logits_bound(const flare::VariantParams& p) {
    return Scalars::cap(p) * flare::kLog2e;
  }
)";
  }
  v.source += "};\n";
  return v;
}

// ALiBi with the default slopes of `heads` (a power of two) query heads, the head taken from
// the row's KV head and group (group a scalar): checks RowContext's kv_head and qo_head.
inline UserVariant user_alibi() {
  UserVariant v;
  v.name = "user_alibi";
  v.scalars = {"heads", "group"};
  v.source = R"(
struct Variant : flare::VariantBase {
  float step;
  int q_pos;
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    const int group = static_cast<int>(Scalars::group(p));
    const int head = row.kv_head * group + row.qo_head % group;
    step = exp2f(-8.0f * static_cast<float>(head + 1) / Scalars::heads(p)) * flare::kLog2e;
    q_pos = row.q_pos;
  }
  __device__ float logits_transform(const flare::VariantParams&, float s, int kv_pos) const {
    return s + step * static_cast<float>(kv_pos - q_pos);
  }
};
)";
  return v;
}

// ALiBi with per-head slopes from a float32 [H_qo] tensor (natural-log units): a variant
// tensor. It declares its logits affine in the KV position (the prefill softmax's two-FMA path,
// kernels/variant.cuh); user_alibi above does not (the per-logit path).
inline UserVariant user_alibi_slopes() {
  UserVariant v;
  v.name = "user_alibi_slopes";
  v.tensors = {{"slopes", DType::kF32}};
  v.source = R"(
struct Variant : flare::VariantBase {
  static constexpr bool kLogitsAffineInKvPos = true;
  float step;
  int q_pos;
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    step = Tensors::slopes(p)[row.qo_head] * flare::kLog2e;
    q_pos = row.q_pos;
  }
  __device__ float logits_transform(const flare::VariantParams&, float s, int kv_pos) const {
    return s + step * static_cast<float>(kv_pos - q_pos);
  }
  __device__ float logits_kv_slope() const { return step; }
};
)";
  return v;
}

// Llama RoPE through the rotary hooks, theta and scale run() scalars: the built-in kRopeLlama.
inline UserVariant user_rope() {
  UserVariant v;
  v.name = "user_rope";
  v.scalars = {"theta", "scale"};
  v.source = R"(
struct Variant : flare::VariantBase {
  static constexpr bool kRotary = true;
  __device__ static float rotary_frequency(const flare::VariantParams& p, int i, int head_dim) {
    return powf(Scalars::theta(p), -2.0f * static_cast<float>(i) / head_dim) / Scalars::scale(p);
  }
};
)";
  return v;
}

// Keys at positions 1 mod 3 are hidden from requests of odd index: a mask that is not a
// window (every key checked) and reads RowContext's request.
inline UserVariant user_stride_mask() {
  UserVariant v;
  v.name = "user_stride_mask";
  v.source = R"(
struct Variant : flare::VariantBase {
  bool odd;
  __device__ void init(const flare::VariantParams&, const flare::RowContext& row) {
    odd = row.request % 2 == 1;
  }
  __device__ bool logits_mask(int kv_pos) const { return !(odd && kv_pos % 3 == 1); }
};
)";
  return v;
}
inline bool stride_mask_visible(int64_t request, int64_t kv_pos) {
  return !(request % 2 == 1 && kv_pos % 3 == 1);
}

// Sigmoid attention (FlashSigmoid): o = sum_j sigmoid(q.k * sm_scale + bias) v_j over the
// visible keys, no softmax and no lse; bias a run() scalar. The shipped source
// (flare/variant/library.h) under a user's name: the reference's use_softmax = false with
// sigmoid_bias.
inline UserVariant user_sigmoid() {
  UserVariant v = variants::sigmoid();
  v.name = "user_sigmoid";
  return v;
}

}  // namespace flare::testing
