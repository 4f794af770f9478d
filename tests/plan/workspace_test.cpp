// The workspace: section offsets fixed by the bounds alone, check_fits over 10,000 random
// problems within the bounds, its errors, and the serialized plan region read back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/plan/cascade.h"
#include "flare/plan/plan.h"
#include "plan/plan_testing.h"
#include "testing/random.h"

namespace flare {
namespace {

using plan_testing::LengthProblem;

WorkspaceBounds decode_bounds() {
  WorkspaceBounds bounds;
  bounds.max_batch = 256;
  bounds.max_total_qo = 256;
  bounds.max_total_kv_pages = 100000;
  bounds.num_ctas = 132;
  bounds.max_query_tile = 16;
  bounds.num_qo_heads = 32;
  bounds.num_kv_heads = 8;
  bounds.head_dim_vo = 128;
  return bounds;
}

TEST(WorkspaceLayout, SectionsAreAlignedOrderedAndSized) {
  const WorkspaceBounds bounds = decode_bounds();
  const WorkspaceLayout layout = workspace_layout(bounds);
  const std::vector<size_t> offsets = {layout.counts,       layout.cta_indptr,  layout.work_items,
                                       layout.merge_indptr, layout.merge_items, layout.merge_slots,
                                       layout.partial_o,    layout.partial_lse, layout.total_bytes};
  for (const size_t offset : offsets) EXPECT_EQ(offset % 256, 0u);
  EXPECT_EQ(layout.counts, 0u);
  EXPECT_EQ(layout.max_partial_slots, 2 * 132);
  EXPECT_EQ(layout.max_merge_items, 132);
  EXPECT_EQ(layout.max_work_items, 256 * 32 + 2 * 132 - 1);
  EXPECT_GE(layout.cta_indptr, layout.counts + sizeof(PlanCounts));
  EXPECT_GE(layout.work_items, layout.cta_indptr + 133 * sizeof(int32_t));
  EXPECT_GE(layout.merge_indptr, layout.work_items + layout.max_work_items * sizeof(WorkItem));
  EXPECT_GE(layout.merge_items, layout.merge_indptr + 133 * sizeof(int32_t));
  EXPECT_GE(layout.merge_slots, layout.merge_items + 132 * sizeof(MergeItem));
  EXPECT_GE(layout.plan_bytes, layout.merge_slots + 264 * sizeof(int32_t));
  EXPECT_GE(layout.partial_o, layout.plan_bytes);
  EXPECT_EQ(layout.partial_lse - layout.partial_o, 264u * 16 * 128 * sizeof(float));
  EXPECT_GE(layout.total_bytes, layout.partial_lse + 264 * 16 * sizeof(float));
  // Within the paper's bound 2 #CTA T_q H_qo (D + 1) floats (002 D.3).
  EXPECT_LE(layout.total_bytes - layout.partial_o, 2u * 132 * 16 * 32 * 129 * sizeof(float));
}

TEST(WorkspaceLayout, ExecutorSectionsAreInsideThePlanRegion) {
  WorkspaceBounds bounds = decode_bounds();
  const WorkspaceLayout without = workspace_layout(bounds);
  EXPECT_EQ(without.executor_items, without.plan_bytes) << "empty sections end the region";
  EXPECT_GE(without.executor_ctas, without.merge_slots + 264 * sizeof(int32_t));
  bounds.executor_cta_bytes = 64;
  bounds.executor_item_bytes = 16;
  const WorkspaceLayout with = workspace_layout(bounds);
  EXPECT_EQ(with.executor_ctas % 256, 0u);
  EXPECT_EQ(with.executor_items % 256, 0u);
  EXPECT_EQ(with.executor_ctas, without.executor_ctas);
  EXPECT_GE(with.executor_items, with.executor_ctas + 132 * 64);
  EXPECT_GE(with.plan_bytes, with.executor_items + static_cast<size_t>(with.max_work_items) * 16);
  EXPECT_GE(with.partial_o, with.plan_bytes);
  EXPECT_EQ(with.total_bytes - with.partial_o, without.total_bytes - without.partial_o);
  bounds.executor_item_bytes = 4097;
  EXPECT_THROW(workspace_layout(bounds), Error);
}

TEST(PlanRegion, WritingThePlanLeavesTheExecutorSections) {
  WorkspaceBounds bounds = decode_bounds();
  bounds.executor_cta_bytes = 64;
  bounds.executor_item_bytes = 16;
  const WorkspaceLayout layout = workspace_layout(bounds);
  LengthProblem p({1, 1, 1}, {5000, 20, 300}, 32, 8, 128, 16);
  const Plan result = plan(p.problem, {132, 1}, {});
  std::vector<std::byte> region(layout.plan_bytes, std::byte{0xab});
  write_plan_region(result, layout, region.data());
  for (size_t i = layout.executor_ctas; i < layout.plan_bytes; ++i) {
    ASSERT_EQ(region[i], std::byte{0xab}) << "byte " << i - layout.executor_ctas;
  }
}

TEST(WorkspaceLayout, OffsetsDependOnlyOnBounds) {
  const WorkspaceLayout a = workspace_layout(decode_bounds());
  const WorkspaceLayout b = workspace_layout(decode_bounds());
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
}

TEST(WorkspaceLayout, BadBoundsAreRejected) {
  WorkspaceBounds bounds = decode_bounds();
  bounds.num_ctas = 0;
  EXPECT_THROW(workspace_layout(bounds), Error);
  bounds = decode_bounds();
  bounds.num_kv_heads = 5;
  EXPECT_THROW(workspace_layout(bounds), Error);
  bounds = decode_bounds();
  bounds.max_query_tile = 0;
  EXPECT_THROW(workspace_layout(bounds), Error);
  bounds = decode_bounds();
  bounds.max_total_qo = -1;
  EXPECT_THROW(workspace_layout(bounds), Error);
}

void expect_too_small(const Plan& plan, const WorkspaceLayout& layout, const std::string& needle) {
  try {
    check_fits(plan, layout);
    ADD_FAILURE() << "check_fits passed; expected \"" << needle << "\"";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kWorkspaceTooSmall) << error.what();
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(CheckFits, FixedSplitSizeBeyondTheSlotsIsAClearError) {
  const WorkspaceLayout layout = workspace_layout(decode_bounds());
  std::vector<int32_t> kv(64, 4000);
  LengthProblem p(std::vector<int32_t>(64, 1), kv, 32, 8, 128, 16);
  PlanOptions options;
  options.query_tile = 4;
  options.fixed_split_size = 256;  // 16 chunks x 512 tiles
  const Plan result = plan(p.problem, {132, 1}, options);
  const int64_t slot_bytes = 16 * 129 * 4;
  expect_too_small(result, layout,
                   "plan needs 8192 partial slots (" + std::to_string(8192 * slot_bytes) +
                       " bytes), workspace has 264 (" + std::to_string(264 * slot_bytes) +
                       " bytes)");
  std::vector<std::byte> region(layout.plan_bytes);
  EXPECT_THROW(write_plan_region(result, layout, region.data()), Error);
}

TEST(CheckFits, MismatchedPlansAreRefused) {
  const WorkspaceLayout layout = workspace_layout(decode_bounds());
  LengthProblem p({1}, {10}, 32, 8, 128, 16);
  expect_too_small(plan(p.problem, {264, 1}), layout, "plan needs 264 CTAs, workspace has 132");
  PlanOptions wide;
  wide.query_tile = 32;
  expect_too_small(plan(p.problem, {132, 1}, wide), layout, "query tiles of 32 rows");
  LengthProblem wider({1}, {10}, 32, 8, 256, 16);
  PlanOptions options;
  options.query_tile = 4;
  expect_too_small(plan(wider.problem, {132, 1}, options), layout, "head_dim_vo 256");
  LengthProblem many(std::vector<int32_t>(300, 1), std::vector<int32_t>(300, 1), 32, 8, 128, 16);
  options.query_tile = 1;
  options.disable_split_kv = true;
  expect_too_small(plan(many.problem, {132, 1}, options), layout, "plan needs 9600 work items");
}

// 10,000 random problems within random bounds (batch, total query tokens, heads, #CTA, query
// tile) under random options: check_fits always passes. The documented preconditions:
// fixed_split_size 0, the plan's query tile <= max_query_tile (auto selection needs 128),
// the problem's heads and head_dim_vo those of the bounds, num_sms * ctas_per_sm == num_ctas.
TEST(CheckFits, TenThousandRandomProblemsFitTheirBounds) {
  testing::Rng rng(77);
  int64_t plans_with_splits = 0;
  int64_t max_slots_seen = 0;
  for (int trial = 0; trial < 10000; ++trial) {
    WorkspaceBounds bounds;
    bounds.max_batch = static_cast<int>(rng.uniform_int(1, 300));
    bounds.max_total_qo = static_cast<int>(
        rng.uniform() < 0.5 ? bounds.max_batch : rng.uniform_int(bounds.max_batch, 3000));
    bounds.num_kv_heads = static_cast<int>(rng.uniform_int(1, 8));
    const int group = std::vector<int>{1, 4, 7, 8}[static_cast<size_t>(rng.uniform_int(0, 3))];
    bounds.num_qo_heads = bounds.num_kv_heads * group;
    bounds.num_ctas = std::vector<int>{
        1, 7, 132, 264,
        static_cast<int>(rng.uniform_int(1, 300))}[static_cast<size_t>(rng.uniform_int(0, 4))];
    bounds.max_query_tile = rng.uniform() < 0.5 ? 128 : static_cast<int>(rng.uniform_int(1, 128));
    bounds.head_dim_vo = 64;
    const WorkspaceLayout layout = workspace_layout(bounds);

    const int64_t batch = rng.uniform_int(0, bounds.max_batch);
    std::vector<int32_t> qo(static_cast<size_t>(batch), 0);
    std::vector<int32_t> kv(static_cast<size_t>(batch), 0);
    int64_t tokens_left = bounds.max_total_qo;
    const double skew = rng.uniform();
    for (size_t i = 0; i < qo.size(); ++i) {
      const int64_t share = tokens_left / static_cast<int64_t>(qo.size() - i);
      qo[i] = static_cast<int32_t>(rng.uniform_int(0, std::min<int64_t>(tokens_left, 2 * share)));
      if (i == 0 && skew < 0.2) qo[i] = static_cast<int32_t>(tokens_left);  // one big request
      tokens_left -= qo[i];
      kv[i] = static_cast<int32_t>(rng.uniform() < 0.05 ? 0 : rng.uniform_int(0, 8000));
      if (skew > 0.8 && rng.uniform() < 0.1)
        kv[i] = static_cast<int32_t>(rng.uniform_int(0, 200000));
      if (rng.uniform() < 0.3) kv[i] = std::max(kv[i], qo[i]);
    }
    const int page = std::vector<int>{1, 3, 16}[static_cast<size_t>(rng.uniform_int(0, 2))];
    const int window = rng.uniform() < 0.2 ? static_cast<int>(rng.uniform_int(0, 300)) : -1;
    LengthProblem p(qo, kv, bounds.num_qo_heads, bounds.num_kv_heads, 64, page, rng.uniform() < 0.5,
                    window);
    PlanOptions options;
    options.query_tile = bounds.max_query_tile == 128 && rng.uniform() < 0.7
                             ? 0
                             : static_cast<int>(rng.uniform_int(1, bounds.max_query_tile));
    options.disable_split_kv = rng.uniform() < 0.1;
    if (rng.uniform() < 0.3) {
      options.alpha = static_cast<float>(rng.uniform(0.0, 50.0));
      options.beta = static_cast<float>(rng.uniform(0.01, 4.0));
    }
    const int ctas_per_sm = bounds.num_ctas % 2 == 0 && rng.uniform() < 0.3 ? 2 : 1;
    const DeviceSpec device{bounds.num_ctas / ctas_per_sm, ctas_per_sm};
    if (rng.uniform() < 0.2) {
      options.num_sms_to_use = static_cast<int>(rng.uniform_int(1, device.num_sms));
    }
    const Plan result = plan(p.problem, device, options);
    ASSERT_NO_THROW(check_fits(result, layout)) << "trial " << trial;
    plans_with_splits += result.num_partial_slots > 0;
    max_slots_seen = std::max<int64_t>(max_slots_seen, result.num_partial_slots);
  }
  // The trials exercise splitting, not only small problems.
  EXPECT_GT(plans_with_splits, 2000);
  EXPECT_GT(max_slots_seen, 200);
}

TEST(CheckFits, TileBoundIsReachedWithQueryTileOne) {
  WorkspaceBounds bounds = decode_bounds();
  bounds.max_total_qo = 1000;
  const WorkspaceLayout layout = workspace_layout(bounds);
  LengthProblem p({600, 400}, {600, 400}, 32, 8, 128, 16, true);
  PlanOptions options;
  options.query_tile = 1;
  options.disable_split_kv = true;
  const Plan result = plan(p.problem, {132, 1}, options);
  EXPECT_EQ(static_cast<int64_t>(result.work_items.size()), 1000 * 32);
  EXPECT_NO_THROW(check_fits(result, layout));
}

// The region as a kernel reads it: counts, cta_indptr of the layout's num_ctas CTAs, work
// items, merge map.
template <class T>
std::vector<T> read_array(const std::vector<std::byte>& region, size_t offset, size_t count) {
  std::vector<T> values(count);
  std::memcpy(values.data(), region.data() + offset, count * sizeof(T));
  return values;
}

TEST(PlanRegion, ReadingTheBytesBackGivesThePlan) {
  testing::Rng rng(5);
  WorkspaceBounds bounds = decode_bounds();
  bounds.num_ctas = 140;  // the plan uses 132 (num_sms_to_use): 8 CTAs with empty queues
  bounds.max_total_qo = 4000;
  const WorkspaceLayout layout = workspace_layout(bounds);
  for (int trial = 0; trial < 20; ++trial) {
    const bool long_kv = trial % 2 == 1;  // few long requests on 132 CTAs: splits
    const int64_t batch = rng.uniform_int(1, long_kv ? 12 : 200);
    std::vector<int32_t> qo(static_cast<size_t>(batch));
    std::vector<int32_t> kv(static_cast<size_t>(batch));
    for (size_t i = 0; i < qo.size(); ++i) {
      qo[i] = static_cast<int32_t>(rng.uniform_int(1, 3));
      kv[i] = static_cast<int32_t>(rng.uniform_int(0, long_kv ? 30000 : 300));
    }
    LengthProblem p(qo, kv, 32, 8, 128, 16);
    PlanOptions options;
    options.query_tile = 16;
    options.num_sms_to_use = 132;
    const Plan expected = plan(p.problem, {140, 1}, options);
    std::vector<std::byte> region(layout.plan_bytes, std::byte{0xab});
    write_plan_region(expected, layout, region.data());

    const PlanCounts counts = read_array<PlanCounts>(region, layout.counts, 1)[0];
    EXPECT_EQ(counts.num_work_items, static_cast<int32_t>(expected.work_items.size()));
    EXPECT_EQ(counts.num_merge_items, static_cast<int32_t>(expected.merge_items.size()));
    EXPECT_EQ(counts.num_partial_slots, expected.num_partial_slots);
    EXPECT_EQ(counts.num_ctas, 132);
    EXPECT_EQ(counts.item_heads, 1);
    int32_t longest = 0;  // the merge kernel walks (item, row) pairs up to it
    for (const MergeItem& m : expected.merge_items)
      longest = std::max(longest, m.row_end - m.row_begin);
    EXPECT_EQ(counts.max_merge_rows, longest);
    Plan read = expected;  // fields outside the region (tile, costs) are copied
    const std::vector<int32_t> grid_indptr =
        read_array<int32_t>(region, layout.cta_indptr, static_cast<size_t>(layout.num_ctas) + 1);
    read.cta_indptr.assign(grid_indptr.begin(), grid_indptr.begin() + counts.num_ctas + 1);
    for (size_t c = static_cast<size_t>(counts.num_ctas) + 1; c < grid_indptr.size(); ++c) {
      EXPECT_EQ(grid_indptr[c], counts.num_work_items) << "CTA beyond the plan has no work";
    }
    read.work_items =
        read_array<WorkItem>(region, layout.work_items, static_cast<size_t>(counts.num_work_items));
    read.merge_indptr = read_array<int32_t>(region, layout.merge_indptr,
                                            static_cast<size_t>(counts.num_merge_items) + 1);
    read.merge_items = read_array<MergeItem>(region, layout.merge_items,
                                             static_cast<size_t>(counts.num_merge_items));
    // Staged as partial row bases: slot x max_query_tile (plus a cascade piece's row offset).
    read.merge_slots = read_array<int32_t>(region, layout.merge_slots,
                                           static_cast<size_t>(counts.num_partial_slots));
    for (int32_t& row_base : read.merge_slots) {
      EXPECT_EQ(row_base % layout.max_query_tile, 0);
      row_base /= layout.max_query_tile;
    }
    read.num_partial_slots = counts.num_partial_slots;
    plan_testing::expect_same_plan(read, expected);
    if (long_kv) {
      EXPECT_GT(expected.num_partial_slots, 0);
    }
  }
}

// A cascade plan (plan/cascade.h) refers to a shared slot from several pieces: its merge
// sections take the bounds' own sizes, and each entry is staged as slot x max_query_tile plus
// the piece's row offset; a plan beyond them is refused.
TEST(PlanRegion, CascadeMergeEntriesAreRowBases) {
  std::vector<int32_t> per_request{0, 1, 2, 3, 4, 5};
  const std::vector<int32_t> prefix_indptr{0, 5};
  const std::vector<int32_t> prefix_kv{3000};
  const std::vector<int32_t> suffix_kv{7, 0, 60, 9, 1};
  const std::vector<CascadeLevelLengths> levels{{prefix_indptr, prefix_kv},
                                                {per_request, suffix_kv}};
  CascadeBatch batch;
  cascade_batch(levels, true, batch);
  PlanProblem problem;
  problem.qo_len = batch.plan_qo_len;
  problem.kv_len = batch.kv_len;
  problem.q_offset = batch.q_offset;
  problem.num_qo_heads = 32;
  problem.num_kv_heads = 8;
  problem.head_dim_qk = problem.head_dim_vo = 128;
  problem.page_size = 16;
  problem.causal = true;
  PlanOptions options;
  options.query_tile = 16;
  options.one_queue = true;
  options.kv_tile = 64;
  Plan cascade = plan(problem, {132, 1}, options);
  cascade_merge_map(batch, cascade);
  ASSERT_GT(cascade.merge_slots.size() * static_cast<size_t>(cascade.merge_heads),
            static_cast<size_t>(cascade.num_partial_slots) / 2);

  WorkspaceBounds bounds = decode_bounds();
  bounds.max_merge_items = 5000;
  bounds.max_merge_slots = 7000;
  const WorkspaceLayout layout = workspace_layout(bounds);
  EXPECT_EQ(layout.max_merge_items, 5000);
  EXPECT_EQ(layout.max_merge_slots, 7000);
  EXPECT_GE(layout.executor_ctas, layout.merge_slots + 7000 * sizeof(int32_t));
  std::vector<std::byte> region(layout.plan_bytes);
  write_plan_region(cascade, layout, region.data());
  const std::vector<int32_t> rows =
      read_array<int32_t>(region, layout.merge_slots, cascade.merge_slots.size());
  bool offset_seen = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i], cascade.merge_slots[i] * 16 + cascade.merge_row_offsets[i]) << i;
    offset_seen = offset_seen || cascade.merge_row_offsets[i] > 0;
  }
  EXPECT_TRUE(offset_seen) << "request 1's rows start inside the prefix tile's slot";
  // Decode pieces: one token of 4 query heads each, so the merge walks 4 rows an item, not 16.
  EXPECT_EQ(read_array<PlanCounts>(region, layout.counts, 1)[0].max_merge_rows, 4);
  EXPECT_EQ(read_array<PlanCounts>(region, layout.counts, 1)[0].merge_heads, cascade.merge_heads);

