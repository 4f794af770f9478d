// One-queue plans: work items in the order a kernel's CTAs take them from one queue (length
// class, longest first; request; KV head; later rows first; KV order; plan/plan.h says why),
// either sorted from Algorithm 1's pieces or, when the queue alone balances, written in that
// order directly: a counting sort over length classes of chunks that each cover all KV heads,
// O(chunks) with no comparison (a batch of 64 causal requests of 1024 tokens is 2048 items).
#include "src/plan/queue.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <vector>

#include "src/plan/schedule.h"

namespace flare::plan_detail {
namespace {

// bit_width of a tile count of an int32 length: 0 (no keys) to 32.
constexpr int kLengthClasses = 33;

// The length class of a KV length: the bit width of the KV tiles it spans.
class LengthClass {
 public:
  explicit LengthClass(int kv_tile) : tile_(kv_tile), tiles_(kv_tile) {}

  int operator()(int64_t length) const {
    return std::bit_width(tiles_(static_cast<uint64_t>(length + tile_ - 1)));
  }

 private:
  int64_t tile_;
  Divider tiles_;
};

// Turns counts per length class into each class's first queue position, longest class first;
// returns the total.
template <typename Count>
Count longest_first_positions(std::array<Count, kLengthClasses>& counts) {
  Count position = 0;
  for (int c = kLengthClasses - 1; c >= 0; --c) {
    const Count count = counts[static_cast<size_t>(c)];
    counts[static_cast<size_t>(c)] = position;
    position += count;
  }
  return position;
}

// A count or next queue position per length class, the current class's held in a register:
// consecutive tiles mostly share a class (a causal request's tiles, last row first, shorten one
// tile at a time), and an increment through the array waited on the store of the one before
// (store-to-load forwarding: ~30% of a 2,000-tile plan, perf). flush() before reading `counts`.
template <typename Count>
class ClassCursor {
 public:
  explicit ClassCursor(std::array<Count, kLengthClasses>& counts) : counts_(counts) {}

  // Returns the class's value, then increments it.
  Count take(int length_class) {
    if (length_class != class_) switch_to(length_class);
    return value_++;
  }
  void flush() {
    if (class_ >= 0) counts_[static_cast<size_t>(class_)] = value_;
  }

 private:
  void switch_to(int length_class) {
    flush();
    class_ = length_class;
    value_ = counts_[static_cast<size_t>(length_class)];
  }

