// Planner internals, second stage: Algorithm 1 of paper 001 (KV chunks, longest first, to the
// least-loaded CTA) with fill splits, write-through and the merge map (002 appendix D.2).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "flare/plan/plan.h"
#include "src/plan/tiles.h"

namespace flare::plan_detail {

// x / divisor for x >= 0: a shift when the divisor is a power of two (every auto tile size,
// page size and the default costs' units), where a 64-bit division per item was a third of
// ordering a thousand items and a sixth of the fill splits (perf).
class Divider {
 public:
  explicit Divider(int64_t divisor)
      : divisor_(divisor),
        shift_(std::has_single_bit(static_cast<uint64_t>(divisor))
                   ? std::countr_zero(static_cast<uint64_t>(divisor))
                   : -1) {}

  uint64_t operator()(uint64_t x) const {
    return shift_ >= 0 ? x >> shift_ : x / static_cast<uint64_t>(divisor_);
  }

 private:
  int64_t divisor_;
  int shift_;
};

// A fill split aims for mean + mean / 50 (2% above the mean): enough slack that page rounding
// and the row cost of the extra chunks rarely push the last chunks onto a full CTA
// (docs/perf.md, "Planner"). One-queue plans skip Algorithm 1 when the queue ends within it.
inline constexpr uint64_t kFillToleranceInverse = 50;

// partial_slot of an assigned chunk of a split tile until slots are numbered.
inline constexpr int32_t kSlotPending = -2;

struct ScheduleParams {
  int num_kv_heads = 0;
  int num_ctas = 0;
  int page_size = 1;
  // L_kv: tiles are cut at the multiples of kv_chunk (a multiple of page_size), so chunk
  // boundaries never depend on other requests. INT64_MAX: no cuts.
  int64_t kv_chunk = 0;
  // Fill splits (see schedule.cpp): off for fixed_split_size (batch invariance) and
  // disable_split_kv.
  bool fill_split = false;
  // The most chunks that may belong to split tiles, i.e. partial slots (2 * num_ctas).
  int64_t max_split_chunks = 0;
  double alpha = 1.0;  // cost per row and per KV token of a chunk, each in [0, 2^20]
  double beta = 1.0;
  double item_cost = 0.0;  // fixed cost of each work item, in [0, 2^20]
};

// Reusable buffers, so that planning every decode step allocates nothing but the Plan.
struct ScheduleScratch {
  struct Chunk {    // one KV chunk of a tile: its work item under KV head 0, and its cost
    WorkItem item;  // partial_slot: -1, or pending for a chunk of a split tile
    uint64_t cost;
    int32_t tile;
  };
  struct Piece {    // a chunk (or what a fill split left of one) under one KV head
    uint64_t rank;  // (INT32_MAX - length) << 32 | request: longer first, then request
    int32_t tile;
    int32_t kv_head;
    int32_t kv_begin;
    int32_t kv_end;
    int32_t split;
  };
  std::vector<Chunk> chunks;
  std::vector<uint64_t> order;     // chunks sorted: longest first, then generation order
  std::vector<uint64_t> cta_tree;  // tournament tree of CTA keys (load << index bits | index)
  std::vector<uint64_t> loads;     // [num_ctas] final loads, cost units
  std::vector<uint8_t> filled;     // [num_ctas] received a fill split
  std::vector<Piece> tails;        // fill-split remainders waiting, sorted (first in order first)
  std::vector<WorkItem> assigned;  // in assignment order; `reserved` holds the CTA
  std::vector<int32_t> cta_items;  // [num_ctas] items per CTA, then the next free position
  // Pieces of split tiles: their (tile, KV head) as tile * num_kv_heads + kv_head, in
  // assignment order; the first piece of each such pair, by pair; their positions in
  // Plan::work_items, by pair.
  std::vector<int32_t> split_pairs;
  std::vector<int32_t> pair_begin;
  std::vector<int32_t> split_items;
  size_t assigned_count = 0;
  int fraction_bits = 0;  // of the cost unit
};

// Number of chunks the cuts at multiples of kv_chunk make of [kv_begin, kv_end) (1 if empty).
inline int64_t chunk_count(int64_t kv_begin, int64_t kv_end, int64_t kv_chunk) {
  if (kv_end <= kv_chunk || kv_end <= kv_begin) return 1;  // without dividing: the usual case
  return (kv_end + kv_chunk - 1) / kv_chunk - kv_begin / kv_chunk;
}

// Puts pieces[begin, end), indices into `items` of one (tile, KV head) pair (its chunks and fill
// splits: a few), in KV order: an insertion sort by kv_begin.
inline void sort_pieces_by_kv(int32_t* pieces, int32_t begin, int32_t end, const WorkItem* items) {
  for (int32_t i = begin + 1; i < end; ++i) {
    const int32_t piece = pieces[i];
    int32_t j = i;
    for (; j > begin && items[pieces[j - 1]].kv_begin > items[piece].kv_begin; --j) {
      pieces[j] = pieces[j - 1];
    }
    pieces[j] = piece;
  }
}

// Assigns every chunk (and fill split) to a CTA, into `scratch`; returns the busiest CTA's
// cost, alpha * rows + beta * kv + item_cost per item (Plan::cta_cost). The caller has checked that
// every count fits int32. With `give_up_at`, a schedule whose busiest CTA would cost at least that
// much stops there and returns +infinity (`scratch` then holds no schedule): a comparison of
// schedules skips the rest of a loser (plan.cpp's even-chunk alternative).
double assign_chunks(std::span<const Tile> tiles, const ScheduleParams& params,
                     ScheduleScratch& scratch,
                     double give_up_at = std::numeric_limits<double>::infinity());

// The time, in microseconds, of the CTAs' final loads in `scratch` when each CTA completes at
// most cta_rate cost units a microsecond and all still busy at most device_rate together:
// the loads sorted, and between consecutive ends the n CTAs still busy each at
// min(cta_rate, device_rate / n). O(CTAs log CTAs).
double replay_loads(const ScheduleScratch& scratch, double cta_rate, double device_rate);

// replay_loads for `pieces` pieces of equal cost (`piece_cost` units) taken by num_ctas CTAs
// from one queue: every CTA takes pieces / num_ctas, the first pieces % num_ctas one more. O(1).
double replay_equal_pieces(int64_t pieces, int num_ctas, double piece_cost, double cta_rate,
                           double device_rate);

// Fills plan.cta_indptr, work_items, merge_indptr, merge_items, merge_slots,
// num_partial_slots and cta_cost from the assignment in `scratch` (of the same tiles and
// params).
void emit_schedule(std::span<const Tile> tiles, const ScheduleParams& params,
                   ScheduleScratch& scratch, Plan& plan);

}  // namespace flare::plan_detail
