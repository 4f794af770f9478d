// The dynamic tail: a static plan balances cost, but SMs stream KV at systematically different
// rates (on the H100 the fastest SMs finish a uniform b64 decode ~25% before the slowest,
// docs/perf.md decode v11), so CTAs end unevenly whatever the static balance. The tail keeps a
// share of the work unassigned: the end of each CTA's longest item, cut into chunks that CTAs take
// at run time once their own queue is done, so fast SMs take more of them.
//
// The chunk boundaries are fixed here, on the host, and every chunk writes its own partial
// slot, merged in KV order: which CTA runs a chunk changes the timing, never the result.
#include <algorithm>
#include <cmath>

#include "flare/core/error.h"
#include "src/plan/schedule.h"

namespace flare::plan_detail {
namespace {

constexpr int32_t kSlotPending = -2;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

void cut_dynamic_tail(Plan& plan, const TailParams& params, ScheduleScratch& scratch) {
  if (params.chunks_per_cta <= 0 || params.fraction <= 0.0 || plan.num_ctas <= 0) return;
  int64_t total_kv = 0;
  for (const WorkItem& item : plan.work_items) total_kv += item.kv_end - item.kv_begin;
  const auto mean = static_cast<double>(total_kv) / plan.num_ctas;
  const auto peel = static_cast<int64_t>(std::floor(params.fraction * mean));
  const int64_t page = params.page_size;
  const int64_t chunk =
      round_up((peel + params.chunks_per_cta - 1) / params.chunks_per_cta, page);
  if (peel <= 0 || chunk < std::max<int64_t>(1, params.min_chunk) || chunk > peel) return;

  // Each CTA keeps its queue; its longest item (the last of equals) keeps [kv_begin, cut), at
  // least one chunk long, and [cut, kv_end) becomes tail chunks: at most ceil(peel / chunk) <=
  // chunks_per_cta of them.
  std::vector<WorkItem>& tail = scratch.assigned;  // free after schedule()
  tail.clear();
  for (int cta = 0; cta < plan.num_ctas; ++cta) {
    const int32_t begin = plan.cta_indptr[static_cast<size_t>(cta)];
    const int32_t end = plan.cta_indptr[static_cast<size_t>(cta) + 1];
    if (begin == end) continue;
    size_t longest = static_cast<size_t>(begin);
    for (size_t i = longest + 1; i < static_cast<size_t>(end); ++i) {
      const WorkItem& a = plan.work_items[i];
      const WorkItem& b = plan.work_items[longest];
      if (a.kv_end - a.kv_begin >= b.kv_end - b.kv_begin) longest = i;
    }
    WorkItem& last = plan.work_items[longest];
    const int64_t cut =
        round_up(std::max<int64_t>(int64_t{last.kv_end} - peel, int64_t{last.kv_begin} + chunk),
                 page);
    if (cut >= last.kv_end) continue;
    for (int64_t b = cut; b < last.kv_end; b += chunk) {
      WorkItem piece = last;
      piece.kv_begin = static_cast<int32_t>(b);
      piece.kv_end = static_cast<int32_t>(std::min<int64_t>(b + chunk, last.kv_end));
      piece.partial_slot = kSlotPending;
      tail.push_back(piece);
    }
    plan.cta_cost[static_cast<size_t>(cta)] -= params.beta * static_cast<double>(last.kv_end - cut);
    last.kv_end = static_cast<int32_t>(cut);
    last.partial_slot = kSlotPending;
  }
  if (tail.empty()) return;
  plan.tail_begin = static_cast<int32_t>(plan.work_items.size());
  plan.tail_chunk = chunk;
  plan.work_items.insert(plan.work_items.end(), tail.begin(), tail.end());
  number_partial_slots(plan, scratch.split_items);
}

}  // namespace flare::plan_detail
