// FlashInfer's variant declarations (flare/variant/flashinfer_variant.h): FlashInfer's own
// FlashSigmoid and custom-mask examples compile unchanged into every flare family without
// spills on sm_80 and sm_90a (the mask at small prefill tiles); malformed specs and hooks no
// family calls are errors naming them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/jit/compiler.h"
#include "flare/variant/flashinfer_variant.h"
#include "jit/jit_test_support.h"
#include "jit/variant_configs.h"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"

namespace flare {
namespace {

// FlashInfer's tests/utils/test_jit_example.py declarations, as users write them.
constexpr const char* kFlashSigmoid = R"(
struct FlashSigmoid : AttentionVariantBase {
  static constexpr bool use_softmax = false;

  uint32_t window_left, qo_len, kv_len;
  float sigmoid_scale_log2;
  float sigmoid_bias_log2;

  // Create closure
  template <typename Params>
  __device__ __host__ FlashSigmoid(const Params& params, uint32_t batch_idx,
                                   uint8_t* smem_ptr) {
    qo_len = params.get_qo_len(batch_idx);
    kv_len = params.get_kv_len(batch_idx);
    window_left = kv_len;
    sigmoid_bias_log2 = params.sigmoid_bias * math::log2e;
    sigmoid_scale_log2 = params.logits_scale * math::log2e;
  }

  REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    return math::ptx_rcp(1.f + math::ptx_exp2(-float(logits * sigmoid_scale_log2 + sigmoid_bias_log2)));
  });
};
)";

constexpr const char* kCustomMask = R"(
struct SingleDecodeWithCustomMask : AttentionVariantBase {
  static constexpr bool use_softmax = true;

  uint8_t* custom_mask_ptr;
  uint32_t window_left, qo_len, kv_len;
  float sm_scale_log2;

  // Create closure
  template <typename Params>
  __device__ __host__ SingleDecodeWithCustomMask(const Params& params, uint32_t batch_idx,
                                                 uint8_t* smem_ptr) {
    custom_mask_ptr = params.custom_mask;
    qo_len = 1;
    kv_len = params.get_kv_len(batch_idx);
    window_left = kv_len;
    sm_scale_log2 = params.sm_scale * math::log2e;
  }

  REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    const uint32_t offset = kv_idx;
    return ((custom_mask_ptr[offset / 8] >> (offset % 8)) & 1);
  })
};
)";

FlashInferVariantSpec flash_sigmoid() {
  return {"FlashSigmoid", kFlashSigmoid, {}, {}, {"logits_scale", "sigmoid_bias"},
          {"double", "double"}};
}
FlashInferVariantSpec custom_mask() {
  return {"SingleDecodeWithCustomMask", kCustomMask, {"custom_mask"}, {"uint8_t"}, {"sm_scale"},
          {"double"}};
}

TEST(FlashInferVariant, DeclarationsBecomeUserVariants) {
  const UserVariant sigmoid = flashinfer_variant(flash_sigmoid());
  EXPECT_EQ(sigmoid.name, "FlashSigmoid");
  EXPECT_FALSE(sigmoid.use_softmax);
  EXPECT_EQ(sigmoid.scalars, (std::vector<std::string>{"logits_scale", "sigmoid_bias"}));
  EXPECT_TRUE(sigmoid.tensors.empty());
  const UserVariant mask = flashinfer_variant(custom_mask());
  EXPECT_TRUE(mask.use_softmax);
  ASSERT_EQ(mask.tensors.size(), 1u);
  EXPECT_EQ(mask.tensors[0].dtype, DType::kU8);
  EXPECT_NE(mask.source.find("logits_mask"), std::string::npos);
  EXPECT_NO_THROW(validate_user_variant(mask, "T"));
}

TEST(FlashInferVariant, MalformedSpecsAndUnsupportedHooksAreErrors) {
  FlashInferVariantSpec s = flash_sigmoid();
  s.scalar_dtypes = {"double"};
  EXPECT_FLARE_ERROR(flashinfer_variant(s), ErrorCode::kInvalidArgument,
                     "2 additional scalar names but 1 dtypes");
  s = custom_mask();
  s.tensor_dtypes = {"half"};
  EXPECT_FLARE_ERROR(flashinfer_variant(s), ErrorCode::kInvalidArgument,
                     "additional tensor custom_mask has dtype 'half'");
  s = flash_sigmoid();
  s.variant_name = "Flash-Sigmoid";
  EXPECT_FLARE_ERROR(flashinfer_variant(s), ErrorCode::kInvalidArgument,
                     "variant_name must be a C identifier");
  s = flash_sigmoid();
  s.variant_decl += "REGISTER_OUTPUT_TRANSFORM(params, output, b, q, h, m, d, scale, {})";
  EXPECT_FLARE_ERROR(flashinfer_variant(s), ErrorCode::kUnsupported,
                     "variant 'FlashSigmoid' defines OutputTransform");
}

class FlashInferVariantCompile : public jit::testing::JitTest,
                                 public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    JitTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
};

TEST_P(FlashInferVariantCompile, EveryFamilyCompilesWithoutSpills) {
  const UserVariant variant = flashinfer_variant(GetParam() == 0 ? flash_sigmoid() : custom_mask());
  std::vector<jit::KernelSpec> specs;
  for (const bool tc : {false, true}) {
    specs.push_back(batch_decode_kernels(testing::decode_config(variant, tc)).decode);
  }
  for (const PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
    BatchPrefillConfig c = testing::prefill_config(variant, kv);
    c.params.mask = MaskMode::kNone;
    // The custom mask (a decode example) loads a mask byte per key: at 128x64 prefill tiles,
    // with every key checked, its row state spills 32-144 bytes; small tiles hold it.
    specs.push_back(batch_prefill_kernels(c, GetParam() == 0 ? PrefillTiles{128, 64}
                                                             : PrefillTiles{16, 64})
                        .prefill);
  }
  for (const char* arch : {"sm_80", "sm_90a"}) {
    const std::vector<jit::CompiledKernel> results = jit::precompile(specs, arch, 1);
    for (size_t i = 0; i < specs.size(); ++i) {
      flare::testing::expect_shipped_usage(results[i], specs[i].label + " on " + arch);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FlashInferExamples, FlashInferVariantCompile, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? "FlashSigmoid" : "CustomMask";
                         });

}  // namespace
}  // namespace flare
