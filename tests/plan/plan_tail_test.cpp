// The dynamic tail (PlanOptions::tail_*, src/plan/dynamic_tail.cpp): where it applies, what it
// cuts, the bounds the workspace reserves for it, and option errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "flare/core/error.h"
#include "flare/plan/plan.h"
#include "plan/plan_testing.h"

namespace flare {
namespace {

using plan_testing::check_plan;
using plan_testing::LengthProblem;

PlanOptions tail_options(int chunks = 4, float fraction = 0.15f, int min_chunk = 64) {
  PlanOptions options;
  options.tail_chunks_per_cta = chunks;
  options.tail_fraction = fraction;
  options.tail_min_chunk = min_chunk;
  return options;
}

int64_t tail_items(const Plan& p) {
  return static_cast<int64_t>(p.work_items.size()) - p.tail_begin;
}

int64_t kv_tokens(const Plan& p, size_t begin, size_t end) {
  int64_t sum = 0;
  for (size_t i = begin; i < end; ++i) sum += p.work_items[i].kv_end - p.work_items[i].kv_begin;
  return sum;
}

// The benchmark's b64 shape: 64 requests of 8192 tokens, 8 KV heads, 132 SMs x 4 CTAs.
TEST(DynamicTail, CutsEachCtasLastItemIntoChunksOfTheSharedTail) {
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 8192), 32, 8, 128, 16);
  const PlanOptions options = tail_options();
  const Plan without = plan(p.problem, {132, 4});
  const Plan with = plan(p.problem, {132, 4}, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(with, p.problem, options, 528));
  EXPECT_EQ(tail_items(without), 0);
  EXPECT_EQ(without.tail_chunk, 0);

  // mean = 64 * 8 * 8192 / 528 = 7943.8 tokens; 15% is 1191, in 4 chunks of 298 -> 304 (page).
  EXPECT_EQ(with.tail_chunk, 304);
  EXPECT_GT(tail_items(with), 0);
  EXPECT_LE(tail_items(with), int64_t{4} * 528);
  // The same KV, only regrouped: the static queues lose exactly what the tail holds.
  const size_t tail_begin = static_cast<size_t>(with.tail_begin);
  EXPECT_EQ(kv_tokens(with, 0, with.work_items.size()),
            kv_tokens(without, 0, without.work_items.size()));
  const int64_t in_tail = kv_tokens(with, tail_begin, with.work_items.size());
  EXPECT_GT(in_tail, 0);
  for (int cta = 0; cta < with.num_ctas; ++cta) {
    const auto c = static_cast<size_t>(cta);
    const int64_t before = kv_tokens(without, static_cast<size_t>(without.cta_indptr[c]),
                                     static_cast<size_t>(without.cta_indptr[c + 1]));
    const int64_t after = kv_tokens(with, static_cast<size_t>(with.cta_indptr[c]),
                                    static_cast<size_t>(with.cta_indptr[c + 1]));
    EXPECT_LE(after, before) << "CTA " << cta;
    EXPECT_GE(after, before - 1191 - 15) << "CTA " << cta << " gives at most the peel";
    EXPECT_EQ(with.cta_indptr[c + 1] - with.cta_indptr[c],
              without.cta_indptr[c + 1] - without.cta_indptr[c])
        << "queues keep their items";
  }
}

TEST(DynamicTail, IsDeterministic) {
  const std::vector<int32_t> kv = plan_testing::zipf_lengths(96, 6000, 3);
  LengthProblem p(std::vector<int32_t>(kv.size(), 1), kv, 32, 8, 128, 16);
  const PlanOptions options = tail_options(3, 0.2f, 32);
  const Plan a = plan(p.problem, {132, 4}, options);
  const Plan b = plan(p.problem, {132, 4}, options);
  ASSERT_NO_FATAL_FAILURE(check_plan(a, p.problem, options, 528));
  EXPECT_GT(tail_items(a), 0);
  plan_testing::expect_same_plan(a, b);
}

TEST(DynamicTail, OffWhenChunksWouldBeShorterThanTheMinimum) {
  // b16 kv4096: mean 993 tokens, 15% in 4 chunks = 48 tokens < 64.
  LengthProblem p(std::vector<int32_t>(16, 1), std::vector<int32_t>(16, 4096), 32, 8, 128, 16);
  const Plan result = plan(p.problem, {132, 4}, tail_options());
  ASSERT_NO_FATAL_FAILURE(check_plan(result, p.problem, tail_options(), 528));
  EXPECT_EQ(tail_items(result), 0);
  const Plan finer = plan(p.problem, {132, 4}, tail_options(4, 0.15f, 48));
  EXPECT_GT(tail_items(finer), 0);
}

TEST(DynamicTail, OffForBatchInvariantAndUnsplitPlans) {
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 8192), 32, 8, 128, 16);
  PlanOptions fixed = tail_options();
  fixed.fixed_split_size = 1024;
  EXPECT_EQ(tail_items(plan(p.problem, {132, 4}, fixed)), 0);
  PlanOptions unsplit = tail_options();
  unsplit.disable_split_kv = true;
  const Plan result = plan(p.problem, {132, 4}, unsplit);
  EXPECT_EQ(tail_items(result), 0);
  EXPECT_EQ(result.num_partial_slots, 0);
}

TEST(DynamicTail, FitsTheWorkspaceThatReservesIt) {
  LengthProblem p(std::vector<int32_t>(64, 1), std::vector<int32_t>(64, 8192), 32, 8, 128, 16);
  const Plan result = plan(p.problem, {132, 4}, tail_options());
  WorkspaceBounds bounds;
  bounds.max_batch = 64;
  bounds.max_total_qo = 64;
  bounds.num_ctas = 528;
  bounds.max_query_tile = result.query_tile;
  bounds.num_qo_heads = 32;
  bounds.num_kv_heads = 8;
  bounds.head_dim_vo = 128;
  EXPECT_GT(result.num_partial_slots, 2 * 528);
  EXPECT_THROW(check_fits(result, workspace_layout(bounds)), Error) << "no room for the tail";
  bounds.tail_chunks_per_cta = 4;
  const WorkspaceLayout layout = workspace_layout(bounds);
  EXPECT_EQ(layout.max_partial_slots, int64_t{(2 + 5) * 528});
  EXPECT_NO_THROW(check_fits(result, layout));

  bounds.tail_chunks_per_cta = 65;
  EXPECT_THROW(workspace_layout(bounds), Error);
}

TEST(DynamicTail, BadOptionsAreRefused) {
  LengthProblem p({1}, {100}, 8, 8);
  for (const PlanOptions& options :
       {tail_options(-1), tail_options(65), tail_options(4, -0.1f), tail_options(4, 1.0f),
        tail_options(4, 0.2f, -1)}) {
    EXPECT_THROW(plan(p.problem, {4, 1}, options), Error);
  }
}

}  // namespace
}  // namespace flare
