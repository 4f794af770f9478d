// CI without a GPU: user-defined variants (flare/variant/user_variant.h) validate their
// declaration, compile with NVRTC into the decode kernels (both loops) and the FA2 prefill
// kernels (paged, ragged) for sm_80 and sm_90a without spills, report errors in their source at
// the user's line numbers, and refuse hooks no kernel family honours and built-in terms they
// would silently replace; the built-in sigmoid (use_softmax = false) compiles in every family.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "flare/variant/attention_params.h"
#include "flare/variant/library.h"
#include "jit/jit_test_support.h"
#include "jit/variant_configs.h"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

class UserVariantCompile : public jit::testing::JitTest {
 protected:
  void SetUp() override {
    JitTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
};

using testing::decode_config;
using testing::prefill_config;

// Both decode loops, and paged and ragged prefill at the tiles of short, mixed and long
// prefills (128x64: what long prefills run), in the mask mode the variant is planned with:
// prefix-LM's own mask replaces the causal one (with the causal mask too, a combination that
// computes plain causal attention, its 128x64 kernels spill 32-112 bytes).
// Every family's kernels of `variant`; with `hopper`, the Hopper prefill family's tiles too
// (sm_90a only).
std::vector<jit::KernelSpec> specs_of(const UserVariant& variant, bool hopper = false) {
  std::vector<jit::KernelSpec> specs;
  for (const bool tc : {false, true})
    specs.push_back(batch_decode_kernels(decode_config(variant, tc)).decode);
  for (const PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
    BatchPrefillConfig config = prefill_config(variant, kv);
    if (variant.name == "prefix_lm") config.params.mask = MaskMode::kNone;
    for (const PrefillTiles tiles :
         {PrefillTiles{16, 64}, PrefillTiles{128, 32}, PrefillTiles{128, 64}}) {
      specs.push_back(batch_prefill_kernels(config, tiles).prefill);
    }
    if (!hopper) continue;
    // 128-row tiles: the Hopper family's most registers (a per-row branch spilled there).
    specs.push_back(batch_prefill_kernels(config, {128, 128, true}).prefill);
  }
  return specs;
}

TEST(UserVariant, DeclarationsAreValidated) {
  UserVariant v = testing::user_soft_cap();
  EXPECT_NO_THROW(validate_user_variant(v, "T"));
  v.name = "2cap";
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "variant.name must be a C identifier, got '2cap'");
  v = testing::user_soft_cap();
  v.source = " \n";
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument, "empty source");
  v = testing::user_soft_cap();
  v.scalars = {"cap", "cap"};
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "declares scalar 'cap' twice");
  v.scalars = {"a-b"};
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "scalar 0 must be a C identifier, got 'a-b'");
  v.scalars = std::vector<std::string>(kMaxUserScalars + 1, "x");
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "declares 9 scalars; at most 8");
  v = testing::user_alibi_slopes();
  EXPECT_NO_THROW(validate_user_variant(v, "T"));
  v.scalars = {"slopes"};
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "declares 'slopes' twice (scalars and tensors share names)");
  v.scalars = {};
  v.tensors[0].shape = {16, -6};
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "tensor slopes declares extent -6; extents are >= 0, kAnyExtent");
  v.tensors[0].shape = {16, kAnyExtent};
  EXPECT_NO_THROW(validate_user_variant(v, "T"));
  v.tensors[0].shape = {kBatchExtent, kQoHeadsExtent, kKvHeadsExtent, kTableExtent};
  EXPECT_NO_THROW(validate_user_variant(v, "T"));
  v.tensors[0].shape = {16, kAnyExtent};
  v.tensors[0].dtype = DType::kE4M3;
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "tensor slopes has dtype float8_e4m3; variant tensors are float32");
  v.tensors = {{"slopes", DType::kF32, {}}, {"slopes_extent", DType::kI32, {}}};
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "tensor slopes_extent collides with tensor slopes's extent accessor");
  v.tensors.assign(kMaxUserTensors + 1, {"t", DType::kU8});
  EXPECT_FLARE_ERROR(validate_user_variant(v, "T"), ErrorCode::kInvalidArgument,
                     "declares 5 tensors; at most 4");
  EXPECT_EQ(user_variant_scalar_index(testing::user_alibi(), "group", "T"), 1);
  EXPECT_FLARE_ERROR(user_variant_scalar_index(testing::user_alibi(), "slope", "T"),
                     ErrorCode::kInvalidArgument,
                     "has no scalar 'slope' (its scalars: heads, group)");
}

