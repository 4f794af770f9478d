// Algorithm 1 of paper 001 with one refinement, the fill split.
//
// Algorithm 1: cut every tile's KV range into chunks of at most L_kv, take the chunks longest
// first and give each to the least-loaded CTA (cost alpha * rows + beta * kv + item_cost). Alone it
// can leave the busiest CTA far above the mean: chunks are about as long as the mean load, so a CTA
// that gets a second medium chunk ends up to ~2x the others (wave quantization; 1.43x for a Zipf
// batch of 64 on 132 CTAs, docs/perf.md "Planner").
//
// Fill split (Stream-K's idea, which the paper credits): when the least-loaded CTA would go
// past 1.02 x the mean load, plus the fixed cost of one more item, by taking the next chunk, the
// chunk is cut at the page boundary nearest to where that CTA reaches 1.02 x the mean; the
// rest re-enters the longest-first order. A CTA takes at most one fill split, and a split
// happens only while the chunks of split tiles stay within the budget of partial slots, so
// the workspace bound holds by construction. A grid of several waves (PlanOptions::waves)
// takes no fill split: the hardware balances it as CTAs end.
//
// Costs are integers (units of 2^-16 of a row or KV token, alpha and beta rounded to that
// grid), so loads add exactly and ties have one order: the same lengths give the same plan,
// bit for bit, on every machine.
#include "src/plan/schedule.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <tuple>

#include "flare/core/error.h"
#include "src/plan/cta_loads.h"

namespace flare::plan_detail {
namespace {

using Chunk = ScheduleScratch::Chunk;
using Piece = ScheduleScratch::Piece;

constexpr uint64_t kMaxLength = std::numeric_limits<int32_t>::max();

// Fixed-point fraction bits of a cost unit; fewer when a plan's total cost would not fit.
constexpr int kCostFractionBits = 16;

class Scheduler {
 public:
  Scheduler(std::span<const Tile> tiles, const ScheduleParams& params, ScheduleScratch& scratch)
      : tiles_(tiles),
        params_(params),
        s_(scratch),
        ctas_(params.num_ctas, scratch.cta_tree),
        page_(params.page_size) {}

  // The busiest CTA's cost, or +infinity as soon as a CTA's cost reaches `give_up_at` (loads
  // only grow: the busiest would reach it too).
  double run(double give_up_at) {
    cut_chunks();
    sort_chunks();
    init_queues();
    give_up_units_ = units_reaching(give_up_at);
    if (!assign_in_order()) return std::numeric_limits<double>::infinity();
    ctas_.loads(s_.loads);
    s_.assigned_count = assigned_count_;
    s_.fraction_bits = fraction_bits_;
    const uint64_t busiest = *std::max_element(s_.loads.begin(), s_.loads.end());
    return static_cast<double>(busiest) * std::ldexp(1.0, -fraction_bits_);
  }

 private:
  // Phase 1: cuts at the multiples of L_kv; every chunk of a tile, in KV order.
  void cut_chunks() {
    const int64_t kv_chunk = params_.kv_chunk;
    s_.chunks.clear();
    int64_t total_rows = 0;  // over chunks, one KV head
    int64_t total_kv = 0;
    int64_t max_rows = 0;
    split_chunks_ = 0;
    for (size_t t = 0; t < tiles_.size(); ++t) {
      const Tile& tile = tiles_[t];
      const auto tile_index = static_cast<int32_t>(t);
      const int64_t rows = tile.row_end - tile.row_begin;
      max_rows = std::max(max_rows, rows);
      total_kv += tile.kv_end - tile.kv_begin;
      if (tile.kv_end <= kv_chunk) {  // one chunk (the common case, no division)
        s_.chunks.push_back({tile, 0, tile_index});
        total_rows += rows;
        continue;
      }
      const int64_t count = chunk_count(tile.kv_begin, tile.kv_end, kv_chunk);
      int64_t begin = tile.kv_begin;
      do {
        const int64_t end = std::min<int64_t>(tile.kv_end, (begin / kv_chunk + 1) * kv_chunk);
        s_.chunks.push_back(
            {{tile.request, 0, tile.row_begin, tile.row_end, static_cast<int32_t>(begin),
              static_cast<int32_t>(end), count > 1 ? kSlotPending : -1, 0},
             0,
             tile_index});
        begin = end;
      } while (begin < tile.kv_end);
      total_rows += rows * count;
      if (count > 1) split_chunks_ += count * params_.num_kv_heads;
    }
    const auto chunks = static_cast<int64_t>(s_.chunks.size());
    choose_cost_units(total_rows, total_kv, max_rows, chunks);
    for (Chunk& chunk : s_.chunks) {
      chunk.cost =
          cost(chunk.item.row_end - chunk.item.row_begin, chunk.item.kv_end - chunk.item.kv_begin);
    }
    const uint64_t total_cost = (alpha_units_ * static_cast<uint64_t>(total_rows) +
                                 beta_units_ * static_cast<uint64_t>(total_kv) +
                                 item_units_ * static_cast<uint64_t>(chunks)) *
                                static_cast<uint64_t>(params_.num_kv_heads);
    const uint64_t mean = total_cost / static_cast<uint64_t>(params_.num_ctas);
    fill_target_ = mean + mean / kFillToleranceInverse;
  }

