// What a run() of BatchDecode or BatchPrefill may change per call without a new plan: the
// scales FlashInfer passes to run(), the LSE's base, and programmatic dependent launch.
#pragma once

#include <optional>
#include <span>

#include "flare/core/lse_base.h"
#include "flare/core/tensor.h"

namespace flare {

struct RunOptions {
  // Multiply q.k (FlashInfer's q_scale and k_scale: fp8 calibration scales; the logits are
  // q.k * sm_scale * q_scale * k_scale) and the output (v_scale). Finite.
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  // The base of the LSE a run() writes (the C++ API's default: the natural log).
  LseBase lse_base = LseBase::kNatural;
  // Programmatic dependent launch: the kernel may start while the stream's previous kernel
  // ends (it waits for that kernel's results before reading anything). Applied on devices of
  // compute capability 9.0 and later, ignored on older ones. Captured runs keep it.
  bool enable_pdl = false;
  // A user variant's scalars (config.variant, include/flare/variant/user_variant.h), in its
  // declared order: exactly one value each, finite. Empty without a user variant.
  std::span<const float> variant_scalars;
  // Its tensors, likewise: one each, of the declared dtype, on the config's CUDA device.
  std::span<const TensorView> variant_tensors;
  // Attention sinks (gpt-oss; FlashInfer's BatchAttentionWithAttentionSinkWrapper): float32
  // [num_qo_heads], contiguous, on the config's CUDA device; logits in the units of q.k *
  // sm_scale * q_scale * k_scale (natural log). Each head's sink is one more key of value 0 in
  // every row's softmax: o = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j)), lse =
  // log(exp(sink) + sum_j exp(s_j)); a row that sees no key gets o = 0 and lse = sink.
  // Applied where each row's output is final (the prefill epilogue, or the merge of its split
  // pieces), so it costs no launch. BatchPrefill only (BatchDecode refuses it), with softmax.
  // Captured runs keep its address.
  std::optional<TensorView> sink;
};

}  // namespace flare
