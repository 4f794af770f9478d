// The shape of plans: query tile selection, KV ranges under causal masks and windows, empty
// tiles, write-through and merge order, L_kv (auto, fixed, disabled), CTA budgets, and the
// full structural check over many random problems and options.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "flare/plan/plan.h"
#include "plan/plan_testing.h"
#include "testing/random.h"

namespace flare {
namespace {

using plan_testing::check_plan;
using plan_testing::LengthProblem;

DeviceSpec device_with(int num_sms, int ctas_per_sm = 1) { return {num_sms, ctas_per_sm}; }

TEST(QueryTile, AutoPicksSmallestTileAtLeastTheAveragePackedLength) {
  struct Case {
    std::vector<int32_t> qo;
    int group;
    int expected;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1}, 1, 1},       // decode without GQA: one packed row per request
      {{1, 1}, 4, 16},         // decode, group 4: 4 packed rows
      {{1, 1}, 16, 16},        // exactly 16
      {{1, 2}, 16, 32},        // average 24
      {{17, 0, 0}, 1, 32},     // empty requests do not lower the average (17, not 17 / 3)
      {{64, 64}, 1, 64},       // exactly 64
      {{100, 29}, 1, 128},     // average 64.5
      {{4096, 4096}, 8, 128},  // capped
  };
  for (const Case& c : cases) {
    LengthProblem p(c.qo, std::vector<int32_t>(c.qo.size(), 10), 8 * c.group, 8);
    EXPECT_EQ(plan(p.problem, device_with(4)).query_tile, c.expected)
        << "group " << c.group << " first qo_len " << c.qo[0];
  }
  LengthProblem none({0, 0}, {5, 5}, 8, 8);
  EXPECT_EQ(plan(none.problem, device_with(4)).work_items.size(), 0u);
}

TEST(QueryTile, ExplicitTileIsUsedAsIs) {
  LengthProblem p({3, 1}, {40, 9}, 28, 4);  // group 7
  PlanOptions options;
  options.query_tile = 7;
  const Plan result = plan(p.problem, device_with(3), options);
  EXPECT_EQ(result.query_tile, 7);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 3));
  // 21 + 7 packed rows in tiles of 7: 3 + 1 tiles per KV head.
  EXPECT_EQ(result.work_items.size() - static_cast<size_t>(result.num_partial_slots) +
                result.merge_items.size(),
            4u * 4u);
}

TEST(TileRanges, CausalPrefillTilesSeeTheirDiagonalPrefix) {
  // q_len == kv_len == 300, tiles of 128 rows: tile t sees [0, min(300, 128 (t + 1))).
  LengthProblem p({300}, {300}, 1, 1, 64, 1, /*causal=*/true);
  PlanOptions options;
  options.disable_split_kv = true;
  const Plan result = plan(p.problem, device_with(2), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 2));
  ASSERT_EQ(result.query_tile, 128);
  std::vector<std::pair<int32_t, int32_t>> ranges;
  for (const WorkItem& item : result.work_items) ranges.push_back({item.row_begin, item.kv_end});
  std::sort(ranges.begin(), ranges.end());
  EXPECT_EQ(ranges, (std::vector<std::pair<int32_t, int32_t>>{{0, 128}, {128, 256}, {256, 300}}));
}

TEST(TileRanges, AppendAndWindowShrinkTheRange) {
  // Append: q_len 5 < kv_len 50 (positions 45..49). Window 10: token 0 sees [35, 46).
  LengthProblem p({5}, {50}, 2, 2, 64, 1, /*causal=*/true, /*window_left=*/10);
  PlanOptions options;
  options.query_tile = 16;
  options.disable_split_kv = true;
  const Plan result = plan(p.problem, device_with(1), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 1));
  ASSERT_EQ(result.work_items.size(), 2u);
  for (const WorkItem& item : result.work_items) {
    EXPECT_EQ(item.kv_begin, 35);
    EXPECT_EQ(item.kv_end, 50);
  }
}

