// ParamsArg construction from keyword arguments and its conversion to AttentionParams.
#include "params_arg.h"

#include "bindings.h"

#include "flare/core/error.h"

namespace flare::python {

AttentionParams ParamsArg::resolved() const {
  AttentionParams params = scalars;
  params.custom_mask = view_of(custom_mask);
  params.mask_indptr = view_of(mask_indptr);
  params.alibi_slopes = view_of(alibi_slopes);
  return params;
}

PosEncoding parse_pos_encoding(const std::string& name) {
  if (name == "NONE") return PosEncoding::kNone;
  if (name == "ROPE_LLAMA") return PosEncoding::kRopeLlama;
  if (name == "ALIBI") return PosEncoding::kAlibi;
  fail(ErrorCode::kInvalidArgument,
       "pos_encoding_mode must be \"NONE\", \"ROPE_LLAMA\" or \"ALIBI\", got \"", name, "\"");
}

void bind_params_arg(nb::module_& m) {
  nb::class_<ParamsArg>(m, "AttentionParams", "flare::AttentionParams (internal argument type).")
      .def(
          "__init__",
          [](ParamsArg* self, float sm_scale, bool causal, int32_t window_left,
             float logits_soft_cap, const std::string& pos_encoding_mode, float rope_theta,
             float rope_scale, float k_scale, float v_scale, std::optional<TensorArg> custom_mask,
             std::optional<TensorArg> mask_indptr, std::optional<TensorArg> alibi_slopes) {
            FLARE_CHECK(!(causal && custom_mask), ErrorCode::kInvalidArgument,
                        "causal=True and a custom mask exclude each other");
            FLARE_CHECK(custom_mask.has_value() == mask_indptr.has_value(),
                        ErrorCode::kInvalidArgument,
                        "custom_mask and mask_indptr must be given together");
            auto* arg = new (self) ParamsArg();
            AttentionParams& p = arg->scalars;
            p.sm_scale = sm_scale;
            p.mask = custom_mask ? MaskMode::kCustom : causal ? MaskMode::kCausal : MaskMode::kNone;
            p.window_left = window_left;
            p.logits_soft_cap = logits_soft_cap;
            p.pos_encoding = parse_pos_encoding(pos_encoding_mode);
            p.rope_theta = rope_theta;
            p.rope_scale = rope_scale;
            p.k_scale = k_scale;
            p.v_scale = v_scale;
            arg->custom_mask = std::move(custom_mask);
            arg->mask_indptr = std::move(mask_indptr);
            arg->alibi_slopes = std::move(alibi_slopes);
          },
          nb::kw_only(), nb::arg("sm_scale") = 0.0f, nb::arg("causal") = false,
          nb::arg("window_left") = -1, nb::arg("logits_soft_cap") = 0.0f,
          nb::arg("pos_encoding_mode") = "NONE", nb::arg("rope_theta") = 1e4f,
          nb::arg("rope_scale") = 1.0f, nb::arg("k_scale") = 1.0f, nb::arg("v_scale") = 1.0f,
          nb::arg("custom_mask") = nb::none(), nb::arg("mask_indptr") = nb::none(),
          nb::arg("alibi_slopes") = nb::none())
      .def_prop_ro("sm_scale", [](const ParamsArg& a) { return a.scalars.sm_scale; })
      .def_prop_ro("causal",
                   [](const ParamsArg& a) { return a.scalars.mask == MaskMode::kCausal; });
}

}  // namespace flare::python
