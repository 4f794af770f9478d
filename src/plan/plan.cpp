// plan(): checks that some kernel can run the problem, picks the query tile and L_kv, and runs
// the scheduler (src/plan/schedule.cpp), or for one-queue plans whose queue order alone ends
// near the mean load writes that order (src/plan/queue.cpp), into a typed Plan.
#include "flare/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "flare/core/error.h"
#include "src/plan/queue.h"
#include "src/plan/queue_bounds.h"
#include "src/plan/schedule.h"
#include "src/plan/tiles.h"

namespace flare {
namespace {

using plan_detail::any_order_ends_near_mean;
using plan_detail::chunk_load;
using plan_detail::ChunkLoad;
using plan_detail::head_major_ends_as_early;
using plan_detail::kDecodeShapedTileRows;
using plan_detail::queue_balances;
using plan_detail::queue_cannot_end_near_mean;
using plan_detail::queue_ends;
using plan_detail::queue_ends_near_mean;
using plan_detail::queue_head_group;
using plan_detail::QueueCost;
using plan_detail::QueueEnds;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kNoCuts = std::numeric_limits<int64_t>::max();
constexpr int kMinHeadDim = 8;
constexpr int kMaxHeadDim = 512;
// Costs are fixed point with 16 fraction bits (src/plan/schedule.cpp).
constexpr float kMinCostCoefficient = 1.0f / 65536;
constexpr float kMaxCostCoefficient = 1 << 20;

void check_head_dim(int head_dim, const char* name) {
  FLARE_CHECK(head_dim >= kMinHeadDim && head_dim <= kMaxHeadDim && head_dim % 8 == 0,
              ErrorCode::kUnsupported, "plan: ", name, " must be a multiple of 8 in [", kMinHeadDim,
              ", ", kMaxHeadDim, "], got ", head_dim);
}

void validate(const PlanProblem& problem, const DeviceSpec& device, const PlanOptions& options) {
  FLARE_CHECK(problem.qo_len.size() == problem.kv_len.size(), ErrorCode::kInvalidArgument,
              "plan: qo_len and kv_len must have one entry per request, got ",
              problem.qo_len.size(), " and ", problem.kv_len.size());
  FLARE_CHECK(problem.q_offset.empty() || problem.q_offset.size() == problem.qo_len.size(),
              ErrorCode::kInvalidArgument,
              "plan: q_offset must be empty or have one entry per request, got ",
              problem.q_offset.size(), " for ", problem.qo_len.size(), " requests");
  FLARE_CHECK(problem.qo_len.size() <= static_cast<size_t>(kInt32Max), ErrorCode::kUnsupported,
              "plan: batch must fit int32, got ", problem.qo_len.size(), " requests");
  FLARE_CHECK(problem.num_qo_heads >= 1 && problem.num_kv_heads >= 1, ErrorCode::kInvalidArgument,
              "plan: num_qo_heads and num_kv_heads must be >= 1, got ", problem.num_qo_heads,
              " and ", problem.num_kv_heads);
  FLARE_CHECK(problem.num_qo_heads % problem.num_kv_heads == 0, ErrorCode::kInvalidArgument,
              "plan: num_kv_heads must divide num_qo_heads, got num_qo_heads=",
              problem.num_qo_heads, " num_kv_heads=", problem.num_kv_heads);
  check_head_dim(problem.head_dim_qk, "head_dim_qk");
  check_head_dim(problem.head_dim_vo, "head_dim_vo");
  FLARE_CHECK(problem.page_size >= 1, ErrorCode::kInvalidArgument,
              "plan: page_size must be >= 1, got ", problem.page_size);
  FLARE_CHECK(problem.window_left >= -1, ErrorCode::kInvalidArgument,
              "plan: window_left must be -1 (no window) or >= 0, got ", problem.window_left);
  // One branch-free pass (this runs every decode step); the offender is looked up on failure.
  const int64_t group = problem.num_qo_heads / problem.num_kv_heads;
  int32_t min_length = 0;
  int32_t max_qo_len = 0;
  for (size_t i = 0; i < problem.qo_len.size(); ++i) {
    min_length = std::min({min_length, problem.qo_len[i], problem.kv_len[i]});
    max_qo_len = std::max(max_qo_len, problem.qo_len[i]);
  }
  if (min_length < 0 || max_qo_len * group > kInt32Max) {
    for (size_t i = 0; i < problem.qo_len.size(); ++i) {
      FLARE_CHECK(problem.qo_len[i] >= 0 && problem.kv_len[i] >= 0, ErrorCode::kInvalidArgument,
                  "plan: request ", i, " has a negative length: qo_len=", problem.qo_len[i],
                  " kv_len=", problem.kv_len[i]);
      FLARE_CHECK(problem.qo_len[i] * group <= kInt32Max, ErrorCode::kUnsupported, "plan: request ",
                  i, " has qo_len * group = ", problem.qo_len[i] * group,
                  " packed rows, more than int32 holds");
    }
  }

  FLARE_CHECK(device.num_sms >= 1 && device.ctas_per_sm >= 1, ErrorCode::kInvalidArgument,
              "plan: device needs num_sms >= 1 and ctas_per_sm >= 1, got ", device.num_sms, " and ",
              device.ctas_per_sm);
  FLARE_CHECK(options.num_sms_to_use >= 0 && options.num_sms_to_use <= device.num_sms,
              ErrorCode::kInvalidArgument, "plan: num_sms_to_use must be in [0, ", device.num_sms,
              "] (0 = all), got ", options.num_sms_to_use);
  FLARE_CHECK(options.waves >= 1 && options.waves <= kMaxPlanWaves, ErrorCode::kInvalidArgument,
              "plan: waves must be in [1, ", kMaxPlanWaves, "], got ", options.waves);
  FLARE_CHECK(options.query_tile >= 0, ErrorCode::kInvalidArgument,
              "plan: query_tile must be >= 1, or 0 for auto, got ", options.query_tile);
  FLARE_CHECK(options.fixed_split_size >= 0, ErrorCode::kInvalidArgument,
              "plan: fixed_split_size must be >= 0, got ", options.fixed_split_size);
  FLARE_CHECK(!options.one_queue || (options.kv_tile >= 1 && options.waves == 1),
              ErrorCode::kInvalidArgument,
              "plan: one_queue needs kv_tile >= 1 and one wave, got kv_tile=", options.kv_tile,
              " waves=", options.waves);
  FLARE_CHECK(!(options.disable_split_kv && options.fixed_split_size > 0),
              ErrorCode::kInvalidArgument,
              "plan: disable_split_kv and fixed_split_size > 0 contradict each other, got "
              "fixed_split_size=",
              options.fixed_split_size);
  const auto in_range = [](float coefficient) {
    return coefficient >= 0.0f && coefficient <= kMaxCostCoefficient;  // false for NaN
  };
  const PlanOptions::QueueRates& rates = options.queue_rates;
  const bool rates_off = rates.cta == 0 && rates.device == 0 && rates.merge_us == 0;
  FLARE_CHECK(rates_off || (rates.cta > 0 && rates.device > 0 && rates.merge_us >= 0 &&
                            std::isfinite(rates.cta) && std::isfinite(rates.device) &&
                            std::isfinite(rates.merge_us)),
              ErrorCode::kInvalidArgument,
              "plan: queue_rates must be all 0 (off) or cta > 0, device > 0 and merge_us >= 0, "
              "finite, got cta=",
              rates.cta, " device=", rates.device, " merge_us=", rates.merge_us);
  FLARE_CHECK(in_range(options.alpha) && in_range(options.beta) && in_range(options.item_cost) &&
                  std::max(options.alpha, options.beta) >= kMinCostCoefficient,
              ErrorCode::kInvalidArgument, "plan: cost coefficients must lie in [0, ",
              kMaxCostCoefficient, "] with alpha or beta >= ", kMinCostCoefficient,
              " (costs use 1/65536 units), got alpha=", options.alpha, " beta=", options.beta,
              " item_cost=", options.item_cost);
}

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct ChunkCounts {
  int64_t all = 0;       // chunks, one KV head
  int64_t of_split = 0;  // chunks of tiles with more than one (partial slots), one KV head
};

// Chunks when tiles are cut at the multiples of kv_chunk.
ChunkCounts count_chunks(std::span<const plan_detail::Tile> tiles,
                         const plan_detail::TileSummary& summary, int64_t kv_chunk) {
  ChunkCounts counts{static_cast<int64_t>(tiles.size()), 0};
  if (summary.max_kv_end <= kv_chunk) return counts;  // no tile reaches a cut
  for (const plan_detail::Tile& tile : tiles) {
    const int64_t count = plan_detail::chunk_count(tile.kv_begin, tile.kv_end, kv_chunk);
    if (count > 1) {
      counts.all += count - 1;
      counts.of_split += count;
    }
  }
  return counts;
}

// L_kv of Algorithm 1: ceil(sum of effective KV over tiles and KV heads / #CTA), rounded up to
// a page. Cuts sit at multiples of L_kv; a windowed tile that straddles one splits even when it
// is shorter than L_kv, so in that (rare) case L_kv doubles until the chunks of split tiles fit
// the 2 * #CTA partial slots the workspace holds.
int64_t auto_kv_chunk(std::span<const plan_detail::Tile> tiles,
                      const plan_detail::TileSummary& summary, const PlanProblem& problem,
                      int num_ctas) {
  const int64_t total_kv = summary.total_kv * problem.num_kv_heads;
  int64_t kv_chunk =
      round_up(std::max<int64_t>(1, (total_kv + num_ctas - 1) / num_ctas), problem.page_size);
  while (count_chunks(tiles, summary, kv_chunk).of_split * problem.num_kv_heads >
         int64_t{2} * num_ctas) {
    kv_chunk *= 2;
  }
  return kv_chunk;
}

// Few tiles (tiles x KV heads <= #CTA): L_kv = W / #CTA cuts a long tile into full
// chunks and a short remainder, and the remainders, each paying alpha * rows, pile up on CTAs
// that already hold a full chunk (16 requests of 4096 tokens x 8 KV heads on 396 CTAs: 384
// chunks of 1328 tokens and 128 of 112, the busiest CTA 15% above the mean when an item costs
// 160 tokens). The alternative cuts the longest tile into floor(#CTA / tiles) near-equal
// chunks; plan() schedules both and keeps the better one. 0 when it does not apply.
int64_t even_kv_chunk(std::span<const plan_detail::Tile> tiles,
                      const plan_detail::TileSummary& summary, const PlanProblem& problem,
                      int num_ctas) {
  const int64_t tile_heads = static_cast<int64_t>(tiles.size()) * problem.num_kv_heads;
  if (tile_heads == 0 || tile_heads > num_ctas || summary.longest == 0) return 0;
  const int64_t chunks_per_tile = num_ctas / tile_heads;
  const int64_t kv_chunk =
      round_up((summary.longest + chunks_per_tile - 1) / chunks_per_tile, problem.page_size);
  // Windowed tiles straddling a cut may still exceed the partial slots.
  if (count_chunks(tiles, summary, kv_chunk).of_split * problem.num_kv_heads >
      int64_t{2} * num_ctas) {
    return 0;
  }
  return kv_chunk;
}

// Scratch kept per thread: planning each decode step reuses it and allocates nothing.
struct PlannerScratch {
  std::vector<plan_detail::Tile> tiles;
  plan_detail::ScheduleScratch schedule;
  plan_detail::ScheduleScratch alternative;  // the even-chunk schedule plan() compares
  std::vector<uint8_t> tile_class;           // of one-queue plans
  plan_detail::QueueScratch queue;
};

// Whether every tile has the rows and the KV length of the first (and there is one).
bool tiles_alike(std::span<const plan_detail::Tile> tiles) {
  if (tiles.empty()) return false;
  const int32_t rows = tiles.front().row_end - tiles.front().row_begin;
  const int32_t kv = tiles.front().kv_end - tiles.front().kv_begin;
  for (const plan_detail::Tile& tile : tiles) {
    if (tile.row_end - tile.row_begin != rows || tile.kv_end - tile.kv_begin != kv) return false;
  }
  return true;
}

// The queue of the tiles' chunks cut at the multiples of kv_chunk (kNoCuts: whole tiles), an
// item for all KV heads (plan_queue), KV head major where that order ends as early as head
// minor (Plan::head_major_queue). Returns the queue's end bounds when it made their pass.
std::optional<QueueEnds> plan_chunk_queue(std::span<const plan_detail::Tile> tiles,
                                          int64_t kv_chunk, const PlanProblem& problem,
                                          const PlanOptions& options,
                                          const plan_detail::TileSummary& summary,
                                          int64_t resident_ctas, PlannerScratch& scratch,
                                          Plan& result) {
  result.kv_chunk = kv_chunk == kNoCuts ? summary.longest : kv_chunk;
  result.head_major_queue = false;
  plan_detail::plan_queue(tiles, {kv_chunk, problem.num_kv_heads, options.kv_tile, result.num_ctas},
                          scratch.tile_class, result);
  // 16-row tiles are decode-shaped (a request's few queries x group): each reads its request's
  // K/V once, so the head-major order adds no L2 hits, and it ran q1 batches 0.7-1.2% slower
  // (head minor, an item's heads read each page's bytes together; docs/perf.md, thirty-third).
  if (result.item_heads == 1 || result.query_tile <= kDecodeShapedTileRows) return std::nullopt;
  const ChunkLoad load = chunk_load(summary, static_cast<int64_t>(tiles.size()), problem, options,
                                    result.query_tile, result.kv_chunk);
  if (any_order_ends_near_mean(load, options, result.query_tile, resident_ctas)) {
    result.head_major_queue = true;
    return std::nullopt;
  }
  const QueueEnds ends = queue_ends(result, options, resident_ctas);
  result.head_major_queue = head_major_ends_as_early(ends, options, result.query_tile);
  return ends;
}

}  // namespace

PlanCounts Plan::counts() const {
  int32_t max_merge_rows = 0;
  for (const MergeItem& m : merge_items) {
    max_merge_rows = std::max(max_merge_rows, m.row_end - m.row_begin);
  }
  return {static_cast<int32_t>(work_items.size()),
          static_cast<int32_t>(merge_items.size()),
          num_partial_slots,
          num_ctas,
          item_heads,
          max_merge_rows,
          merge_heads,
          head_major_queue ? 1 : 0};
}

Plan plan(const PlanProblem& problem, const DeviceSpec& device, const PlanOptions& options) {
  Plan result;
  plan(problem, device, options, result);
  return result;
}

void plan(const PlanProblem& problem, const DeviceSpec& device, const PlanOptions& options,
          Plan& result) {
  validate(problem, device, options);
  const int group = problem.num_qo_heads / problem.num_kv_heads;
  const int64_t sms = options.num_sms_to_use > 0 ? options.num_sms_to_use : device.num_sms;
  const int64_t resident_ctas = sms * device.ctas_per_sm;
  const int64_t num_ctas = resident_ctas * options.waves;
  FLARE_CHECK(num_ctas <= kInt32Max / 2, ErrorCode::kUnsupported,
              "plan: num_sms * ctas_per_sm * waves = ", num_ctas, " CTAs is more than supported (",
              kInt32Max / 2, ")");

  thread_local PlannerScratch scratch;
  result.num_ctas = static_cast<int>(num_ctas);
  result.group_size = group;
  result.num_kv_heads = problem.num_kv_heads;
  result.head_dim_vo = problem.head_dim_vo;
  result.split_kv = !options.disable_split_kv;
  result.item_heads = 1;
  result.head_major_queue = false;
  // A cascade's map (plan/cascade.h) may have filled this before: a plan of its own has none.
  result.merge_row_offsets.clear();
  result.merge_heads = 1;
  result.query_tile = plan_detail::choose_query_tile(problem, group, options.query_tile);

  int64_t tile_count = 0;
  for (const int32_t q_len : problem.qo_len) {
    const int64_t packed_rows = int64_t{q_len} * group;
    tile_count += packed_rows <= result.query_tile
                      ? packed_rows > 0
                      : (packed_rows + result.query_tile - 1) / result.query_tile;
  }
  FLARE_CHECK(tile_count <= kInt32Max && tile_count * problem.num_kv_heads <= kInt32Max,
              ErrorCode::kUnsupported, "plan: ", tile_count, " query tiles x ",
              problem.num_kv_heads, " KV heads exceed int32 work items");
  const plan_detail::TileSummary summary =
      plan_detail::build_tiles(problem, group, result.query_tile, tile_count, scratch.tiles);
  const std::span<const plan_detail::Tile> tiles(scratch.tiles);

  int64_t kv_chunk = kNoCuts;
  if (options.fixed_split_size > 0) {
    kv_chunk = round_up(options.fixed_split_size, problem.page_size);
  } else if (!options.disable_split_kv) {
    // Cut for the CTAs that run at once: later waves balance whole chunks, finer cuts would
    // only add partial states to merge (docs/perf.md, decode v14).
    kv_chunk = auto_kv_chunk(tiles, summary, problem, static_cast<int>(resident_ctas));
  }
  const int64_t chunks = count_chunks(tiles, summary, kv_chunk).all;
  // Fill splits add at most one work item per CTA.
  FLARE_CHECK(chunks <= kInt32Max && (chunks + num_ctas) * problem.num_kv_heads <= kInt32Max,
              ErrorCode::kUnsupported, "plan: ", chunks, " KV chunks x ", problem.num_kv_heads,
              " KV heads exceed int32 work items (fixed_split_size=", options.fixed_split_size,
              " is too small for these lengths)");

  const bool may_split =
      !options.disable_split_kv && options.fixed_split_size == 0 && options.waves == 1;
  // Rates given and every tile alike (decode-like batches: where the choice pays): the queue
  // of whole tiles is a candidate. Under a fixed rate a CTA it ends later than a cut plan, but
  // its last CTAs stream faster while the others idle, and a cut plan pays for partial states:
  // both are replayed under the rates. When the whole queue ends within the merge's cost of
  // the soonest any plan can end (all its work at the CTAs' joint rate; cuts only add work),
  // it is kept without the queue check or Algorithm 1.
  const PlanOptions::QueueRates& rates = options.queue_rates;
  const bool weigh_whole = options.one_queue && rates.cta > 0 && may_split && tiles_alike(tiles);
  double whole_time = 0;
  if (weigh_whole) {
    const plan_detail::Tile& tile = tiles.front();
    const double piece_cost =
        QueueCost(options).chunk(tile.row_end - tile.row_begin, tile.kv_end - tile.kv_begin);
    const int64_t pieces = tile_count * problem.num_kv_heads;
    whole_time = plan_detail::replay_equal_pieces(pieces, result.num_ctas, piece_cost, rates.cta,
                                                  rates.device);
    const double soonest = static_cast<double>(pieces) * piece_cost /
                           std::min(rates.cta * result.num_ctas, rates.device);
    if (whole_time <= soonest + rates.merge_us) {
      plan_chunk_queue(tiles, kNoCuts, problem, options, summary, resident_ctas, scratch, result);
      return;
    }
  }
  if (options.one_queue) {
    // The queue alone when its longest entry is short against the mean load (no check needed)
    // or the queue's own order ends near the mean (few or skewed tiles: one pass to check).
    const bool short_entries = queue_balances(
        chunk_load(summary, tile_count, problem, options, result.query_tile, kv_chunk),
        resident_ctas);
    if (short_entries || !queue_cannot_end_near_mean(tiles, problem, options, result.query_tile,
                                                     kv_chunk, chunks, resident_ctas)) {
      const std::optional<QueueEnds> ends = plan_chunk_queue(
          tiles, kv_chunk, problem, options, summary, resident_ctas, scratch, result);
      if (short_entries ||
          queue_ends_near_mean(ends ? *ends : queue_ends(result, options, resident_ctas), options,
                               result.query_tile)) {
        return;
      }
    }
  }

  // A one-queue plan runs Algorithm 1 over groups of KV heads (queue_head_group).
  const int head_group =
      options.one_queue ? queue_head_group(problem.num_kv_heads, result.num_ctas) : 1;
  plan_detail::ScheduleParams params;
  params.num_kv_heads = problem.num_kv_heads / head_group;
  params.num_ctas = result.num_ctas / head_group;
  params.page_size = problem.page_size;
  params.fill_split = may_split;
  params.max_split_chunks = int64_t{2} * params.num_ctas;  // a chunk: head_group partial slots
  params.alpha = options.alpha;
  params.beta = options.beta;
  params.item_cost = options.item_cost;
  params.kv_chunk = kv_chunk;
  const double busiest = plan_detail::assign_chunks(tiles, params, scratch.schedule);
  plan_detail::ScheduleScratch* chosen = &scratch.schedule;
  if (params.fill_split) {
    // The same L_kv with or without head groups (tiles x heads against CTAs, both / the group).
    const int64_t even = even_kv_chunk(tiles, summary, problem, static_cast<int>(num_ctas));
    if (even > 0 && even != kv_chunk) {
      plan_detail::ScheduleParams even_params = params;
      even_params.kv_chunk = even;
      if (plan_detail::assign_chunks(tiles, even_params, scratch.alternative, busiest) < busiest) {
        params.kv_chunk = even;
        chosen = &scratch.alternative;
      }
    }
  }
  result.kv_chunk = params.kv_chunk == kNoCuts ? summary.longest : params.kv_chunk;
  if (weigh_whole && !chosen->split_pairs.empty() &&
      whole_time <= plan_detail::replay_loads(*chosen, rates.cta, rates.device / head_group) +
                        rates.merge_us) {  // a head group's CTAs share the device rate
    plan_chunk_queue(tiles, kNoCuts, problem, options, summary, resident_ctas, scratch, result);
    return;
  }
  if (options.one_queue) {
    const bool fill_splits =
        chosen->assigned_count != chosen->chunks.size() * static_cast<size_t>(params.num_kv_heads);
    if (fill_splits) {
      plan_detail::emit_queue(tiles, options.kv_tile, head_group, *chosen, scratch.queue, result);
    } else {  // the chunks as they are: the queue of them
      plan_chunk_queue(tiles, params.kv_chunk, problem, options, summary, resident_ctas, scratch,
                       result);
    }
  } else {
    plan_detail::emit_schedule(tiles, params, *chosen, result);
  }
}

}  // namespace flare
