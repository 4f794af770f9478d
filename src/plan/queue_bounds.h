// Planner internals: the cost-model checks that choose a one-queue plan's path (plan/plan.h
// PlanOptions::one_queue): the queue alone (no check, or its own order ending near the mean),
// KV head major or minor, or Algorithm 1 over groups of KV heads. Every check prices a queue
// entry as alpha * rows + beta * kv + item_cost and bounds where the kernel's dynamic queue ends.
#pragma once

#include <cstdint>
#include <span>

#include "flare/plan/plan.h"
#include "src/plan/schedule.h"
#include "src/plan/tiles.h"

namespace flare::plan_detail {

// The query tile of the mma.sync family's decode-shaped items; larger tiles may take the queue
// KV head major.
inline constexpr int kDecodeShapedTileRows = 16;

// PlanOptions' cost model in doubles.
struct QueueCost {
  explicit QueueCost(const PlanOptions& options)
      : alpha(options.alpha), beta(options.beta), item(options.item_cost) {}

  // A chunk's (a queue entry's) cost.
  double chunk(double rows, double kv) const { return alpha * rows + beta * kv + item; }
  // How far above the mean load Algorithm 1 lets a CTA end before a fill split: 2% of the mean
  // plus one item's fixed cost (a whole tile's rows and item_cost).
  double fill_slack(double mean, int query_tile) const {
    return mean / kFillToleranceInverse + alpha * query_tile + item;
  }

  double alpha;
  double beta;
  double item;
};

// A one-queue plan's chunks from the tiles alone: the longest chunk's cost and the total load,
// which counts each tile's rows and item cost once (a lower bound: a cut tile has more items).
struct ChunkLoad {
  double longest;
  double total;
};
ChunkLoad chunk_load(const TileSummary& summary, int64_t tile_count, const PlanProblem& problem,
                     const PlanOptions& options, int query_tile, int64_t kv_chunk);

// Whether a one-queue plan's chunks need no Algorithm 1: the longest chunk costs at most 1/8 of
// a CTA's mean load (a CTA takes its next entry when it ends one, so none ends more than one
// entry, 12.5% of the mean, after the mean, and longest-class-first keeps the last entries
// short). A chunk has at most query_tile rows.
bool queue_balances(const ChunkLoad& load, int64_t resident_ctas);

// Whether a queue of the chunks ends within Algorithm 1's fill target in any order of its
// entries: entry j starts no later than (the cost of the entries before it) / resident CTAs, at
// most (total - its own cost) / CTAs, so every entry ends by the mean plus (1 - 1 / CTAs) of its
// cost; the longest chunk's within the slack bounds them all. O(1): decides head_major_queue.
bool any_order_ends_near_mean(const ChunkLoad& load, const PlanOptions& options, int query_tile,
                              int64_t resident_ctas);

// Bounds on the latest end of a one-queue plan's entries (item_heads entries an item, in queue
// order), one pass over the items. Entry j starts when a CTA frees: at the launch while j <
// resident CTAs, else no later than (the cost of the entries before j) / resident CTAs, since
// every CTA is busy until the first one frees; it ends its own cost later. head_minor: the
// queue as the kernel takes it by default, an item's heads one after another (its last head
// ends last); head_major: every item under the first head, then under the next (the last head's
// entries end last: its item i starts no later than ((heads - 1) x the cost of one head's items
// + the cost of items 0..i-1) / CTAs).
struct QueueEnds {
  double mean;
  double head_minor;
  double head_major;
};
QueueEnds queue_ends(const Plan& queue, const PlanOptions& options, int64_t resident_ctas);

// Whether the queue as taken by default ends within Algorithm 1's fill target of its mean load:
// within 2% above the mean plus the fixed cost of one item (the slack Algorithm 1 allows before a
// fill split), Algorithm 1 cannot balance better by more than that. A long causal request (b1
// q4096, 1,024 entries) plans in a tenth of the time Algorithm 1 takes (docs/perf.md,
// twenty-fourth session).
bool queue_ends_near_mean(const QueueEnds& ends, const PlanOptions& options, int query_tile);

// Whether the queue taken KV head major ends within Algorithm 1's fill slack of the later of
// the mean load and its end taken head minor.
bool head_major_ends_as_early(const QueueEnds& ends, const PlanOptions& options, int query_tile);

// Whether queue_ends_near_mean must fail, known from the tiles without building the queue: with
// more entries than CTAs, its bound on the last entry's end is the mean plus (1 - 1 / CTAs) of
// that entry's cost, which is at least the cheapest chunk's (alpha x its tile's rows + beta x
// the tile's first or last chunk: those between are kv_chunk long). Spares Algorithm-1 plans
// the queue they would discard (b64 q1 kv2048: two entries a CTA end 3% past the mean; b16 q16
// kv4096: the tiles' 96-token tails).
bool queue_cannot_end_near_mean(std::span<const Tile> tiles, const PlanProblem& problem,
                                const PlanOptions& options, int query_tile, int64_t kv_chunk,
                                int64_t chunks, int64_t resident_ctas);

// The KV heads of one work item when a one-queue plan runs Algorithm 1: the largest divisor of
// the KV heads that also divides the CTAs. The kernel's CTAs take an item's heads as consecutive
// queue entries, so the group's heads start together on as many CTAs at the same cost:
// Algorithm 1 over num_kv_heads / g head groups on num_ctas / g CTAs is the per-head problem's
// g-fold symmetric schedule, with g times fewer pieces to assign and sort (NVFP4 b64 q1 kv2048,
// 8 KV heads on 396 CTAs: 908 -> 227 pieces, the same cuts). Over random problems its queue
// entries equal the per-head schedule's in 1,720 of 1,839 plans, the rest ending alike under the
// cost model (experiments/head_group_entries.cpp; docs/perf.md, thirty-fourth session).
int queue_head_group(int num_kv_heads, int num_ctas);

}  // namespace flare::plan_detail
