// BatchDecode's plans on the GPU's geometry (its SM count): long requests split and merged,
// few tiles planned on two of four CTAs per SM outside CUDA graphs, full batches in waves, equal
// lengths cut evenly. The kernels' results: decode_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "decode_test_support.h"
#include "flare/api/batch_decode.h"
#include "flare/jit/cuda_sync.h"

namespace flare {
namespace {

// The bf16 32 q / 8 kv heads, D 128, page 16 decode the planner tests below use.
BatchDecodeConfig planner_test_config(int max_batch) {
  BatchDecodeConfig config;
  config.max_batch = max_batch;
  config.num_qo_heads = 32;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.page_size = 16;
  return config;
}

// Long single requests must be split across CTAs (that is what makes batch 1 fast) and merged.
TEST(BatchDecodePlan, LongRequestsAreSplitAndMerged) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);  // current context for the closing synchronize (run alone: sharded)
  BatchDecodeConfig config = planner_test_config(4);
  BatchDecode decode(config);
  const std::vector<int32_t> indptr = {0, 2048};
  const std::vector<int32_t> last = {16};
  decode.plan(indptr, last, nullptr);
  const Plan& plan = decode.last_plan();
  EXPECT_GT(plan.merge_items.size(), 0u);
  EXPECT_GE(plan.work_items.size(), static_cast<size_t>(plan.num_ctas) / 2);
  EXPECT_EQ(decode.rows_per_item(), 4);
  EXPECT_GE(decode.num_ctas(), cuda::device_properties(0).num_sms);
  cuda::stream_synchronize(nullptr);
}

// At most one (request, KV head, row tile) per SM: a grid of four CTAs per SM is planned (and
// launched) with two per SM, for longer chunks and fewer partial states; more tiles, or a
// CUDA-graph wrapper (whose captured grid is fixed), use every CTA.
TEST(BatchDecodePlan, FewTilesPlanTwoOfFourCtasPerSmOutsideGraphs) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);  // current context for the closing synchronize (run alone: sharded)
  BatchDecodeConfig config = planner_test_config(64);
  const int num_sms = cuda::device_properties(0).num_sms;
  for (const bool graph : {false, true}) {
    config.use_cuda_graph = graph;
    BatchDecode decode(config);
    if (decode.num_ctas() < 4 * num_sms) GTEST_SKIP() << "fewer than four CTAs per SM";
    const auto planned_ctas = [&](int batch) {
      std::vector<int32_t> indptr = {0}, last(static_cast<size_t>(batch), 16);
      for (int i = 0; i < batch; ++i) indptr.push_back(indptr.back() + 4096 / 16);
      decode.plan(indptr, last, nullptr);
      return decode.last_plan().num_ctas;
    };
    const int few = graph ? decode.num_ctas() : decode.num_ctas() / 2;
    EXPECT_EQ(planned_ctas(1), few) << "graph " << graph;                 // 8 tiles
    EXPECT_EQ(planned_ctas(16), few) << "graph " << graph;                // 128 tiles <= num_sms
    EXPECT_EQ(planned_ctas(64), decode.num_ctas()) << "graph " << graph;  // 512 tiles
  }
  cuda::stream_synchronize(nullptr);
}

// The tensor-core loop's grid is two waves of its resident CTAs: a batch with at least as many
// tiles as resident CTAs is planned over both, a smaller one (or one under an SM budget) over
// one. The CUDA-core loop plans one wave unless asked for more.
TEST(BatchDecodePlan, FullBatchesArePlannedInWaves) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);  // current context for the closing synchronize (run alone: sharded)
  for (const bool tensor_cores : {true, false}) {
    BatchDecodeConfig config = planner_test_config(256);
    config.use_tensor_cores = tensor_cores;
    config.waves = tensor_cores ? 0 : 3;
    BatchDecode decode(config);
    const int waves = tensor_cores ? 2 : 3;
    ASSERT_EQ(decode.num_ctas() % waves, 0);
    const int resident = decode.num_ctas() / waves;
    const auto planned_ctas = [&](int batch) {
      std::vector<int32_t> indptr = {0}, last(static_cast<size_t>(batch), 16);
      for (int i = 0; i < batch; ++i) indptr.push_back(indptr.back() + 2048 / 16);
      decode.plan(indptr, last, nullptr);
      const Plan& plan = decode.last_plan();
      EXPECT_TRUE(plan.merge_items.empty() || plan.num_ctas == resident) << "batch " << batch;
      return plan.num_ctas;
    };
    const int fills = (resident + 7) / 8;  // 8 KV heads: tiles >= resident CTAs
    ASSERT_LE(fills, 256);
    EXPECT_EQ(planned_ctas(fills), decode.num_ctas()) << "tensor cores " << tensor_cores;
    EXPECT_EQ(planned_ctas(256), decode.num_ctas()) << "tensor cores " << tensor_cores;
    EXPECT_EQ(planned_ctas(fills - 1), resident) << "tensor cores " << tensor_cores;
  }
  BatchDecodeConfig budget = planner_test_config(256);
  budget.use_tensor_cores = true;
  budget.num_sms_to_use = 100;
  BatchDecode decode(budget);
  std::vector<int32_t> indptr = {0}, last(256, 16);
  for (int i = 0; i < 256; ++i) indptr.push_back(indptr.back() + 2048 / 16);
  decode.plan(indptr, last, nullptr);
  EXPECT_EQ(decode.last_plan().num_ctas,
            100 * decode.num_ctas() / 2 / cuda::device_properties(0).num_sms);
  cuda::stream_synchronize(nullptr);
}

// A batch of equal lengths with fewer tiles than CTAs: every tile is cut into near-equal
// chunks and no CTA gets more than one (cuts at multiples of total KV / #CTA gave the busiest
// CTA 8 items and 12% more than the mean at batch 16, kv 4096 on 396 CTAs).
TEST(BatchDecodePlan, EqualLengthsAreCutEvenly) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);  // current context for the closing synchronize (run alone: sharded)
  BatchDecodeConfig config = planner_test_config(16);
  BatchDecode decode(config);
  const int tiles = 16 * 8;
  std::vector<int32_t> indptr = {0}, last(16, 16);
  for (int i = 0; i < 16; ++i) indptr.push_back(indptr.back() + 4096 / 16);
  decode.plan(indptr, last, nullptr);
  const Plan& plan = decode.last_plan();
  if (plan.num_ctas < 2 * tiles) GTEST_SKIP() << "fewer than two planned CTAs per tile";
  for (int cta = 0; cta < plan.num_ctas; ++cta) {
    EXPECT_LE(plan.cta_indptr[cta + 1] - plan.cta_indptr[cta], 1) << "CTA " << cta;
  }
  const int chunks = plan.num_ctas / tiles;
  const int longest = ((4096 + chunks - 1) / chunks + 15) / 16 * 16;  // page-rounded
  const int per_tile = (4096 + longest - 1) / longest;
  int32_t shortest = 4096;
  for (const WorkItem& item : plan.work_items) {
    EXPECT_LE(item.kv_end - item.kv_begin, longest);
    shortest = std::min(shortest, item.kv_end - item.kv_begin);
  }
  EXPECT_GE(shortest, 4096 - (per_tile - 1) * longest);
  EXPECT_EQ(plan.work_items.size(), static_cast<size_t>(tiles * per_tile));
  cuda::stream_synchronize(nullptr);
}

}  // namespace
}  // namespace flare
