// BatchPrefill's split decision (PlanOptions::queue_rates, set by api_detail::plan_prefill from
// the tiles and the device's DRAM peak): which batches take the queue of whole tiles. No GPU
// needed: the host planning path BatchPrefill::plan() runs, on the figures of an H200 (4.81
// TB/s: 3201 MHz x 6016 bits) and an H100 (3.35 TB/s), 132 SMs.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "src/api/prefill_plan.h"

namespace flare {
namespace {

constexpr double kH200PeakBytesPerUs = 3201e-3 * 2 * 6016 / 8 * 1e3;
constexpr double kH100PeakBytesPerUs = 2619e-3 * 2 * 5120 / 8 * 1e3;
constexpr int kSms = 132;
constexpr int kPage = 16;

BatchPrefillConfig paged_config(int batch, int q_len, DType kv_dtype) {
  BatchPrefillConfig c;
  c.kv = PrefillKV::kPaged;
  c.page_size = kPage;
  c.max_batch = batch;
  c.max_total_qo = batch * q_len;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim_qk = 128;
  c.head_dim_vo = 128;
  c.dtype = DType::kF16;
  c.kv_dtype = kv_dtype;
  c.max_total_kv = kv_dtype == DType::kU8 ? 1 << 20 : 0;
  return c;
}

// The plan of `batch` requests of q_len query and kv_len KV tokens at `tiles`.
Plan planned(int batch, int q_len, int kv_len, PrefillTiles tiles, int ctas_per_sm, double peak,
             DType kv_dtype = DType::kF16) {
  const BatchPrefillConfig config = paged_config(batch, q_len, kv_dtype);
  const int32_t pages = (kv_len + kPage - 1) / kPage;
  std::vector<int32_t> qo_indptr, kv_indptr, last;
  for (int i = 0; i <= batch; ++i) {
    qo_indptr.push_back(i * q_len);
    kv_indptr.push_back(i * pages);
  }
  last.assign(static_cast<size_t>(batch), (kv_len - 1) % kPage + 1);
  api_detail::PrefillHostPlan out;
  api_detail::validate_prefill_batch(config, tiles, {}, qo_indptr, kv_indptr, last, {}, out);
  api_detail::plan_prefill(config, kSms, ctas_per_sm, peak, out);
  return out.plan;
}

constexpr PrefillTiles kSyncTiles{16, 64, false};
constexpr PrefillTiles kWarpgroupTiles{64, 128, true};

TEST(PrefillPlanRates, DecodeLikeBatchesTakeWholeTilesWhereTheLastRoundStreamsFaster) {
  // q1, 16-row tiles, 2 CTAs an SM (H200 sweep: 174.3 -> 156.7 us at b150 kv1024).
  for (const double peak : {kH200PeakBytesPerUs, kH100PeakBytesPerUs}) {
    const Plan whole = planned(150, 1, 1024, kSyncTiles, 2, peak);
    EXPECT_EQ(whole.num_partial_slots, 0) << peak;
    EXPECT_EQ(whole.work_items.size(), 150u);
    EXPECT_EQ(whole.item_heads, 8);
  }
  // Without the device's peak there is no rate to weigh with: Algorithm 1's cut plan.
  EXPECT_GT(planned(150, 1, 1024, kSyncTiles, 2, 0).num_partial_slots, 0);
  // A long second round: the cut plan (b40 kv8192: 1.22x faster than whole tiles).
  EXPECT_GT(planned(40, 1, 8192, kSyncTiles, 2, kH200PeakBytesPerUs).num_partial_slots, 0);
}

TEST(PrefillPlanRates, HopperTilesOfSixtyFourRowsAreWeighedToo) {
  // q16 at GQA 4 = 64 rows (H200 sweep: b24 kv4096 147.8 -> 112.6 us, b16 kv2048 58.6 -> 46.9).
  EXPECT_EQ(planned(24, 16, 4096, kWarpgroupTiles, 2, kH200PeakBytesPerUs).num_partial_slots, 0);
  EXPECT_EQ(planned(16, 16, 2048, kWarpgroupTiles, 2, kH200PeakBytesPerUs).num_partial_slots, 0);
  // Half the CTAs idle at long pieces: cut (b16 kv8192 whole lost 3-15%); few tiles: cut.
  EXPECT_GT(planned(16, 16, 8192, kWarpgroupTiles, 2, kH200PeakBytesPerUs).num_partial_slots, 0);
  EXPECT_GT(planned(8, 16, 4096, kWarpgroupTiles, 2, kH200PeakBytesPerUs).num_partial_slots, 0);
}

TEST(PrefillPlanRates, NvFp4AndLongTilesAreNotWeighed) {
  // NVFP4 K/V: its conversion bounds it and Algorithm 1's cuts win (b64 q1 kv2048 1.23x).
  EXPECT_GT(planned(150, 1, 1024, kSyncTiles, 2, kH200PeakBytesPerUs, DType::kU8).num_partial_slots,
            0);
  // 32-row mma.sync tiles are not the memory-bound class the rates were fitted on: as without.
  const Plan with_peak = planned(150, 8, 1024, PrefillTiles{32, 64, false}, 2, kH200PeakBytesPerUs);
  const Plan without = planned(150, 8, 1024, PrefillTiles{32, 64, false}, 2, 0);
  ASSERT_GT(without.num_partial_slots, 0);
  EXPECT_EQ(with_peak.work_items.size(), without.work_items.size());
  EXPECT_EQ(with_peak.num_partial_slots, without.num_partial_slots);
}

}  // namespace
}  // namespace flare
