// Variants flare ships written through the user-variant interface (flare/variant/user_variant.h),
// the same source in every kernel family: what FlexAttention users write as score_mod /
// mask_mod, ready to pass as BatchDecodeConfig::variant / BatchPrefillConfig::variant (Python:
// flare.variants). Their tensors declare symbolic extents, so run() guarantees every index they
// read lies inside them.
#pragma once

#include <string>
#include <vector>

#include "flare/variant/user_variant.h"

namespace flare::variants {

// Sigmoid attention (FlashSigmoid): o = sum_j sigmoid(q.k * sm_scale + bias) v_j over the
// visible keys, no softmax and no lse. Scalar: bias.
UserVariant sigmoid();

// Prefix-LM: request r's first prefix_len[r] keys are visible to all of its queries, the rest
// causally (key j visible to the query at position i when j < prefix_len[r] or j <= i). Tensor:
// prefix_len, int32 [batch]. Plan the prefill without the kernel's causal mask (the variant's
// mask holds it).
UserVariant prefix_lm();

// T5's relative position bias for causal models: logits += table[h][bucket(i - j)] for the
// query at position i and key j (natural-log units), with 32 buckets: distances 0-15 exactly,
// then logarithmic up to max_distance, the last bucket beyond it. Tensor: table, float32
// [num_qo_heads, 32]; scalar: max_distance (T5: 128).
UserVariant relative_position_bias();
inline constexpr int kRelativePositionBuckets = 32;

// The names above, for bindings.
std::vector<std::string> names();
// The variant of that name; kInvalidArgument naming the known ones otherwise.
UserVariant by_name(const std::string& name);

}  // namespace flare::variants