  // The finest cost unit 2^-f (f <= kCostFractionBits) at which every load, fill splits
  // included, fits the heap keys beside the CTA index.
  void choose_cost_units(int64_t total_rows, int64_t total_kv, int64_t max_rows, int64_t chunks) {
    const double limit = std::ldexp(1.0, 63 - ctas_.index_bits());
    for (int bits = kCostFractionBits; bits >= 0; --bits) {
      const double alpha = std::round(std::ldexp(params_.alpha, bits));
      const double beta = std::round(std::ldexp(params_.beta, bits));
      const double item = std::round(std::ldexp(params_.item_cost, bits));
      const double total =
          (alpha * static_cast<double>(total_rows) + beta * static_cast<double>(total_kv) +
           item * static_cast<double>(chunks)) *
              params_.num_kv_heads +
          (alpha * static_cast<double>(max_rows) + item) * params_.num_ctas;
      if (total < limit) {
        fraction_bits_ = bits;
        alpha_units_ = static_cast<uint64_t>(alpha);
        beta_units_ = static_cast<uint64_t>(beta);
        item_units_ = static_cast<uint64_t>(item);
        per_token_ = Divider(static_cast<int64_t>(beta_units_));
        return;
      }
    }
    fail(ErrorCode::kUnsupported,
         "plan: the total cost alpha * rows + beta * kv + item_cost * chunks of this batch (",
         params_.alpha * static_cast<double>(total_rows) +
             params_.beta * static_cast<double>(total_kv) +
             params_.item_cost * static_cast<double>(chunks),
         " per KV head) does not fit the 64-bit loads of ", params_.num_ctas,
         " CTAs; lower alpha, beta and item_cost");
  }

  // The smallest load whose cost (as run() converts it) is at least `cost`; UINT64_MAX if none
  // (or for +infinity).
  uint64_t units_reaching(double cost) const {
    const double unit = std::ldexp(1.0, -fraction_bits_);
    const double scaled = std::ceil(cost / unit);
    if (!(scaled < 0x1p63)) return std::numeric_limits<uint64_t>::max();
    auto units = static_cast<uint64_t>(std::max(scaled, 0.0));
    while (units > 0 && static_cast<double>(units - 1) * unit >= cost) --units;
    while (static_cast<double>(units) * unit < cost) ++units;
    return units;
  }

  uint64_t cost(int64_t rows, int64_t kv) const {
    return alpha_units_ * static_cast<uint64_t>(rows) + beta_units_ * static_cast<uint64_t>(kv) +
           item_units_;
  }

  // Longest first; ties in generation order, i.e. (request, tile, chunk): one sort of packed
  // keys instead of a comparator over records.
  void sort_chunks() {
    s_.order.resize(s_.chunks.size());
    for (size_t i = 0; i < s_.chunks.size(); ++i) {
      const WorkItem& item = s_.chunks[i].item;
      const auto length = static_cast<uint64_t>(item.kv_end - item.kv_begin);
      s_.order[i] = (kMaxLength - length) << 32 | i;
    }
    std::sort(s_.order.begin(), s_.order.end());
  }

  const Chunk& chunk_at(size_t position) const {
    return s_.chunks[static_cast<size_t>(s_.order[position] & 0xffffffffu)];
  }

  void init_queues() {
    const auto ctas = static_cast<size_t>(params_.num_ctas);
    s_.filled.assign(ctas, 0);
    s_.cta_items.assign(ctas, 0);
    s_.tails.clear();
    tails_head_ = 0;
    s_.split_pairs.clear();
    // Every chunk under every head, plus at most one fill split per CTA. Never shrunk, so
    // steady-state planning does not touch the allocator.
    const size_t most_items = s_.chunks.size() * static_cast<size_t>(params_.num_kv_heads) + ctas;
    if (s_.assigned.size() < most_items) s_.assigned.resize(most_items);
    assigned_count_ = 0;
  }

