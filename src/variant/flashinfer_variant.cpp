// FlashInfer's variant declarations as flare variants (flare/variant/flashinfer_variant.h).
#include "flare/variant/flashinfer_variant.h"

#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/identifier.h"

namespace flare {
namespace {

constexpr const char* kWhat = "flare::flashinfer_variant";

struct TensorType {
  const char* name;  // FlashInfer's C type name
  DType dtype;
};
constexpr TensorType kTensorTypes[] = {
    {"uint8_t", DType::kU8}, {"int32_t", DType::kI32}, {"int64_t", DType::kI64},
    {"float", DType::kF32}};
constexpr const char* kScalarTypes[] = {"double", "float", "int32_t", "int64_t", "uint32_t",
                                        "int"};

// What every declaration sees: FlashInfer's fixed-width integer names under NVRTC, its math
// helpers, hook macros and base, inside namespace flashinfer.
constexpr const char* kPrelude = R"(
#ifdef __CUDACC_RTC__
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned short uint16_t;
typedef short int16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif
namespace flashinfer {
namespace math {
constexpr float log2e = 1.44269504088896340736f;
constexpr float loge2 = 0.693147180559945309417f;
constexpr float inf = __builtin_bit_cast(float, 0x7f800000u);
__device__ __forceinline__ float ptx_exp2(float x) { return flare::fast_exp2(x); }
__device__ __forceinline__ float ptx_rcp(float x) { return flare::fast_rcp(x); }
__device__ __forceinline__ float ptx_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float tanh(float x) { return flare::fast_tanh(x); }  // as FlashInfer's
}  // namespace math
#define REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx,      \
                                  kv_head_idx, ...)                                            \
  template <typename Params, typename T>                                                       \
  __device__ __forceinline__ T LogitsTransform(const Params& params, T logits,                 \
                                               uint32_t batch_idx, uint32_t qo_idx,            \
                                               uint32_t kv_idx, uint32_t qo_head_idx,          \
                                               uint32_t kv_head_idx) {                         \
    __VA_ARGS__                                                                                \
  }
#define REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, ...) \
  template <typename Params>                                                                   \
  __device__ __forceinline__ bool LogitsMask(const Params& params, uint32_t batch_idx,         \
                                             uint32_t qo_idx, uint32_t kv_idx,                 \
                                             uint32_t qo_head_idx, uint32_t kv_head_idx) {     \
    __VA_ARGS__                                                                                \
  }
struct AttentionVariantBase {
  static constexpr bool use_softmax = true;
  REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx,
                            kv_head_idx, { return logits; })
  REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx,
                       { return true; })
};
)";

bool contains(const std::string& text, const char* word) {
  return text.find(word) != std::string::npos;
}

void check_names(const std::vector<std::string>& names, const std::vector<std::string>& dtypes,
                 const char* kind) {
  FLARE_CHECK(names.size() == dtypes.size(), ErrorCode::kInvalidArgument, kWhat, ": ",
              names.size(), " additional ", kind, " names but ", dtypes.size(), " dtypes");
  for (const std::string& name : names) {
    FLARE_CHECK(is_c_identifier(name), ErrorCode::kInvalidArgument, kWhat, ": additional ",
                kind, " name '", name, "' is not a C identifier");
  }
}

}  // namespace

