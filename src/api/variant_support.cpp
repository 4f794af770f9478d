// The variant of a BatchDecode / BatchPrefill config (variant_support.h).
#include "src/api/variant_support.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/variant/builtin_variants.h"

namespace flare::api_detail {
namespace {

// "[16, any]" for a declared shape.
// A declared extent with the symbolic ones resolved (kAnyExtent stays).
int64_t resolved_extent(int64_t declared, const VariantExtents& extents) {
  switch (declared) {
    case kBatchExtent: return extents.batch;
    case kQoHeadsExtent: return extents.num_qo_heads;
    case kKvHeadsExtent: return extents.num_kv_heads;
    default: return declared;
  }
}

std::string shape_text(const std::vector<int64_t>& shape, const VariantExtents& extents) {
  static const char* const kNames[] = {"any", "batch", "num_qo_heads", "num_kv_heads"};
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    out += d ? ", " : "";
    if (shape[d] >= 0) {
      out += std::to_string(shape[d]);
    } else if (shape[d] == kAnyExtent) {
      out += kNames[0];
    } else if (shape[d] == kTableExtent) {
      out += "at least 1";
    } else {
      out += std::string(kNames[-shape[d] - 1]) + "=" +
             std::to_string(resolved_extent(shape[d], extents));
    }
  }
  return out + "]";
}

std::string scalar_list(const UserVariant& user) {
  std::string out;
  for (const std::string& name : user.scalars) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

ResolvedVariant resolve_variant(const AttentionParams& params,
                                const std::optional<UserVariant>& user, int num_qo_heads,
                                const char* what) {
  if (params.alibi_slopes) {
    const TensorView& s = *params.alibi_slopes;
    FLARE_CHECK(params.pos_encoding == PosEncoding::kAlibi, ErrorCode::kInvalidArgument, what,
                ": alibi_slopes is given but pos_encoding is not kAlibi");
    FLARE_CHECK(
        s.device.is_cpu() && s.dtype == DType::kF32 && s.ndim == 1 && s.shape[0] == num_qo_heads,
        ErrorCode::kInvalidArgument, what, ": alibi_slopes must be a float32 CPU tensor [",
        num_qo_heads, "], got ", dtype_name(s.dtype), " ", s.shape_str(), " on ", s.device.str());
  }
  if (!user) {
    const StandardVariantFlags flags = standard_variant_flags(params, what);
    return {standard_variant_source(flags), standard_variant_name(flags)};
  }
  validate_user_variant(*user, what);
  const char* built_in = params.logits_soft_cap != 0.0f              ? "logits_soft_cap"
                         : params.window_left != -1                  ? "window_left"
                         : params.pos_encoding != PosEncoding::kNone ? "pos_encoding"
                         : !params.use_softmax                       ? "use_softmax = false"
                         : params.alibi_slopes.has_value()           ? "alibi_slopes"
                         : params.prefix_len.has_value()             ? "prefix_len"
                         : params.relative_bias.has_value()          ? "relative_bias"
                         : params.document_id.has_value()            ? "document_id"
                                                                     : nullptr;
  FLARE_CHECK(built_in == nullptr, ErrorCode::kInvalidArgument, what, ": params.", built_in,
              " is a built-in variant term, and variant '", user->name,
              "' replaces the built-in variant: express it in the variant's source");
  return {user_variant_source(*user), "user:" + user->name};
}

bool uses_softmax(const AttentionParams& params, const std::optional<UserVariant>& user) {
  return user ? user->use_softmax : params.use_softmax;
}

void check_run_options(const AttentionParams& params, const std::optional<UserVariant>& user,
                       const RunOptions& options, bool wants_lse, const VariantExtents& extents,
                       int device, const char* what) {
  FLARE_CHECK(std::isfinite(options.q_scale) && std::isfinite(options.k_scale) &&
                  std::isfinite(options.v_scale),
              ErrorCode::kInvalidArgument, what,
              ": q_scale, k_scale and v_scale must be finite, got ", options.q_scale, ", ",
              options.k_scale, " and ", options.v_scale);
  FLARE_CHECK(!wants_lse || uses_softmax(params, user), ErrorCode::kInvalidArgument, what,
              ": lse was given, but ",
              user ? "variant '" + user->name + "' has use_softmax = false"
                   : std::string("params.use_softmax is false (sigmoid attention)"),
              ": the output is a weighted sum with no softmax denominator, so there is no lse; "
              "pass none");
  if (options.sink) {
    const TensorView& sink = *options.sink;
    FLARE_CHECK(uses_softmax(params, user), ErrorCode::kInvalidArgument, what,
                ": sink was given, but the variant has no softmax (use_softmax = false): a sink "
                "joins the softmax's denominator");
    FLARE_CHECK(sink.dtype == DType::kF32 && sink.ndim == 1 &&
                    sink.shape[0] == extents.num_qo_heads && sink.is_contiguous(),
                ErrorCode::kInvalidArgument, what, ": sink must be a contiguous float32 [",
                extents.num_qo_heads, "] tensor (one logit per query head), got ",
                dtype_name(sink.dtype), " ", sink.shape_str());
    FLARE_CHECK(sink.device.is_cuda() && sink.device.index == device, ErrorCode::kInvalidArgument,
                what, ": sink must be on cuda:", device, ", got ", sink.device.str());
    FLARE_CHECK(sink.data != nullptr, ErrorCode::kInvalidArgument, what, ": sink has no data");
  }
  const size_t given = options.variant_scalars.size();
  const size_t tensors = options.variant_tensors.size();
  if (!user) {
    FLARE_CHECK(given == 0 && tensors == 0, ErrorCode::kInvalidArgument, what,
                ": variant_scalars / variant_tensors hold ", given, " / ", tensors,
                " values but the config has no user variant");
    return;
  }
  FLARE_CHECK(tensors == user->tensors.size(), ErrorCode::kInvalidArgument, what, ": variant '",
              user->name, "' takes ", user->tensors.size(), " tensors, variant_tensors holds ",
              tensors);
  for (size_t i = 0; i < tensors; ++i) {
    const UserVariantTensor& decl = user->tensors[i];
    const TensorView& t = options.variant_tensors[i];
    FLARE_CHECK(t.dtype == decl.dtype, ErrorCode::kInvalidArgument, what, ": variant '", user->name,
                "' tensor ", decl.name, " must be ", dtype_name(decl.dtype), ", got ",
                dtype_name(t.dtype));
    FLARE_CHECK(t.device.is_cuda() && t.device.index == device, ErrorCode::kInvalidArgument, what,
                ": variant '", user->name, "' tensor ", decl.name, " must be on cuda:", device,
                ", got ", t.device.str());
    FLARE_CHECK(t.data != nullptr || t.numel() == 0, ErrorCode::kInvalidArgument, what,
                ": variant '", user->name, "' tensor ", decl.name, " has no data");
    FLARE_CHECK(t.is_contiguous(), ErrorCode::kInvalidArgument, what, ": variant '", user->name,
                "' tensor ", decl.name, " must be contiguous (shape ", t.shape_str(), ")");
    bool shape_ok = decl.shape.empty() || static_cast<size_t>(t.ndim) == decl.shape.size();
    bool table = false;
    for (size_t d = 0; shape_ok && d < decl.shape.size(); ++d) {
      const int64_t extent = resolved_extent(decl.shape[d], extents);
      table = table || extent == kTableExtent;
      shape_ok = extent == kAnyExtent || extent == t.shape[d] ||
                 (extent == kTableExtent && t.shape[d] >= 1);
    }
    FLARE_CHECK(shape_ok, ErrorCode::kInvalidArgument, what, ": variant '", user->name, "' tensor ",
                decl.name, " must have shape ", shape_text(decl.shape, extents), ", got ",
                t.shape_str());
    FLARE_CHECK(!table || t.numel() <= std::numeric_limits<int32_t>::max(),
                ErrorCode::kInvalidArgument, what, ": variant '", user->name, "' tensor ",
                decl.name, " holds ", t.numel(),
                " elements; a table (kTableExtent) holds at most 2^31 - 1, "
                "so that a 32-bit index reaches every entry");
    for (int d = 0; d < t.ndim; ++d) {
      FLARE_CHECK(t.shape[d] <= std::numeric_limits<int32_t>::max(), ErrorCode::kInvalidArgument,
                  what, ": variant '", user->name, "' tensor ", decl.name, " has extent ",
                  t.shape[d], " in dimension ", d, "; variant tensors' extents are at most 2^31 - 1");
    }
  }
  FLARE_CHECK(given == user->scalars.size(), ErrorCode::kInvalidArgument, what, ": variant '",
              user->name, "' takes ", user->scalars.size(), " scalars (",
              user->scalars.empty() ? "none" : scalar_list(*user), "), variant_scalars holds ",
              given);
  for (size_t i = 0; i < given; ++i) {
    FLARE_CHECK(std::isfinite(options.variant_scalars[i]), ErrorCode::kInvalidArgument, what,
                ": variant '", user->name, "' scalar ", user->scalars[i], " must be finite, got ",
                options.variant_scalars[i]);
  }
}

void set_variant_arguments(const RunOptions& options, VariantParams& out) {
  if (!options.variant_scalars.empty()) {
    std::memcpy(out.scalars, options.variant_scalars.data(),
                options.variant_scalars.size() * sizeof(float));
  }
  for (size_t i = 0; i < options.variant_tensors.size(); ++i) {
    const TensorView& t = options.variant_tensors[i];
    out.tensors[i] = t.data;
    for (int d = 0; d < kMaxVariantTensorDims; ++d) {
      out.tensor_extents[i][d] = d < t.ndim ? static_cast<int32_t>(t.shape[d]) : 1;
    }
  }
}

}  // namespace flare::api_detail