TEST(TileRanges, RowsThatSeeNothingGetOneEmptyItem) {
  // Request 0: kv_len 0. Request 1: causal with q_len 4 > kv_len 2 and a tile of 2 rows: the
  // first tile (tokens 0, 1 at positions -2, -1) sees nothing. Request 2: q_len 0, no tiles.
  LengthProblem p({3, 4, 0}, {0, 2, 7}, 1, 1, 64, 16, /*causal=*/true);
  PlanOptions options;
  options.query_tile = 2;
  const Plan result = plan(p.problem, device_with(5), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 5));
  int empty = 0;
  for (const WorkItem& item : result.work_items) {
    EXPECT_NE(item.request, 2);
    if (item.kv_begin == item.kv_end) {
      ++empty;
      EXPECT_EQ(item.partial_slot, -1);
    }
  }
  EXPECT_EQ(empty, 3);  // two tiles of request 0, one of request 1
}

TEST(Splitting, LongRequestIsSplitAndMergedInKvOrder) {
  // One request of 10,000 tokens among 50 of 10 on 16 CTAs: it must be split.
  std::vector<int32_t> kv(51, 10);
  kv[20] = 10000;
  LengthProblem p(std::vector<int32_t>(51, 1), kv, 4, 1, 128, 16);
  const PlanOptions options;
  const Plan result = plan(p.problem, device_with(16), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 16));
  ASSERT_EQ(result.merge_items.size(), 1u);
  EXPECT_EQ(result.merge_items[0].request, 20);
  EXPECT_GE(result.num_partial_slots, 8);
  EXPECT_EQ(result.kv_chunk % 16, 0);
  for (const WorkItem& item : result.work_items) {
    EXPECT_EQ(item.partial_slot >= 0, item.request == 20) << "only the long request splits";
  }
}

TEST(Splitting, FixedSplitSizeCutsAtItsPageRoundedMultiples) {
  LengthProblem p({1, 1, 1}, {100, 37, 16}, 8, 2, 64, 16);
  PlanOptions options;
  options.fixed_split_size = 20;  // rounded up to 32
  const Plan result = plan(p.problem, device_with(7), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 7));
  EXPECT_EQ(result.kv_chunk, 32);
  // 100 -> 4 chunks, 37 -> 2, 16 -> 1; per KV head.
  EXPECT_EQ(result.work_items.size(), 2u * (4 + 2 + 1));
  EXPECT_EQ(result.num_partial_slots, 2 * (4 + 2));
}

TEST(Splitting, FixedSplitSizeIsBatchInvariant) {
  // A request's chunks and merge order do not depend on the rest of the batch.
  PlanOptions options;
  options.fixed_split_size = 64;
  LengthProblem alone({1}, {1000}, 4, 1, 64, 16);
  LengthProblem batched({1, 1, 1}, {5, 1000, 3000}, 4, 1, 64, 16);
  const Plan a = plan(alone.problem, device_with(9), options);
  const Plan b = plan(batched.problem, device_with(9), options);
  std::vector<std::pair<int32_t, int32_t>> chunks_a;
  std::vector<std::pair<int32_t, int32_t>> chunks_b;
  for (const WorkItem& item : a.work_items) chunks_a.push_back({item.kv_begin, item.kv_end});
  for (const WorkItem& item : b.work_items) {
    if (item.request == 1) chunks_b.push_back({item.kv_begin, item.kv_end});
  }
  std::sort(chunks_a.begin(), chunks_a.end());
  std::sort(chunks_b.begin(), chunks_b.end());
  EXPECT_EQ(chunks_a, chunks_b);
}

TEST(Splitting, DisableSplitKvGivesOneItemPerTile) {
  std::vector<int32_t> kv(8, 3);
  kv[0] = 50000;
  LengthProblem p(std::vector<int32_t>(8, 1), kv, 8, 8, 64, 1);
  PlanOptions options;
  options.disable_split_kv = true;
  const Plan result = plan(p.problem, device_with(132), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 132));
  EXPECT_EQ(result.work_items.size(), 64u);
  EXPECT_EQ(result.num_partial_slots, 0);
  EXPECT_EQ(result.kv_chunk, 50000);
  EXPECT_FALSE(result.split_kv);
}

