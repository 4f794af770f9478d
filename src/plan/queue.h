// Planner internals, one-queue plans (plan/plan.h, PlanOptions::one_queue): the queue order of
// work items, and the plan whose items cover every KV head when the queue alone balances them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flare/plan/plan.h"
#include "src/plan/schedule.h"
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

// emit_queue's buffers, reused from plan to plan (members, not thread_locals: in a shared
// library every access to a thread_local was a __tls_get_addr call, 7% of a plan).
struct QueueScratch {
  std::vector<int32_t> first_tile;  // [requests + 1] each request's first tile
  std::vector<int32_t> pair_end;    // [pairs + 1] counts, then each pair's end
  std::vector<int32_t> key;         // [items] pair rank, then partial slot
  std::vector<int32_t> by_pair;     // [items] item indices in pair order
  std::vector<uint8_t> item_class;  // [items] length class
  std::vector<uint8_t> pair_split;  // [pairs] 1 for the pairs of split tiles
};

// Fills every field emit_schedule() fills from the assignment in `scratch` (assign_chunks of
// `tiles` over num_kv_heads / item_heads groups of item_heads KV heads: a piece's kv_head is its
// group), the work items in queue order (item i under KV heads kv_head .. kv_head + item_heads
// - 1, whatever a plan built before in `plan` held), cta_indptr their even split and cta_cost
// empty. A split piece holds item_heads consecutive partial slots, one a head; each split
// (tile, KV head) is a merge item over its pieces' slots in KV order (for item_heads 1 the
// numbering emit_schedule gives). plan.query_tile and num_kv_heads are the tiles'.
void emit_queue(std::span<const Tile> tiles, int kv_tile, int item_heads,
                const ScheduleScratch& scratch, QueueScratch& queue_scratch, Plan& plan);

}  // namespace flare::plan_detail
