// One-queue plans (PlanOptions::one_queue): the queue order; items covering every KV head when
// the queue alone balances, Algorithm 1's pieces otherwise; head-minor partial slots; batch
// invariance under fixed_split_size; determinism; item_heads and the KV-head-major queue order
// in the plan region.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "flare/core/error.h"
#include "flare/plan/plan.h"
#include "plan/plan_testing.h"
#include "testing/random.h"

namespace flare {
namespace {

using plan_testing::check_plan;
using plan_testing::LengthProblem;

constexpr int kKvTile = 64;
const DeviceSpec kH100Prefill{132, 2};  // 264 resident CTAs

PlanOptions one_queue(int kv_tile = kKvTile) {
  PlanOptions options;
  options.one_queue = true;
  options.kv_tile = kv_tile;
  return options;
}

std::vector<int32_t> uniform_lengths(int64_t batch, uint64_t seed) {
  testing::Rng rng(seed);
  std::vector<int32_t> lengths(static_cast<size_t>(batch));
  for (int32_t& length : lengths) length = static_cast<int32_t>(rng.uniform_int(1, 2047));
  return lengths;
}

// The queue order (plan/plan.h): length class descending, request, KV head, row descending,
// KV position.
void expect_queue_order(const Plan& plan, int kv_tile) {
  const auto key = [kv_tile](const WorkItem& item) {
    const auto tiles = static_cast<uint32_t>((item.kv_end - item.kv_begin + kv_tile - 1) / kv_tile);
    return std::tuple(-std::bit_width(tiles), item.request, item.kv_head, -item.row_begin,
                      item.kv_begin);
  };
  for (size_t i = 1; i < plan.work_items.size(); ++i) {
    ASSERT_LT(key(plan.work_items[i - 1]), key(plan.work_items[i])) << "queue position " << i;
  }
}

void expect_even_split(const Plan& plan) {
  const auto items = static_cast<int64_t>(plan.work_items.size());
  for (int c = 0; c <= plan.num_ctas; ++c) {
    EXPECT_EQ(plan.cta_indptr[static_cast<size_t>(c)], items * c / plan.num_ctas) << "CTA " << c;
  }
}

TEST(OneQueue, ManyTilesGiveItemsCoveringEveryKvHeadInQueueOrder) {
  // plan-latency's prefill at batch 64: causal, q_len = kv_len, mean 1024.
  const std::vector<int32_t> lengths = uniform_lengths(64, 64);
  LengthProblem p(lengths, lengths, 32, 8, 128, 16, /*causal=*/true);
  PlanOptions options = one_queue();
  options.query_tile = 128;
  const Plan result = plan(p.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 264));
  EXPECT_EQ(result.item_heads, 8);
  size_t tiles = 0;
  for (const int32_t length : lengths) tiles += static_cast<size_t>((length * 4 + 127) / 128);
  EXPECT_EQ(result.work_items.size(), tiles) << "one item per tile: no cuts, no fill splits";
  EXPECT_EQ(result.num_partial_slots, 0);
  for (const WorkItem& item : result.work_items) EXPECT_EQ(item.kv_head, 0);
  ASSERT_NO_FATAL_FAILURE(expect_queue_order(result, kKvTile));
  expect_even_split(result);
}

// Every queue entry (an item under each of its item_heads KV heads) as (request, KV head,
// rows, KV range).
std::multiset<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t>> entries(
    const Plan& plan) {
  std::multiset<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t>> set;
  for (const WorkItem& item : plan.work_items) {
    for (int32_t h = 0; h < plan.item_heads; ++h) {
      set.insert({item.request, item.kv_head + h, item.row_begin, item.row_end, item.kv_begin,
                  item.kv_end});
    }
  }
  return set;
}

TEST(OneQueue, FillSplitsKeepAlgorithmOnesPiecesInQueueOrder) {
  // 64 one-row requests of 2048 tokens x 8 KV heads on 264 CTAs: two entries a CTA end 3% past
  // the mean, and at item_cost 0 Algorithm 1 cuts fill splits.
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 2048), 32, 8, 128, 16,
                  /*causal=*/false);
  const PlanOptions options = one_queue();
  const Plan result = plan(p.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 264));
  EXPECT_EQ(result.item_heads, 8) << "Algorithm 1 over one group of all 8 heads on 264 / 8 CTAs";
  EXPECT_GT(result.merge_items.size(), 0u);
  ASSERT_NO_FATAL_FAILURE(expect_queue_order(result, kKvTile));
  expect_even_split(result);
  // The same pieces as the per-CTA plan, in another order.
  const Plan reference = plan(p.problem, kH100Prefill, PlanOptions{});
  EXPECT_GT(reference.work_items.size(), 64u * 8) << "fill splits";
  EXPECT_EQ(entries(result), entries(reference));
  EXPECT_EQ(result.num_partial_slots, reference.num_partial_slots);
}