TEST(Ctas, SmBudgetAndCtasPerSm) {
  LengthProblem p({1, 1, 1, 1}, {4000, 300, 20, 1}, 32, 8, 128, 16);
  PlanOptions options;
  options.num_sms_to_use = 10;
  const Plan result = plan(p.problem, device_with(132, 2), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 20));
  for (size_t c = 0; c + 1 < result.cta_indptr.size(); ++c) {
    EXPECT_LT(result.cta_indptr[c], result.cta_indptr[c + 1]) << "every CTA has work";
  }
}

TEST(Ctas, MoreCtasThanWorkLeavesEmptyQueues) {
  LengthProblem p({1}, {5}, 2, 2, 64, 16);
  const Plan result = plan(p.problem, device_with(264));
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, {}, 264));
  EXPECT_EQ(result.work_items.size(), 2u);
  EXPECT_EQ(result.num_partial_slots, 0);
}

// A grid of waves: KV cut as for the resident CTAs alone, the chunks handed out longest first
// over all CTAs of the grid (the lowest CTAs, which the hardware starts first, get the longest),
// and no fill split (every cut at a multiple of L_kv).
TEST(Waves, ChunksAreCutForTheResidentCtasAndHandedOutLongestFirst) {
  LengthProblem p(std::vector<int32_t>(64, 1), plan_testing::zipf_lengths(64, 2048, 5), 32, 8, 128,
                  16);
  PlanOptions one_wave;
  one_wave.alpha = 40.0f;  // the decode wrapper's per-item cost at D = 128, bf16 KV
  PlanOptions waves = one_wave;
  waves.waves = 2;
  const Plan single = plan(p.problem, device_with(132, 2), one_wave);
  const Plan result = plan(p.problem, device_with(132, 2), waves);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, waves, 528));
  EXPECT_EQ(result.kv_chunk, single.kv_chunk) << "cut for the 264 resident CTAs";
  EXPECT_GT(result.merge_items.size(), 0u) << "Zipf's longest requests are still split";
  for (const WorkItem& item : result.work_items) {
    const int32_t length = p.kv_len[static_cast<size_t>(item.request)];
    EXPECT_TRUE(item.kv_begin % result.kv_chunk == 0) << "no fill split";
    EXPECT_TRUE(item.kv_end == length || item.kv_end % result.kv_chunk == 0) << "no fill split";
  }
  int64_t previous_length = std::numeric_limits<int64_t>::max();
  bool empty_seen = false;
  for (int cta = 0; cta < result.num_ctas; ++cta) {
    const int32_t first = result.cta_indptr[static_cast<size_t>(cta)];
    if (first == result.cta_indptr[static_cast<size_t>(cta) + 1]) {
      empty_seen = true;
      continue;
    }
    EXPECT_FALSE(empty_seen) << "CTAs with work come first, CTA " << cta;
    const WorkItem& item = result.work_items[static_cast<size_t>(first)];
    EXPECT_LE(item.kv_end - item.kv_begin, previous_length) << "CTA " << cta;
    previous_length = item.kv_end - item.kv_begin;
  }
}

// Equal requests that fill the resident CTAs: one whole request per CTA of the grid, no
// partial states (b64 kv8192 on 2 x 264 CTAs: 512 items, none split; one wave cuts 248).
TEST(Waves, EqualRequestsStayWhole) {
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 8192), 32, 8, 128, 16);
  PlanOptions options;
  options.alpha = 40.0f;
  options.waves = 2;
  const Plan result = plan(p.problem, device_with(132, 2), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 528));
  EXPECT_EQ(result.work_items.size(), 512u);
  EXPECT_EQ(result.num_partial_slots, 0);
  for (int cta = 0; cta < result.num_ctas; ++cta) {
    EXPECT_EQ(result.cta_indptr[static_cast<size_t>(cta) + 1] -
                  result.cta_indptr[static_cast<size_t>(cta)],
              cta < 512 ? 1 : 0)
        << "CTA " << cta;
  }
  options.waves = 1;
  EXPECT_GT(plan(p.problem, device_with(132, 2), options).num_partial_slots, 0);
}

TEST(Ctas, CostsFollowAlphaAndBeta) {
  LengthProblem p({16, 1, 1}, {100, 200, 300}, 4, 4, 64, 1);
  PlanOptions options;
  options.alpha = 3.5f;
  options.beta = 0.25f;
  const Plan result = plan(p.problem, device_with(3), options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 3));  // recomputes costs
}