TEST(UserVariant, SpecsCarryTheUserSourceAndName) {
  const BatchDecodeKernels k = batch_decode_kernels(decode_config(testing::user_soft_cap(), true));
  EXPECT_NE(k.decode.variant_source.find("struct Variant : flare::VariantBase"), std::string::npos);
  EXPECT_NE(k.decode.variant_source.find("static float cap(const flare::VariantParams& p)"),
            std::string::npos);
  EXPECT_NE(k.decode.label.find("user:user_soft_cap"), std::string::npos) << k.decode.label;
  const std::string with_tensor = user_variant_source(testing::user_alibi_slopes());
  EXPECT_NE(with_tensor.find("static const float* slopes(const flare::VariantParams& p) { "
                             "return static_cast<const float*>(p.tensors[0]); }"),
            std::string::npos)
      << with_tensor;
  EXPECT_NE(with_tensor.find("static int slopes_extent(const flare::VariantParams& p, int d) { "
                             "return p.tensor_extents[0][d]; }"),
            std::string::npos)
      << with_tensor;
}

// document_mask() relies on the kernel's causal mask: a prefill config without it is refused
// before any kernel is chosen; its tensor comes from per-position ids.
TEST(UserVariant, DocumentMaskRequiresTheCausalMaskAndReadsDocumentStarts) {
  BatchPrefillConfig p = prefill_config(variants::document_mask(), PrefillKV::kRagged);
  EXPECT_TRUE(p.variant->requires_causal);
  EXPECT_NO_THROW(batch_prefill_kernels(p, {64, 64}));
  p.params.mask = MaskMode::kNone;
  EXPECT_FLARE_ERROR(batch_prefill_kernels(p, {64, 64}), ErrorCode::kInvalidArgument,
                     "variant 'document_mask' requires the causal mask");
  const std::vector<int32_t> ids = {3, 3, 4, 4, 4, 9, /* row 2 */ 1, 2, 2, 2, 1, 1};
  EXPECT_EQ(variants::document_starts(ids, 2, 6),
            (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 4, 4}));
  EXPECT_FLARE_ERROR(variants::document_starts(ids, 2, 5), ErrorCode::kInvalidArgument,
                     "document_id holds 12 ids, not rows * columns = 2 * 5");
}

// distance_bias()'s table for T5: the CPU reference's buckets of distances 0 .. ceil(max
// distance), the last one T5's last bucket, every row the table's own.
TEST(UserVariant, T5DistanceBiasIsTheBucketTableByDistance) {
  const std::vector<int32_t> buckets = variants::t5_distance_buckets(128.0);
  ASSERT_EQ(buckets.size(), 129u);
  for (int n = 0; n < 129; ++n) EXPECT_EQ(buckets[n], relative_bias_bucket(n, 128.0)) << n;
  EXPECT_EQ(buckets[15], 15);
  EXPECT_EQ(buckets[31], 21);
  EXPECT_EQ(buckets[128], 31);
  EXPECT_EQ(variants::t5_distance_buckets(100.5).size(), 102u);  // 101 >= 100.5: the last bucket
  EXPECT_EQ(variants::t5_distance_buckets(100.5).back(), 31);
  std::vector<float> table(2 * 32);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  const std::vector<float> bias = variants::t5_distance_bias(table, 2, 40.0);
  ASSERT_EQ(bias.size(), 2u * 41);
  for (int h = 0; h < 2; ++h) {
    for (int n = 0; n < 41; ++n) {
      EXPECT_EQ(bias[h * 41 + n], table[h * 32 + relative_bias_bucket(n, 40.0)]) << h << " " << n;
    }
  }
  for (const double bad : {16.0, 3.0, -1.0, std::nan(""), 1e9}) {
    EXPECT_FLARE_ERROR(variants::t5_distance_buckets(bad), ErrorCode::kInvalidArgument,
                       "max_distance must be finite, above 16 and at most 2^24");
  }
  EXPECT_FLARE_ERROR(variants::t5_distance_bias(table, 3, 40.0), ErrorCode::kInvalidArgument,
                     "table holds 64 values, not heads * 32 = 3 * 32");
  EXPECT_EQ(variants::distance_bias().tensors[0].shape,
            (std::vector<int64_t>{kQoHeadsExtent, kTableExtent}));
}