TEST(OneQueue, AlgorithmOneRunsOverHeadGroupsThatDivideTheCtas) {
  // The NVFP4 prefill's q1 batch: 8 KV heads on 396 CTAs (3 an SM). Algorithm 1 runs over two
  // groups of 4 heads on 99 CTAs: items cover 4 heads (4x fewer than per head), and the queue's
  // entries are the pieces the per-head schedule cuts (the per-CTA plan's), fill splits
  // included; uniform and spread lengths.
  const DeviceSpec three_a_sm{132, 3};
  const PlanOptions options = one_queue();
  testing::Rng rng(17);
  for (const int spread : {0, 1024}) {
    std::vector<int32_t> kv(64);
    for (int32_t& length : kv) {
      length = 2048 + (spread == 0 ? 0 : static_cast<int32_t>(rng.uniform_int(-spread, spread)));
    }
    LengthProblem p(std::vector<int32_t>(64, 1), kv, 32, 8, 128, 16, /*causal=*/false);
    const Plan result = plan(p.problem, three_a_sm, options);
    ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 396));
    EXPECT_EQ(result.item_heads, 4) << "spread " << spread;
    EXPECT_GT(result.num_partial_slots, 0) << "fill splits";
    for (const WorkItem& item : result.work_items) {
      EXPECT_TRUE(item.kv_head == 0 || item.kv_head == 4);
    }
    ASSERT_NO_FATAL_FAILURE(expect_queue_order(result, kKvTile));
    const Plan reference = plan(p.problem, three_a_sm, PlanOptions{});
    EXPECT_EQ(entries(result), entries(reference)) << "spread " << spread;
    EXPECT_EQ(result.num_partial_slots, reference.num_partial_slots);
  }
  // A CTA count that no divisor of the heads above 1 divides: one head an item, as before.
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 2048), 32, 8, 128, 16,
                  /*causal=*/false);
  const Plan odd = plan(p.problem, {131, 3}, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(odd, p.problem, options, 393));
  EXPECT_EQ(odd.item_heads, 1);
  EXPECT_GT(odd.num_partial_slots, 0);
}

TEST(OneQueue, AlgorithmOnesChunksWithoutFillSplitsGiveItemsCoveringEveryKvHead) {
  // One append of 16 tokens on 32768 and one on 4096: 8 tiles on 264 CTAs need cuts, after
  // which no fill split is made, and the queue holds each chunk once for all 8 KV heads (8x
  // fewer items to write and read than Algorithm 1's pieces).
  LengthProblem p({16, 16}, {32768, 4096}, 32, 8, 128, 16, /*causal=*/true);
  const PlanOptions options = one_queue();
  const Plan result = plan(p.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 264));
  EXPECT_EQ(result.item_heads, 8);
  EXPECT_GT(result.merge_items.size(), 0u);
  ASSERT_NO_FATAL_FAILURE(expect_queue_order(result, kKvTile));
  const Plan reference = plan(p.problem, kH100Prefill, PlanOptions{});
  EXPECT_EQ(entries(result), entries(reference));
  EXPECT_EQ(result.num_partial_slots, reference.num_partial_slots);
}