  std::array<Count, kLengthClasses>& counts_;
  int class_ = -1;
  Count value_ = 0;
};

// cta_indptr: num_ctas near-equal ranges of the items in queue order, for executors that run
// CTAs (the kernel takes entries from the queue and ignores it).
void split_evenly(int num_ctas, Plan& plan) {
  const auto items = static_cast<int64_t>(plan.work_items.size());
  plan.cta_indptr.resize(static_cast<size_t>(num_ctas) + 1);
  // items * c / num_ctas as a running quotient and remainder: no division per CTA.
  const int64_t step = items / num_ctas;
  const int64_t step_remainder = items % num_ctas;
  int64_t quotient = 0;
  int64_t remainder = 0;
  for (int c = 0; c <= num_ctas; ++c) {
    plan.cta_indptr[static_cast<size_t>(c)] = static_cast<int32_t>(quotient);
    quotient += step;
    remainder += step_remainder;
    if (remainder >= num_ctas) {
      remainder -= num_ctas;
      ++quotient;
    }
  }
  plan.cta_cost.clear();
}

// Calls visit(kv_begin, kv_end) for the chunks of `tile` cut at the multiples of kv_chunk, in
// KV order; returns their number.
template <typename Visit>
int64_t for_each_chunk(const Tile& tile, int64_t kv_chunk, Visit&& visit) {
  int64_t count = 0;
  int64_t begin = tile.kv_begin;
  do {
    const int64_t end = std::min<int64_t>(tile.kv_end, (begin / kv_chunk + 1) * kv_chunk);
    visit(static_cast<int32_t>(begin), static_cast<int32_t>(end));
    ++count;
    begin = end;
  } while (begin < tile.kv_end);
  return count;
}

}  // namespace

void plan_queue(std::span<const Tile> tiles, const QueueParams& params,
                std::vector<uint8_t>& tile_class, Plan& plan) {
  const int heads = params.num_kv_heads;
  const LengthClass length_class(params.kv_tile);
  // Pass 1: chunks per length class (and the class of each tile that is one chunk, the usual
  // case), then each class's first queue position, longest first.
  std::array<int64_t, kLengthClasses> next{};
  tile_class.resize(tiles.size());
  uint8_t* const classes = tile_class.data();
  ClassCursor<int64_t> counted(next);
  for (size_t t = 0; t < tiles.size(); ++t) {
    const Tile& tile = tiles[t];
    if (tile.kv_end <= params.kv_chunk) {
      const int length = length_class(tile.kv_end - tile.kv_begin);
      classes[t] = static_cast<uint8_t>(length);
      counted.take(length);
      continue;
    }
    for_each_chunk(tile, params.kv_chunk, [&](int32_t kv_begin, int32_t kv_end) {
      counted.take(length_class(kv_end - kv_begin));
    });
  }
  counted.flush();
  const int64_t position = longest_first_positions(next);

  // Pass 2: requests in order, a request's tiles last row first, chunks in KV order, each to
  // the next position of its class. A split tile's chunk c holds the partial slots
  // base + c * heads + h, and each of its heads is a merge item over them in KV order.
  plan.work_items.resize(static_cast<size_t>(position));
  plan.merge_items.clear();
  plan.merge_indptr.assign(1, 0);
  plan.merge_slots.clear();
  WorkItem* const items = plan.work_items.data();
  ClassCursor<int64_t> at(next);
  int32_t slots = 0;
  for (size_t first = 0; first < tiles.size();) {
    size_t end = first + 1;
    while (end < tiles.size() && tiles[end].request == tiles[first].request) ++end;
    for (size_t t = end; t-- > first;) {
      const Tile& tile = tiles[t];
      if (tile.kv_end <= params.kv_chunk) {
        items[at.take(classes[t])] = tile;
        continue;
      }
      const bool split = chunk_count(tile.kv_begin, tile.kv_end, params.kv_chunk) > 1;
      const int32_t base = slots;
      const int64_t count =
          for_each_chunk(tile, params.kv_chunk, [&](int32_t kv_begin, int32_t kv_end) {
            items[at.take(length_class(kv_end - kv_begin))] = {
                tile.request, 0,      tile.row_begin,     tile.row_end,
                kv_begin,     kv_end, split ? slots : -1, 0};
            if (split) slots += heads;
          });
      if (!split) continue;
      for (int32_t h = 0; h < heads; ++h) {
        plan.merge_items.push_back({tile.request, h, tile.row_begin, tile.row_end});
        plan.merge_indptr.push_back(plan.merge_indptr.back() + static_cast<int32_t>(count));
        for (int64_t c = 0; c < count; ++c) {
          plan.merge_slots.push_back(base + static_cast<int32_t>(c) * heads + h);
        }
      }
    }
    first = end;
  }
  plan.num_partial_slots = slots;
  plan.item_heads = heads;
  split_evenly(params.num_ctas, plan);
}

void emit_queue(std::span<const Tile> tiles, int kv_tile, int item_heads,
                const ScheduleScratch& scratch, QueueScratch& q, Plan& plan) {
  // Without comparisons: the items of one (tile, head group) pair are the pieces of one tile's KV
  // range, so a counting sort by pair rank, in (request, KV head, row descending) order, with
  // the few pieces of a split pair put in KV order, then a stable counting sort by length
  // class gives the queue order in O(items + pairs). A comparison sort of packed keys took ~40%
  // of a thousand-item plan, emit_schedule's grouping by CTA (discarded here) another 20% (perf,
  // b64 q1 kv2048).
  const size_t n = scratch.assigned_count;
  const WorkItem* const items = scratch.assigned.data();
  plan.merge_items.clear();
  plan.merge_indptr.assign(1, 0);
  plan.merge_slots.clear();
  plan.num_partial_slots = 0;
  plan.item_heads = item_heads;   // Algorithm 1's pieces, one head group each
  plan.head_major_queue = false;  // one order (a queue of items plan_queue wrote may be reused)
  plan.work_items.resize(n);
  if (n == 0) {
    split_evenly(plan.num_ctas, plan);
    return;
  }
  const auto heads = static_cast<int64_t>(plan.num_kv_heads / item_heads);  // head groups
  const Divider tile_of_row(plan.query_tile);
  const LengthClass length_class(kv_tile);
  const auto requests = static_cast<size_t>(tiles.back().request) + 1;
  const size_t pairs = tiles.size() * static_cast<size_t>(heads);
  q.first_tile.resize(requests + 1);
  q.pair_end.assign(pairs + 1, 0);
  q.key.resize(n);
  q.by_pair.resize(n);
  q.item_class.resize(n);
  q.pair_split.resize(pairs);
  // The buffers through raw pointers: item_class's byte stores may alias anything, and the
  // vectors' data pointers were reloaded from memory after each one (perf, x86 code).
  int32_t* const first_tile = q.first_tile.data();
  int32_t* const pair_end = q.pair_end.data();
  int32_t* const key = q.key.data();
  int32_t* const by_pair = q.by_pair.data();
  uint8_t* const item_class = q.item_class.data();
  size_t request = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    while (request <= static_cast<size_t>(tiles[t].request)) {
      first_tile[request++] = static_cast<int32_t>(t);
    }
  }
  while (request <= requests) first_tile[request++] = static_cast<int32_t>(tiles.size());

