// Algorithm 1 of paper 001 with one refinement, the fill split.
//
// Algorithm 1: cut every tile's KV range into chunks of at most L_kv, take the chunks longest
// first and give each to the least-loaded CTA (cost alpha * rows + beta * kv). Alone it leaves
// CTAs up to ~2x the mean load: chunks are as long as the mean itself, so whichever CTA gets a
// second medium chunk ends far above the others (wave quantization).
//
// Fill split (Stream-K's idea, which the paper credits): when the least-loaded CTA would go
// past (1 + kFillTolerance) * mean by taking the next chunk, the chunk is cut at the page
// boundary nearest to where that CTA reaches the target; the rest re-enters the longest-first
// order. A CTA takes at most one fill split, and a split happens only while the chunks of
// split tiles stay within the budget of partial slots, so the workspace bound holds by
// construction. Everything is integer or IEEE double arithmetic in a fixed order with total
// orders for ties: the same lengths give the same plan on every machine.
#include "src/plan/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flare::plan_detail {
namespace {

using Chunk = ScheduleScratch::Chunk;
using Piece = ScheduleScratch::Piece;
using CtaLoad = ScheduleScratch::CtaLoad;
using SplitChunk = ScheduleScratch::SplitChunk;

// Load above the mean a fill split aims for: enough slack that page rounding and the row cost
// of the extra chunks rarely push the last chunks onto a full CTA (docs/perf.md, "Planner").
constexpr double kFillTolerance = 0.02;
constexpr uint64_t kMaxLength = std::numeric_limits<int32_t>::max();

// Two statements: no compiler may fuse them into an FMA, which would change the plan between
// machines.
double chunk_cost(const ScheduleParams& params, int64_t rows, int64_t kv) {
  const double row_cost = params.alpha * static_cast<double>(rows);
  const double kv_cost = params.beta * static_cast<double>(kv);
  return row_cost + kv_cost;
}

bool lighter(const CtaLoad& a, const CtaLoad& b) {
  return a.cost < b.cost || (a.cost == b.cost && a.cta < b.cta);
}

// Replaces the root of the min-heap by `x` and restores the heap (pop + push in one pass).
void replace_top(std::vector<CtaLoad>& heap, CtaLoad x) {
  const size_t size = heap.size();
  size_t hole = 0;
  for (;;) {
    size_t child = 2 * hole + 1;
    if (child >= size) break;
    if (child + 1 < size && lighter(heap[child + 1], heap[child])) ++child;
    if (!lighter(heap[child], x)) break;
    heap[hole] = heap[child];
    hole = child;
  }
  heap[hole] = x;
}

class Scheduler {
 public:
  Scheduler(std::span<const Tile> tiles, const ScheduleParams& params, ScheduleScratch& scratch)
      : tiles_(tiles), params_(params), s_(scratch) {}

  void run(Plan& plan) {
    cut_chunks();
    sort_chunks();
    init_ctas();
    assign_in_order();
    emit(plan);
  }

 private:
  int64_t tile_id(const Piece& piece) const {
    return int64_t{piece.tile} * params_.num_kv_heads + piece.kv_head;
  }

  // Phase 1: cuts at the multiples of L_kv; every chunk of a tile, in KV order.
  void cut_chunks() {
    const int heads = params_.num_kv_heads;
    const int64_t kv_chunk = params_.kv_chunk;
    s_.chunks.clear();
    s_.chunks_of_tile.resize(tiles_.size() * static_cast<size_t>(heads));
    double total_cost = 0.0;
    split_chunks_ = 0;
    for (size_t t = 0; t < tiles_.size(); ++t) {
      const Tile& tile = tiles_[t];
      const int64_t count = chunk_count(tile.kv_begin, tile.kv_end, kv_chunk);
      int64_t begin = tile.kv_begin;
      do {
        const int64_t end = std::min<int64_t>(tile.kv_end, (begin / kv_chunk + 1) * kv_chunk);
        s_.chunks.push_back({static_cast<int32_t>(t), static_cast<int32_t>(begin),
                             static_cast<int32_t>(end)});
        total_cost += chunk_cost(params_, tile.row_end - tile.row_begin, end - begin) * heads;
        begin = end;
      } while (begin < tile.kv_end);
      std::fill_n(s_.chunks_of_tile.begin() + static_cast<ptrdiff_t>(t * heads), heads,
                  static_cast<int32_t>(count));
      if (count > 1) split_chunks_ += count * heads;
    }
    const double mean = total_cost / params_.num_ctas;
    fill_target_ = mean + mean * kFillTolerance;
  }

