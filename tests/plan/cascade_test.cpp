// Cascade plans (flare/plan/cascade.h): cascade_batch + plan() + cascade_merge_map, run by
// execute_cascade_cpu, equal each level's float64 reference merged with ⊕ (decode and append
// stages, two and three levels, empty shared groups, GQA 1/4/8, page sizes 1/16, #CTA
// 1/7/132); the merge map's structure (every token's row merged once, a piece's entries inside
// their slots, write-through tiles alone on their rows); malformed levels are refused.
#include "flare/plan/cascade.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flare/core/error.h"
#include "flare/reference/execute_cascade.h"
#include "testing/cascade_case.h"
#include "testing/compare.h"

namespace flare {
namespace {

constexpr int kHeadDim = 32;

Plan plan_cascade_lengths(const CascadeBatch& batch, int num_qo_heads, int num_kv_heads,
                          int page_size, bool causal, int num_ctas, int query_tile) {
  PlanProblem problem;
  problem.qo_len = batch.plan_qo_len;
  problem.kv_len = batch.kv_len;
  problem.q_offset = batch.q_offset;
  problem.num_qo_heads = num_qo_heads;
  problem.num_kv_heads = num_kv_heads;
  problem.head_dim_qk = problem.head_dim_vo = kHeadDim;
  problem.page_size = page_size;
  problem.causal = causal;
  PlanOptions options;
  options.one_queue = true;
  options.kv_tile = 64;
  options.query_tile = query_tile;
  Plan plan = flare::plan(problem, {num_ctas, 1}, options);
  cascade_merge_map(batch, plan);
  return plan;
}

// Every (token, query head) row is written by exactly one write-through item or merge piece,
// and every merge entry lies inside its slot.
void expect_rows_written_once(const Plan& plan, const CascadeBatch& batch, int64_t group) {
  const int64_t rows_total = batch.total_qo * group * plan.num_kv_heads;
  std::vector<int> written(static_cast<size_t>(rows_total), 0);
  auto mark = [&](int32_t request, int64_t kv_head, int64_t row_begin, int64_t row_end) {
    for (int64_t r = row_begin; r < row_end; ++r) {
      const int64_t token = batch.qo_begin[static_cast<size_t>(request)] + r / group;
      const int64_t head = kv_head * group + r % group;
      ++written[static_cast<size_t>(token * group * plan.num_kv_heads + head)];
    }
  };
  for (const WorkItem& item : plan.work_items) {
    if (item.partial_slot >= 0) continue;
    for (int32_t h = 0; h < plan.item_heads; ++h) {
      mark(item.request, item.kv_head + h, item.row_begin, item.row_end);
    }
  }
  ASSERT_EQ(plan.merge_slots.size(), plan.merge_row_offsets.size());
  for (size_t m = 0; m < plan.merge_items.size(); ++m) {
    const MergeItem& merge = plan.merge_items[m];
    EXPECT_GE(merge.request, batch.first_request[static_cast<size_t>(batch.num_levels()) - 1]);
    for (int32_t h = 0; h < plan.merge_heads; ++h) {
      mark(merge.request, merge.kv_head + h, merge.row_begin, merge.row_end);
    }
    for (int32_t s = plan.merge_indptr[m]; s < plan.merge_indptr[m + 1]; ++s) {
      EXPECT_GE(plan.merge_slots[static_cast<size_t>(s)], 0);
      EXPECT_LE(plan.merge_slots[static_cast<size_t>(s)] + plan.merge_heads,
                plan.num_partial_slots);
      EXPECT_LE(plan.merge_row_offsets[static_cast<size_t>(s)] + merge.row_end - merge.row_begin,
                plan.query_tile);
    }
  }
  for (int64_t i = 0; i < rows_total; ++i) {
    ASSERT_EQ(written[static_cast<size_t>(i)], 1) << "row " << i;
  }
}

struct Shape {
  const char* name;
  int levels, requests, q_min, q_max, max_prefix, max_suffix;
  bool causal;
};

const Shape kShapes[] = {
    {"decode_two_levels", 2, 17, 1, 1, 300, 40, false},
    {"decode_two_levels_causal", 2, 9, 1, 1, 130, 21, true},
    {"append_causal", 2, 7, 1, 9, 200, 33, true},
    {"append_non_causal", 2, 6, 2, 13, 77, 50, false},
    {"three_levels_decode", 3, 23, 1, 1, 90, 17, true},
    {"three_levels_append", 3, 8, 1, 6, 64, 40, true},
};

using Param = std::tuple<int, int, int, int>;  // shape, group, page size, CTAs

// A cascade of kShapes[shape_index] with `kv_heads` KV heads and `group` query heads each, its
// batch built.
struct ShapeCase {
  testing::CascadeCase c;
  CascadeBatch batch;

