// validate_cascade and cascade_query_tile (src/api/cascade_plan.h).
#include "src/api/cascade_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flare/core/error.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_nvfp4.h"

namespace flare::api_detail {
namespace {

const char* const kWhat = "BatchPrefill";

// What a cascade's launch cannot do (kUnsupported), checked before anything else.
void check_cascade_config(const BatchPrefillConfig& c, size_t levels) {
  FLARE_CHECK(levels >= 1 && levels <= static_cast<size_t>(c.max_levels),
              ErrorCode::kInvalidArgument, kWhat,
              ": plan_cascade needs 1 to max_levels = ", c.max_levels, " levels, got ", levels);
  FLARE_CHECK(c.kv == PrefillKV::kPaged && !is_nvfp4_prefill(c), ErrorCode::kUnsupported, kWhat,
              ": plan_cascade needs paged 16-bit K/V (its levels are page lists)");
  FLARE_CHECK(c.params.mask != MaskMode::kCustom && !c.variant, ErrorCode::kUnsupported, kWhat,
              ": plan_cascade takes no custom mask or user variant (their per-request bits and "
              "tensors would be indexed by the cascade's groups)");
  const bool positional = c.params.window_left >= 0 || c.params.pos_encoding != PosEncoding::kNone;
  FLARE_CHECK(!(c.params.mask == MaskMode::kCausal && levels > 1 && positional),
              ErrorCode::kUnsupported, kWhat,
              ": a causal cascade of several levels takes no window, ALiBi or RoPE: its shared "
              "levels place their queries after all their keys, not bottom-right");
}

}  // namespace

void validate_cascade(const BatchPrefillConfig& c, std::span<const CascadeLevel> levels,
                      const std::optional<PrefillTiles>& fixed_tiles,
                      const PrefillDeviceLimits& limits, double memory_bytes_per_us,
                      CascadeHostPlan& out, PrefillHostPlan& next) {
  check_cascade_config(c, levels.size());
  // Each level's KV lengths; the page ranges back to back over the levels.
  std::vector<std::vector<int32_t>>& kv_lens = out.kv_len;
  kv_lens.resize(levels.size());
  std::vector<CascadeLevelLengths>& lengths = out.lengths;
  lengths.resize(levels.size());
  std::vector<int32_t>& kv_indptr = out.kv_indptr;
  kv_indptr.assign(1, 0);
  std::vector<int32_t>& last_page_len = out.last_page_len;
  last_page_len.clear();
  for (size_t l = 0; l < levels.size(); ++l) {
    const CascadeLevel& level = levels[l];
    const int64_t groups = static_cast<int64_t>(level.qo_indptr.size()) - 1;
    FLARE_CHECK(groups >= 1 && static_cast<int64_t>(level.kv_indptr.size()) == groups + 1 &&
                    static_cast<int64_t>(level.kv_last_page_len.size()) == groups,
                ErrorCode::kInvalidArgument, kWhat, ": level ", l,
                ": qo_indptr and kv_indptr need groups + 1 >= 2 entries and kv_last_page_len "
                "groups, got ",
                level.qo_indptr.size(), ", ", level.kv_indptr.size(), " and ",
                level.kv_last_page_len.size());
    FLARE_CHECK(level.kv_indptr[0] == kv_indptr.back(), ErrorCode::kInvalidArgument, kWhat,
                ": level ", l, ": kv_indptr[0] must be ", kv_indptr.back(),
                l == 0 ? " (level 0's pages start the page ids)"
                       : " (where the level before's pages end: the levels' page ids back to "
                         "back in one array)",
                ", got ", level.kv_indptr[0]);
    kv_lens[l].resize(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t pages = int64_t{level.kv_indptr[static_cast<size_t>(g) + 1]} -
                            level.kv_indptr[static_cast<size_t>(g)];
      FLARE_CHECK(pages >= 0, ErrorCode::kInvalidArgument, kWhat, ": level ", l,
                  ": kv_indptr must be non-decreasing: kv_indptr[", g + 1,
                  "]=", level.kv_indptr[static_cast<size_t>(g) + 1], " < kv_indptr[", g,
                  "]=", level.kv_indptr[static_cast<size_t>(g)]);
      const int64_t last = level.kv_last_page_len[static_cast<size_t>(g)];
      FLARE_CHECK(pages == 0 || (last >= 1 && last <= c.page_size), ErrorCode::kInvalidArgument,
                  kWhat, ": level ", l, ": kv_last_page_len[", g, "] must be in [1, ", c.page_size,
                  "], got ", last);
      const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * c.page_size + last;
      FLARE_CHECK(kv_len <= std::numeric_limits<int32_t>::max(), ErrorCode::kUnsupported, kWhat,
                  ": level ", l, ": group ", g, " has ", kv_len,
                  " KV tokens, more than int32 holds");
      kv_lens[l][static_cast<size_t>(g)] = static_cast<int32_t>(kv_len);
      kv_indptr.push_back(level.kv_indptr[static_cast<size_t>(g) + 1]);
      last_page_len.push_back(level.kv_last_page_len[static_cast<size_t>(g)]);
    }
    lengths[l] = {level.qo_indptr, kv_lens[l]};
  }
  CascadeBatch& batch = out.batch;
  cascade_batch(lengths, c.params.mask == MaskMode::kCausal, batch);
  const int64_t requests = batch.num_requests();
  FLARE_CHECK(requests <= c.max_batch, ErrorCode::kInvalidArgument, kWhat, ": the levels have ",
              requests, " groups in all, more than max_batch = ", c.max_batch,
              " (a cascade's groups are the launch's requests)");
  FLARE_CHECK(batch.total_qo <= c.max_total_qo, ErrorCode::kInvalidArgument, kWhat,
              ": the batch has ", batch.total_qo,
              " query tokens, more than max_total_qo = ", c.max_total_qo);
  next.batch = requests;
  next.total_qo = batch.total_qo;
  next.mask_bytes = 0;
  next.mask_indptr.clear();
  next.qo_len = batch.plan_qo_len;
  next.kv_len = batch.kv_len;
  next.q_offset = batch.q_offset;
  if (fixed_tiles) {
    next.tiles = *fixed_tiles;
  } else {
    const int tile = cascade_query_tile(batch, c, limits, memory_bytes_per_us);
    next.tiles =
        with_config_kv_tile(choose_prefill_tiles(tile, c.head_dim_qk, prefill_kernel_head_dim_vo(c),
                                                 c.params.mask, limits),
                            c);
  }
}

// One tile for every level of a cascade's launch, so the shared levels'
// groups (many rows over long KV) and the last level's (few rows over short KV) compete.
// plan()'s heuristic (the average packed rows) would cut a 64-request prefix group into four
// 16-row tiles that each read the prefix: 2.0x the graph time of the levels run one by one at
// b64 prefix 32768 (docs/perf.md, thirtieth session). Instead each tile size is priced as its
// launch would run, memory- or compute-bound, over the virtual requests' tiles: KV tokens read
// (each tile reads its request's KV), row x KV products at the family's rate, and a fixed cost
// per tile; the cheapest wins (ties: the smaller tile).
int cascade_query_tile(const CascadeBatch& batch, const BatchPrefillConfig& c,
                       const PrefillDeviceLimits& limits, double memory_bytes_per_us) {
  const int group = c.num_qo_heads / c.num_kv_heads;
  constexpr int kTiles[] = {16, 32, 64, 128};
  // Sustained rates, TFLOP/s of the tile products (docs/perf.md: the FA2 family's 16-row tiles
  // ~100, its 128-row ~360, the Hopper family's 64 / 128-row tiles ~450 / 550).
  const double sync_rate[] = {100e6, 180e6, 300e6, 360e6};  // flop per us
  const double warpgroup_rate[] = {0, 0, 450e6, 550e6};
  const double bandwidth = memory_bytes_per_us > 0 ? 0.8 * memory_bytes_per_us : 2.5e6;
  const double token_bytes = 2.0 * (c.head_dim_qk + c.head_dim_vo) * c.num_kv_heads;
  const double flops_per_product = 2.0 * (c.head_dim_qk + c.head_dim_vo) * c.num_kv_heads;
  constexpr double kTileBytes = 64.0 * 1024;  // per tile and KV head, as prefill_plan.cpp
  int best = 0;
  double best_us = 0;
  for (int i = 0; i < 4; ++i) {
    const int tile = kTiles[i];
    const bool warpgroup = limits.warpgroup_mma && tile >= 64;
    if (limits.warpgroup_only && tile < 64) continue;
    double reads = 0, products = 0, tiles = 0;
    for (size_t v = 0; v < batch.plan_qo_len.size(); ++v) {
      const double rows = static_cast<double>(batch.plan_qo_len[v]) * group;
      if (rows == 0) continue;
      const double n = std::ceil(rows / tile);
      reads += n * batch.kv_len[v];
      products += n * tile * batch.kv_len[v];
      tiles += n;
    }
    const double rate = warpgroup ? warpgroup_rate[i] : sync_rate[i];
    const double us =
        std::max((reads * token_bytes + tiles * kTileBytes * c.num_kv_heads) / bandwidth,
                 products * flops_per_product / rate);
    if (best == 0 || us < best_us) {
      best = tile;
      best_us = us;
    }
  }
  return best;
}

}  // namespace flare::api_detail