// The dynamic queue under the cost model: each of `ctas` CTAs takes the next entry when it
// ends the last; returns the latest end over the mean load.
double queue_end_over_mean(const Plan& plan, const PlanOptions& options, int ctas) {
  std::vector<double> ends(static_cast<size_t>(ctas), 0.0);
  double total = 0;
  for (const WorkItem& item : plan.work_items) {
    const double cost = plan_testing::item_cost(item, options);
    for (int h = 0; h < plan.item_heads; ++h) {
      *std::min_element(ends.begin(), ends.end()) += cost;
      total += cost;
    }
  }
  return *std::max_element(ends.begin(), ends.end()) / (total / ctas);
}

TEST(OneQueue, QueueOrdersEndingNearTheMeanSkipAlgorithmOne) {
  // 1,024 tiles x KV heads on 132 CTAs: the longest entry is a quarter of a CTA's mean load
  // (more than the 1/8 that needs no check), yet longest class first ends within 2% of it.
  const DeviceSpec hopper{132, 1};
  PlanOptions options = one_queue(128);
  options.query_tile = 128;
  for (const auto& [batch, length] : {std::pair{1, 4096}, std::pair{4, 1024}}) {
    const std::vector<int32_t> lengths(static_cast<size_t>(batch), length);
    LengthProblem p(lengths, lengths, 32, 8, 128, 16, /*causal=*/true);
    const Plan result = plan(p.problem, hopper, options);
    ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 132));
    EXPECT_EQ(result.item_heads, 8) << "batch " << batch;
    EXPECT_EQ(result.num_partial_slots, 0);
    EXPECT_LE(queue_end_over_mean(result, options, 132), 1.02 + 128.0 / 4096) << "batch " << batch;
    ASSERT_NO_FATAL_FAILURE(expect_queue_order(result, 128));
  }
  // As many entries as CTAs: all start at the launch and end together (no fill split needed).
  const std::vector<int32_t> one_tile_rows(33, 32);  // x group 4: one 128-row tile each
  const std::vector<int32_t> equal_kv(33, 2048);
  LengthProblem one_round(one_tile_rows, equal_kv, 32, 8, 128, 16, /*causal=*/false);
  const Plan round = plan(one_round.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(round, one_round.problem, options, 264));
  EXPECT_EQ(round.item_heads, 8);
  EXPECT_EQ(round.num_partial_slots, 0);
  EXPECT_LE(queue_end_over_mean(round, options, 264), 1.0 + 1e-9);
  // 64 one-row requests on 264 CTAs: two entries a CTA end 3% past the mean, so Algorithm 1
  // cuts fill splits, and its plan ends closer to the mean.
  const std::vector<int32_t> rows(64, 1);
  const std::vector<int32_t> kv(64, 2048);
  LengthProblem decode_like(rows, kv, 32, 8, 128, 16, /*causal=*/false);
  PlanOptions small = one_queue(64);
  const Plan split = plan(decode_like.problem, kH100Prefill, small);
  ASSERT_NO_FATAL_FAILURE(check_plan(split, decode_like.problem, small, 264));
  EXPECT_EQ(split.item_heads, 8);
  EXPECT_GT(split.num_partial_slots, 0);
  EXPECT_LT(queue_end_over_mean(split, small, 264), 1.03);
}