  ShapeCase(const Shape& shape, int group, int kv_heads, int page_size, uint64_t seed)
      : c(testing::random_cascade(shape.levels, shape.requests, shape.q_min, shape.q_max,
                                  shape.max_prefix, shape.max_suffix, shape.causal, seed),
          group * kv_heads, kv_heads, kHeadDim, page_size, DType::kF32, seed) {
    const std::vector<CascadeLevelLengths> levels = c.lengths();
    cascade_batch(levels, shape.causal, batch);
  }
};

// `plan` writes every row once and, run by the CPU executor, gives the levels merged (float64
// oracle).
void expect_executes_like_levels_merged(const Plan& plan, const ShapeCase& sc, int group,
                                        const std::string& what) {
  expect_rows_written_once(plan, sc.batch, group);
  const int64_t heads = int64_t{group} * plan.num_kv_heads;
  HostTensor o(DType::kF32, {sc.c.total_q, heads, kHeadDim});
  HostTensor lse(DType::kF32, {sc.c.total_q, heads});
  testing::poison(o.view());
  testing::poison(lse.view());
  execute_cascade_cpu(plan, sc.batch, sc.c.problems, {o.view(), lse.view()});
  HostTensor want_o(DType::kF32, {sc.c.total_q, heads, kHeadDim});
  HostTensor want_lse(DType::kF32, {sc.c.total_q, heads});
  sc.c.oracle(want_o.view(), want_lse.view());
  EXPECT_LE(testing::max_abs_error(o.view(), want_o.view()), 1e-4) << what;
  // -inf rows (no key in any level) must match exactly; error_stats treats equal infinities
  // as equal.
  EXPECT_LE(testing::max_abs_error(lse.view(), want_lse.view()), 1e-4) << what;
}

class CascadePlan : public ::testing::TestWithParam<Param> {};

TEST_P(CascadePlan, ExecutesLikeLevelsMerged) {
  const auto [shape_index, group, page_size, ctas] = GetParam();
  const Shape& shape = kShapes[shape_index];
  const int kv_heads = 2;
  const uint64_t seed = 100 + static_cast<uint64_t>(shape_index * 7 + group + page_size + ctas);
  const ShapeCase sc(shape, group, kv_heads, page_size, seed);
  for (const int query_tile : {16, 64}) {
    const Plan plan = plan_cascade_lengths(sc.batch, group * kv_heads, kv_heads, page_size,
                                           shape.causal, ctas, query_tile);
    expect_executes_like_levels_merged(
        plan, sc, group, std::string(shape.name) + " tile " + std::to_string(query_tile));
  }
}

// 4 KV heads on CTA counts that 2 divides but 4 does not: where Algorithm 1 runs (here on 50 and
// 66 CTAs for most shapes), its items cover 2 of the 4 heads (plan/plan.h), and the merge map
// lists each head's chunks.
TEST(CascadePlan, ItemsOverPartOfTheHeadsExecuteLikeLevelsMerged) {
  const int kv_heads = 4, group = 2;
  int part_head_plans = 0;
  for (int shape_index = 0; shape_index < 6; ++shape_index) {
    const Shape& shape = kShapes[shape_index];
    const ShapeCase sc(shape, group, kv_heads, 16, 900 + static_cast<uint64_t>(shape_index));
    for (const int ctas : {6, 50, 66}) {
      const Plan plan =
          plan_cascade_lengths(sc.batch, group * kv_heads, kv_heads, 16, shape.causal, ctas, 16);
      part_head_plans += plan.item_heads == 2;
      expect_executes_like_levels_merged(plan, sc, group,
                                         std::string(shape.name) + " ctas " + std::to_string(ctas));
    }
  }
  EXPECT_GT(part_head_plans, 0) << "no plan had items over part of the heads";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CascadePlan,
                         ::testing::Combine(::testing::Range(0, 6), ::testing::Values(1, 4, 8),
                                            ::testing::Values(1, 16),
                                            ::testing::Values(1, 7, 132)));

TEST(CascadePlanStructure, EmptySharedLevelWritesThrough) {
  // No prefix anywhere: the last level's unsplit tiles (one CTA: no splits) write o directly,
  // nothing is merged.
  testing::CascadeSpec spec;
  spec.qo_indptr = {{0, 4, 8}, {0, 1, 2, 3, 4, 5, 6, 7, 8}};
  spec.kv_len = {{0, 0}, {5, 9, 1, 0, 30, 2, 2, 7}};
  CascadeBatch batch;
  std::vector<CascadeLevelLengths> levels{{spec.qo_indptr[0], spec.kv_len[0]},
                                          {spec.qo_indptr[1], spec.kv_len[1]}};
  cascade_batch(levels, false, batch);
  EXPECT_EQ(batch.plan_qo_len[0], 0);
  const Plan plan = plan_cascade_lengths(batch, 8, 2, 16, false, 1, 16);
  EXPECT_TRUE(plan.merge_items.empty());
  EXPECT_EQ(plan.num_partial_slots, 0);
  for (const WorkItem& item : plan.work_items) EXPECT_EQ(item.partial_slot, -1);
}

TEST(CascadePlanStructure, SharedPrefixReadOncePerTile) {
  // 64 decode requests under one 1000-token prefix, 32 / 32 heads at 16-row tiles: the prefix
  // is one virtual request of 64 rows per KV head (4 tiles), not 64.
  std::vector<int32_t> per_request(65);
  for (int i = 0; i <= 64; ++i) per_request[static_cast<size_t>(i)] = i;
  const std::vector<int32_t> prefix_indptr{0, 64};
  const std::vector<int32_t> prefix_kv{1000};
  const std::vector<int32_t> suffix_kv(64, 128);
  std::vector<CascadeLevelLengths> levels{{prefix_indptr, prefix_kv}, {per_request, suffix_kv}};
  CascadeBatch batch;
  cascade_batch(levels, true, batch);
  EXPECT_EQ(batch.q_offset[0], 999);  // all prefix keys visible to a causal kernel
  EXPECT_EQ(batch.q_offset[1], 127);
  const Plan plan = plan_cascade_lengths(batch, 32, 32, 16, true, 132, 16);
  int64_t prefix_tokens = 0;
  for (const WorkItem& item : plan.work_items) {
    if (item.request == 0) prefix_tokens += int64_t{item.kv_end - item.kv_begin} * plan.item_heads;
  }
  EXPECT_EQ(prefix_tokens, 4 * 32 * 1000);
  // Every request's row under every head is one piece of two states or more: one merge item
  // each, or one for all heads where the work items cover every head.
  EXPECT_EQ(plan.merge_heads, plan.item_heads == 32 ? 32 : 1);
  EXPECT_EQ(plan.merge_items.size() * static_cast<size_t>(plan.merge_heads), 64u * 32u);
  expect_rows_written_once(plan, batch, 1);
}

// BatchPrefill reuses one Plan object for plan_cascade() and plan(): an ordinary plan into it
// after a cascade keeps no row offsets of the cascade's map.
TEST(CascadePlanStructure, AnOrdinaryPlanAfterACascadeHasNoRowOffsets) {
  const std::vector<int32_t> prefix_indptr{0, 4}, prefix_kv{500}, per_request{0, 1, 2, 3, 4};
  const std::vector<int32_t> suffix_kv{9, 0, 33, 2};
  const std::vector<CascadeLevelLengths> levels{{prefix_indptr, prefix_kv},
                                                {per_request, suffix_kv}};
  CascadeBatch batch;
  cascade_batch(levels, false, batch);
  Plan reused = plan_cascade_lengths(batch, 8, 2, 16, false, 132, 16);
  ASSERT_FALSE(reused.merge_row_offsets.empty());
  const std::vector<int32_t> qo{1, 1, 1}, kv{4000, 3000, 5000};
  PlanProblem problem;
  problem.qo_len = qo;
  problem.kv_len = kv;
  problem.num_qo_heads = 8;
  problem.num_kv_heads = 2;
  problem.head_dim_qk = problem.head_dim_vo = kHeadDim;
  problem.page_size = 16;
  PlanOptions options;
  options.one_queue = true;
  options.kv_tile = 64;
  options.query_tile = 16;
  plan(problem, {132, 1}, options, reused);
  EXPECT_TRUE(reused.merge_row_offsets.empty());
  EXPECT_FALSE(reused.merge_items.empty());  // split: the map is the ordinary one
}

TEST(CascadePlanStructure, MalformedLevelsAreRefused) {
  CascadeBatch batch;
  const std::vector<int32_t> a{0, 3, 5}, b{0, 2, 6}, bad{0, 4, 2};
  const std::vector<int32_t> kv2{4, 4}, negative{4, -1}, kv1{4};
  auto expect_error = [&](std::vector<CascadeLevelLengths> levels, const std::string& text) {
    try {
      cascade_batch(levels, false, batch);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error({}, "at least one level");
  expect_error({{a, kv2}, {b, kv2}}, "level 1's qo_indptr ends at 6 tokens, level 0's at 5");
  expect_error({{bad, kv2}}, "non-decreasing");
  expect_error({{a, negative}}, "group 1 has -1 KV tokens");
  expect_error({{a, kv1}}, "one KV length per group");
}

}  // namespace
}  // namespace flare