  static uint64_t rank(int64_t kv_begin, int64_t kv_end, int32_t request) {
    return (kMaxLength - static_cast<uint64_t>(kv_end - kv_begin)) << 32 |
           static_cast<uint64_t>(request);
  }

  // The order of Algorithm 1 over pieces: longer first, then (request, kv_head, tile, kv_begin).
  static bool goes_before(const Piece& a, const Piece& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    if (a.tile != b.tile) return a.tile < b.tile;
    return a.kv_begin < b.kv_begin;
  }

  bool tails_empty() const { return tails_head_ == s_.tails.size(); }

  // Keeps s_.tails[tails_head_, end) sorted in the order above. A new tail is shorter than the
  // piece it came from, so it usually belongs last: it is appended, its fields stored in place
  // (a Piece built on the stack and copied in was read back by wide loads over its narrow
  // stores, a store-forwarding stall that was ~20% of assign(); a heap here took ~25% of
  // Algorithm 1's time on 908 items), and rotated into place otherwise (at most one tail a CTA
  // waits).
  void push_tail(int32_t request, int32_t tile, int32_t kv_head, int32_t kv_begin, int32_t kv_end) {
    std::vector<Piece>& tails = s_.tails;
    Piece& tail = tails.emplace_back();
    tail.rank = rank(kv_begin, kv_end, request);
    tail.tile = tile;
    tail.kv_head = kv_head;
    tail.kv_begin = kv_begin;
    tail.kv_end = kv_end;
    tail.split = 1;
    const auto first = tails.begin() + static_cast<std::ptrdiff_t>(tails_head_);
    const auto last = tails.end() - 1;
    if (last != first && goes_before(*last, *(last - 1))) {
      std::rotate(std::upper_bound(first, last, *last, goes_before), last, tails.end());
    }
  }

  // Assigns the fill-split tails that come before `next` (all of them for nullptr); false when
  // a CTA reached the give-up cost.
  bool assign_tails_before(const Piece* next) {
    while (!tails_empty() && (next == nullptr || goes_before(s_.tails[tails_head_], *next))) {
      const Piece tail = s_.tails[tails_head_++];
      if (tails_empty()) {  // drained: reuse the storage from its start
        s_.tails.clear();
        tails_head_ = 0;
      }
      if (!assign(tail)) return false;
    }
    return true;
  }

  // Every chunk under every KV head in the order above, merged with the fill-split tails. A
  // run of chunks of one length and one request is emitted head by head, which is the order
  // (request, kv_head, tile, chunk) the sorted chunks imply once heads are expanded. False when
  // a CTA reached the give-up cost.
  bool assign_in_order() {
    const size_t count = s_.order.size();
    // The fast path below: no tails waiting and no fill split possible.
    const uint64_t fill_limit =
        params_.fill_split ? fill_target_ : std::numeric_limits<uint64_t>::max();
    WorkItem* const assigned = s_.assigned.data();
    int32_t* const cta_items = s_.cta_items.data();
    const int32_t heads = params_.num_kv_heads;
    bool tails_waiting = false;
    size_t run_begin = 0;
    while (run_begin < count) {
      const WorkItem& first = chunk_at(run_begin).item;
      const int32_t length = first.kv_end - first.kv_begin;
      size_t run_end = run_begin + 1;
      while (run_end < count) {
        const WorkItem& next = chunk_at(run_end).item;
        if (next.kv_end - next.kv_begin != length || next.request != first.request) break;
        ++run_end;
      }
      for (int32_t head = 0; head < params_.num_kv_heads; ++head) {
        for (size_t i = run_begin; i < run_end; ++i) {
          const Chunk& chunk = chunk_at(i);
          if (tails_waiting || ctas_.lightest_load() + chunk.cost > fill_limit) {
            // The general path: tails that come first, fill splits.
            const WorkItem& item = chunk.item;
            const Piece piece{rank(item.kv_begin, item.kv_end, item.request),
                              chunk.tile,
                              head,
                              item.kv_begin,
                              item.kv_end,
                              item.partial_slot == kSlotPending};
            if (!assign_tails_before(&piece) || !assign(piece)) return false;
            tails_waiting = !tails_empty();
            continue;
          }
          if (ctas_.lightest_load() + chunk.cost >= give_up_units_) return false;
          const int32_t cta = ctas_.lightest();
          WorkItem& item = assigned[assigned_count_++];
          item = chunk.item;
          item.kv_head = head;
          item.reserved = cta;
          ++cta_items[cta];
          if (chunk.item.partial_slot == kSlotPending)
            s_.split_pairs.push_back(chunk.tile * heads + head);
          ctas_.add_to_lightest(chunk.cost);
        }
      }
      run_begin = run_end;
    }
    return assign_tails_before(nullptr);
  }