TEST(OneQueue, AnItemsFixedCostKeepsFillSplitsFromPilingTails) {
  // The same 64 one-row requests as above. With an item's fixed cost at 128 tokens (the prefill
  // wrapper's at head_dim 128), a fill split would leave a CTA a 48-token tail that costs more
  // than the 3% it saves: the plan is the queue of whole tiles, an item for all 8 KV heads,
  // and it ends within the fill tolerance plus one item under that cost.
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 2048), 32, 8, 128, 16,
                  /*causal=*/false);
  PlanOptions options = one_queue();
  options.item_cost = 128;
  const Plan result = plan(p.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, 264));
  EXPECT_EQ(result.item_heads, 8);
  EXPECT_EQ(result.work_items.size(), 64u);
  EXPECT_EQ(result.num_partial_slots, 0);
  const double item = options.alpha * 4 + options.item_cost;
  EXPECT_LE(queue_end_over_mean(result, options, 264), 1.02 + item / (2048 + item) / 1.94);
  // At 8192 tokens the same 3% is worth a tail: fill splits, and the model's end improves.
  LengthProblem longer(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 8192), 32, 8, 128, 16,
                       /*causal=*/false);
  const Plan split = plan(longer.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(split, longer.problem, options, 264));
  EXPECT_EQ(split.item_heads, 8);
  EXPECT_GT(split.num_partial_slots, 0);
  EXPECT_LT(queue_end_over_mean(split, options, 264), 1.025);
  // The per-CTA plan records item_cost in each CTA's cost (check_plan sums it per item).
  PlanOptions per_cta;
  per_cta.item_cost = 128;
  const Plan static_plan = plan(longer.problem, kH100Prefill, per_cta);
  ASSERT_NO_FATAL_FAILURE(check_plan(static_plan, longer.problem, per_cta, 264));
}

TEST(OneQueue, QueueRatesKeepWholeTilesWhereTheirLastRoundStreamsFaster) {
  // q1 batches on 264 CTAs at BatchPrefill's item cost, with the rates fitted to the H200 sweep
  // (docs/perf.md, twenty-fifth session): 40 requests of 1024 tokens (320 entries, 56 CTAs with
  // a second) end sooner whole, since the 56 stream at the bandwidth's share of 56, not of 264;
  // at 8192 tokens the second round is long enough that Algorithm 1's cuts win.
  PlanOptions options = one_queue();
  options.item_cost = 128;
  options.query_tile = 16;
  const auto problem = [](int batch, int kv) {
    return LengthProblem(std::vector<int32_t>(static_cast<size_t>(batch), 1),
                         std::vector<int32_t>(static_cast<size_t>(batch), kv), 32, 8, 128, 16,
                         /*causal=*/false);
  };
  LengthProblem short_kv = problem(40, 1024);
  LengthProblem long_kv = problem(40, 8192);
  ASSERT_GT(plan(short_kv.problem, kH100Prefill, options).num_partial_slots, 0)
      << "without rates: cut";
  options.queue_rates = {30e3 / 512, 4.6e6 / 512, 8};
  const Plan whole = plan(short_kv.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(whole, short_kv.problem, options, 264));
  EXPECT_EQ(whole.num_partial_slots, 0);
  EXPECT_EQ(whole.item_heads, 8);
  EXPECT_EQ(whole.work_items.size(), 40u);
  ASSERT_NO_FATAL_FAILURE(expect_queue_order(whole, kKvTile));
  const Plan cut = plan(long_kv.problem, kH100Prefill, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(cut, long_kv.problem, options, 264));
  EXPECT_GT(cut.num_partial_slots, 0);
  // Without the merge's price the cut plan wins at 1024 too; fixed_split_size keeps its chunks.
  options.queue_rates.merge_us = 0;
  options.queue_rates.device = 1e12;  // no sharing: every CTA at `cta`
  EXPECT_GT(plan(short_kv.problem, kH100Prefill, options).num_partial_slots, 0);
  options.queue_rates = {30e3 / 512, 4.6e6 / 512, 8};
  options.fixed_split_size = 512;
  EXPECT_GT(plan(short_kv.problem, kH100Prefill, options).num_partial_slots, 0);
}

