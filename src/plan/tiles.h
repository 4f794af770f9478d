// Planner internals, first stage: the query tile size (001 §3.2.2) and the packed-row tiles of
// each request with the KV range their rows can see (causal, sliding window).
#pragma once

#include <cstdint>
#include <vector>

#include "flare/plan/plan.h"

namespace flare::plan_detail {

// Packed rows [row_begin, row_end) of one request (head-group fusion, 002 appendix A). The KV
// range is the union of what those rows see and is the same under every KV head; an empty
// range is stored as [0, 0).
struct Tile {
  int32_t request;
  int32_t row_begin;
  int32_t row_end;
  int32_t kv_begin;
  int32_t kv_end;
};

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

// Replaces `tiles` with the tiles of every request, in (request, row) order. Requests with
// q_len 0 have none. Lengths must be validated (non-negative, packed rows within int32).
TileSummary build_tiles(const PlanProblem& problem, int group, int query_tile,
                        std::vector<Tile>& tiles);

}  // namespace flare::plan_detail