  // Gives `piece` (or its head, after a fill split) to the least-loaded CTA; false (nothing
  // assigned) when that CTA would reach the give-up cost. By reference: passed by value, the
  // caller's Piece, just built with narrow stores, was copied by wide loads (a store-forwarding
  // stall, perf).
  bool assign(const Piece& piece) {
    const int32_t cta = ctas_.lightest();
    const uint64_t load = ctas_.lightest_load();
    const Tile& tile = tiles_[static_cast<size_t>(piece.tile)];
    const int64_t rows = tile.row_end - tile.row_begin;
    int32_t kv_end = piece.kv_end;
    bool split = piece.split != 0;
    uint64_t piece_cost = cost(rows, kv_end - piece.kv_begin);
    // A split adds an item (alpha * rows + item_cost more work): only worth it when the CTA
    // would end more than that above the target.
    const uint64_t item_cost = alpha_units_ * static_cast<uint64_t>(rows) + item_units_;
    if (params_.fill_split && load + piece_cost > fill_target_ + item_cost &&
        !s_.filled[static_cast<size_t>(cta)]) {
      const int64_t cut = fill_cut(load, rows, piece.kv_begin);
      const int64_t new_split_chunks = split ? 1 : 2;
      if (cut > piece.kv_begin && cut < kv_end &&
          split_chunks_ + new_split_chunks <= params_.max_split_chunks) {
        split_chunks_ += new_split_chunks;
        s_.filled[static_cast<size_t>(cta)] = 1;
        split = true;
        push_tail(tile.request, piece.tile, piece.kv_head, static_cast<int32_t>(cut), kv_end);
        kv_end = static_cast<int32_t>(cut);
        piece_cost = cost(rows, kv_end - piece.kv_begin);
      }
    }
    if (load + piece_cost >= give_up_units_) return false;
    s_.assigned[assigned_count_++] = {tile.request,
                                      piece.kv_head,
                                      tile.row_begin,
                                      tile.row_end,
                                      piece.kv_begin,
                                      kv_end,
                                      split ? kSlotPending : -1,
                                      cta};
    ++s_.cta_items[static_cast<size_t>(cta)];
    if (split) s_.split_pairs.push_back(piece.tile * params_.num_kv_heads + piece.kv_head);
    ctas_.add_to_lightest(piece_cost);
    return true;
  }

  // The page boundary nearest to where a CTA at `load` reaches the fill target with a chunk
  // of `rows` rows starting at kv_begin (at most kv_begin when it is already there).
  int64_t fill_cut(uint64_t load, int64_t rows, int64_t kv_begin) const {
    const uint64_t used = load + alpha_units_ * static_cast<uint64_t>(rows) + item_units_;
    if (beta_units_ == 0 || used >= fill_target_) return kv_begin;
    const auto room = static_cast<int64_t>(per_token_(fill_target_ - used));
    const int64_t page = params_.page_size;
    return static_cast<int64_t>(page_(static_cast<uint64_t>(kv_begin + room + page / 2))) * page;
  }

  std::span<const Tile> tiles_;
  const ScheduleParams& params_;
  ScheduleScratch& s_;
  CtaLoads ctas_;
  int64_t split_chunks_ = 0;  // chunks that belong to split tiles (= partial slots)
  int fraction_bits_ = kCostFractionBits;
  uint64_t alpha_units_ = 0;  // alpha, beta and item_cost in units of 2^-fraction_bits_
  uint64_t beta_units_ = 0;
  uint64_t item_units_ = 0;
  uint64_t fill_target_ = 0;
  Divider per_token_{1};  // by beta_units_ (fill_cut)
  Divider page_;          // by the page size
  uint64_t give_up_units_ = std::numeric_limits<uint64_t>::max();
  size_t assigned_count_ = 0;
  size_t tails_head_ = 0;  // s_.tails[tails_head_, end): the tails waiting, in order
};

}  // namespace

double assign_chunks(std::span<const Tile> tiles, const ScheduleParams& params,
                     ScheduleScratch& scratch, double give_up_at) {
  return Scheduler(tiles, params, scratch).run(give_up_at);
}

double replay_loads(const ScheduleScratch& scratch, double cta_rate, double device_rate) {
  thread_local std::vector<uint64_t> sorted;
  sorted.assign(scratch.loads.begin(), scratch.loads.end());
  std::sort(sorted.begin(), sorted.end());
  const double unit = std::ldexp(1.0, -scratch.fraction_bits);
  double time = 0;
  uint64_t done = 0;  // cost every CTA still busy has completed
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] == done) continue;
    const auto busy = static_cast<double>(sorted.size() - i);
    time += static_cast<double>(sorted[i] - done) * unit / std::min(cta_rate, device_rate / busy);
    done = sorted[i];
  }
  return time;
}

