// CI without a GPU: every shipped batch-prefill configuration compiles with NVRTC for sm_80 and
// sm_90a with zero spills and zero local memory; the tile heuristic is a pure function of the
// packed query length and the device limits; configs no kernel handles are rejected.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "jit/shipped_kernel_shards.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_nvfp4.h"
#include "src/api/prefill_rope_staging.h"
#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare {
namespace {

using testing::define_value;

// The shipped units `arch` compiles: the Hopper family's (warpgroup MMAs) on sm_90a only.
std::vector<jit::KernelSpec> shipped_prefill_specs(const std::string& arch) {
  std::vector<jit::KernelSpec> specs;
  std::set<std::string> seen;
  for (const ShippedPrefillConfig& shipped : shipped_prefill_configs()) {
    if (shipped.tiles.warpgroup && arch != "sm_90a") continue;
    const jit::KernelSpec spec = batch_prefill_kernels(shipped.config, shipped.tiles).prefill;
    if (seen.insert(spec.translation_unit()).second) specs.push_back(spec);
  }
  return specs;
}

// About 30 distinct units, a second or so each on one core.
constexpr int kPrefillShards = 3;

class ShippedPrefillKernels : public jit::testing::ShippedKernelShard {};

TEST_P(ShippedPrefillKernels, CompileWithoutSpillsOrLocalMemory) {
  const std::string arch = GetParam().arch;
  const std::vector<jit::KernelSpec> specs =
      jit::testing::specs_of_shard(shipped_prefill_specs(arch), GetParam());
  ASSERT_FALSE(specs.empty()) << "fewer shipped units than shards: lower kPrefillShards";
  // One thread: CTest runs the shards side by side.
  const std::vector<jit::CompiledKernel> results = jit::precompile(specs, arch, 1);
  for (size_t i = 0; i < specs.size(); ++i) {
    const jit::CompiledKernel& compiled = results[i];
    ASSERT_EQ(compiled.usage.size(), 1u) << specs[i].label;
    EXPECT_EQ(compiled.usage[0].entry, "flare_prefill") << specs[i].label;
    testing::expect_shipped_usage(compiled, specs[i].label + " on " + arch);
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, ShippedPrefillKernels,
                         ::testing::ValuesIn(jit::testing::shipped_arch_shards(kPrefillShards)),
                         jit::testing::shard_name);

TEST(ShippedPrefillConfigs, CoverEveryHeadDimQueryTileMaskPathAndDtype) {
  std::set<std::string> dims, query_tiles, masks, paths, dtypes, variants;
  for (const ShippedPrefillConfig& shipped : shipped_prefill_configs()) {
    const jit::KernelSpec spec = batch_prefill_kernels(shipped.config, shipped.tiles).prefill;
    dims.insert(define_value(spec, "FLARE_HEAD_DIM_QK") + "/" +
                define_value(spec, "FLARE_HEAD_DIM_VO"));
    query_tiles.insert(define_value(spec, "FLARE_QUERY_TILE"));
    masks.insert(define_value(spec, "FLARE_MASK"));
    paths.insert(define_value(spec, "FLARE_KV_PAGED"));
    dtypes.insert(define_value(spec, "FLARE_Q_DTYPE"));
    variants.insert(spec.variant_source);
  }
  EXPECT_EQ(dims, (std::set<std::string>{"64/64", "128/128", "256/256", "192/128", "512/256"}));
  EXPECT_EQ(query_tiles, (std::set<std::string>{"16", "32", "64", "128"}));
  EXPECT_EQ(masks.size(), 3u);  // none, causal, custom
  EXPECT_EQ(paths.size(), 2u);  // ragged, paged
  EXPECT_EQ(dtypes.size(), 2u);
  // default, soft-cap + window + ALiBi, window, soft-cap + window, RoPE, RoPE + window, ALiBi
  EXPECT_EQ(variants.size(), 7u);
}

TEST(ShippedPrefillConfigs, CoverTheHopperFamily) {
  std::set<std::string> dims, query_tiles, kv_tiles, masks, paths;
  for (const ShippedPrefillConfig& shipped : shipped_prefill_configs()) {
    if (!shipped.tiles.warpgroup) continue;
    const jit::KernelSpec spec = batch_prefill_kernels(shipped.config, shipped.tiles).prefill;
    EXPECT_EQ(define_value(spec, "FLARE_WARPGROUP"), "1");
    dims.insert(define_value(spec, "FLARE_HEAD_DIM_QK") + "/" +
                define_value(spec, "FLARE_HEAD_DIM_VO"));
    query_tiles.insert(define_value(spec, "FLARE_QUERY_TILE"));
    kv_tiles.insert(define_value(spec, "FLARE_KV_TILE"));
    masks.insert(define_value(spec, "FLARE_MASK"));
    paths.insert(define_value(spec, "FLARE_KV_PAGED"));
  }
  EXPECT_EQ(dims, (std::set<std::string>{"64/64", "128/128", "256/256", "192/128"}));
  EXPECT_EQ(query_tiles, (std::set<std::string>{"64", "128"}));
  EXPECT_EQ(kv_tiles, (std::set<std::string>{"64", "128"}));
  EXPECT_EQ(masks.size(), 3u);
  EXPECT_EQ(paths.size(), 2u);
}

TEST(ChoosePrefillTiles, HopperFamilyTakesQueryTilesOf64And128) {
  PrefillDeviceLimits hopper = h100_prefill_limits();
  hopper.warpgroup_mma = true;
  const MaskMode causal = MaskMode::kCausal;
  // 128 rows: 8 warps, one CTA per SM either way, so the larger KV tile.
  EXPECT_EQ(choose_prefill_tiles(1e6, 128, 128, causal, hopper), (PrefillTiles{128, 128, true}));
  // 64 rows: 64 KV rows keep two CTAs per SM (128 would hold one).
  EXPECT_EQ(choose_prefill_tiles(33, 128, 128, causal, hopper), (PrefillTiles{64, 64, true}));
  // D 256: 128 O accumulators leave room for 64 KV columns only.
  EXPECT_EQ(choose_prefill_tiles(1e6, 256, 256, causal, hopper), (PrefillTiles{128, 64, true}));
  // Q rows of 384 bytes (192) take 64 KV columns as well (the variants' row state spills 128).
  EXPECT_EQ(choose_prefill_tiles(1e6, 192, 128, causal, hopper), (PrefillTiles{128, 64, true}));
  // 64 rows at D 256 stay on the mma.sync family (two CTAs per SM leave 128 registers at launch).
  EXPECT_FALSE(choose_prefill_tiles(33, 256, 256, causal, hopper).warpgroup);
  // Short queries stay on the mma.sync family's small tiles.
  EXPECT_FALSE(choose_prefill_tiles(16, 128, 128, causal, hopper).warpgroup);
  EXPECT_FALSE(choose_prefill_tiles(32, 128, 128, causal, hopper).warpgroup);
  // kFA3: at least 64 rows whatever the queries.
  hopper.warpgroup_only = true;
  EXPECT_EQ(choose_prefill_tiles(1, 128, 128, causal, hopper), (PrefillTiles{64, 64, true}));
  EXPECT_EQ(choose_prefill_tiles(1, 256, 256, causal, hopper), (PrefillTiles{128, 64, true}));
}

// NVFP4 K/V under kAuto: tiles below 128 rows (short queries over long KV) on the FA2 family's
// NVFP4 kernels (4.5 bits read a value), 128 on the Hopper family's staged copy; kFA3 keeps
// the Hopper family for every tile.
// NVFP4 under kAuto on sm_90: below 64 rows the FA2 family's NVFP4 kernels, at 64 the Hopper
// family's producer converts, at 128 the Hopper family reads the staged copy; kFA3 at 64 rows
// converts in the producer too, except with RoPE (docs/perf.md, NVFP4 prefill v7).
TEST(ChoosePrefillTiles, Nvfp4TilesChooseWhereTheConversionRuns) {
  PrefillDeviceLimits hopper = h100_prefill_limits();
  hopper.warpgroup_mma = true;
  BatchPrefillConfig c;
  c.kv_dtype = DType::kU8;
  const PrefillDeviceLimits nvfp4 = api_detail::limits_under_backend(hopper, c);
  EXPECT_TRUE(nvfp4.nvfp4_raw_stages);
  const MaskMode causal = MaskMode::kCausal;
  const PrefillTiles rows16 = choose_prefill_tiles(4, 128, 128, causal, nvfp4);
  EXPECT_EQ(rows16.query_tile, 16);
  EXPECT_FALSE(rows16.warpgroup);
  EXPECT_TRUE(api_detail::prefill_fused_nvfp4(c, rows16));
  const PrefillTiles rows64 = choose_prefill_tiles(64, 128, 128, causal, nvfp4);
  EXPECT_EQ(rows64.query_tile, 64);
  EXPECT_TRUE(rows64.warpgroup);
  EXPECT_TRUE(api_detail::prefill_fused_nvfp4(c, rows64));
  const PrefillTiles rows128 = choose_prefill_tiles(1e6, 128, 128, causal, nvfp4);
  EXPECT_EQ(rows128.query_tile, 128);
  EXPECT_TRUE(rows128.warpgroup);
  EXPECT_FALSE(api_detail::prefill_fused_nvfp4(c, rows128));
  // 16-bit K/V at 64 rows: the Hopper family as before.
  EXPECT_TRUE(choose_prefill_tiles(64, 128, 128, causal, hopper).warpgroup);
  c.backend = PrefillBackend::kFA3;
  const PrefillTiles fa3 =
      choose_prefill_tiles(64, 128, 128, causal, api_detail::limits_under_backend(hopper, c));
  EXPECT_TRUE(fa3.warpgroup);
  EXPECT_TRUE(api_detail::prefill_fused_nvfp4(c, fa3));
  c.params.pos_encoding = PosEncoding::kRopeLlama;  // the producer rotates 16-bit rows
  EXPECT_FALSE(api_detail::prefill_fused_nvfp4(c, fa3));
}

// kAuto: the Hopper family for K/V without RoPE, ragged or paged, and for ragged K/V with
// RoPE; paged K/V with RoPE stays on FA2 unless kFA3 asks (docs/perf.md, Hopper v9 and v14,
// forty-first session C).
TEST(PrefillBackendLimits, AutoTakesTheHopperFamilyExceptForPagedRope) {
  PrefillDeviceLimits hopper = h100_prefill_limits();
  hopper.warpgroup_mma = true;
  BatchPrefillConfig c;
  c.kv = PrefillKV::kRagged;
  EXPECT_TRUE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  EXPECT_FALSE(api_detail::limits_under_backend(hopper, c).warpgroup_only);
  c.params.pos_encoding = PosEncoding::kRopeLlama;
  EXPECT_TRUE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  c.params.pos_encoding = PosEncoding::kAlibi;
  EXPECT_TRUE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  c.params.pos_encoding = PosEncoding::kNone;
  c.kv = PrefillKV::kPaged;
  EXPECT_TRUE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  c.params.pos_encoding = PosEncoding::kRopeLlama;
  EXPECT_FALSE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  c.backend = PrefillBackend::kFA3;
  EXPECT_TRUE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  EXPECT_TRUE(api_detail::limits_under_backend(hopper, c).warpgroup_only);
  c.backend = PrefillBackend::kFA2;
  c.kv = PrefillKV::kRagged;
  EXPECT_FALSE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  // Head dim 512 runs the FA2 family only.
  c.backend = PrefillBackend::kAuto;
  c.params.pos_encoding = PosEncoding::kNone;
  c.head_dim_qk = c.head_dim_vo = 512;
  EXPECT_FALSE(api_detail::limits_under_backend(hopper, c).warpgroup_mma);
  c.head_dim_qk = c.head_dim_vo = 128;
  // Off sm_90 kAuto runs FA2; kFA3 is refused.
  PrefillDeviceLimits ampere = h100_prefill_limits();
  ampere.warpgroup_mma = false;
  c.backend = PrefillBackend::kAuto;
  EXPECT_FALSE(api_detail::limits_under_backend(ampere, c).warpgroup_mma);
  c.backend = PrefillBackend::kFA3;
  EXPECT_THROW(api_detail::limits_under_backend(ampere, c), Error);
}

TEST(BatchPrefillKernels, HopperFamilySpecs) {
  BatchPrefillConfig c;
  c.max_batch = c.max_total_qo = c.num_qo_heads = c.num_kv_heads = 1;
  c.head_dim_qk = c.head_dim_vo = 128;
  c.params.mask = MaskMode::kCausal;
  const BatchPrefillKernels k = batch_prefill_kernels(c, {128, 128, true});
  EXPECT_EQ(define_value(k.prefill, "FLARE_WARPGROUP"), "1");
  EXPECT_EQ(define_value(batch_prefill_kernels(c, {128, 128}).prefill, "FLARE_WARPGROUP"), "0");
  EXPECT_EQ(k.threads, 384);  // two consumer warpgroups of 64 rows and a producer
  // Q 128 x 256 bytes + 2 stages x 128 rows x 512 bytes, page ids 2 x 128 x 4; the mbarriers
  // (full / empty per half stage, item ready per hand-off slot, q full / empty: 12 x 8), two
  // hand-off slots (record 128, row tables 2 x 128 x 4), the two consumer warpgroups' item
  // records (2 x 128), the item record (128), row tables 2 x 128 x 4, per consumer thread (256)
  // 4 floats of statistics, one unused loop position (the mma.sync family's), warp spans 8 x 12,
  // to 16 bytes; then the 896 bytes that align the tiles to 1024 wherever the 128-byte aligned
  // shared memory starts.
  EXPECT_EQ(k.shared_bytes, (128u * 256 + 2u * 128 * 512 + 1024 + 96 + 2 * (128 + 1024) + 2 * 128 +
                             128 + 1024 + 4096 + 4 + 96 + 15) /
                                    16 * 16 +
                                896);
  EXPECT_NE(k.prefill.label.find("wgmma"), std::string::npos);
  EXPECT_EQ(batch_prefill_kernels(c, {64, 64, true}).threads, 256);
  EXPECT_FLARE_ERROR(batch_prefill_kernels(c, {32, 64, true}), ErrorCode::kInvalidArgument,
                     "Hopper family");
  EXPECT_FLARE_ERROR(batch_prefill_kernels(c, {128, 32, true}), ErrorCode::kInvalidArgument,
                     "Hopper family");
  c.head_dim_qk = c.head_dim_vo = 256;
  EXPECT_FLARE_ERROR(batch_prefill_kernels(c, {64, 64, true}), ErrorCode::kInvalidArgument,
                     "Hopper family");
  c.head_dim_qk = c.head_dim_vo = 128;
  c.backend = PrefillBackend::kFA3;
  c.query_tile = 16;
  EXPECT_FLARE_ERROR(batch_prefill_kernels(c, {128, 64, true}), ErrorCode::kInvalidArgument,
                     "query_tile=16");
  c.query_tile = 0;
  c.kv_tile = 32;
  EXPECT_FLARE_ERROR(batch_prefill_kernels(c, {128, 64, true}), ErrorCode::kInvalidArgument,
                     "kv_tile=32");
  c.kv_tile = 0;
  c.head_dim_qk = c.head_dim_vo = 256;
  c.params.mask = MaskMode::kCustom;  // every mask at head_dim_vo 256 too (the bits gathered early)
  EXPECT_NE(batch_prefill_kernels(c, {128, 64, true}).prefill.label.find("wgmma"),
            std::string::npos);
}

TEST(ChoosePrefillTiles, QueryTileIsTheSmallestCoveringTheAveragePackedLength) {
  const PrefillDeviceLimits h100 = h100_prefill_limits();
  const MaskMode causal = MaskMode::kCausal;
  EXPECT_EQ(choose_prefill_tiles(1, 128, 128, causal, h100).query_tile, 16);
  EXPECT_EQ(choose_prefill_tiles(16, 128, 128, causal, h100).query_tile, 16);
  EXPECT_EQ(choose_prefill_tiles(16.5, 128, 128, causal, h100).query_tile, 32);
  EXPECT_EQ(choose_prefill_tiles(33, 128, 128, causal, h100).query_tile, 64);
  EXPECT_EQ(choose_prefill_tiles(100, 128, 128, causal, h100).query_tile, 128);
  EXPECT_EQ(choose_prefill_tiles(1e6, 128, 128, causal, h100).query_tile, 128);
}

TEST(ChoosePrefillTiles, KvTileFollowsRegistersAndSharedMemory) {
  const PrefillDeviceLimits h100 = h100_prefill_limits();
  const MaskMode causal = MaskMode::kCausal;
  // 128 rows x D 128: 4 warps of two m16 tiles; 128 KV rows would need 256 accumulators, 64
  // keep two CTAs (8 warps) per SM.
  EXPECT_EQ(choose_prefill_kv_tile(128, 128, 128, causal, h100), 64);
  // A custom mask keeps one m16 tile per warp (8 warps) and at most 64 KV columns per warp.
  EXPECT_EQ(choose_prefill_kv_tile(128, 128, 128, MaskMode::kCustom, h100), 64);
  // 64 rows x D 128: 128 KV rows would hold one CTA (4 warps) per SM, 64 rows two.
  EXPECT_EQ(choose_prefill_kv_tile(64, 128, 128, causal, h100), 64);
  EXPECT_EQ(choose_prefill_kv_tile(64, 256, 256, causal, h100), 32);
  // D 64: two m16 tiles take at most 64 KV columns (128 spill).
  EXPECT_EQ(choose_prefill_kv_tile(128, 64, 64, causal, h100), 64);
  EXPECT_EQ(choose_prefill_kv_tile(16, 256, 256, causal, h100), 64);  // 4 KV warps x 16 columns
  // 192/128: 64 KV rows would leave one 4-warp CTA per SM (Q rows of 400 bytes), 32 two.
  EXPECT_EQ(choose_prefill_kv_tile(128, 192, 128, causal, h100), 32);
  // A device with under half the shared memory per SM (sm_86-like) moves to smaller tiles,
  // and to a smaller query tile where no KV tile fits (64 x 256 needs 104 KB with 32 KV rows).
  PrefillDeviceLimits small = h100;
  small.max_shared_bytes_per_block = 99 * 1024;
  small.shared_bytes_per_sm = 100 * 1024;
  EXPECT_EQ(choose_prefill_kv_tile(64, 128, 128, causal, small), 64);
  EXPECT_FLARE_ERROR(choose_prefill_kv_tile(64, 256, 256, causal, small), ErrorCode::kUnsupported,
                     "no KV tile fits");
  EXPECT_LE(batch_prefill_kernels(
                [] {
                  BatchPrefillConfig c;
                  c.max_batch = c.max_total_qo = c.num_qo_heads = c.num_kv_heads = 1;
                  c.head_dim_qk = c.head_dim_vo = 256;
                  c.params.mask = MaskMode::kCausal;
                  return c;
                }(),
                choose_prefill_tiles(1e6, 256, 256, causal, small))
                .shared_bytes,
            99u * 1024u);
  EXPECT_EQ(choose_prefill_tiles(1e6, 256, 256, causal, small), (PrefillTiles{32, 32}));
}

BatchPrefillConfig base_config() {
  BatchPrefillConfig c;
  c.max_batch = 4;
  c.max_total_qo = 1024;
  c.num_qo_heads = 28;
  c.num_kv_heads = 4;
  c.head_dim_qk = 192;
  c.head_dim_vo = 128;
  c.page_size = 3;
  c.dtype = DType::kF16;
  c.params.mask = MaskMode::kCausal;
  return c;
}

TEST(BatchPrefillKernels, SpecsFollowTheConfig) {
  BatchPrefillConfig c = base_config();
  c.params.logits_soft_cap = 50.0f;
  const BatchPrefillKernels k = batch_prefill_kernels(c, {64, 32});
  EXPECT_EQ(k.prefill.family_header, "prefill_kernel.cuh");
  EXPECT_EQ(k.prefill.entry, "flare_prefill");
  EXPECT_EQ(k.merge.family_header, "merge.cuh");
  EXPECT_EQ(define_value(k.prefill, "FLARE_HEAD_DIM_QK"), "192");
  EXPECT_EQ(define_value(k.prefill, "FLARE_HEAD_DIM_VO"), "128");
  EXPECT_EQ(define_value(k.prefill, "FLARE_QUERY_TILE"), "64");
  EXPECT_EQ(define_value(k.prefill, "FLARE_KV_TILE"), "32");
  EXPECT_EQ(define_value(k.prefill, "FLARE_KV_PAGED"), "1");
  EXPECT_EQ(define_value(k.prefill, "FLARE_PAGE_SIZE"), "3");
  EXPECT_EQ(define_value(k.prefill, "FLARE_MASK"), "1");
  EXPECT_EQ(define_value(k.merge, "FLARE_HEAD_DIM"), "128");
  EXPECT_NE(k.prefill.variant_source.find("FLARE_VARIANT_SOFT_CAP 1"), std::string::npos);
  // A cap of 50 is a logit bound of 72.1 (log2 units) <= 79: the fixed-offset softmax's flag
  // (kernels/variant.cuh has_logits_bound); 55 (79.3) keeps the running max, another kernel.
  EXPECT_NE(k.prefill.variant_source.find("FLARE_VARIANT_BOUNDED_LOGITS 1"), std::string::npos);
  EXPECT_NE(k.prefill.label.find("soft_cap"), std::string::npos);
  BatchPrefillConfig wide_cap = c;
  wide_cap.params.logits_soft_cap = 55.0f;
  const BatchPrefillKernels running_max = batch_prefill_kernels(wide_cap, {64, 32});
  EXPECT_NE(running_max.prefill.variant_source.find("FLARE_VARIANT_BOUNDED_LOGITS 0"),
            std::string::npos);
  EXPECT_NE(running_max.prefill.label.find("soft_cap_running_max"), std::string::npos);
  EXPECT_NE(running_max.prefill.translation_unit(), k.prefill.translation_unit());
  wide_cap.params.logits_soft_cap = 54.0f;
  EXPECT_EQ(batch_prefill_kernels(wide_cap, {64, 32}).prefill.translation_unit(),
            k.prefill.translation_unit());
  // Not beside ALiBi (its Hopper units spilled with it) nor without softmax (sigmoid).
  for (const bool alibi : {true, false}) {
    BatchPrefillConfig other = c;
    if (alibi) {
      other.params.pos_encoding = PosEncoding::kAlibi;
    } else {
      other.params.use_softmax = false;
    }
    const jit::KernelSpec spec = batch_prefill_kernels(other, {64, 32}).prefill;
    EXPECT_NE(spec.variant_source.find("FLARE_VARIANT_BOUNDED_LOGITS 0"), std::string::npos);
    EXPECT_EQ(spec.label.find("running_max"), std::string::npos) << spec.label;
  }
  EXPECT_EQ(k.threads, 128);
  // Q 64 rows x 192 x 2 + 2 stages x 32 rows x (192 + 128) x 2 (swizzled rows, no padding) +
  // page ids 2 x 32 x 4; then the item record (128), row tables 2 x 64 x 4, per thread (128) 4
  // floats of row statistics and a loop position, warp spans 4 x 12.
  EXPECT_EQ(k.shared_bytes, 64u * 384 + 2u * 32 * 640 + 256 + 128 + 512 + 2048 + 512 + 48);

  c.kv = PrefillKV::kRagged;
  EXPECT_EQ(define_value(batch_prefill_kernels(c, {16, 64}).prefill, "FLARE_KV_PAGED"), "0");
  EXPECT_EQ(batch_prefill_kernels(c, {16, 64}).threads, 128);   // 1 query warp x 4 KV warps
  EXPECT_EQ(batch_prefill_kernels(c, {128, 32}).threads, 128);  // 4 warps x 2 m16 tiles
  c.params.mask = MaskMode::kCustom;
  EXPECT_EQ(batch_prefill_kernels(c, {128, 32}).threads, 256);  // 8 warps x 1 m16 tile
  c.params.mask = MaskMode::kCausal;
  c.head_dim_qk = c.head_dim_vo = 256;
  EXPECT_EQ(batch_prefill_kernels(c, {128, 64}).threads, 256);  // 8 warps x 1 m16 tile
  // Head dim 512: passes of kernels 512 / 256 (prefill_config.h), the merge at 256.
  c.head_dim_qk = c.head_dim_vo = 512;
  EXPECT_EQ(api_detail::prefill_vo_passes(c), 2);
  const BatchPrefillKernels wide = batch_prefill_kernels(c, {16, 64});
  EXPECT_EQ(define_value(wide.prefill, "FLARE_HEAD_DIM_QK"), "512");
  EXPECT_EQ(define_value(wide.prefill, "FLARE_HEAD_DIM_VO"), "256");
  EXPECT_EQ(define_value(wide.merge, "FLARE_HEAD_DIM"), "256");
  EXPECT_EQ(define_value(wide.prefill, "FLARE_WARPGROUP"), "0");
}

TEST(BatchPrefillKernels, RejectsConfigsNoKernelHandles) {
  const auto expect_code = [](BatchPrefillConfig c, ErrorCode code, const char* needle) {
    EXPECT_FLARE_ERROR(batch_prefill_kernels(c, {64, 64}), code, needle);
  };
  BatchPrefillConfig c = base_config();
  c.head_dim_qk = 96;
  expect_code(c, ErrorCode::kUnsupported, "head dims");
  c = base_config();
  c.head_dim_qk = 512;  // 512 with vo 128
  expect_code(c, ErrorCode::kUnsupported, "head dims");
  c.head_dim_vo = 512;
  c.backend = PrefillBackend::kFA3;
  expect_code(c, ErrorCode::kUnsupported, "head dim 512 runs on the FA2 family");
  c = base_config();
  c.head_dim_qk = c.head_dim_vo = 32;
  expect_code(c, ErrorCode::kUnsupported, "head dims");
  c = base_config();
  c.num_qo_heads = 30;
  expect_code(c, ErrorCode::kInvalidArgument, "num_kv_heads");
  c = base_config();
  c.page_size = 0;
  expect_code(c, ErrorCode::kInvalidArgument, "page_size");
  c = base_config();
  c.max_total_qo = 0;
  expect_code(c, ErrorCode::kInvalidArgument, "max_total_qo");
  c = base_config();
  c.dtype = DType::kE4M3;
  expect_code(c, ErrorCode::kUnsupported, "dtype");
  c = base_config();
  c.params.pos_encoding = PosEncoding::kRopeLlama;  // runs; its offsets are the reference's
  HostTensor offsets = testing::int32_tensor({0});
  c.params.rope_offsets = offsets.view();
  expect_code(c, ErrorCode::kUnsupported, "rope_offsets");
  c.params.rope_offsets.reset();
  c.params.rope_theta = 0.0f;
  expect_code(c, ErrorCode::kInvalidArgument, "rope_theta must be finite and > 0");
  c = base_config();
  c.params.use_softmax = false;  // sigmoid attention runs; its bias must be finite
  c.params.sigmoid_bias = std::numeric_limits<float>::infinity();
  expect_code(c, ErrorCode::kInvalidArgument, "sigmoid_bias must be finite");
  c = base_config();
  c.params.k_scale = 0.5f;
  expect_code(c, ErrorCode::kUnsupported, "k_scale");
  c = base_config();
  c.query_tile = 48;
  expect_code(c, ErrorCode::kInvalidArgument, "query_tile");
  EXPECT_FLARE_ERROR(batch_prefill_kernels(base_config(), {16, 32}), ErrorCode::kInvalidArgument,
                     "not a kernel configuration");
}

// NVFP4 KV's dequantization into the staged 16-bit copy (src/api/prefill_nvfp4.h).
class Nvfp4PrefillStageKernel : public ::testing::TestWithParam<const char*> {};

TEST_P(Nvfp4PrefillStageKernel, CompilesWithoutSpills) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const jit::KernelSpec spec = api_detail::prefill_nvfp4_stage_kernel_spec();
  const jit::CompiledKernel compiled = jit::compile(spec, GetParam());
  ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
  testing::expect_shipped_usage(compiled, spec.label + " on " + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Archs, Nvfp4PrefillStageKernel, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

// rope_staging kStaged: RoPE on ragged 16-bit K/V, eager, one level (every head dim the prefill
// takes, 512 included, rotates whole); the staged plans' kernels compile without RoPE. kAuto and
// kFused take any config.
TEST(BatchPrefillConfigRopeStaging, StagedNeedsRaggedRopeAndItsKernelsCompileWithout) {
  BatchPrefillConfig c;
  c.max_batch = 2, c.max_total_qo = 64, c.num_qo_heads = 8, c.num_kv_heads = 2;
  c.head_dim_qk = c.head_dim_vo = 128;
  c.kv = PrefillKV::kRagged;
  c.params.mask = MaskMode::kCausal;
  c.rope_staging = RopeStaging::kStaged;
  constexpr const char* kNeeds = "rope_staging kStaged needs pos_encoding kRopeLlama, ragged";
  EXPECT_FLARE_ERROR(api_detail::validate_prefill_config(c), ErrorCode::kInvalidArgument, kNeeds);
  c.params.pos_encoding = PosEncoding::kRopeLlama;
  api_detail::validate_prefill_config(c);
  EXPECT_TRUE(api_detail::rope_staging_applies(c));
  for (const auto& change : std::vector<std::function<void(BatchPrefillConfig&)>>{
           [](BatchPrefillConfig& b) { b.kv = PrefillKV::kPaged; },
           [](BatchPrefillConfig& b) { b.use_cuda_graph = true; },
           [](BatchPrefillConfig& b) { b.max_levels = 2; },
           [](BatchPrefillConfig& b) { b.kv_dtype = DType::kU8, b.max_total_kv = 100; }}) {
    BatchPrefillConfig bad = c;
    change(bad);
    EXPECT_FALSE(api_detail::rope_staging_applies(bad));
    EXPECT_FLARE_ERROR(api_detail::validate_prefill_config(bad), ErrorCode::kInvalidArgument,
                       kNeeds);
    for (const RopeStaging other : {RopeStaging::kAuto, RopeStaging::kFused}) {
      bad.rope_staging = other;
      api_detail::validate_prefill_config(bad);  // the kernels rotate
    }
  }
  const BatchPrefillConfig kernel = api_detail::staged_rope_kernel_config(c);
  EXPECT_EQ(kernel.params.pos_encoding, PosEncoding::kNone);
  EXPECT_EQ(kernel.rope_staging, RopeStaging::kFused);
  const PrefillTiles tiles{128, 128, true};
  EXPECT_EQ(batch_prefill_kernels(kernel, tiles).prefill.label.find("rope"), std::string::npos);
  EXPECT_NE(batch_prefill_kernels(c, tiles).prefill.label.find("rope"), std::string::npos);
}

// fused_rope_key_reads by hand: causal b1 1024 on 128-row tiles sees 128 + 256 + ... + 1024
// keys (4.5 a key), an append of one tile reads each key once, a tile without the mask reads
// them all, GQA packs 4 rows a token, a window caps each tile, and queries past the cache see
// what there is.
TEST(FusedRopeKeyReads, CountsTheKeysEachQueryTileSees) {
  const auto reads = [](std::vector<int32_t> qo, std::vector<int32_t> kv, int group, int tile,
                        MaskMode mask = MaskMode::kCausal, int window = -1) {
    return fused_rope_key_reads(qo, kv, group, tile, mask, window);
  };
  EXPECT_DOUBLE_EQ(reads({0, 1024}, {0, 1024}, 1, 128), 4.5);
  EXPECT_DOUBLE_EQ(reads({0, 128}, {0, 32768}, 1, 128), 1.0);
  EXPECT_DOUBLE_EQ(reads({0, 1024}, {0, 1024}, 1, 128, MaskMode::kNone), 8.0);
  EXPECT_DOUBLE_EQ(reads({0, 256}, {0, 256}, 4, 128), (32.0 * 28 + 256) / 256);  // 8 tiles
  // Tile 0 sees its 128 keys, each later one 127 more before its first token.
  EXPECT_DOUBLE_EQ(reads({0, 4096}, {0, 4096}, 1, 128, MaskMode::kCausal, 127),
                   (128.0 + 31 * 255) / 4096);
  EXPECT_DOUBLE_EQ(reads({0, 1024}, {0, 1024}, 1, 128, MaskMode::kNone, 1023), 8.0);
  EXPECT_DOUBLE_EQ(reads({0, 10}, {0, 5}, 1, 16), 1.0);
  // Requests sum: 4608 + 32768 reads of 1024 + 32768 keys; empty ones count their keys only.
  EXPECT_DOUBLE_EQ(reads({0, 1024, 1152, 1152}, {0, 1024, 33792, 33800}, 1, 128),
                   (4608.0 + 32768) / 33800);
  EXPECT_DOUBLE_EQ(reads({0, 0}, {0, 0}, 1, 128), 0.0);
  // 64 rows a token over 16-row tiles: each token's rows span 4 tiles, each reading its keys.
  EXPECT_DOUBLE_EQ(reads({0, 2}, {0, 2}, 64, 16), (4.0 * 1 + 4.0 * 2) / 2);
}

// plan_stages_rope: kFused never, kStaged always, kAuto by the measure on configs where staging
// applies (not paged).
// A causal RoPE prefill on ragged K/V, 4 / 4 heads of 128 dims, of these capacities.
BatchPrefillConfig causal_rope_ragged(int max_batch, int max_total_qo) {
  BatchPrefillConfig c;
  c.max_batch = max_batch, c.max_total_qo = max_total_qo, c.num_qo_heads = c.num_kv_heads = 4;
  c.head_dim_qk = c.head_dim_vo = 128;
  c.kv = PrefillKV::kRagged;
  c.params.mask = MaskMode::kCausal;
  c.params.pos_encoding = PosEncoding::kRopeLlama;
  return c;
}

TEST(FusedRopeKeyReads, PlanStagesByTheRopeStagingAndTheMeasure) {
  BatchPrefillConfig c = causal_rope_ragged(1, 1024);
  const std::vector<int32_t> prefill_q = {0, 1024}, prefill_kv = {0, 1024};
  const std::vector<int32_t> append_q = {0, 128}, append_kv = {0, 32768};
  const PrefillTiles tiles{128, 128, true};
  EXPECT_TRUE(api_detail::plan_stages_rope(c, prefill_q, prefill_kv, tiles));
  EXPECT_FALSE(api_detail::plan_stages_rope(c, append_q, append_kv, tiles));
  c.rope_staging = RopeStaging::kStaged;
  EXPECT_TRUE(api_detail::plan_stages_rope(c, append_q, append_kv, tiles));
  c.rope_staging = RopeStaging::kFused;
  EXPECT_FALSE(api_detail::plan_stages_rope(c, prefill_q, prefill_kv, tiles));
  c.rope_staging = RopeStaging::kAuto;
  c.kv = PrefillKV::kPaged;
  c.page_size = 16;
  const std::vector<int32_t> pages = {0, 64};
  EXPECT_FALSE(api_detail::plan_stages_rope(c, prefill_q, pages, tiles));
}

// Under use_cuda_graph staging needs max_total_kv (the k copy's rows, allocated at creation),
// and the choice is the config's, every plan alike: max_batch prefills of max_total_qo /
// max_batch tokens on the fixed tiles; the capacities bound the captured rotation's 2^31 pieces.
TEST(FusedRopeKeyReads, GraphConfigsStageByTheirCapacities) {
  BatchPrefillConfig c = causal_rope_ragged(4, 4096);
  c.use_cuda_graph = true;
  EXPECT_FALSE(api_detail::rope_staging_applies(c));
  c.rope_staging = RopeStaging::kStaged;
  EXPECT_FLARE_ERROR(api_detail::validate_prefill_config(c), ErrorCode::kInvalidArgument,
                     "under use_cuda_graph max_total_kv >= 1");
  c.rope_staging = RopeStaging::kAuto;
  c.max_total_kv = 8192;
  EXPECT_TRUE(api_detail::rope_staging_applies(c));
  const PrefillTiles tiles{128, 128, true};
  EXPECT_TRUE(api_detail::graph_stages_rope(c, tiles));  // 1024-token prefills: 4.5 a key
  const std::vector<int32_t> append_q = {0, 128}, append_kv = {0, 4096};
  EXPECT_TRUE(api_detail::plan_stages_rope(c, append_q, append_kv, tiles));  // the config's
  c.max_total_qo = 4 * 128;  // one query tile a request
  EXPECT_FALSE(api_detail::graph_stages_rope(c, tiles));
  c.rope_staging = RopeStaging::kStaged;
  EXPECT_TRUE(api_detail::graph_stages_rope(c, tiles));
  c.max_total_kv = int64_t{1} << 30;  // x 4 heads x 8 pieces: past 2^31
  EXPECT_FLARE_ERROR(api_detail::graph_stages_rope(c, tiles), ErrorCode::kUnsupported,
                     "2^31 16-byte pieces of q or k a run, under use_cuda_graph");
  c.rope_staging = RopeStaging::kAuto;
  c.max_total_qo = 4096;
  EXPECT_FALSE(api_detail::graph_stages_rope(c, tiles));
}

TEST(BatchPrefillConfigNvfp4, KvDtypeAndCapacityChecked) {
  BatchPrefillConfig c;
  c.max_batch = 1, c.max_total_qo = 1, c.num_qo_heads = 1, c.num_kv_heads = 1;
  c.head_dim_qk = c.head_dim_vo = 128;
  c.kv_dtype = DType::kE4M3;
  EXPECT_FLARE_ERROR(api_detail::validate_prefill_config(c), ErrorCode::kUnsupported,
                     "kv_dtype must be dtype (bfloat16) or uint8 (NVFP4), got float8_e4m3");
  c.kv_dtype = DType::kU8;
  EXPECT_FLARE_ERROR(api_detail::validate_prefill_config(c), ErrorCode::kInvalidArgument,
                     "needs max_total_kv >= 1");
  c.max_total_kv = 4;
  api_detail::validate_prefill_config(c);
}

}  // namespace
}  // namespace flare
