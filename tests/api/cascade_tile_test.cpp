// The query tile of a cascade's one launch (api_detail::cascade_query_tile, used by
// BatchPrefill::plan_cascade): a prefix group of many decode requests takes a tile holding all
// its rows (it is then read once per KV head, not once per 16 rows), short shared prefixes keep
// the decode-sized tile, long appends the large one; kFA3 limits keep it at 64 or more. No GPU.
#include <gtest/gtest.h>

#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/plan/cascade.h"
#include "src/api/cascade_plan.h"

namespace flare {
namespace {

constexpr double kH200PeakBytesPerUs = 3201e-3 * 2 * 6016 / 8 * 1e3;

BatchPrefillConfig config_of(int heads, int kv_heads) {
  BatchPrefillConfig c;
  c.num_qo_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim_qk = c.head_dim_vo = 128;
  return c;
}

PrefillDeviceLimits hopper() {
  PrefillDeviceLimits limits;
  limits.warpgroup_mma = true;
  return limits;
}

// Table 5's shape: `batch` decode requests (q_len tokens each) under one prefix, own suffixes.
int tile_for(int batch, int q_len, int prefix, int suffix, int heads, int kv_heads,
             PrefillDeviceLimits limits = hopper()) {
  std::vector<int32_t> qo0{0, batch * q_len}, qo1, kv0{prefix}, kv1(batch, suffix);
  for (int r = 0; r <= batch; ++r) qo1.push_back(r * q_len);
  const std::vector<CascadeLevelLengths> levels{{qo0, kv0}, {qo1, kv1}};
  CascadeBatch cascade;
  cascade_batch(levels, q_len > 1, cascade);
  return api_detail::cascade_query_tile(cascade, config_of(heads, kv_heads), limits,
                                        kH200PeakBytesPerUs);
}

TEST(CascadeTile, APrefixSharedByManyDecodesIsOneTile) {
  EXPECT_EQ(tile_for(64, 1, 32768, 128, 32, 32), 64);  // 64 rows a KV head: one 64-row tile
  EXPECT_EQ(tile_for(64, 1, 8192, 128, 32, 32), 64);
  EXPECT_EQ(tile_for(16, 1, 32768, 128, 32, 32), 16);  // 16 rows fit the smallest tile
  EXPECT_EQ(tile_for(100, 1, 32768, 128, 32, 32), 128);
  EXPECT_EQ(tile_for(32, 1, 16384, 128, 32, 8), 128);  // GQA 4: 128 packed rows a KV head
}

TEST(CascadeTile, NoPrefixKeepsTheDecodeTile) {
  EXPECT_EQ(tile_for(64, 1, 0, 128, 32, 32), 16);
  EXPECT_EQ(tile_for(16, 1, 0, 2048, 32, 8), 16);
}

TEST(CascadeTile, LongAppendsTakeTheLargeTile) {
  EXPECT_EQ(tile_for(4, 512, 1024, 512, 32, 32), 128);
}

TEST(CascadeTile, Fa3LimitsStayAtSixtyFourRowsOrMore) {
  PrefillDeviceLimits fa3 = hopper();
  fa3.warpgroup_only = true;
  EXPECT_GE(tile_for(64, 1, 0, 128, 32, 32, fa3), 64);
}

}  // namespace
}  // namespace flare
