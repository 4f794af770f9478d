// Helpers of the planner tests: problems from length lists, the tiles a plan must cover
// (computed row by row, independently of the planner), a full structural check of a plan,
// and field-by-field plan equality.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <tuple>
#include <vector>

#include "flare/plan/plan.h"
#include "testing/random.h"

namespace flare::plan_testing {

// Owns the length arrays a PlanProblem points into.
struct LengthProblem {
  std::vector<int32_t> qo_len;
  std::vector<int32_t> kv_len;
  PlanProblem problem;

  LengthProblem(std::vector<int32_t> qo, std::vector<int32_t> kv, int num_qo_heads,
                int num_kv_heads, int head_dim = 64, int page_size = 1, bool causal = false,
                int window_left = -1)
      : qo_len(std::move(qo)), kv_len(std::move(kv)) {
    problem.qo_len = qo_len;
    problem.kv_len = kv_len;
    problem.num_qo_heads = num_qo_heads;
    problem.num_kv_heads = num_kv_heads;
    problem.head_dim_qk = head_dim;
    problem.head_dim_vo = head_dim;
    problem.page_size = page_size;
    problem.causal = causal;
    problem.window_left = window_left;
  }
  LengthProblem(const LengthProblem&) = delete;
  LengthProblem& operator=(const LengthProblem&) = delete;
};

// Zipf-skewed lengths (tests/testing/random.h) rescaled so that their mean is `mean` (each at
// least 1): a few long requests and many short ones.
inline std::vector<int32_t> zipf_lengths(int64_t batch, double mean, uint64_t seed) {
  std::vector<int32_t> lengths =
      testing::random_lengths(batch, testing::LengthDistribution::kZipf, 1, 1 << 15, seed);
  const double sum = std::accumulate(lengths.begin(), lengths.end(), 0.0);
  for (int32_t& length : lengths) {
    length = std::max<int32_t>(1, static_cast<int32_t>(length * mean * batch / sum + 0.5));
  }
  return lengths;
}

// One (request, packed-row tile, KV head) and the KV range its rows see.
struct ExpectedTile {
  int32_t request;
  int32_t kv_head;
  int32_t row_begin;
  int32_t row_end;
  int64_t kv_begin;  // kv_begin == kv_end: the rows see nothing
  int64_t kv_end;
};

// Tiles of `query_tile` packed rows; the KV range is the union of the rows' visible ranges,
// evaluated row by row (bottom-right causal alignment, window_left on the left).
inline std::vector<ExpectedTile> expected_tiles(const PlanProblem& problem, int query_tile) {
  std::vector<ExpectedTile> tiles;
  const int64_t group = problem.num_qo_heads / problem.num_kv_heads;
  for (size_t r = 0; r < problem.qo_len.size(); ++r) {
    const int64_t q_len = problem.qo_len[r];
    const int64_t kv_len = problem.kv_len[r];
    for (int64_t row_begin = 0; row_begin < q_len * group; row_begin += query_tile) {
      const int64_t row_end = std::min(q_len * group, row_begin + query_tile);
      int64_t lo = kv_len;
      int64_t hi = 0;
      for (int64_t row = row_begin; row < row_end; ++row) {
        const int64_t position = kv_len - q_len + row / group;
        const int64_t row_hi = problem.causal ? std::min(kv_len, position + 1) : kv_len;
        const int64_t row_lo =
            problem.window_left >= 0 ? std::max<int64_t>(0, position - problem.window_left) : 0;
        if (row_lo < row_hi) {
          lo = std::min(lo, row_lo);
          hi = std::max(hi, row_hi);
        }
      }
      if (lo >= hi) lo = hi = 0;
      for (int32_t head = 0; head < problem.num_kv_heads; ++head) {
        tiles.push_back({static_cast<int32_t>(r), head, static_cast<int32_t>(row_begin),
                         static_cast<int32_t>(row_end), lo, hi});
      }
    }
  }
  return tiles;
}

inline double item_cost(const WorkItem& item, const PlanOptions& options) {
  const double row_cost = static_cast<double>(options.alpha) * (item.row_end - item.row_begin);
  const double kv_cost = static_cast<double>(options.beta) * (item.kv_end - item.kv_begin);
  return row_cost + kv_cost + static_cast<double>(options.item_cost);
}

// Everything a plan from plan() promises (ASSERTs; call via ASSERT_NO_FATAL_FAILURE):
// CTA queues cover every expected tile exactly (an item under each of its item_heads KV heads),
// chunks are disjoint and tile the tile's KV range, interior cuts are page aligned and chunks
// at most kv_chunk long, unsplit tiles write through, split tiles have slots merged in KV
// order (consecutive ones for item_heads 1), and the recorded CTA costs are the sums of their
// items' costs (to the planner's 2^-16 rounding of alpha, beta and item_cost; none for
// one-queue plans).
inline void check_plan(const Plan& plan, const PlanProblem& problem, const PlanOptions& options,
                       int expected_ctas) {
  ASSERT_EQ(plan.num_ctas, expected_ctas);
  ASSERT_EQ(plan.group_size, problem.num_qo_heads / problem.num_kv_heads);
  ASSERT_EQ(plan.num_kv_heads, problem.num_kv_heads);
  ASSERT_EQ(plan.head_dim_vo, problem.head_dim_vo);
  ASSERT_EQ(plan.split_kv, !options.disable_split_kv);
  if (options.query_tile > 0) {
    ASSERT_EQ(plan.query_tile, options.query_tile);
  }
  ASSERT_GE(plan.query_tile, 1);
  ASSERT_EQ(plan.cta_indptr.size(), static_cast<size_t>(plan.num_ctas) + 1);
  ASSERT_EQ(plan.cta_indptr.front(), 0);
  ASSERT_EQ(plan.cta_indptr.back(), static_cast<int32_t>(plan.work_items.size()));
  ASSERT_TRUE(std::is_sorted(plan.cta_indptr.begin(), plan.cta_indptr.end()));
  ASSERT_EQ(plan.cta_cost.size(), options.one_queue ? 0u : static_cast<size_t>(plan.num_ctas));
  // Items over several KV heads only in one-queue plans: every head (the queue alone) or a
  // group of them (Algorithm 1 over head groups), starting at a multiple of the group.
  ASSERT_TRUE(plan.item_heads == 1 ||
              (options.one_queue && plan.num_kv_heads % plan.item_heads == 0));
  for (const WorkItem& item : plan.work_items) ASSERT_EQ(item.kv_head % plan.item_heads, 0);
  ASSERT_TRUE(plan.item_heads > 1 || !plan.head_major_queue);  // one order of one-head items
  ASSERT_EQ(plan.merge_indptr.size(), plan.merge_items.size() + 1);
  ASSERT_EQ(plan.merge_indptr.front(), 0);
  ASSERT_EQ(plan.merge_slots.size(), static_cast<size_t>(plan.num_partial_slots));
  ASSERT_EQ(plan.merge_indptr.back(), plan.num_partial_slots);
  for (size_t slot = 0; slot < plan.merge_slots.size() && plan.item_heads == 1; ++slot) {
    ASSERT_EQ(plan.merge_slots[slot], static_cast<int32_t>(slot)) << "merge_slots is the identity";
  }

  for (int cta = 0; cta < plan.num_ctas && !options.one_queue; ++cta) {
    double cost = 0.0;
    for (int32_t i = plan.cta_indptr[static_cast<size_t>(cta)];
         i < plan.cta_indptr[static_cast<size_t>(cta) + 1]; ++i) {
      cost += item_cost(plan.work_items[static_cast<size_t>(i)], options);
    }
    // Exact when alpha and beta are multiples of 2^-16 (the planner's cost unit).
    ASSERT_NEAR(plan.cta_cost[static_cast<size_t>(cta)], cost, 1e-4 * cost) << "CTA " << cta;
  }

  using TileKey = std::tuple<int32_t, int32_t, int32_t>;  // request, kv_head, row_begin
  std::map<TileKey, std::vector<WorkItem>> pieces;
  std::vector<int> slot_uses(static_cast<size_t>(plan.num_partial_slots), 0);
  for (const WorkItem& item : plan.work_items) {
    ASSERT_EQ(item.reserved, 0);
    for (int32_t h = 0; h < plan.item_heads; ++h) {  // the item's queue entries
      WorkItem entry = item;
      entry.kv_head += h;
      if (entry.partial_slot >= 0) entry.partial_slot += h;
      pieces[{entry.request, entry.kv_head, entry.row_begin}].push_back(entry);
      if (entry.partial_slot >= 0) {
        ASSERT_LT(entry.partial_slot, plan.num_partial_slots);
        ++slot_uses[static_cast<size_t>(entry.partial_slot)];
      } else {
        ASSERT_EQ(entry.partial_slot, -1);
      }
    }
  }
  for (const int uses : slot_uses) ASSERT_EQ(uses, 1) << "every partial slot has one writer";

  std::map<TileKey, size_t> merge_of_tile;
  for (size_t m = 0; m < plan.merge_items.size(); ++m) {
    const MergeItem& merge = plan.merge_items[m];
    ASSERT_TRUE(
        merge_of_tile.emplace(TileKey{merge.request, merge.kv_head, merge.row_begin}, m).second)
        << "one merge item per tile";
  }

  const std::vector<ExpectedTile> tiles = expected_tiles(problem, plan.query_tile);
  ASSERT_EQ(pieces.size(), tiles.size()) << "every tile has work items, no others";
  int64_t split_tiles = 0;
  for (const ExpectedTile& tile : tiles) {
    const auto found = pieces.find({tile.request, tile.kv_head, tile.row_begin});
    ASSERT_NE(found, pieces.end());
    std::vector<const WorkItem*> chunks;
    for (const WorkItem& chunk : found->second) chunks.push_back(&chunk);
    std::sort(chunks.begin(), chunks.end(),
              [](const WorkItem* a, const WorkItem* b) { return a->kv_begin < b->kv_begin; });
    if (tile.kv_begin == tile.kv_end) {
      ASSERT_EQ(chunks.size(), 1u) << "an empty tile is one item, never split";
      ASSERT_EQ(chunks[0]->kv_begin, chunks[0]->kv_end);
    } else {
      ASSERT_EQ(chunks.front()->kv_begin, tile.kv_begin) << "request " << tile.request;
      ASSERT_EQ(chunks.back()->kv_end, tile.kv_end) << "request " << tile.request;
    }
    for (size_t c = 0; c < chunks.size(); ++c) {
      const WorkItem& chunk = *chunks[c];
      ASSERT_EQ(chunk.row_end, tile.row_end);
      ASSERT_LE(chunk.kv_end - chunk.kv_begin, plan.kv_chunk);
      if (c > 0) {
        ASSERT_EQ(chunk.kv_begin, chunks[c - 1]->kv_end) << "chunks tile the range";
        ASSERT_LT(chunk.kv_begin, chunk.kv_end) << "no empty chunk in a split tile";
        ASSERT_EQ(chunk.kv_begin % problem.page_size, 0) << "cuts are page aligned";
        if (options.fixed_split_size > 0) {
          ASSERT_EQ(chunk.kv_begin % plan.kv_chunk, 0);
        }
      }
    }
    const auto merge = merge_of_tile.find({tile.request, tile.kv_head, tile.row_begin});
    if (chunks.size() == 1) {
      ASSERT_EQ(chunks[0]->partial_slot, -1) << "an unsplit tile writes through";
      ASSERT_EQ(merge, merge_of_tile.end());
      continue;
    }
    ++split_tiles;
    ASSERT_FALSE(options.disable_split_kv);
    ASSERT_NE(merge, merge_of_tile.end());
    const MergeItem& item = plan.merge_items[merge->second];
    ASSERT_EQ(item.row_end, tile.row_end);
    const int32_t begin = plan.merge_indptr[merge->second];
    ASSERT_EQ(plan.merge_indptr[merge->second + 1] - begin, static_cast<int32_t>(chunks.size()));
    for (size_t c = 0; c < chunks.size(); ++c) {
      ASSERT_EQ(plan.merge_slots[static_cast<size_t>(begin) + c], chunks[c]->partial_slot)
          << "merge slots in increasing KV order";
      if (plan.item_heads == 1) {
        ASSERT_EQ(chunks[c]->partial_slot, chunks[0]->partial_slot + static_cast<int32_t>(c))
            << "consecutive slots";
      }
    }
  }
  ASSERT_EQ(static_cast<int64_t>(plan.merge_items.size()), split_tiles);
  if (options.fixed_split_size == 0) {
    ASSERT_LE(plan.num_partial_slots, 2 * plan.num_ctas) << "the 2 x #CTA slot bound";
  }
}

inline void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.num_ctas, b.num_ctas);
  EXPECT_EQ(a.query_tile, b.query_tile);
  EXPECT_EQ(a.group_size, b.group_size);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim_vo, b.head_dim_vo);
  EXPECT_EQ(a.split_kv, b.split_kv);
  EXPECT_EQ(a.kv_chunk, b.kv_chunk);
  EXPECT_EQ(a.cta_indptr, b.cta_indptr);
  ASSERT_EQ(a.work_items.size(), b.work_items.size());
  for (size_t i = 0; i < a.work_items.size(); ++i) {
    const WorkItem& x = a.work_items[i];
    const WorkItem& y = b.work_items[i];
    EXPECT_TRUE(x.request == y.request && x.kv_head == y.kv_head && x.row_begin == y.row_begin &&
                x.row_end == y.row_end && x.kv_begin == y.kv_begin && x.kv_end == y.kv_end &&
                x.partial_slot == y.partial_slot && x.reserved == y.reserved)
        << "work item " << i;
  }
  EXPECT_EQ(a.merge_indptr, b.merge_indptr);
  ASSERT_EQ(a.merge_items.size(), b.merge_items.size());
  for (size_t i = 0; i < a.merge_items.size(); ++i) {
    const MergeItem& x = a.merge_items[i];
    const MergeItem& y = b.merge_items[i];
    EXPECT_TRUE(x.request == y.request && x.kv_head == y.kv_head && x.row_begin == y.row_begin &&
                x.row_end == y.row_end)
        << "merge item " << i;
  }
  EXPECT_EQ(a.merge_slots, b.merge_slots);
  EXPECT_EQ(a.num_partial_slots, b.num_partial_slots);
  EXPECT_EQ(a.cta_cost, b.cta_cost);
  EXPECT_EQ(a.item_heads, b.item_heads);
}

}  // namespace flare::plan_testing
