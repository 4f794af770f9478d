// BatchPrefill::plan_cascade()'s host work, which needs no GPU: the config's and levels'
// validation, the virtual batch (plan/cascade.h) with its staged tables, and the query tile's
// pricing. BatchPrefill::plan_cascade() and `flare plan-latency --kinds cascade` run the same
// functions.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/plan/cascade.h"
#include "src/api/prefill_plan.h"

namespace flare::api_detail {

// One cascade's host results, and buffers reused from one plan to the next.
struct CascadeHostPlan {
  CascadeBatch batch;
  std::vector<std::vector<int32_t>> kv_len;  // per level, per group
  std::vector<CascadeLevelLengths> lengths;  // per level: its qo_indptr and kv_len
  // The virtual requests' tables as the kernels read them: the levels' page ranges back to
  // back (an indptr over all groups) and their last page lengths.
  std::vector<int32_t> kv_indptr, last_page_len;
};

// Validates `config` for a cascade (kUnsupported: ragged or NVFP4 K/V, custom masks, user
// variants, position terms in a causal cascade of several levels) and `levels`
// (kInvalidArgument naming the level and array) into `out`, and fills next's lengths, q_offset
// and tiles (`fixed_tiles`, or cascade_query_tile's under `limits`) for plan_prefill.
void validate_cascade(const BatchPrefillConfig& config, std::span<const CascadeLevel> levels,
                      const std::optional<PrefillTiles>& fixed_tiles,
                      const PrefillDeviceLimits& limits, double memory_bytes_per_us,
                      CascadeHostPlan& out, PrefillHostPlan& next);

// The query tile of a cascade's one launch: each of 16 / 32 / 64 / 128 priced over the virtual
// requests' tiles (KV read, tile products at the family's rate, a fixed cost per tile), the
// cheapest taken; a tile `limits` allow (warpgroup_only: >= 64).
int cascade_query_tile(const CascadeBatch& batch, const BatchPrefillConfig& config,
                       const PrefillDeviceLimits& limits, double memory_bytes_per_us);

}  // namespace flare::api_detail
