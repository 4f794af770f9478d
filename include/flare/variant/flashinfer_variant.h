// FlashInfer's customized attention (flashinfer.jit.gen_customize_*_module, the wrappers'
// jit_args): a `variant_decl` written with FlashInfer's FA2 hook macros, translated into a flare
// UserVariant so that the same declaration runs unchanged on flare's kernel families (decode on
// both loops, FA2 prefill paged and ragged).
//
// The declaration defines `struct <variant_name> : AttentionVariantBase` with a constructor
// `template <typename Params> __device__ __host__ Name(const Params&, uint32_t batch_idx,
// uint8_t* smem_ptr)` and any of REGISTER_LOGITS_TRANSFORM and REGISTER_LOGITS_MASK, plus
// `static constexpr bool use_softmax` and, with softmax, a `float sm_scale_log2` member (the
// scale FlashInfer's kernels apply to the transformed logits). The generated flare variant
// builds one per query row and calls its hooks with FlashInfer's arguments: logits = q.k
// (unscaled), batch_idx = the request, qo_idx = the query's index in its request, kv_idx = the
// key's position, and the query and KV heads. Params offers get_qo_len(b), get_kv_len(b),
// sm_scale (unless declared otherwise) and each additional tensor (a pointer of its declared
// type) and scalar (a value of its declared type) as a member of its name; `math::` has
// FlashInfer's ptx_exp2, ptx_log2, ptx_rcp, tanh, log2e, loge2 and inf.
//
// Hooks flare's families do not call are refused, naming the hook: QueryTransform and
// KeyTransform (FlashInfer's FA2 kernels do not call them either; flare's rotary hooks do
// RoPE), OutputTransform and update_m_d. Scalars travel as float, as flare's do: a double
// scalar is rounded to float, an integer one is exact up to 2^24.
#pragma once

#include <string>
#include <vector>

#include "flare/variant/user_variant.h"

namespace flare {

struct FlashInferVariantSpec {
  std::string variant_name;  // the struct's name (a C identifier)
  std::string variant_decl;  // FlashInfer's declaration of it
  // Additional tensors and scalars, FlashInfer's C type names: tensors uint8_t, int32_t,
  // int64_t or float; scalars double, float, int32_t, int64_t or uint32_t.
  std::vector<std::string> tensor_names;
  std::vector<std::string> tensor_dtypes;
  std::vector<std::string> scalar_names;
  std::vector<std::string> scalar_dtypes;
};

// The flare variant running `spec`; kInvalidArgument naming what is malformed (names that are
// not C identifiers, list lengths that differ, a dtype outside the lists above) and
// kUnsupported naming a hook no flare family calls. Its tensors and scalars keep their
// declared names and orders (run() passes them as for any UserVariant).
UserVariant flashinfer_variant(const FlashInferVariantSpec& spec);

}  // namespace flare
