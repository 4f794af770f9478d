// CI without a GPU: every shipped batch-decode configuration (its decode kernel, which merges
// split tiles itself) compiles with NVRTC for sm_80 and sm_90a with zero spills and zero local
// memory; the kernel specs follow the config, and configs no kernel handles are rejected before
// compiling.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "jit/shipped_kernel_shards.h"
#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/kernel_usage.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

using testing::define_value;

// The distinct kernel specs of every shipped config, for a GPU of the architecture's shared
// memory per block (A100 for sm_80, H100 for sm_90a).
std::vector<jit::KernelSpec> shipped_specs(const std::string& arch) {
  const size_t shared = arch == "sm_80" ? kSm80SharedBytesPerBlock : kSm90SharedBytesPerBlock;
  std::vector<jit::KernelSpec> specs;
  std::set<std::string> seen;
  for (const BatchDecodeConfig& config : shipped_decode_configs()) {
    const BatchDecodeKernels kernels = batch_decode_kernels(config, shared);
    if (seen.insert(kernels.decode.translation_unit()).second) specs.push_back(kernels.decode);
  }
  return specs;
}

// About 100 distinct units an architecture, a second or so each on one core: shards short
// enough that `ctest -j` keeps every core busy to the end.
constexpr int kDecodeShards = 8;

class ShippedDecodeKernels : public jit::testing::ShippedKernelShard {};

// Spill bytes (stores + loads) allowed in one configuration: at the 128-register cap of
// whole-page fp8 items (8 KV heads, D 64, every variant flag, sm_90a), ptxas keeps the score
// scale, a product of two parameters it hoists out of the item loop, in local memory between
// items: one 4-byte store when the CTA starts and one load per work item, outside the tile loop
// (SASS read with experiments/dump_decode_cubin.cpp). Every other configuration: none.
int allowed_spill_bytes(const std::string& label, const std::string& arch) {
  const bool known =
      arch == "sm_90a" && label ==
                              "decode-mma q=bfloat16 kv=float8_e5m2 D=64 rows=4 page=16 heads=8 "
                              "soft_cap+window+alibi";
  return known ? 8 : 0;
}

