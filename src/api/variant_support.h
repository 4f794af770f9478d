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

// Throws kUnsupported for what the built-in cannot express (standard_variant_flags), and for a
// user variant kInvalidArgument when it is malformed (validate_user_variant) or when `params`
// also asks for a built-in term (soft-cap, window, ALiBi, RoPE, use_softmax = false) that the
// user's source replaces. `params` without the kernel's own mask terms.
ResolvedVariant resolve_variant(const AttentionParams& params,
                                const std::optional<UserVariant>& user, const char* what);

// run(): options.variant_scalars and variant_tensors against the config's variant (one finite
// value per declared scalar; one tensor per declared tensor, of its dtype, on `device`; none
// without a user variant). Throws kInvalidArgument naming the variant's scalars or tensor.
void check_variant_arguments(const std::optional<UserVariant>& user, const RunOptions& options,
                             int device, const char* what);

// Copies the checked scalars and tensor pointers into the kernel's parameters.
void set_variant_arguments(const RunOptions& options, VariantParams& out);

}  // namespace flare::api_detail
