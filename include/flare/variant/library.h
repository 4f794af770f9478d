// Variants flare ships written through the user-variant interface (flare/variant/user_variant.h),
// the same source in every kernel family: what FlexAttention users write as score_mod /
// mask_mod, ready to pass as BatchDecodeConfig::variant / BatchPrefillConfig::variant (Python:
// flare.variants). Their tensors declare symbolic extents, so run() guarantees every index they
// read lies inside them.
#pragma once

#include <cstdint>
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
// [num_qo_heads, 32]; scalar: max_distance (T5: 128). distance_bias() below computes the same
// from a table per distance built once from this one, without a logarithm a near key (faster).
UserVariant relative_position_bias();
inline constexpr int kRelativePositionBuckets = 32;

// A bias by query-key distance for causal attention: logits += bias[h][min(i - j, W - 1)] for
// the query at position i and key j <= i (natural-log units), W = bias's second extent: the last
// entry applies to every key W - 1 or more positions back. Tensor: bias, float32 [num_qo_heads,
// W >= 1], at most 2^31 - 1 entries (kTableExtent). Needs the causal mask
// (UserVariant::requires_causal). T5's relative position bias is this with the table from
// t5_distance_bias() below, and costs one load a near key instead of a logarithm and a bucket:
// 1.9x faster than relative_position_bias() at 2048 tokens (docs/perf.md, forty-sixth session).
UserVariant distance_bias();
// T5's bucket (flare::relative_bias_bucket, the CPU reference's) of each distance 0 .. W - 1,
// W = ceil(max_distance) + 1: every distance >= max_distance is in the last bucket, so
// distance_bias() with these columns is relative_position_bias(). max_distance: finite, in
// (16, 2^24]; kInvalidArgument otherwise.
std::vector<int32_t> t5_distance_buckets(double max_distance);
// distance_bias()'s table for T5: row h is table[h][t5_distance_buckets(max_distance)];
// table: heads x 32 row-major (relative_position_bias()'s).
std::vector<float> t5_distance_bias(const std::vector<float>& table, int64_t heads,
                                    double max_distance);

// Document masking (packed sequences): the query at position i sees key j when j <= i and both
// lie in one document, a run of positions [s, e) of its request. Tensor: document_start, int32
// [batch, L], each position's document start s (document_starts() below builds it from
// per-position document ids); positions >= L are documents of their own. Needs the causal mask
// (UserVariant::requires_causal): the prefill skips the tiles of earlier documents.
UserVariant document_mask();
// document_mask()'s tensor from document ids, rows x columns row-major: each position's first
// position of the run of equal ids it belongs to (ids of one document are contiguous).
std::vector<int32_t> document_starts(const std::vector<int32_t>& document_id, int64_t rows,
                                     int64_t columns);

// The names above, for bindings.
std::vector<std::string> names();
// The variant of that name; kInvalidArgument naming the known ones otherwise.
UserVariant by_name(const std::string& name);

}  // namespace flare::variants
