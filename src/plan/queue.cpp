// One-queue plans: work items in the order a kernel's CTAs take them from one queue (length
// class, longest first; request; KV head; later rows first; KV order; plan/plan.h says why),
// either sorted from Algorithm 1's pieces or, when the queue alone balances, written in that
// order directly: a counting sort over length classes of chunks that each cover all KV heads,
// O(chunks) with no comparison (a batch of 64 causal requests of 1024 tokens is 2048 items).
#include "src/plan/queue.h"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstdint>
#include <vector>

#include "src/plan/schedule.h"

namespace flare::plan_detail {
namespace {

// bit_width of a tile count of an int32 length: 0 (no keys) to 32.
constexpr int kLengthClasses = 33;

// The length class of a KV length: the bit width of the KV tiles it spans. kv_tile is a
// power of two in practice: a shift instead of a division per chunk.
class LengthClass {
 public:
  explicit LengthClass(int kv_tile)
      : tile_(kv_tile),
        shift_(std::has_single_bit(static_cast<uint32_t>(kv_tile))
                   ? std::countr_zero(static_cast<uint32_t>(kv_tile))
                   : -1) {}

  int operator()(int64_t length) const {
    const auto rounded = static_cast<uint64_t>(length + tile_ - 1);
    return std::bit_width(shift_ >= 0 ? rounded >> shift_ : rounded / tile_);
  }

 private:
  int64_t tile_;
  int shift_;
};

// cta_indptr: num_ctas near-equal ranges of the items in queue order, for executors that run
// CTAs (the kernel takes entries from the queue and ignores it).
void split_evenly(int num_ctas, Plan& plan) {
  const auto items = static_cast<int64_t>(plan.work_items.size());
  plan.cta_indptr.resize(static_cast<size_t>(num_ctas) + 1);
  for (int c = 0; c <= num_ctas; ++c) {
    plan.cta_indptr[static_cast<size_t>(c)] = static_cast<int32_t>(items * c / num_ctas);
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
  for (size_t t = 0; t < tiles.size(); ++t) {
    const Tile& tile = tiles[t];
    if (tile.kv_end <= params.kv_chunk) {
      const int length = length_class(tile.kv_end - tile.kv_begin);
      tile_class[t] = static_cast<uint8_t>(length);
      ++next[static_cast<size_t>(length)];
      continue;
    }
    for_each_chunk(tile, params.kv_chunk, [&](int32_t kv_begin, int32_t kv_end) {
      ++next[static_cast<size_t>(length_class(kv_end - kv_begin))];
    });
  }
  int64_t position = 0;
  for (int c = kLengthClasses - 1; c >= 0; --c) {
    const int64_t count = next[static_cast<size_t>(c)];
    next[static_cast<size_t>(c)] = position;
    position += count;
  }

  // Pass 2: requests in order, a request's tiles last row first, chunks in KV order, each to
  // the next position of its class. A split tile's chunk c holds the partial slots
  // base + c * heads + h, and each of its heads is a merge item over them in KV order.
  plan.work_items.resize(static_cast<size_t>(position));
  plan.merge_items.clear();
  plan.merge_indptr.assign(1, 0);
  plan.merge_slots.clear();
  WorkItem* const items = plan.work_items.data();
  int32_t slots = 0;
  for (size_t first = 0; first < tiles.size();) {
    size_t end = first + 1;
    while (end < tiles.size() && tiles[end].request == tiles[first].request) ++end;
    for (size_t t = end; t-- > first;) {
      const Tile& tile = tiles[t];
      if (tile.kv_end <= params.kv_chunk) {
        items[next[tile_class[t]]++] = tile;
        continue;
      }
      const bool split = chunk_count(tile.kv_begin, tile.kv_end, params.kv_chunk) > 1;
      const int32_t base = slots;
      const int64_t count =
          for_each_chunk(tile, params.kv_chunk, [&](int32_t kv_begin, int32_t kv_end) {
            int64_t& at = next[static_cast<size_t>(length_class(kv_end - kv_begin))];
            items[at++] = {tile.request, 0,      tile.row_begin,     tile.row_end,
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

void order_for_queue(int kv_tile, Plan& plan) {
  // The queue order as a key per item (length class descending, request, KV head, row_begin
  // descending, kv_begin; every field >= 0), sorted with the item's index, then the items
  // permuted: comparing keys is three integer compares where deriving each item's class in
  // the comparison took half the planning time of a thousand-item plan (perf).
  struct Keyed {
    uint64_t class_request;  // (32 - class) << 32 | request
    uint64_t head_row;       // kv_head << 32 | (INT32_MAX - row_begin)
    uint32_t kv_begin;
    uint32_t index;
  };
  const LengthClass length_class(kv_tile);
  thread_local std::vector<Keyed> keyed;
  thread_local std::vector<WorkItem> sorted;
  const size_t n = plan.work_items.size();
  keyed.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const WorkItem& w = plan.work_items[i];
    const auto inverse_class =
        static_cast<uint64_t>(kLengthClasses - 1 - length_class(w.kv_end - w.kv_begin));
    keyed[i] = {inverse_class << 32 | static_cast<uint32_t>(w.request),
                static_cast<uint64_t>(static_cast<uint32_t>(w.kv_head)) << 32 |
                    static_cast<uint32_t>(INT32_MAX - w.row_begin),
                static_cast<uint32_t>(w.kv_begin), static_cast<uint32_t>(i)};
  }
  std::sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) {
    if (a.class_request != b.class_request) return a.class_request < b.class_request;
    if (a.head_row != b.head_row) return a.head_row < b.head_row;
    return a.kv_begin < b.kv_begin;
  });
  sorted.resize(n);
  for (size_t i = 0; i < n; ++i) sorted[i] = plan.work_items[keyed[i].index];
  plan.work_items.swap(sorted);
  split_evenly(plan.num_ctas, plan);
}

}  // namespace flare::plan_detail