TEST(OneQueue, QueueRatesWeighOnlyAlikeTilesAndKeepTheWholeQueueNearTheSoonestEnd) {
  PlanOptions options = one_queue();
  options.item_cost = 128;
  options.query_tile = 16;
  const auto problem = [](int batch, int kv, int kv_step) {
    std::vector<int32_t> kv_len(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) kv_len[static_cast<size_t>(i)] = kv + (i % 2) * kv_step;
    return LengthProblem(std::vector<int32_t>(static_cast<size_t>(batch), 1), kv_len, 32, 8, 128,
                         16, /*causal=*/false);
  };
  // 150 x 8 entries of 1024 tokens: four full rounds and 144 CTAs with a fifth, which stream
  // near the bandwidth's share (the whole queue ends within the merge's price of all the work at
  // full bandwidth: no Algorithm 1); 64 x 8 of 8192: the second round at full bandwidth.
  for (const auto& [batch, kv] : {std::pair{150, 1024}, std::pair{64, 8192}}) {
    LengthProblem p = problem(batch, kv, 0);
    options.queue_rates = {};
    ASSERT_GT(plan(p.problem, kH100Prefill, options).num_partial_slots, 0) << batch;
    options.queue_rates = {30e3 / 512, 4.6e6 / 512, 8};
    const Plan whole = plan(p.problem, kH100Prefill, options);
    ASSERT_NO_FATAL_FAILURE(check_plan(whole, p.problem, options, 264));
    EXPECT_EQ(whole.num_partial_slots, 0) << batch;
    EXPECT_EQ(whole.item_heads, 8);
    EXPECT_EQ(whole.work_items.size(), static_cast<size_t>(batch));
    ASSERT_NO_FATAL_FAILURE(expect_queue_order(whole, kKvTile));
  }
  // 32 q16 requests of 2048 at 64-row tiles (the Hopper family's rates): without rates the
  // queue of chunks cut at 2000 ends near the mean and is kept (tails of 48 tokens, 256 merges);
  // with them the whole queue, one round at the bandwidth's share, is at the soonest end.
  {
    PlanOptions wide = options;
    wide.queue_rates = {};
    wide.query_tile = 64;
    wide.kv_tile = 128;
    LengthProblem p(std::vector<int32_t>(32, 16), std::vector<int32_t>(32, 2048), 32, 8, 128, 16,
                    /*causal=*/false);
    ASSERT_GT(plan(p.problem, kH100Prefill, wide).num_partial_slots, 0);
    wide.queue_rates = {27e3 / 512, 0.76 * 4.92e6 / 512, 8};
    const Plan whole = plan(p.problem, kH100Prefill, wide);
    ASSERT_NO_FATAL_FAILURE(check_plan(whole, p.problem, wide, 264));
    EXPECT_EQ(whole.num_partial_slots, 0);
    EXPECT_EQ(whole.work_items.size(), 32u);
  }
  // Lengths alternating 1024 / 1040: not weighed, the plan of Algorithm 1 as without rates.
  LengthProblem mixed = problem(150, 1024, 16);
  options.queue_rates = {};
  const Plan without = plan(mixed.problem, kH100Prefill, options);
  ASSERT_GT(without.num_partial_slots, 0);
  options.queue_rates = {30e3 / 512, 4.6e6 / 512, 8};
  plan_testing::expect_same_plan(without, plan(mixed.problem, kH100Prefill, options));
}

TEST(OneQueue, FixedSplitSizeSlotsAreHeadMinorAndBatchInvariant) {
  PlanOptions options = one_queue();
  options.fixed_split_size = 100;  // rounded up to 112 (page 16)
  options.query_tile = 16;
  std::vector<int32_t> kv = uniform_lengths(40, 3);
  kv[7] = 1000;
  std::vector<int32_t> qo(kv.size(), 4);
  LengthProblem batched(qo, kv, 8, 2, 64, 16, /*causal=*/true);
  const Plan b = plan(batched.problem, {7, 1}, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(b, batched.problem, options, 7));
  ASSERT_EQ(b.item_heads, 2);
  ASSERT_GT(b.num_partial_slots, 0);
  for (const WorkItem& item : b.work_items) {
    if (item.partial_slot >= 0) {
      EXPECT_EQ(item.partial_slot % 2, 0) << "head 0's slot";
    }
  }

  // Request 7 alone is a few tiles (Algorithm 1, which makes no fill split under
  // fixed_split_size: its chunks, an item for both KV heads): the same chunks.
  LengthProblem alone({4}, {1000}, 8, 2, 64, 16, /*causal=*/true);
  const Plan a = plan(alone.problem, {7, 1}, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(a, alone.problem, options, 7));
  EXPECT_EQ(a.item_heads, 2);
  std::set<std::tuple<int32_t, int32_t, int32_t>> chunks_a;
  std::set<std::tuple<int32_t, int32_t, int32_t>> chunks_b;
  for (const WorkItem& item : a.work_items) {
    chunks_a.insert({item.row_begin, item.kv_begin, item.kv_end});
  }
  for (const WorkItem& item : b.work_items) {
    if (item.request == 7) chunks_b.insert({item.row_begin, item.kv_begin, item.kv_end});
  }
  EXPECT_EQ(chunks_a, chunks_b);
}