  // Longest first; ties in generation order, i.e. (request, tile, chunk): one sort of packed
  // keys instead of a comparator over records.
  void sort_chunks() {
    s_.order.resize(s_.chunks.size());
    for (size_t i = 0; i < s_.chunks.size(); ++i) {
      const uint64_t length = static_cast<uint64_t>(s_.chunks[i].kv_end - s_.chunks[i].kv_begin);
      s_.order[i] = (kMaxLength - length) << 32 | i;
    }
    std::sort(s_.order.begin(), s_.order.end());
  }

  const Chunk& chunk_at(size_t position) const {
    return s_.chunks[static_cast<size_t>(s_.order[position] & 0xffffffffu)];
  }

  void init_ctas() {
    const auto ctas = static_cast<size_t>(params_.num_ctas);
    s_.heap.resize(ctas);
    for (size_t c = 0; c < ctas; ++c) s_.heap[c] = {0.0, static_cast<int32_t>(c)};  // a heap
    s_.filled.assign(ctas, 0);
    s_.tails.clear();
    s_.assigned.clear();
    s_.assigned_cta.clear();
    s_.assigned_tile.clear();
  }

  // The order of Algorithm 1 over pieces: longer first, then (request, kv_head, tile, kv_begin).
  bool goes_before(const Piece& a, const Piece& b) const {
    const int32_t length_a = a.kv_end - a.kv_begin;
    const int32_t length_b = b.kv_end - b.kv_begin;
    if (length_a != length_b) return length_a > length_b;
    const int32_t request_a = tiles_[static_cast<size_t>(a.tile)].request;
    const int32_t request_b = tiles_[static_cast<size_t>(b.tile)].request;
    if (request_a != request_b) return request_a < request_b;
    if (a.kv_head != b.kv_head) return a.kv_head < b.kv_head;
    if (a.tile != b.tile) return a.tile < b.tile;
    return a.kv_begin < b.kv_begin;
  }

  // Every chunk under every KV head in the order above, merged with the fill-split tails. A
  // run of chunks of one length and one request is emitted head by head, which is the order
  // (request, kv_head, tile, chunk) the sorted chunks imply once heads are expanded.
  void assign_in_order() {
    const auto tail_after = [this](const Piece& a, const Piece& b) { return goes_before(b, a); };
    const size_t count = s_.order.size();
    size_t run_begin = 0;
    while (run_begin < count) {
      const Chunk& first = chunk_at(run_begin);
      const int32_t length = first.kv_end - first.kv_begin;
      const int32_t request = tiles_[static_cast<size_t>(first.tile)].request;
      size_t run_end = run_begin + 1;
      while (run_end < count) {
        const Chunk& next = chunk_at(run_end);
        if (next.kv_end - next.kv_begin != length ||
            tiles_[static_cast<size_t>(next.tile)].request != request) {
          break;
        }
        ++run_end;
      }
      for (int32_t head = 0; head < params_.num_kv_heads; ++head) {
        for (size_t i = run_begin; i < run_end; ++i) {
          const Chunk& chunk = chunk_at(i);
          const Piece piece{chunk.tile, head, chunk.kv_begin, chunk.kv_end};
          while (!s_.tails.empty() && goes_before(s_.tails.front(), piece)) {
            std::pop_heap(s_.tails.begin(), s_.tails.end(), tail_after);
            const Piece tail = s_.tails.back();
            s_.tails.pop_back();
            assign(tail);
          }
          assign(piece);
        }
      }
      run_begin = run_end;
    }
    while (!s_.tails.empty()) {
      std::pop_heap(s_.tails.begin(), s_.tails.end(), tail_after);
      const Piece tail = s_.tails.back();
      s_.tails.pop_back();
      assign(tail);
    }
  }

  // Gives `piece` (or its head, after a fill split) to the least-loaded CTA.
  void assign(Piece piece) {
    CtaLoad top = s_.heap.front();
    const Tile& tile = tiles_[static_cast<size_t>(piece.tile)];
    const int64_t rows = tile.row_end - tile.row_begin;
    double cost = chunk_cost(params_, rows, piece.kv_end - piece.kv_begin);
    const int64_t id = tile_id(piece);
    if (params_.fill_split && !s_.filled[static_cast<size_t>(top.cta)] &&
        top.cost + cost > fill_target_) {
      const int64_t cut = fill_cut(top.cost, rows, piece.kv_begin);
      const int64_t new_split_chunks = s_.chunks_of_tile[static_cast<size_t>(id)] == 1 ? 2 : 1;
      if (cut > piece.kv_begin && cut < piece.kv_end &&
          split_chunks_ + new_split_chunks <= params_.max_split_chunks) {
        split_chunks_ += new_split_chunks;
        ++s_.chunks_of_tile[static_cast<size_t>(id)];
        s_.filled[static_cast<size_t>(top.cta)] = 1;
        s_.tails.push_back({piece.tile, piece.kv_head, static_cast<int32_t>(cut), piece.kv_end});
        std::push_heap(s_.tails.begin(), s_.tails.end(),
                       [this](const Piece& a, const Piece& b) { return goes_before(b, a); });
        piece.kv_end = static_cast<int32_t>(cut);
        cost = chunk_cost(params_, rows, piece.kv_end - piece.kv_begin);
      }
    }
    s_.assigned.push_back({tile.request, piece.kv_head, tile.row_begin, tile.row_end,
                           piece.kv_begin, piece.kv_end, -1, 0});
    s_.assigned_cta.push_back(top.cta);
    s_.assigned_tile.push_back(static_cast<int32_t>(id));
    top.cost += cost;
    replace_top(s_.heap, top);
  }