TEST(UserVariant, BuiltInTermsAlongsideAUserVariantAreErrors) {
  BatchDecodeConfig d = decode_config(testing::user_soft_cap(), false);
  d.params.logits_soft_cap = 30.0f;
  EXPECT_FLARE_ERROR(batch_decode_kernels(d), ErrorCode::kInvalidArgument,
                     "params.logits_soft_cap is a built-in variant term, and variant "
                     "'user_soft_cap' replaces the built-in variant");
  BatchPrefillConfig p = prefill_config(testing::user_alibi(), PrefillKV::kPaged);
  p.params.window_left = 128;
  EXPECT_FLARE_ERROR(batch_prefill_kernels(p, {64, 64}), ErrorCode::kInvalidArgument,
                     "params.window_left is a built-in variant term");
  p.params.window_left = -1;
  p.params.mask = MaskMode::kCustom;  // the kernel's own mask stays allowed
  EXPECT_NO_THROW(batch_prefill_kernels(p, {64, 64}));
}

class UserVariantFamilies : public UserVariantCompile,
                            public ::testing::WithParamInterface<const char*> {};

UserVariant variant_named(const std::string& name) {
  if (name == "soft_cap") return testing::user_soft_cap();
  if (name == "alibi") return testing::user_alibi();
  if (name == "alibi_slopes") return testing::user_alibi_slopes();
  if (name == "sigmoid") return testing::user_sigmoid();
  if (name.rfind("library:", 0) == 0) return variants::by_name(name.substr(8));
  return testing::user_stride_mask();
}