TEST(OneQueue, RandomProblemsPassTheStructureCheckAndFitTheirBounds) {
  testing::Rng rng(31);
  int queue_plans = 0;
  int split_queue_plans = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t batch = rng.uniform_int(1, 120);
    std::vector<int32_t> qo(static_cast<size_t>(batch));
    std::vector<int32_t> kv(static_cast<size_t>(batch));
    for (size_t i = 0; i < qo.size(); ++i) {
      kv[i] = static_cast<int32_t>(rng.uniform() < 0.05 ? 0 : rng.uniform_int(1, 3000));
      qo[i] = rng.uniform() < 0.5 ? kv[i] : static_cast<int32_t>(rng.uniform_int(0, kv[i]));
    }
    const int kv_heads = static_cast<int>(rng.uniform_int(1, 8));
    const int group = std::vector<int>{1, 4, 7, 8}[static_cast<size_t>(rng.uniform_int(0, 3))];
    const int page = std::vector<int>{1, 3, 16}[static_cast<size_t>(rng.uniform_int(0, 2))];
    const int window = rng.uniform() < 0.2 ? static_cast<int>(rng.uniform_int(0, 500)) : -1;
    LengthProblem p(qo, kv, kv_heads * group, kv_heads, 64, page, rng.uniform() < 0.7, window);
    PlanOptions options = one_queue(std::vector<int>{16, 32, 64, 128}[trial % 4]);
    const double mode = rng.uniform();
    if (mode < 0.1) options.disable_split_kv = true;
    if (mode > 0.8) options.fixed_split_size = static_cast<int>(rng.uniform_int(1, 1000));
    options.query_tile = std::vector<int>{0, 16, 64, 128}[static_cast<size_t>(trial % 4)];
    const DeviceSpec device{static_cast<int>(rng.uniform_int(1, 140)),
                            static_cast<int>(rng.uniform_int(1, 2))};
    const Plan result = plan(p.problem, device, options);
    const int ctas = device.num_sms * device.ctas_per_sm;
    ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, options, ctas)) << "trial " << trial;
    ASSERT_NO_FATAL_FAILURE(expect_queue_order(result, options.kv_tile)) << "trial " << trial;
    queue_plans += result.item_heads > 1;
    split_queue_plans += result.item_heads > 1 && result.num_partial_slots > 0;

    WorkspaceBounds bounds;
    bounds.max_batch = static_cast<int>(batch);
    bounds.max_total_qo = 0;
    for (const int32_t q : qo) bounds.max_total_qo += q;
    bounds.num_ctas = ctas;
    bounds.max_query_tile = 128;
    bounds.num_qo_heads = kv_heads * group;
    bounds.num_kv_heads = kv_heads;
    bounds.head_dim_vo = 64;
    bounds.max_partial_slots = std::max(result.num_partial_slots, 2 * ctas);
    if (bounds.max_total_qo > 0) {
      ASSERT_NO_THROW(check_fits(result, workspace_layout(bounds))) << "trial " << trial;
    }
  }
  EXPECT_GT(queue_plans, 50);
  EXPECT_GT(split_queue_plans, 5);
}