UserVariant flashinfer_variant(const FlashInferVariantSpec& spec) {
  FLARE_CHECK(is_c_identifier(spec.variant_name), ErrorCode::kInvalidArgument, kWhat,
              ": variant_name must be a C identifier, got '", spec.variant_name, "'");
  check_names(spec.tensor_names, spec.tensor_dtypes, "tensor");
  check_names(spec.scalar_names, spec.scalar_dtypes, "scalar");
  const std::string& decl = spec.variant_decl;
  // Hooks FlashInfer's FA2 kernels call that no flare family can honour: an error, not a skip.
  const struct {
    const char* hook;
    const char* macro;
  } refused[] = {{"QueryTransform", "REGISTER_QUERY_TRANSFORM"},
                 {"KeyTransform", "REGISTER_KEY_TRANSFORM"},
                 {"OutputTransform", "REGISTER_OUTPUT_TRANSFORM"},
                 {"update_m_d", "REGISTER_M_D_UPDATE"}};
  for (const auto& r : refused) {
    FLARE_CHECK(!contains(decl, r.hook) && !contains(decl, r.macro), ErrorCode::kUnsupported,
                kWhat, ": variant '", spec.variant_name, "' defines ", r.hook,
                ", which flare's kernel families (decode, FA2 prefill) do not call; "
                "LogitsTransform and LogitsMask are supported");
  }

  UserVariant v;
  v.name = spec.variant_name;
  std::string params = "struct Params {\n  int qo_len_, kv_len_;\n";
  std::string fill;
  bool declares_sm_scale = false;
  for (size_t i = 0; i < spec.tensor_names.size(); ++i) {
    const std::string& name = spec.tensor_names[i];
    const TensorType* type = nullptr;
    for (const TensorType& t : kTensorTypes) {
      if (spec.tensor_dtypes[i] == t.name) type = &t;
    }
    FLARE_CHECK(type != nullptr, ErrorCode::kInvalidArgument, kWhat, ": additional tensor ", name,
                " has dtype '", spec.tensor_dtypes[i],
                "'; flare's variant tensors are uint8_t, int32_t, int64_t or float");
    v.tensors.push_back({name, type->dtype, {}});
    params += "  " + std::string(type->name) + "* " + name + ";\n";
    fill += "    f." + name + " = (" + type->name + "*)Tensors::" + name + "(p);\n";
    declares_sm_scale = declares_sm_scale || name == "sm_scale";
  }
  for (size_t i = 0; i < spec.scalar_names.size(); ++i) {
    const std::string& name = spec.scalar_names[i];
    bool known = false;
    for (const char* t : kScalarTypes) known = known || spec.scalar_dtypes[i] == t;
    FLARE_CHECK(known, ErrorCode::kInvalidArgument, kWhat, ": additional scalar ", name,
                " has dtype '", spec.scalar_dtypes[i],
                "'; scalars are double, float, int32_t, int64_t, uint32_t or int");
    v.scalars.push_back(name);
    params += "  " + spec.scalar_dtypes[i] + " " + name + ";\n";
    fill += "    f." + name + " = (" + spec.scalar_dtypes[i] + ")Scalars::" + name + "(p);\n";
    declares_sm_scale = declares_sm_scale || name == "sm_scale";
  }
  if (!declares_sm_scale) {
    params += "  float sm_scale;\n";
    fill += "    f.sm_scale = p.sm_scale;\n";
  }
  params +=
      "  __device__ uint32_t get_qo_len(uint32_t) const { return qo_len_; }\n"
      "  __device__ uint32_t get_kv_len(uint32_t) const { return kv_len_; }\n};\n";
  // FlashInfer's examples write `use_softmax = false` for sigmoid-like variants; the compiled
  // source checks the host's reading against the struct (user_variant_source).
  const size_t softmax_at = decl.find("use_softmax");
  v.use_softmax = softmax_at == std::string::npos ||
                  decl.find("false", softmax_at) > decl.find(';', softmax_at);

  const bool has_transform = contains(decl, "LOGITS_TRANSFORM") || contains(decl, "LogitsTransform");
  const bool has_mask = contains(decl, "LOGITS_MASK") || contains(decl, "LogitsMask");
  std::string source = "#line 1 \"" + v.name + ": FlashInfer prelude\"\n" + kPrelude + params +
                       "}  // namespace flashinfer\n";
  source += "namespace flashinfer_user {\nusing namespace flashinfer;\n#line 1 \"" + v.name +
            "\"\n" + decl + "\n}  // namespace flashinfer_user\n";
  source += "#line 1 \"" + v.name + ": flare adapter\"\n";
  source +=
      "struct Variant : flare::VariantBase {\n"
      "  using Decl = flashinfer_user::" + v.name + ";\n"
      "  static constexpr bool use_softmax = Decl::use_softmax;\n"
      "  flashinfer::Params params;\n"
      "  int request, qo_head, kv_head, q_index;\n"
      // FlashInfer's logits are q.k unscaled; a softmax variant's sm_scale_log2 scales them.
      "  __device__ static float query_scale(const flare::VariantParams&) { return 1.0f; }\n"
      "  template <class D>\n"
      "  __device__ static float softmax_scaled(const D& d, float logit) {\n"
      "    if constexpr (D::use_softmax) {\n"
      "      return logit * d.sm_scale_log2;\n"
      "    } else {\n"
      "      return logit;\n"
      "    }\n"
      "  }\n"
      "  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {\n"
      "    flashinfer::Params& f = params;\n"
      "    f.qo_len_ = row.q_len;\n"
      "    f.kv_len_ = row.kv_len;\n" + fill +
      "    request = row.request;\n"
      "    qo_head = row.qo_head;\n"
      "    kv_head = row.kv_head;\n"
      "    q_index = row.q_pos - (row.kv_len - row.q_len);\n"
      "  }\n";
  if (has_transform || v.use_softmax) {
    source +=
        "  __device__ float logits_transform(const flare::VariantParams&, float s, int kv_pos) "
        "const {\n"
        "    Decl d(params, request, nullptr);\n"
        "    return softmax_scaled(d, d.LogitsTransform(params, s, request, q_index, kv_pos, "
        "qo_head, kv_head));\n"
        "  }\n";
  }
  if (has_mask) {
    source +=
        "  __device__ bool logits_mask(int kv_pos) const {\n"
        "    Decl d(params, request, nullptr);\n"
        "    return d.LogitsMask(params, request, q_index, kv_pos, qo_head, kv_head);\n"
        "  }\n";
  }
  source += "};\n";
  v.source = source;
  return v;
}

}  // namespace flare
