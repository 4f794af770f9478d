// Planner internals, first stage: the query tile size (001 §3.2.2) and the packed-row tiles of
// each request with the KV range their rows can see (causal, sliding window).
#pragma once

#include <cstdint>
#include <vector>

#include "flare/plan/plan.h"

namespace flare::plan_detail {

// Packed rows [row_begin, row_end) of one request (head-group fusion, 002 appendix A) and the
// KV range [kv_begin, kv_end) their rows can see, the same under every KV head (an empty range
// is [0, 0)): the work item of the whole range under KV head 0 (partial_slot -1, reserved 0),
// so that a tile of one chunk goes into a plan as it is.
using Tile = WorkItem;

// The tile sizes auto selection picks from (001 §3.2.2).
inline constexpr int kAutoQueryTiles[] = {1, 16, 32, 64, 128};

// `requested` > 0 is taken as is; 0 picks the smallest auto tile at least as large as the
// average packed length (q_len * group) over requests with q_len > 0, capped at 128.
int choose_query_tile(const PlanProblem& problem, int group, int requested);

// What the planner needs to know about all tiles' KV ranges (one KV head).
struct TileSummary {
  int64_t total_rows = 0;  // packed rows of all tiles
  int64_t total_kv = 0;    // sum of the ranges' lengths
  int32_t max_kv_end = 0;
  int32_t longest = 0;  // the longest range
};

// Replaces `tiles` with the tile_count tiles of every request (ceil(q_len * group /
// query_tile) each), in (request, row) order. Requests with q_len 0 have none. Lengths must be
// validated (non-negative, packed rows within int32).
TileSummary build_tiles(const PlanProblem& problem, int group, int query_tile, int64_t tile_count,
                        std::vector<Tile>& tiles);

}  // namespace flare::plan_detail