TEST(OneQueue, RepeatedPlansAreIdentical) {
  const std::vector<int32_t> lengths = uniform_lengths(256, 5);
  LengthProblem p(lengths, lengths, 32, 8, 128, 16, /*causal=*/true);
  const Plan first = plan(p.problem, kH100Prefill, one_queue());
  LengthProblem other({16}, {30000}, 32, 8, 128, 16, true);
  (void)plan(other.problem, kH100Prefill, one_queue());
  Plan second;
  plan(p.problem, kH100Prefill, one_queue(), second);
  plan_testing::expect_same_plan(first, second);
  EXPECT_EQ(first.item_heads, 8);
}

TEST(OneQueue, OptionsAreChecked) {
  LengthProblem p({4}, {40}, 8, 2, 64, 16);
  EXPECT_THROW(plan(p.problem, {7, 1}, one_queue(0)), Error);
  PlanOptions waves = one_queue();
  waves.waves = 2;
  EXPECT_THROW(plan(p.problem, {7, 1}, waves), Error);
}

TEST(OneQueue, PlanRegionCarriesItemHeads) {
  const std::vector<int32_t> lengths = uniform_lengths(64, 9);
  LengthProblem p(lengths, lengths, 32, 8, 128, 16, /*causal=*/true);
  const Plan result = plan(p.problem, kH100Prefill, one_queue());
  ASSERT_EQ(result.item_heads, 8);
  WorkspaceBounds bounds;
  bounds.max_batch = 64;
  bounds.max_total_qo = 64 * 2048;
  bounds.num_ctas = 264;
  bounds.max_query_tile = 128;
  bounds.num_qo_heads = 32;
  bounds.num_kv_heads = 8;
  bounds.head_dim_vo = 128;
  const WorkspaceLayout layout = workspace_layout(bounds);
  std::vector<std::byte> region(layout.plan_bytes);
  write_plan_region(result, layout, region.data());
  PlanCounts counts;
  std::memcpy(&counts, region.data() + layout.counts, sizeof(counts));
  EXPECT_EQ(counts.item_heads, 8);
  EXPECT_EQ(counts.num_work_items, static_cast<int32_t>(result.work_items.size()));
  EXPECT_EQ(counts.head_major, result.head_major_queue ? 1 : 0);
}

// Block-sparse rows (BlockSparseAttentionWrapper: a 64-row request a block row, its blocks'
// keys) of alike lengths: the longest entry is short against one head's share, so the queue
// runs KV head major (the entries running at once read one head's K/V); a few causal requests
// whose longest tiles are long against a head's share keep the longest-first order across
// heads, which KV head major would give up (the last head's longest tile would start late).
TEST(OneQueue, KvHeadMajorWhereItEndsAsEarlyAsHeadMinor) {
  testing::Rng rng(3);
  std::vector<int32_t> rows(256, 64), keys(256);
  for (int32_t& k : keys) k = 64 * static_cast<int32_t>(rng.uniform_int(200, 250));
  LengthProblem sparse(rows, keys, 32, 32, 128, 64);
  const Plan sparse_plan = plan(sparse.problem, {132, 1}, one_queue());
  EXPECT_EQ(sparse_plan.item_heads, 32);
  EXPECT_TRUE(sparse_plan.head_major_queue);
  EXPECT_EQ(sparse_plan.counts().head_major, 1);
  check_plan(sparse_plan, sparse.problem, one_queue(), 132);

  const std::vector<int32_t> causal_lengths(4, 1024);
  LengthProblem causal(causal_lengths, causal_lengths, 32, 32, 128, 16, /*causal=*/true);
  PlanOptions options = one_queue();
  options.query_tile = 128;
  const Plan causal_plan = plan(causal.problem, {132, 1}, options);
  EXPECT_EQ(causal_plan.item_heads, 32);
  EXPECT_FALSE(causal_plan.head_major_queue);
  EXPECT_EQ(causal_plan.counts().head_major, 0);
}

}  // namespace
}  // namespace flare
