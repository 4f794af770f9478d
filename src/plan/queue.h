// Planner internals, one-queue plans (plan/plan.h, PlanOptions::one_queue): the queue order of
// work items, and the plan whose items cover every KV head when the queue alone balances them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flare/plan/plan.h"
#include "src/plan/tiles.h"

namespace flare::plan_detail {

struct QueueParams {
  int64_t kv_chunk = 0;  // L_kv: cuts at its multiples (INT64_MAX: none)
  int num_kv_heads = 0;
  int kv_tile = 1;  // the unit of the length classes
  int num_ctas = 0;
};

// Fills every field schedule() fills: the chunks of every tile, one item each covering all KV
// heads (item_heads = num_kv_heads), in queue order. `tile_class` is scratch. The caller has
// checked that every count fits int32.
void plan_queue(std::span<const Tile> tiles, const QueueParams& params,
                std::vector<uint8_t>& tile_class, Plan& plan);

// Puts the work items of a plan from schedule() of `tiles` in queue order, cta_indptr to the
// even split of them and cta_cost to empty. plan.query_tile and num_kv_heads are the tiles'.
void order_for_queue(std::span<const Tile> tiles, int kv_tile, Plan& plan);

}  // namespace flare::plan_detail
