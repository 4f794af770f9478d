// The one-queue plan's cost-model checks (src/plan/queue_bounds.h says what each decides).
#include "src/plan/queue_bounds.h"

#include <algorithm>
#include <limits>

namespace flare::plan_detail {
namespace {

// queue_balances: the longest chunk at most 1/8 of a CTA's mean load.
constexpr int64_t kQueueEntriesPerCta = 8;

}  // namespace

ChunkLoad chunk_load(const TileSummary& summary, int64_t tile_count, const PlanProblem& problem,
                     const PlanOptions& options, int query_tile, int64_t kv_chunk) {
  const QueueCost cost(options);
  return {cost.chunk(query_tile, static_cast<double>(std::min<int64_t>(summary.longest, kv_chunk))),
          (cost.alpha * static_cast<double>(summary.total_rows) +
           cost.beta * static_cast<double>(summary.total_kv) +
           cost.item * static_cast<double>(tile_count)) *
              problem.num_kv_heads};
}

bool queue_balances(const ChunkLoad& load, int64_t resident_ctas) {
  return load.longest * static_cast<double>(kQueueEntriesPerCta * resident_ctas) <= load.total;
}

bool any_order_ends_near_mean(const ChunkLoad& load, const PlanOptions& options, int query_tile,
                              int64_t resident_ctas) {
  const double ctas = static_cast<double>(resident_ctas);
  return load.longest * (1 - 1 / ctas) <=
         QueueCost(options).fill_slack(load.total / ctas, query_tile);
}

QueueEnds queue_ends(const Plan& queue, const PlanOptions& options, int64_t resident_ctas) {
  const QueueCost costs(options);
  const double heads_after_first = queue.item_heads - 1;
  const double ctas = static_cast<double>(resident_ctas);
  const int64_t items = static_cast<int64_t>(queue.work_items.size());
  const int64_t last_head_first_entry = (queue.item_heads - 1) * items;
  double before = 0;                 // cost of the entries before this one, head minor
  double latest_minor = 0;           // bound on the latest end so far, head minor
  int64_t entries = 0;               // through this item's last head, head minor
  double one_head = 0;               // cost of items 0..i-1 under one head
  double latest_major_shifted = 0;   // without (heads - 1) x one head's cost / CTAs
  double latest_major_launched = 0;  // the last head's entries that start with the launch
  for (int64_t i = 0; i < items; ++i) {
    const WorkItem& item = queue.work_items[static_cast<size_t>(i)];
    const double cost = costs.chunk(item.row_end - item.row_begin, item.kv_end - item.kv_begin);
    before += heads_after_first * cost;
    entries += queue.item_heads;
    latest_minor = std::max(latest_minor, (entries > resident_ctas ? before / ctas : 0.0) + cost);
    before += cost;
    if (last_head_first_entry + i >= resident_ctas) {
      latest_major_shifted = std::max(latest_major_shifted, one_head / ctas + cost);
    } else {
      latest_major_launched = std::max(latest_major_launched, cost);
    }
    one_head += cost;
  }
  return {
      before / ctas, latest_minor,
      std::max(latest_major_launched, heads_after_first * one_head / ctas + latest_major_shifted)};
}

bool queue_ends_near_mean(const QueueEnds& ends, const PlanOptions& options, int query_tile) {
  return ends.head_minor <= ends.mean + QueueCost(options).fill_slack(ends.mean, query_tile);
}

bool head_major_ends_as_early(const QueueEnds& ends, const PlanOptions& options, int query_tile) {
  return ends.head_major <= std::max(ends.head_minor, ends.mean) +
                                QueueCost(options).fill_slack(ends.mean, query_tile);
}

bool queue_cannot_end_near_mean(std::span<const Tile> tiles, const PlanProblem& problem,
                                const PlanOptions& options, int query_tile, int64_t kv_chunk,
                                int64_t chunks, int64_t resident_ctas) {
  if (chunks * problem.num_kv_heads <= resident_ctas) return false;
  const QueueCost cost(options);
  double total = 0;  // cost of every chunk, one KV head
  double cheapest = std::numeric_limits<double>::max();
  for (const Tile& tile : tiles) {
    const int64_t length = tile.kv_end - tile.kv_begin;
    const double rows = tile.row_end - tile.row_begin;
    int64_t count = 1;
    int64_t shortest = length;
    if (tile.kv_end > kv_chunk) {  // the rare cut tile: divisions
      const int64_t first_end = (tile.kv_begin / kv_chunk + 1) * kv_chunk;
      const int64_t last_begin = (tile.kv_end - 1) / kv_chunk * kv_chunk;
      count = chunk_count(tile.kv_begin, tile.kv_end, kv_chunk);
      shortest = std::min(first_end - tile.kv_begin, tile.kv_end - last_begin);
    }
    cheapest = std::min(cheapest, cost.chunk(rows, static_cast<double>(shortest)));
    total += (cost.alpha * rows + cost.item) * static_cast<double>(count) +
             cost.beta * static_cast<double>(length);
  }
  const double ctas = static_cast<double>(resident_ctas);
  const double mean = total * problem.num_kv_heads / ctas;
  return cheapest * (1 - 1 / ctas) > cost.fill_slack(mean, query_tile);
}

int queue_head_group(int num_kv_heads, int num_ctas) {
  for (int group = num_kv_heads; group > 1; --group) {
    if (num_kv_heads % group == 0 && num_ctas % group == 0) return group;
  }
  return 1;
}

}  // namespace flare::plan_detail