  bounds.max_merge_slots = static_cast<int64_t>(cascade.merge_slots.size()) - 1;
  try {
    check_fits(cascade, workspace_layout(bounds));
    ADD_FAILURE() << "a merge map beyond max_merge_slots fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kWorkspaceTooSmall);
    EXPECT_NE(std::string(e.what()).find("merge slot entries"), std::string::npos) << e.what();
  }
}

TEST(WorkspaceLayout, RequestTablesAreInsideThePlanRegion) {
  WorkspaceBounds bounds = decode_bounds();
  bounds.executor_request_bytes = 16;
  const WorkspaceLayout layout = workspace_layout(bounds);
  EXPECT_EQ(layout.executor_requests % 256, 0u);
  EXPECT_GE(layout.executor_requests, layout.executor_items);
  EXPECT_GE(layout.plan_bytes, layout.executor_requests + 257 * 16);
  EXPECT_LE(layout.plan_bytes, layout.partial_o);
}

// A caller's scratch buffer holds more partial slots than the default bound (fixed_split_size
// plans): the layout takes the count, and partial_slots_fitting finds the most that fit.
TEST(WorkspaceLayout, PartialSlotsBeyondTheDefaultBoundFitTheScratch) {
  WorkspaceBounds bounds = decode_bounds();
  bounds.max_partial_slots = 5000;
  const WorkspaceLayout layout = workspace_layout(bounds);
  EXPECT_EQ(layout.max_partial_slots, 5000);
  EXPECT_EQ(layout.max_merge_items, 2500) << "each split tile owns at least two slots";
  EXPECT_EQ(layout.max_work_items, 256 * 32 + 5000 - 1);
  EXPECT_EQ(layout.scratch_bytes(), layout.total_bytes - layout.partial_o);
  EXPECT_GE(layout.scratch_bytes(), size_t{5000} * 16 * 129 * sizeof(float));

  for (const size_t scratch : {size_t{1} << 20, size_t{128} << 20, size_t{3456789}}) {
    const int64_t slots = partial_slots_fitting(bounds, scratch);
    ASSERT_GT(slots, 0) << scratch;
    WorkspaceBounds fit = bounds;
    fit.max_partial_slots = slots;
    EXPECT_LE(workspace_layout(fit).scratch_bytes(), scratch);
    fit.max_partial_slots = slots + 1;
    EXPECT_GT(workspace_layout(fit).scratch_bytes(), scratch) << "one more slot must not fit";
  }
  EXPECT_EQ(partial_slots_fitting(bounds, 1000), 0) << "not even one 8 KiB slot";
  bounds.max_partial_slots = -1;
  EXPECT_THROW(workspace_layout(bounds), Error);
}

}  // namespace
}  // namespace flare