double replay_equal_pieces(int64_t pieces, int num_ctas, double piece_cost, double cta_rate,
                           double device_rate) {
  const int64_t rounds = pieces / num_ctas;
  const int64_t last = pieces % num_ctas;  // CTAs with one piece more
  const auto rate = [&](int64_t busy) {
    return std::min(cta_rate, device_rate / static_cast<double>(busy));
  };
  double time = static_cast<double>(rounds) * piece_cost / rate(num_ctas);
  if (last > 0) time += piece_cost / rate(last);
  return time;
}

// Work items grouped by CTA (assignment order kept), then partial slots for split tiles:
// consecutive per (tile, KV head), in increasing KV order, in (request, tile, kv_head) order: a
// counting sort of the split pieces by (tile, KV head), then KV order within each (a few
// pieces).
void emit_schedule(std::span<const Tile> tiles, const ScheduleParams& params, ScheduleScratch& s,
                   Plan& plan) {
  const auto ctas = static_cast<size_t>(params.num_ctas);
  plan.cta_cost.resize(ctas);
  const double unit = std::ldexp(1.0, -s.fraction_bits);
  for (size_t c = 0; c < ctas; ++c) plan.cta_cost[c] = static_cast<double>(s.loads[c]) * unit;

  plan.cta_indptr.resize(ctas + 1);
  plan.cta_indptr[0] = 0;
  for (size_t c = 0; c < ctas; ++c) {
    plan.cta_indptr[c + 1] = plan.cta_indptr[c] + s.cta_items[c];
    s.cta_items[c] = plan.cta_indptr[c];  // from here on: the CTA's next free position
  }
  // Without split tiles, no slots to number.
  const size_t pairs =
      s.split_pairs.empty() ? 0 : tiles.size() * static_cast<size_t>(params.num_kv_heads);
  s.pair_begin.assign(pairs + 1, 0);
  for (const int32_t pair : s.split_pairs) ++s.pair_begin[static_cast<size_t>(pair) + 1];
  for (size_t p = 0; p < pairs; ++p) s.pair_begin[p + 1] += s.pair_begin[p];
  s.split_items.resize(s.split_pairs.size());

  plan.work_items.resize(s.assigned_count);
  WorkItem* const work_items = plan.work_items.data();
  int32_t* const next_position = s.cta_items.data();
  size_t split = 0;
  for (size_t i = 0; i < s.assigned_count; ++i) {
    WorkItem item = s.assigned[i];
    const int32_t position = next_position[item.reserved]++;
    item.reserved = 0;
    work_items[position] = item;
    if (item.partial_slot == kSlotPending) {
      const auto pair = static_cast<size_t>(s.split_pairs[split++]);
      // Counts down from the pair's end: pair_begin[pair + 1] ends as the pair's first piece.
      s.split_items[static_cast<size_t>(--s.pair_begin[pair + 1])] = position;
    }
  }

  plan.merge_items.clear();
  plan.merge_indptr.assign(1, 0);
  plan.merge_slots.resize(s.split_items.size());
  int32_t* const slots = s.split_items.data();
  for (size_t p = 0; p < pairs; ++p) {
    const int32_t begin = s.pair_begin[p + 1];
    const int32_t end =
        p + 1 < pairs ? s.pair_begin[p + 2] : static_cast<int32_t>(s.split_items.size());
    if (begin == end) continue;
    sort_pieces_by_kv(slots, begin, end, work_items);
    for (int32_t slot = begin; slot < end; ++slot) {
      work_items[slots[slot]].partial_slot = slot;
      plan.merge_slots[static_cast<size_t>(slot)] = slot;
    }
    const WorkItem& item = work_items[slots[begin]];
    plan.merge_items.push_back({item.request, item.kv_head, item.row_begin, item.row_end});
    plan.merge_indptr.push_back(end);
  }
  plan.num_partial_slots = static_cast<int32_t>(s.split_items.size());
}

}  // namespace flare::plan_detail
