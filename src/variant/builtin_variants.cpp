// The built-in StandardVariant: its flags from AttentionParams and its source text.
#include "flare/variant/builtin_variants.h"

#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "flare/core/error.h"

namespace flare {
namespace {

// Whether a soft-cap of these flags could take the fixed-offset softmax (its cap decides): with
// softmax, not beside ALiBi (two of its Hopper units spilled 24-40 bytes with the fixed offset).
bool fixed_offset_eligible(const StandardVariantFlags& flags) {
  return flags.soft_cap && !flags.sigmoid && !flags.alibi;
}

}  // namespace

StandardVariantFlags standard_variant_flags(const AttentionParams& params, const char* what) {
  FLARE_CHECK(params.mask == MaskMode::kNone || params.mask == MaskMode::kCausal,
              ErrorCode::kUnsupported, what, ": custom masks are not supported");
  FLARE_CHECK(!params.rope_offsets, ErrorCode::kUnsupported, what,
              ": params.rope_offsets is the CPU reference's; the GPU kernels rotate q and k at "
              "their positions in the request");
  check_rope_params(params, (std::string(what) + ": ").c_str());
  FLARE_CHECK(params.logits_soft_cap >= 0.0f, ErrorCode::kInvalidArgument, what,
              ": logits_soft_cap must be >= 0 (0 = off), got ", params.logits_soft_cap);
  FLARE_CHECK(params.window_left >= -1, ErrorCode::kInvalidArgument, what,
              ": window_left must be -1 (no window) or >= 0, got ", params.window_left);
  const char* reference_only = params.prefix_len      ? "prefix_len"
                               : params.relative_bias ? "relative_bias"
                               : params.document_id   ? "document_id"
                                                      : nullptr;
  FLARE_CHECK(reference_only == nullptr, ErrorCode::kUnsupported, what, ": params.",
              reference_only, " is the CPU reference's; on the GPU pass flare::variants::",
              params.prefix_len      ? "prefix_lm()"
              : params.relative_bias ? "relative_position_bias()"
                                     : "document_mask()",
              " (flare/variant/library.h) as the config's variant");
  FLARE_CHECK(std::isfinite(params.sigmoid_bias), ErrorCode::kInvalidArgument, what,
              ": sigmoid_bias must be finite, got ", params.sigmoid_bias);
  StandardVariantFlags flags;
  flags.soft_cap = params.logits_soft_cap > 0.0f;
  flags.alibi = params.pos_encoding == PosEncoding::kAlibi;
  flags.sigmoid = !params.use_softmax;
  flags.bounded_logits =
      fixed_offset_eligible(flags) &&
      params.logits_soft_cap * std::numbers::log2e_v<float> <= kSoftCapFixedOffsetMaxBound;
  flags.sliding_window = params.window_left >= 0;
  flags.rope = params.pos_encoding == PosEncoding::kRopeLlama;
  return flags;
}

std::string standard_variant_source(const StandardVariantFlags& flags) {
  std::string source;
  source += "#define FLARE_VARIANT_SOFT_CAP " + std::string(flags.soft_cap ? "1" : "0") + "\n";
  source += "#define FLARE_VARIANT_BOUNDED_LOGITS " +
            std::string(flags.bounded_logits ? "1" : "0") + "\n";
  source += "#define FLARE_VARIANT_WINDOW " + std::string(flags.sliding_window ? "1" : "0") + "\n";
  source += "#define FLARE_VARIANT_ALIBI " + std::string(flags.alibi ? "1" : "0") + "\n";
  source += "#define FLARE_VARIANT_SIGMOID " + std::string(flags.sigmoid ? "1" : "0") + "\n";
  source += "#define FLARE_VARIANT_ROPE " + std::string(flags.rope ? "1" : "0") + "\n";
  source += "#include \"variant.cuh\"\n";
  source += "struct Variant : flare::StandardVariant {};\n";
  return source;
}

std::string standard_variant_name(const StandardVariantFlags& flags) {
  std::string name;
  // A soft-cap past the fixed offset's bound keeps the running max: another kernel.
  const bool running_max = fixed_offset_eligible(flags) && !flags.bounded_logits;
  const char* soft_cap = running_max ? "soft_cap_running_max" : "soft_cap";
  for (const auto& [on, part] :
       {std::pair{flags.soft_cap, soft_cap}, std::pair{flags.sliding_window, "window"},
        std::pair{flags.alibi, "alibi"}, std::pair{flags.sigmoid, "sigmoid"},
        std::pair{flags.rope, "rope"}}) {
    if (!on) continue;
    if (!name.empty()) name += '+';
    name += part;
  }
  return name.empty() ? "default" : name;
}

}  // namespace flare