TEST(Determinism, RepeatedPlansAreIdentical) {
  testing::Rng rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t batch = rng.uniform_int(1, 300);
    std::vector<int32_t> qo(static_cast<size_t>(batch));
    std::vector<int32_t> kv(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) {
      qo[static_cast<size_t>(i)] = static_cast<int32_t>(rng.uniform_int(0, 40));
      kv[static_cast<size_t>(i)] = static_cast<int32_t>(rng.uniform_int(0, 5000));
    }
    const int kv_heads = static_cast<int>(rng.uniform_int(1, 4));
    LengthProblem p(qo, kv, kv_heads * static_cast<int>(rng.uniform_int(1, 8)), kv_heads, 64,
                    static_cast<int>(rng.uniform_int(1, 16)), rng.uniform() < 0.5);
    const DeviceSpec device = device_with(static_cast<int>(rng.uniform_int(1, 200)));
    const Plan first = plan(p.problem, device);
    // Plans in between must not leak state into the next one (per-thread scratch).
    LengthProblem other({7, 0, 900}, {1, 2, 3000}, 8, 2, 64, 4);
    (void)plan(other.problem, device_with(31));
    const Plan second = plan(p.problem, device);
    plan_testing::expect_same_plan(first, second);
  }
}

// Random problems of every kind under random options: every plan passes the full check.
TEST(Structure, RandomProblemsAndOptions) {
  testing::Rng rng(2024);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t batch = rng.uniform_int(0, 40);
    std::vector<int32_t> qo(static_cast<size_t>(batch));
    std::vector<int32_t> kv(static_cast<size_t>(batch));
    const int shape = static_cast<int>(rng.uniform_int(0, 3));
    for (size_t i = 0; i < qo.size(); ++i) {
      kv[i] = static_cast<int32_t>(rng.uniform() < 0.1 ? 0 : rng.uniform_int(1, 3000));
      switch (shape) {
        case 0:
          qo[i] = 1;
          break;  // decode
        case 1:
          qo[i] = kv[i];
          break;  // prefill
        case 2:
          qo[i] = static_cast<int32_t>(rng.uniform_int(0, kv[i]));
          break;  // append
        default:
          qo[i] = static_cast<int32_t>(rng.uniform_int(0, 300));  // anything
      }
    }
    if (!kv.empty() && rng.uniform() < 0.3) kv[0] = static_cast<int32_t>(rng.uniform_int(1, 60000));
    const int kv_heads = static_cast<int>(rng.uniform_int(1, 4));
    const int group = std::vector<int>{1, 4, 7, 8}[static_cast<size_t>(rng.uniform_int(0, 3))];
    const int page = std::vector<int>{1, 3, 16}[static_cast<size_t>(rng.uniform_int(0, 2))];
    const int window = rng.uniform() < 0.3 ? static_cast<int>(rng.uniform_int(0, 500)) : -1;
    LengthProblem p(qo, kv, kv_heads * group, kv_heads, 64, page, rng.uniform() < 0.6, window);
    PlanOptions options;
    const double mode = rng.uniform();
    if (mode < 0.15) options.disable_split_kv = true;
    if (mode > 0.85) options.fixed_split_size = static_cast<int>(rng.uniform_int(1, 2000));
    if (rng.uniform() < 0.3) options.query_tile = static_cast<int>(rng.uniform_int(1, 100));
    if (rng.uniform() < 0.2) options.alpha = static_cast<float>(rng.uniform(0.0, 20.0));
    const int sms = static_cast<int>(rng.uniform_int(1, 140));
    const int per_sm = static_cast<int>(rng.uniform_int(1, 2));
    if (rng.uniform() < 0.2) options.num_sms_to_use = static_cast<int>(rng.uniform_int(1, sms));
    if (rng.uniform() < 0.3) options.waves = static_cast<int>(rng.uniform_int(2, 3));
    const int ctas =
        (options.num_sms_to_use > 0 ? options.num_sms_to_use : sms) * per_sm * options.waves;
    const Plan result = plan(p.problem, device_with(sms, per_sm), options);
    ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, ctas)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace flare
