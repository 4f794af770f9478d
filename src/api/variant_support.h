// What BatchDecode and BatchPrefill share about the variant a config compiles: the built-in
// StandardVariant from AttentionParams, or the user's variant (flare/variant/user_variant.h).
#pragma once

#include <optional>
#include <string>

#include "flare/api/run_options.h"
#include "flare/variant/attention_params.h"
#include "flare/variant/user_variant.h"
#include "kernels/decode_params.cuh"

namespace flare::api_detail {

struct ResolvedVariant {
  std::string source;  // jit::KernelSpec::variant_source
  std::string name;    // for the kernel label: "default", "soft_cap+window", "user:<name>"
};

// Throws kInvalidArgument for alibi_slopes that are not a float32 CPU tensor [num_qo_heads] or
// come without kAlibi, kUnsupported for what the built-in cannot express
// (standard_variant_flags), and for a user variant kInvalidArgument when it is malformed
// (validate_user_variant) or when `params` also asks for a built-in term (soft-cap, window,
// ALiBi, RoPE, use_softmax = false) that the user's source replaces. `params` without the
// kernel's own mask terms.
ResolvedVariant resolve_variant(const AttentionParams& params,
                                const std::optional<UserVariant>& user, int num_qo_heads,
                                const char* what);

// Whether the config's variant normalises with softmax: the user variant's use_softmax, else
// params.use_softmax (the built-in sigmoid).
bool uses_softmax(const AttentionParams& params, const std::optional<UserVariant>& user);

// The values of a variant tensor's symbolic extents (kBatchExtent, ...) for one run().
struct VariantExtents {
  int64_t batch = 0;
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
};

// run()'s options: finite q/k/v scales, no lse output (`wants_lse`) without softmax
// (uses_softmax), a sink (float32 [num_qo_heads] on `device`) only with softmax, and
// variant_scalars and variant_tensors against the config's variant (one
// finite value per declared scalar; one contiguous tensor per declared tensor, of its dtype and
// declared shape with `extents` for its symbolic extents, on `device`; none without a user
// variant). Throws kInvalidArgument naming the scale, lse, the variant's scalars or the tensor.
void check_run_options(const AttentionParams& params, const std::optional<UserVariant>& user,
                       const RunOptions& options, bool wants_lse, const VariantExtents& extents,
                       int device, const char* what);

// Copies the checked scalars and tensor pointers into the kernel's parameters.
void set_variant_arguments(const RunOptions& options, VariantParams& out);

}  // namespace flare::api_detail