  // The page boundary nearest to where a CTA at `load` reaches the fill target with a chunk
  // of `rows` rows starting at kv_begin (at most kv_begin when it is already there).
  int64_t fill_cut(double load, int64_t rows, int64_t kv_begin) const {
    if (params_.beta <= 0.0) return kv_begin;
    const double row_cost = params_.alpha * static_cast<double>(rows);
    const double room = (fill_target_ - load - row_cost) / params_.beta;
    if (!(room > 0.0)) return kv_begin;
    const double page = static_cast<double>(params_.page_size);
    const double pages = std::floor((static_cast<double>(kv_begin) + room) / page + 0.5);
    return static_cast<int64_t>(pages) * params_.page_size;
  }

  // Work items grouped by CTA (assignment order kept), then partial slots for split tiles:
  // consecutive per tile, in increasing KV order, tiles in (request, tile, kv_head) order.
  void emit(Plan& plan) {
    const auto ctas = static_cast<size_t>(params_.num_ctas);
    plan.cta_cost.assign(ctas, 0.0);
    for (const CtaLoad& load : s_.heap) plan.cta_cost[static_cast<size_t>(load.cta)] = load.cost;

    plan.cta_indptr.assign(ctas + 1, 0);
    for (const int32_t cta : s_.assigned_cta) ++plan.cta_indptr[static_cast<size_t>(cta) + 1];
    for (size_t c = 0; c < ctas; ++c) plan.cta_indptr[c + 1] += plan.cta_indptr[c];
    s_.cursor.assign(plan.cta_indptr.begin(), plan.cta_indptr.end() - 1);
    plan.work_items.resize(s_.assigned.size());
    s_.split_chunks.clear();
    for (size_t i = 0; i < s_.assigned.size(); ++i) {
      const int32_t position = s_.cursor[static_cast<size_t>(s_.assigned_cta[i])]++;
      const WorkItem& item = s_.assigned[i];
      plan.work_items[static_cast<size_t>(position)] = item;
      const int32_t id = s_.assigned_tile[i];
      if (s_.chunks_of_tile[static_cast<size_t>(id)] > 1) {
        s_.split_chunks.push_back(
            {uint64_t{static_cast<uint32_t>(id)} << 32 | static_cast<uint32_t>(item.kv_begin),
             position});
      }
    }
    std::sort(s_.split_chunks.begin(), s_.split_chunks.end(),
              [](const SplitChunk& a, const SplitChunk& b) { return a.key < b.key; });

    plan.merge_items.clear();
    plan.merge_indptr.assign(1, 0);
    plan.merge_slots.resize(s_.split_chunks.size());
    for (size_t slot = 0; slot < s_.split_chunks.size(); ++slot) {
      WorkItem& item = plan.work_items[static_cast<size_t>(s_.split_chunks[slot].item)];
      item.partial_slot = static_cast<int32_t>(slot);
      plan.merge_slots[slot] = static_cast<int32_t>(slot);
      const bool last_of_tile = slot + 1 == s_.split_chunks.size() ||
                                (s_.split_chunks[slot + 1].key >> 32) != (s_.split_chunks[slot].key >> 32);
      if (last_of_tile) {
        plan.merge_items.push_back({item.request, item.kv_head, item.row_begin, item.row_end});
        plan.merge_indptr.push_back(static_cast<int32_t>(slot + 1));
      }
    }
    plan.num_partial_slots = static_cast<int32_t>(s_.split_chunks.size());
  }

  std::span<const Tile> tiles_;
  const ScheduleParams& params_;
  ScheduleScratch& s_;
  int64_t split_chunks_ = 0;  // chunks that belong to split tiles (= partial slots)
  double fill_target_ = 0.0;
};

}  // namespace

void schedule(std::span<const Tile> tiles, const ScheduleParams& params, ScheduleScratch& scratch,
              Plan& plan) {
  Scheduler(tiles, params, scratch).run(plan);
}

}  // namespace flare::plan_detail