TEST_P(ShippedDecodeKernels, CompileWithoutSpillsOrLocalMemory) {
  const std::string arch = GetParam().arch;
  const std::vector<jit::KernelSpec> specs =
      jit::testing::specs_of_shard(shipped_specs(arch), GetParam());
  ASSERT_FALSE(specs.empty()) << "fewer shipped units than shards: lower kDecodeShards";
  // One thread: CTest runs the shards side by side.
  const std::vector<jit::CompiledKernel> results = jit::precompile(specs, arch, 1);
  for (size_t i = 0; i < specs.size(); ++i) {
    const jit::CompiledKernel& compiled = results[i];
    ASSERT_EQ(compiled.usage.size(), 1u) << specs[i].label;
    EXPECT_EQ(compiled.usage[0].entry, specs[i].entry) << specs[i].label;
    testing::expect_shipped_usage(compiled, specs[i].label + " on " + arch, 255,
                                  allowed_spill_bytes(specs[i].label, arch));
    EXPECT_FALSE(compiled.cubin.empty()) << specs[i].label;
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, ShippedDecodeKernels,
                         ::testing::ValuesIn(jit::testing::shipped_arch_shards(kDecodeShards)),
                         jit::testing::shard_name);

// The define values the shipped configs of one loop (or of both) are compiled with.
struct ShippedDefines {
  std::set<std::string> head_dims, rows, kv_dtypes, q_dtypes, variants, pages, loops, item_heads;
};
ShippedDefines shipped_defines(bool tensor_cores_only) {
  ShippedDefines d;
  for (const BatchDecodeConfig& config : shipped_decode_configs()) {
    if (tensor_cores_only && !config.use_tensor_cores) continue;
    const BatchDecodeKernels k = batch_decode_kernels(config);
    d.head_dims.insert(define_value(k.decode, "FLARE_HEAD_DIM"));
    d.rows.insert(define_value(k.decode, "FLARE_ROWS"));
    d.kv_dtypes.insert(define_value(k.decode, "FLARE_KV_DTYPE"));
    d.q_dtypes.insert(define_value(k.decode, "FLARE_Q_DTYPE"));
    d.pages.insert(define_value(k.decode, "FLARE_PAGE_SIZE"));
    d.loops.insert(define_value(k.decode, "FLARE_DECODE_MMA"));
    d.item_heads.insert(define_value(k.decode, "FLARE_ITEM_HEADS"));
    d.variants.insert(k.decode.variant_source);
  }
  return d;
}

TEST(ShippedDecodeConfigs, CoverEveryHeadDimRowTileKvDtypeAndVariantFlag) {
  const ShippedDefines d = shipped_defines(false);
  EXPECT_EQ(d.head_dims, (std::set<std::string>{"64", "128", "256", "512"}));
  EXPECT_EQ(d.rows, (std::set<std::string>{"1", "2", "4", "8"}));
  EXPECT_EQ(d.kv_dtypes.size(), 5u);  // f16, bf16, e4m3, e5m2, NVFP4 (uint8)
  EXPECT_EQ(d.q_dtypes.size(), 2u);   // f16, bf16
  EXPECT_EQ(d.variants.size(), 6u);   // default, soft-cap, window, ALiBi, all three, RoPE
  EXPECT_GE(d.pages.size(), 3u);
  EXPECT_EQ(d.loops, (std::set<std::string>{"0", "1"}));
}

TEST(ShippedDecodeConfigs, TensorCoreLoopCoversEveryHeadDimRowTileAndVariantFlag) {
  const ShippedDefines d = shipped_defines(true);
  EXPECT_EQ(d.loops, (std::set<std::string>{"1"}));
  EXPECT_EQ(d.head_dims, (std::set<std::string>{"64", "128", "256"}));
  EXPECT_EQ(d.rows, (std::set<std::string>{"1", "2", "4", "8"}));
  EXPECT_EQ(d.kv_dtypes.size(), 4u);  // f16, bf16 (q of the same type), e4m3, e5m2
  EXPECT_EQ(d.q_dtypes.size(), 2u);
  EXPECT_EQ(d.variants.size(), 3u);  // default, all three flags, RoPE
  EXPECT_EQ(d.item_heads, (std::set<std::string>{"1", "2", "4", "8"}));  // whole-page items
}

BatchDecodeConfig base_config() {
  BatchDecodeConfig c;
  c.max_batch = 4;
  c.num_qo_heads = 28;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.page_size = 3;
  c.q_dtype = DType::kF16;
  c.kv_dtype = DType::kE5M2;
  return c;
}

TEST(BatchDecodeKernels, SpecsFollowTheConfig) {
  BatchDecodeConfig c = base_config();
  c.params.logits_soft_cap = 50.0f;
  const BatchDecodeKernels k = batch_decode_kernels(c);
  EXPECT_EQ(k.decode.family_header, "decode.cuh");
  EXPECT_EQ(k.decode.entry, "flare_decode");
  EXPECT_EQ(k.rows_per_item, 8);  // group 7 padded to the 8-row tile
  EXPECT_EQ(define_value(k.decode, "FLARE_ROWS"), "8");
  EXPECT_EQ(define_value(k.decode, "FLARE_PAGE_SIZE"), "3");
  EXPECT_EQ(define_value(k.decode, "FLARE_Q_DTYPE"), std::to_string(static_cast<int>(DType::kF16)));
  EXPECT_EQ(define_value(k.decode, "FLARE_KV_DTYPE"),
            std::to_string(static_cast<int>(DType::kE5M2)));
  EXPECT_NE(k.decode.variant_source.find("FLARE_VARIANT_SOFT_CAP 1"), std::string::npos);
  EXPECT_NE(k.decode.variant_source.find("FLARE_VARIANT_WINDOW 0"), std::string::npos);
  EXPECT_EQ(define_value(k.decode, "FLARE_HEAD_DIM"), "128");
  EXPECT_GE(k.decode_shared_bytes, 32u * 1024u);
  EXPECT_EQ(k.threads, 128);

  c.num_qo_heads = 64;  // group 16: two 8-row tiles per KV head
  EXPECT_EQ(batch_decode_kernels(c).rows_per_item, 8);
  c.num_qo_heads = 12;  // group 3
  EXPECT_EQ(batch_decode_kernels(c).rows_per_item, 4);
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_DECODE_MMA"), "0");
}

TEST(BatchDecodeKernels, TensorCoreSpecsFollowTheConfig) {
  BatchDecodeConfig c = base_config();
  c.kv_dtype = DType::kF16;
  c.use_tensor_cores = true;
  const BatchDecodeKernels k = batch_decode_kernels(c);
  EXPECT_EQ(define_value(k.decode, "FLARE_DECODE_MMA"), "1");
  EXPECT_EQ(k.rows_per_item, 8);  // group 7: the n8 tile's rows
  EXPECT_EQ(k.decode.label.rfind("decode-mma ", 0), 0u) << k.decode.label;
  // 3 stages of 64 tokens of K and V at D = 128 (kernels/decode_mma.cuh).
  EXPECT_EQ(define_value(k.decode, "FLARE_STAGES"), "3");
  EXPECT_EQ(k.decode_shared_bytes, 3u * 2u * 64u * 128u * 2u);
  EXPECT_EQ(define_value(k.decode, "FLARE_MIN_CTAS_PER_SM"), "2");
  c.head_dim = 256;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_MIN_CTAS_PER_SM"), "1");
  // One CTA per SM at D = 256: 3 stages of 64 KiB where a block may hold them, else 2.
  const BatchDecodeKernels a100 = batch_decode_kernels(c, kSm80SharedBytesPerBlock);
  EXPECT_EQ(define_value(a100.decode, "FLARE_STAGES"), "2");
  EXPECT_EQ(a100.decode_shared_bytes, 2u * 2u * 64u * 256u * 2u);
  const BatchDecodeKernels h100 = batch_decode_kernels(c, kSm90SharedBytesPerBlock);
  EXPECT_EQ(define_value(h100.decode, "FLARE_STAGES"), "3");
  EXPECT_EQ(h100.decode_shared_bytes, 3u * 2u * 64u * 256u * 2u);
  EXPECT_LE(h100.decode_shared_bytes, kSm90SharedBytesPerBlock);
  // D = 128 keeps 3 stages of 32 KiB (2 CTAs per SM) on either.
  c.head_dim = 128;
  EXPECT_EQ(define_value(batch_decode_kernels(c, kSm90SharedBytesPerBlock).decode, "FLARE_STAGES"),
            "3");
  // RoPE adds its angle table (kernels/decode_pipeline.cuh kRotaryTableBytes: 16 offsets + 2 of
  // padding a pair, then each warp's first-token angles, float2 each) after the same 3 stages; a
  // user variant (which may be rotary) reserves it as well. Two such CTAs still fit an SM.
  {
    BatchDecodeConfig rope = c;
    rope.params.pos_encoding = PosEncoding::kRopeLlama;
    const size_t table = (64u * 18u + 4u * 64u) * 8u;
    const BatchDecodeKernels r = batch_decode_kernels(rope, kSm90SharedBytesPerBlock);
    EXPECT_EQ(define_value(r.decode, "FLARE_STAGES"), "3");
    EXPECT_EQ(r.decode_shared_bytes, 3u * 2u * 64u * 128u * 2u + table);
    EXPECT_LE(2 * (r.decode_shared_bytes + 1024), 228u * 1024u);
    BatchDecodeConfig user = c;
    user.variant = testing::user_soft_cap();
    EXPECT_EQ(batch_decode_kernels(user, kSm90SharedBytesPerBlock).decode_shared_bytes,
              r.decode_shared_bytes);
  }
  // fp8 KV keeps the stages' bytes: 3 stages of 128 one-byte tokens of K and V.
  for (const DType q : {DType::kF16, DType::kBF16}) {
    c.q_dtype = q;
    c.kv_dtype = DType::kE4M3;
    const BatchDecodeKernels fp8 = batch_decode_kernels(c);
    EXPECT_EQ(define_value(fp8.decode, "FLARE_DECODE_MMA"), "1");
    EXPECT_EQ(define_value(fp8.decode, "FLARE_STAGES"), "3");
    EXPECT_EQ(fp8.decode_shared_bytes, 3u * 2u * 128u * 128u);
    EXPECT_EQ(define_value(fp8.decode, "FLARE_MIN_CTAS_PER_SM"), "2");
  }
}

// Whole-page items (kv_heads_per_item > 1): a warp per KV head, stages of every head's tile.
TEST(BatchDecodeKernels, WholePageSpecsFollowTheConfig) {
  BatchDecodeConfig c = base_config();  // 28 q / 4 kv heads: group 7, padded to 8 rows a head
  c.q_dtype = c.kv_dtype = DType::kBF16;
  c.use_tensor_cores = true;
  c.kv_heads_per_item = 4;
  const BatchDecodeKernels k = batch_decode_kernels(c, kSm90SharedBytesPerBlock);
  EXPECT_EQ(define_value(k.decode, "FLARE_ITEM_HEADS"), "4");
  EXPECT_EQ(define_value(k.decode, "FLARE_ROWS"), "8");  // per KV head
  EXPECT_EQ(k.rows_per_item, 32);
  EXPECT_EQ(k.threads, 128);  // 4 warps, one per head
  EXPECT_NE(k.decode.label.find(" heads=4 "), std::string::npos) << k.decode.label;
  // A stage: 16 tokens x 4 heads of K and of V (32 KiB), 3 of them, 2 CTAs per SM.
  EXPECT_EQ(define_value(k.decode, "FLARE_STAGES"), "3");
  EXPECT_EQ(define_value(k.decode, "FLARE_MIN_CTAS_PER_SM"), "2");
  EXPECT_EQ(k.decode_shared_bytes, 3u * 2u * 16u * 4u * 128u * 2u);
  // 8 heads: 256 threads, stages of 64 KiB, one CTA per SM (2 stages on an A100).
  c.num_qo_heads = 32, c.num_kv_heads = 8, c.kv_heads_per_item = 8;
  const BatchDecodeKernels h100 = batch_decode_kernels(c, kSm90SharedBytesPerBlock);
  EXPECT_EQ(h100.threads, 256);
  EXPECT_EQ(h100.rows_per_item, 32);
  EXPECT_EQ(define_value(h100.decode, "FLARE_MIN_CTAS_PER_SM"), "1");
  EXPECT_EQ(define_value(h100.decode, "FLARE_STAGES"), "3");
  EXPECT_EQ(h100.decode_shared_bytes, 3u * 64u * 1024u);
  EXPECT_EQ(define_value(batch_decode_kernels(c, kSm80SharedBytesPerBlock).decode, "FLARE_STAGES"),
            "2");
  // fp8 at D 128: 32 tokens a warp keep 64 KiB stages. At D 256 with 8 rows a head, the fused
  // merge's two slots (64 rows x 257 floats each) outgrow an A100's two stages.
  c.kv_dtype = DType::kE4M3;
  EXPECT_EQ(batch_decode_kernels(c, kSm90SharedBytesPerBlock).decode_shared_bytes,
            3u * 64u * 1024u);
  c.head_dim = 256;
  c.num_qo_heads = 64;
  const BatchDecodeKernels a100 = batch_decode_kernels(c, kSm80SharedBytesPerBlock);
  EXPECT_EQ(define_value(a100.decode, "FLARE_STAGES"), "2");
  EXPECT_EQ(a100.decode_shared_bytes, (2u * 64u * 257u + 6u * 256u) * 4u);
  // The one-head loop is unchanged by the knob's default.
  c = base_config();
  c.q_dtype = c.kv_dtype = DType::kBF16;
  c.use_tensor_cores = true;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_ITEM_HEADS"), "1");
  EXPECT_EQ(batch_decode_kernels(c).threads, 128);
  c.use_tensor_cores = false;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_ITEM_HEADS"), "1");
}

TEST(BatchDecodeKernels, RejectsWholePageItemsNoKernelHandles) {
  BatchDecodeConfig c = base_config();
  c.q_dtype = c.kv_dtype = DType::kBF16;
  c.use_tensor_cores = true;
  for (const int heads : {0, 3, 16, -1}) {
    c.kv_heads_per_item = heads;
    EXPECT_FLARE_ERROR(batch_decode_kernels(c), ErrorCode::kInvalidArgument,
                       "kv_heads_per_item must be 1, 2, 4 or 8");
  }
  c.kv_heads_per_item = 8;  // 4 KV heads
  EXPECT_FLARE_ERROR(batch_decode_kernels(c), ErrorCode::kUnsupported, "divisible");
  c.kv_heads_per_item = 4;
  c.use_tensor_cores = false;
  EXPECT_FLARE_ERROR(batch_decode_kernels(c), ErrorCode::kUnsupported, "needs use_tensor_cores");
  c.use_tensor_cores = true;
  c.num_qo_heads = 64;  // group 16: two row tiles a head
  EXPECT_FLARE_ERROR(batch_decode_kernels(c), ErrorCode::kUnsupported, "at most 8 query heads");
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.kv_heads_per_item = 8;
  c.head_dim = 256;  // 16 tokens x 8 heads x 512 bytes of K and V: 128 KiB stages
  EXPECT_FLARE_ERROR(batch_decode_kernels(c), ErrorCode::kUnsupported, "131072-byte");
  c.kv_heads_per_item = 4;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_ITEM_HEADS"), "4");
}

TEST(BatchDecodeKernels, RejectsConfigsNoKernelHandles) {
  const auto expect_code = [](BatchDecodeConfig c, ErrorCode code, const char* needle) {
    EXPECT_FLARE_ERROR(batch_decode_kernels(c), code, needle);
  };
  BatchDecodeConfig c = base_config();
  c.head_dim = 96;
  expect_code(c, ErrorCode::kUnsupported, "head_dim");
  c = base_config();  // D 512: the CUDA-core loop, head groups in items of at most 4 rows
  c.head_dim = 512;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_ROWS"), "4");
  EXPECT_EQ(batch_decode_kernels(c).rows_per_item, 4);
  c.use_tensor_cores = true;
  expect_code(c, ErrorCode::kUnsupported, "head_dim 512");
  c = base_config();  // NVFP4 KV: the CUDA-core loop, items of at most 4 rows
  c.kv_dtype = DType::kU8;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_KV_DTYPE"), "7");
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_ROWS"), "4");
  c.use_tensor_cores = true;
  expect_code(c, ErrorCode::kUnsupported, "NVFP4");
  c = base_config();
  c.num_qo_heads = 30;
  expect_code(c, ErrorCode::kInvalidArgument, "num_kv_heads");
  c = base_config();
  c.page_size = 0;
  expect_code(c, ErrorCode::kInvalidArgument, "page_size");
  c = base_config();
  c.max_batch = 0;
  expect_code(c, ErrorCode::kInvalidArgument, "max_batch");
  c = base_config();
  c.q_dtype = DType::kF32;
  expect_code(c, ErrorCode::kUnsupported, "q_dtype");
  c = base_config();
  c.kv_dtype = DType::kF32;
  expect_code(c, ErrorCode::kUnsupported, "kv_dtype");
  c = base_config();  // the tensor-core loop takes fp8 KV with either q, not mixed 16-bit pairs
  c.use_tensor_cores = true;
  EXPECT_EQ(define_value(batch_decode_kernels(c).decode, "FLARE_DECODE_MMA"), "1");
  c.kv_dtype = DType::kBF16;  // f16 q
  expect_code(c, ErrorCode::kUnsupported, "use_tensor_cores");
  c.q_dtype = DType::kBF16;
  c.kv_dtype = DType::kF16;
  expect_code(c, ErrorCode::kUnsupported, "use_tensor_cores");
  for (const int waves : {-1, 17}) {
    c = base_config();
    c.waves = waves;
    expect_code(c, ErrorCode::kInvalidArgument, "waves must be in [0, 16]");
  }
  c = base_config();
  c.params.pos_encoding = PosEncoding::kRopeLlama;  // fp8 KV too (fp8 K rotated as converted)
  c.kv_dtype = DType::kE5M2;
  EXPECT_NO_THROW(batch_decode_kernels(c));
  c.kv_dtype = DType::kF16;
  c.params.rope_scale = -1.0f;
  expect_code(c, ErrorCode::kInvalidArgument, "rope_scale must be finite and > 0");
  c = base_config();
  HostTensor prefix = testing::int32_tensor({4});
  c.params.prefix_len = prefix.view();  // the CPU reference's; the GPU takes the variant
  expect_code(c, ErrorCode::kUnsupported, "flare::variants::prefix_lm()");
  c = base_config();
  c.params.use_softmax = false;  // sigmoid attention runs; its bias must be finite
  c.params.sigmoid_bias = std::numeric_limits<float>::infinity();
  expect_code(c, ErrorCode::kInvalidArgument, "sigmoid_bias must be finite");
  c = base_config();
  c.params.mask = MaskMode::kCustom;
  expect_code(c, ErrorCode::kUnsupported, "custom");
  c = base_config();
  c.params.window_left = -2;
  expect_code(c, ErrorCode::kInvalidArgument, "window_left");
}

}  // namespace
}  // namespace flare
