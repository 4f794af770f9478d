// The variants flare ships: kernels/variant.cuh's StandardVariant with its compile-time flags
// (soft-cap, sliding window, ALiBi, sigmoid, RoPE), as variant source text for a jit::KernelSpec.
#pragma once

#include <string>

#include "flare/variant/attention_params.h"

namespace flare {

// Which optional terms of AttentionParams a StandardVariant kernel is compiled with. A kernel
// without a flag ignores the matching runtime value, so the flags must come from the params.
struct StandardVariantFlags {
  bool soft_cap = false;        // logits_soft_cap > 0
  // soft_cap with softmax, without ALiBi, and logits_soft_cap * log2 e <=
  // kSoftCapFixedOffsetMaxBound: the variant declares its logits bounded, and the Hopper
  // prefill's bfloat16 softmax subtracts a fixed offset instead of a running max
  // (kernels/variant.cuh has_logits_bound).
  bool bounded_logits = false;
  bool sliding_window = false;  // window_left >= 0
  bool alibi = false;           // pos_encoding == kAlibi
  bool sigmoid = false;         // use_softmax == false: weights sigmoid(s + sigmoid_bias)
  bool rope = false;            // pos_encoding == kRopeLlama: q and k rotate (kernels/rotary.cuh)

  friend bool operator==(const StandardVariantFlags&, const StandardVariantFlags&) = default;
};

// The largest logit bound (log2 units) of a fixed-offset softmax (soft-caps up to 54.7;
// kernels/variant.cuh has_logits_bound says why).
constexpr float kSoftCapFixedOffsetMaxBound = 79.0f;

// The flags `params` needs. Throws kUnsupported for what StandardVariant cannot express
// (custom masks, rope_offsets, the reference-only prefix_len / relative_bias),
// kInvalidArgument for a non-finite sigmoid_bias or a RoPE theta / scale that is not > 0; causal masks of one
// query token see every key and need no flag. `what` names the caller in messages
// ("BatchDecode").
StandardVariantFlags standard_variant_flags(const AttentionParams& params, const char* what);

// Variant source defining `struct Variant` (its flags as #defines, then the struct).
std::string standard_variant_source(const StandardVariantFlags& flags);

// "default", "soft_cap", "window+alibi", ...: for kernel labels and logs.
std::string standard_variant_name(const StandardVariantFlags& flags);

}  // namespace flare