  // Pair rank of request r's tile i (of m, the first at index f) under head h:
  // f * heads + h * m + (m - 1 - i), dense over [0, tiles * heads) and increasing in
  // (request, KV head, row descending).
  const auto pair_rank = [first_tile, heads](size_t r, int64_t i, int64_t h) {
    const int64_t first = first_tile[r];
    const int64_t count = first_tile[r + 1] - first;
    return static_cast<size_t>(first * heads + h * count + (count - 1 - i));
  };
  // Each item's pair rank (counted per pair) and length class (counted per class).
  std::array<int32_t, kLengthClasses> next{};
  ClassCursor<int32_t> counted(next);
  const bool any_split = !scratch.split_pairs.empty();
  for (size_t i = 0; i < n; ++i) {
    const WorkItem& w = items[i];
    const size_t rank =
        pair_rank(static_cast<size_t>(w.request),
                  static_cast<int64_t>(tile_of_row(static_cast<uint64_t>(w.row_begin))), w.kv_head);
    key[i] = static_cast<int32_t>(rank);
    ++pair_end[rank + 1];
    const int length = length_class(w.kv_end - w.kv_begin);
    item_class[i] = static_cast<uint8_t>(length);
    counted.take(length);
  }
  counted.flush();
  for (size_t p = 0; p < pairs; ++p) pair_end[p + 1] += pair_end[p];
  for (size_t i = 0; i < n; ++i) by_pair[pair_end[key[i]]++] = static_cast<int32_t>(i);
  // pair_end[p] is now pair p's end (and pair p + 1's begin from index p).

  int32_t slots = 0;
  if (any_split) {
    // Partial slots as emit_schedule numbers them: the pairs of split tiles in (tile, head
    // group) order, a pair's pieces consecutive in KV order (only a split pair has more than one
    // piece); one merge item per head of such a pair. The split pairs are marked from the
    // schedule's list of them, so the pass reads no item of the others (a look-up of each pair's
    // first item was ~20% of this function, perf).
    uint8_t* const split = q.pair_split.data();
    std::fill_n(split, pairs, uint8_t{0});
    for (const int32_t pair : scratch.split_pairs) split[pair] = 1;
    for (size_t t = 0; t < tiles.size(); ++t) {
      const auto r = static_cast<size_t>(tiles[t].request);
      const int64_t i = static_cast<int64_t>(t) - first_tile[r];
      for (int64_t h = 0; h < heads; ++h) {
        if (!split[t * static_cast<size_t>(heads) + static_cast<size_t>(h)]) continue;
        const size_t rank = pair_rank(r, i, h);
        const int32_t pair_begin = rank == 0 ? 0 : pair_end[rank - 1];
        const int32_t end = pair_end[rank];
        sort_pieces_by_kv(by_pair, pair_begin, end, items);
        // Piece k of the pair holds slots first + k * item_heads + j under the group's head j.
        const int32_t first = slots;
        for (int32_t k = pair_begin; k < end; ++k) {
          key[by_pair[k]] = slots;
          slots += item_heads;
        }
        for (int32_t j = 0; j < item_heads; ++j) {
          plan.merge_items.push_back({tiles[t].request, static_cast<int32_t>(h) * item_heads + j,
                                      tiles[t].row_begin, tiles[t].row_end});
          for (int32_t slot = first + j; slot < slots; slot += item_heads) {
            plan.merge_slots.push_back(slot);
          }
          plan.merge_indptr.push_back(static_cast<int32_t>(plan.merge_slots.size()));
        }
      }
    }
  }
  plan.num_partial_slots = slots;

  // Stable counting sort by length class, longest first.
  longest_first_positions(next);
  WorkItem* const out = plan.work_items.data();
  ClassCursor<int32_t> at(next);
  for (size_t k = 0; k < n; ++k) {
    const auto i = static_cast<size_t>(by_pair[k]);
    WorkItem item = items[i];
    item.reserved = 0;
    item.kv_head *= item_heads;
    if (item.partial_slot == kSlotPending) item.partial_slot = key[i];
    out[at.take(item_class[i])] = item;
  }
  split_evenly(plan.num_ctas, plan);
}

}  // namespace flare::plan_detail