TEST_P(UserVariantFamilies, EveryFamilyCompilesWithoutSpills) {
  for (const char* arch : {"sm_80", "sm_90a"}) {
    // The Hopper family, sm_90a only, for T5 and the distance bias: the user variants with a
    // path of their own there (logits affine on some keys; the built-in ALiBi's affine path is
    // a shipped kernel).
    const std::string name = GetParam();
    const bool hopper =
        std::string(arch) == "sm_90a" &&
        (name == "library:relative_position_bias" || name == "library:distance_bias");
    const std::vector<jit::KernelSpec> specs = specs_of(variant_named(name), hopper);
    const std::vector<jit::CompiledKernel> results = jit::precompile(specs, arch, 1);
    for (size_t i = 0; i < specs.size(); ++i) {
      // The distance bias's branch-free table loads (a tile's loads in flight at once) spill
      // up to 32 bytes in the mma.sync family's 128-row units for sm_90a, the fallback family
      // there (auto takes the Hopper family, 0 bytes; sm_80's units: 0 bytes).
      const bool fallback_128_rows = name == "library:distance_bias" &&
                                     std::string(arch) == "sm_90a" &&
                                     testing::define_value(specs[i], "FLARE_WARPGROUP") == "0" &&
                                     testing::define_value(specs[i], "FLARE_QUERY_TILE") == "128";
      flare::testing::expect_shipped_usage(results[i], specs[i].label + " on " + arch, 255,
                                           fallback_128_rows ? 32 : 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, UserVariantFamilies,
                         ::testing::Values("soft_cap", "alibi", "alibi_slopes", "stride_mask",
                                           "sigmoid", "library:sigmoid", "library:prefix_lm",
                                           "library:relative_position_bias",
                                           "library:distance_bias", "library:document_mask"));

// The built-in sigmoid attention (params.use_softmax = false, StandardVariant's kSigmoid) takes
// the same paths as a user variant without softmax, with soft-cap alongside.
TEST_F(UserVariantCompile, BuiltInSigmoidCompilesInEveryFamilyWithoutSpills) {
  std::vector<jit::KernelSpec> specs;
  for (const bool tc : {false, true}) {
    BatchDecodeConfig d = decode_config(testing::user_sigmoid(), tc);
    d.variant.reset();
    d.params.use_softmax = false;
    d.params.sigmoid_bias = -1.0f;
    d.params.logits_soft_cap = 30.0f;
    specs.push_back(batch_decode_kernels(d).decode);
  }
  for (const PrefillKV kv : {PrefillKV::kPaged, PrefillKV::kRagged}) {
    BatchPrefillConfig p = prefill_config(testing::user_sigmoid(), kv);
    p.variant.reset();
    p.params.use_softmax = false;
    specs.push_back(batch_prefill_kernels(p, {128, 64}).prefill);
  }
  for (const jit::KernelSpec& spec : specs) {
    EXPECT_NE(spec.label.find("sigmoid"), std::string::npos) << spec.label;
  }
  for (const char* arch : {"sm_80", "sm_90a"}) {
    const std::vector<jit::CompiledKernel> results = jit::precompile(specs, arch, 1);
    for (size_t i = 0; i < specs.size(); ++i) {
      flare::testing::expect_shipped_usage(results[i], specs[i].label + " on " + arch);
    }
  }
}

TEST_F(UserVariantCompile, UseSoftmaxMustMatchTheSource) {
  UserVariant v = testing::user_sigmoid();
  v.use_softmax = true;  // declared with softmax, the source has none
  const jit::KernelSpec spec = batch_decode_kernels(decode_config(v, true)).decode;
  try {
    jit::compile_cached(spec, "sm_80");
    FAIL() << "compiled a variant whose use_softmax disagrees with its declaration";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCompileError);
    EXPECT_NE(std::string(e.what()).find("was declared with use_softmax = true"), std::string::npos)
        << e.what();
  }
}

TEST_F(UserVariantCompile, ErrorsCiteTheUsersOwnLines) {
  UserVariant v = testing::user_soft_cap();
  v.name = "broken";
  v.source = "struct Variant : flare::VariantBase {\n  int x = ;\n};\n";
  const jit::KernelSpec spec = batch_decode_kernels(decode_config(v, false)).decode;
  try {
    jit::compile_cached(spec, "sm_90a");
    FAIL() << "compiled a broken variant";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCompileError);
    EXPECT_NE(std::string(e.what()).find("broken(2)"), std::string::npos) << e.what();
  }
}

TEST_F(UserVariantCompile, HooksNoFamilyHonoursAreCompileErrors) {
  UserVariant v;
  v.name = "with_output_transform";
  v.source = R"(
struct Variant : flare::VariantBase {
  __device__ float output_transform(float o) const { return o; }
};
)";
  for (const jit::KernelSpec& spec :
       {batch_decode_kernels(decode_config(v, true)).decode,
        batch_prefill_kernels(prefill_config(v, PrefillKV::kRagged), {64, 64}).prefill}) {
    try {
      jit::compile_cached(spec, "sm_80");
      FAIL() << spec.label << " compiled a variant with output_transform";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("output_transform is not supported"), std::string::npos)
          << e.what();
    }
  }
}

// kLogitsBounded promises a bound logits_bound(p) returns: declared without that hook, the
// fixed-offset softmax would take VariantBase's placeholder.
TEST_F(UserVariantCompile, ABoundWithoutItsHookIsACompileError) {
  UserVariant v;
  v.name = "bounded_without_bound";
  v.source = R"(
struct Variant : flare::VariantBase {
  static constexpr bool kLogitsBounded = true;
  __device__ float logits_transform(const flare::VariantParams&, float s, int) const {
    return 30.0f * flare::kLog2e * flare::fast_tanh(s);
  }
};
)";
  BatchPrefillConfig config = prefill_config(v, PrefillKV::kRagged);
  config.dtype = DType::kBF16;
  const PrefillTiles hopper{64, 64, true};
  for (const auto& [spec, arch] :
       {std::pair{batch_prefill_kernels(config, hopper).prefill, "sm_90a"},
        std::pair{batch_decode_kernels(decode_config(v, true)).decode, "sm_80"}}) {
    try {
      jit::compile_cached(spec, arch);
      FAIL() << spec.label << " compiled kLogitsBounded without logits_bound";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("kLogitsBounded needs its own static logits_bound"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace flare
