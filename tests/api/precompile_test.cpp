// CI without a GPU: the kernels precompile() compiles for a set of configurations
// (flare/api/precompile.h): a decode config's kernel, a prefill config's merge kernel and one
// kernel per tile pair its plans may pick (or its fixed tiles), each distinct unit once, and a
// bad configuration named by its list and index before anything else.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "flare/api/precompile.h"
#include "testing/expect_error.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

BatchDecodeConfig decode_config(bool tensor_cores) {
  BatchDecodeConfig c;
  c.max_batch = 1;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 16;
  c.use_tensor_cores = tensor_cores;
  return c;
}

BatchPrefillConfig prefill_config() {
  BatchPrefillConfig c;
  c.max_batch = 1;
  c.max_total_qo = 1;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim_qk = c.head_dim_vo = 128;
  c.params.mask = MaskMode::kCausal;
  return c;
}

std::set<std::string> entries(const std::vector<jit::KernelSpec>& specs) {
  std::set<std::string> out;
  for (const jit::KernelSpec& s : specs) out.insert(s.label);
  return out;
}

TEST(Precompile, EveryKernelAConfigMayLaunchOnce) {
  const std::vector<BatchDecodeConfig> decode = {decode_config(false), decode_config(true),
                                                 decode_config(true)};  // a duplicate
  const std::vector<BatchPrefillConfig> prefill = {prefill_config()};
  const std::vector<jit::KernelSpec> specs =
      kernels_to_precompile(decode, prefill, h100_prefill_limits());
  // Two decode loops; the prefill kernels of the query tiles 16, 32, 64 and 128 and one merge.
  ASSERT_EQ(specs.size(), 2u + 4u + 1u) << ::testing::PrintToString(entries(specs));
  int merges = 0;
  std::set<int> query_tiles;
  for (const jit::KernelSpec& s : specs) {
    merges += s.entry == "flare_merge";
    for (const int tile : {16, 32, 64, 128}) {
      if (s.entry == "flare_prefill" &&
          s.label.find("tile=" + std::to_string(tile) + "x") != std::string::npos) {
        query_tiles.insert(tile);
      }
    }
  }
  EXPECT_EQ(merges, 1);
  EXPECT_EQ(query_tiles, (std::set<int>{16, 32, 64, 128}));
}

TEST(Precompile, FixedTilesAndVariantsAreTheirOwnKernels) {
  BatchPrefillConfig fixed = prefill_config();
  fixed.query_tile = 64;
  BatchPrefillConfig with_variant = fixed;
  with_variant.variant = testing::user_sigmoid();
  const std::vector<BatchPrefillConfig> prefill = {fixed, with_variant};
  const std::vector<jit::KernelSpec> specs =
      kernels_to_precompile({}, prefill, h100_prefill_limits());
  // One prefill kernel each, the merge shared.
  ASSERT_EQ(specs.size(), 3u) << ::testing::PrintToString(entries(specs));
  EXPECT_NE(specs[2].label.find("user:user_sigmoid"), std::string::npos) << specs[2].label;
}

TEST(Precompile, ABadConfigurationIsNamed) {
  BatchPrefillConfig bad = prefill_config();
  bad.head_dim_qk = bad.head_dim_vo = 100;
  const std::vector<BatchPrefillConfig> prefill = {prefill_config(), bad};
  EXPECT_FLARE_ERROR(kernels_to_precompile({}, prefill, h100_prefill_limits()),
                     ErrorCode::kUnsupported, "prefill[1]: ");
  BatchDecodeConfig bad_decode = decode_config(false);
  bad_decode.num_kv_heads = 5;
  const std::vector<BatchDecodeConfig> decode = {bad_decode};
  // Before the device is asked for (none here in CI).
  EXPECT_FLARE_ERROR(precompile(decode, {}, 0), ErrorCode::kInvalidArgument,
                     "decode[0]: BatchDecode: num_kv_heads must be >= 1 and divide");
}

}  // namespace
}  // namespace flare
