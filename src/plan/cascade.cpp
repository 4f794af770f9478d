// The cascade's virtual batch and merge map (flare/plan/cascade.h). Row space: packed row
// token * group + h of the whole batch ("global rows"); a virtual request's packed row r is
// global row qo_begin * group + r. Every level's tiles partition the global rows they cover;
// pieces are the common refinement of all levels' tiles.
#include "flare/plan/cascade.h"

#include <algorithm>
#include <limits>

#include "flare/core/error.h"

namespace flare {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// A tile of the plan: rows [row_begin, row_end) of `request`, as global rows.
struct CascadeTile {
  int32_t request = 0;
  int32_t level = 0;
  int64_t global_begin = 0;
  int64_t global_end = 0;
};

}  // namespace

void cascade_batch(std::span<const CascadeLevelLengths> levels, bool causal, CascadeBatch& out) {
  FLARE_CHECK(!levels.empty(), ErrorCode::kInvalidArgument, "cascade: at least one level needed");
  out.first_request.assign(1, 0);
  out.qo_begin.clear();
  out.qo_len.clear();
  out.kv_len.clear();
  out.q_offset.clear();
  out.plan_qo_len.clear();
  const int num_levels = static_cast<int>(levels.size());
  int64_t total = -1;
  for (int l = 0; l < num_levels; ++l) {
    const CascadeLevelLengths& level = levels[static_cast<size_t>(l)];
    const auto groups = static_cast<int64_t>(level.qo_indptr.size()) - 1;
    FLARE_CHECK(groups >= 1, ErrorCode::kInvalidArgument, "cascade: level ", l,
                ": qo_indptr must have groups + 1 >= 2 entries, got ", level.qo_indptr.size());
    FLARE_CHECK(static_cast<int64_t>(level.kv_len.size()) == groups, ErrorCode::kInvalidArgument,
                "cascade: level ", l, ": one KV length per group needed (", groups, "), got ",
                level.kv_len.size());
    FLARE_CHECK(level.qo_indptr[0] == 0, ErrorCode::kInvalidArgument, "cascade: level ", l,
                ": qo_indptr[0] must be 0, got ", level.qo_indptr[0]);
    const bool last = l == num_levels - 1;
    for (int64_t g = 0; g < groups; ++g) {
      const int32_t begin = level.qo_indptr[static_cast<size_t>(g)];
      const int32_t end = level.qo_indptr[static_cast<size_t>(g) + 1];
      const int32_t kv = level.kv_len[static_cast<size_t>(g)];
      FLARE_CHECK(end >= begin, ErrorCode::kInvalidArgument, "cascade: level ", l,
                  ": qo_indptr must be non-decreasing: qo_indptr[", g + 1, "]=", end,
                  " < qo_indptr[", g, "]=", begin);
      FLARE_CHECK(kv >= 0, ErrorCode::kInvalidArgument, "cascade: level ", l, ": group ", g,
                  " has ", kv, " KV tokens");
      const int32_t q = end - begin;
      out.qo_begin.push_back(begin);
      out.qo_len.push_back(q);
      out.kv_len.push_back(kv);
      // Shared levels of a causal cascade see every key: token t at kv_len - 1 + t.
      out.q_offset.push_back(causal && !last ? kv - 1 : kv - q);
      // The last level covers every token (its tiles write o where nothing else does); a
      // shared group without KV has no state to add.
      out.plan_qo_len.push_back(last || kv > 0 ? q : 0);
    }
    const int64_t level_total = level.qo_indptr.back();
    FLARE_CHECK(total < 0 || level_total == total, ErrorCode::kInvalidArgument, "cascade: level ",
                l, "'s qo_indptr ends at ", level_total, " tokens, level 0's at ", total,
                ": every level must cover the batch's tokens");
    total = level_total;
    FLARE_CHECK(static_cast<int64_t>(out.qo_len.size()) <= kInt32Max, ErrorCode::kUnsupported,
                "cascade: more groups than int32 holds");
    out.first_request.push_back(static_cast<int32_t>(out.qo_len.size()));
  }
  out.total_qo = total;
}

void cascade_merge_map(const CascadeBatch& batch, Plan& plan) {
  const int64_t group = plan.group_size;
  const int64_t heads = plan.num_kv_heads;
  const int64_t tile_rows = plan.query_tile;
  const int32_t requests = batch.num_requests();
  const int num_levels = batch.num_levels();
  FLARE_CHECK(group >= 1 && heads >= 1 && tile_rows >= 1 && plan.item_heads >= 1,
              ErrorCode::kInvalidArgument, "cascade_merge_map: not a plan from plan()");

  // Tiles of each virtual request, in request order (so in global row order within a level).
  std::vector<int64_t> tile_base(static_cast<size_t>(requests) + 1, 0);
  std::vector<CascadeTile> tiles;
  for (int l = 0; l < num_levels; ++l) {
    for (int32_t v = batch.first_request[static_cast<size_t>(l)];
         v < batch.first_request[static_cast<size_t>(l) + 1]; ++v) {
      const int64_t rows = int64_t{batch.plan_qo_len[static_cast<size_t>(v)]} * group;
      const int64_t first = int64_t{batch.qo_begin[static_cast<size_t>(v)]} * group;
      for (int64_t r = 0; r < rows; r += tile_rows) {
        tiles.push_back({v, l, first + r, first + std::min(rows, r + tile_rows)});
      }
      tile_base[static_cast<size_t>(v) + 1] = static_cast<int64_t>(tiles.size());
    }
  }
  const auto num_tiles = static_cast<int64_t>(tiles.size());

  // Chunks of each (tile, KV head): (work item, head within it), in KV order. Items covering
  // every KV head give every head the same chunks: then one list a tile (head 0's).
  const int64_t chunk_heads = plan.item_heads == heads ? 1 : heads;
  const int32_t item_heads_listed = chunk_heads == 1 ? 1 : plan.item_heads;
  const auto key = [chunk_heads](int64_t tile, int64_t head) {
    return static_cast<size_t>(tile * chunk_heads + (chunk_heads == 1 ? 0 : head));
  };
  struct Chunk {
    int32_t item;
    int32_t head;  // within the item's item_heads
    int32_t kv_begin;
  };
  std::vector<int64_t> chunk_indptr(static_cast<size_t>(num_tiles * chunk_heads) + 1, 0);
  auto tile_of = [&](const WorkItem& item) {
    FLARE_CHECK(item.request >= 0 && item.request < requests && item.row_begin % tile_rows == 0,
                ErrorCode::kInvalidArgument, "cascade_merge_map: work item of request ",
                item.request, " row ", item.row_begin, " is not a tile of the cascade's batch");
    const int64_t tile = tile_base[static_cast<size_t>(item.request)] + item.row_begin / tile_rows;
    FLARE_CHECK(tile < tile_base[static_cast<size_t>(item.request) + 1],
                ErrorCode::kInvalidArgument, "cascade_merge_map: work item of request ",
                item.request, " row ", item.row_begin, " is past the request's tiles");
    return tile;
  };
  std::vector<int64_t> item_tile(plan.work_items.size());  // each work item's tile
  for (size_t i = 0; i < plan.work_items.size(); ++i) {
    const WorkItem& item = plan.work_items[i];
    const int64_t tile = item_tile[i] = tile_of(item);
    for (int32_t j = 0; j < item_heads_listed; ++j) ++chunk_indptr[key(tile, item.kv_head + j) + 1];
  }
  for (size_t i = 1; i < chunk_indptr.size(); ++i) chunk_indptr[i] += chunk_indptr[i - 1];
  std::vector<Chunk> chunks(static_cast<size_t>(chunk_indptr.back()));
  {
    std::vector<int64_t> fill(chunk_indptr.begin(), chunk_indptr.end() - 1);
    for (size_t i = 0; i < plan.work_items.size(); ++i) {
      const WorkItem& item = plan.work_items[i];
      const int64_t tile = item_tile[i];
      for (int32_t j = 0; j < item_heads_listed; ++j) {
        chunks[static_cast<size_t>(fill[key(tile, item.kv_head + j)]++)] = {static_cast<int32_t>(i),
                                                                            j, item.kv_begin};
      }
    }
  }
  for (int64_t k = 0; k < num_tiles * chunk_heads; ++k) {
    FLARE_CHECK(chunk_indptr[static_cast<size_t>(k) + 1] > chunk_indptr[static_cast<size_t>(k)],
                ErrorCode::kInvalidArgument, "cascade_merge_map: tile ", k / chunk_heads,
                " has no work item under KV head ", k % chunk_heads);
    std::sort(chunks.begin() + chunk_indptr[static_cast<size_t>(k)],
              chunks.begin() + chunk_indptr[static_cast<size_t>(k) + 1],
              [](const Chunk& a, const Chunk& b) { return a.kv_begin < b.kv_begin; });
  }

  // Pieces: the segments between all tiles' boundaries, each with the tile of every level that
  // covers it (-1 for none).
  std::vector<int64_t> bounds;
  bounds.reserve(static_cast<size_t>(2 * num_tiles));
  for (const CascadeTile& t : tiles) {
    bounds.push_back(t.global_begin);
    bounds.push_back(t.global_end);
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<int64_t> level_tiles_begin(static_cast<size_t>(num_levels) + 1, 0);
  for (const CascadeTile& t : tiles) ++level_tiles_begin[static_cast<size_t>(t.level) + 1];
  for (int l = 0; l < num_levels; ++l) {
    level_tiles_begin[static_cast<size_t>(l) + 1] += level_tiles_begin[static_cast<size_t>(l)];
  }
  const auto num_pieces = bounds.empty() ? 0 : static_cast<int64_t>(bounds.size()) - 1;
  std::vector<int64_t> cover(static_cast<size_t>(num_pieces * num_levels), -1);
  std::vector<uint8_t> shared(static_cast<size_t>(num_tiles), 0);  // another level overlaps it
  {
    std::vector<int64_t> next(level_tiles_begin.begin(), level_tiles_begin.end() - 1);
    for (int64_t p = 0; p < num_pieces; ++p) {
      const int64_t begin = bounds[static_cast<size_t>(p)];
      int covering = 0;
      for (int l = 0; l < num_levels; ++l) {
        int64_t& t = next[static_cast<size_t>(l)];
        const int64_t end = level_tiles_begin[static_cast<size_t>(l) + 1];
        while (t < end && tiles[static_cast<size_t>(t)].global_end <= begin) ++t;
        if (t < end && tiles[static_cast<size_t>(t)].global_begin <= begin) {
          cover[static_cast<size_t>(p * num_levels + l)] = t;
          ++covering;
        }
      }
      if (covering > 1) {
        for (int l = 0; l < num_levels; ++l) {
          const int64_t t = cover[static_cast<size_t>(p * num_levels + l)];
          if (t >= 0) shared[static_cast<size_t>(t)] = 1;
        }
      }
    }
  }
  FLARE_CHECK(num_pieces == 0 ||
                  cover[static_cast<size_t>((num_pieces - 1) * num_levels + num_levels - 1)] >= 0,
              ErrorCode::kInvalidArgument, "cascade_merge_map: the last level covers no row");

  // Write-through: a tile alone on its rows in one chunk, under every KV head of its items.
  auto chunk_count = [&](int64_t tile, int64_t head) {
    return chunk_indptr[key(tile, head) + 1] - chunk_indptr[key(tile, head)];
  };
  int32_t slots = 0;
  for (size_t i = 0; i < plan.work_items.size(); ++i) {
    WorkItem& item = plan.work_items[i];
    const int64_t tile = item_tile[i];
    bool direct = shared[static_cast<size_t>(tile)] == 0;
    for (int32_t j = 0; direct && j < item_heads_listed; ++j) {
      direct = chunk_count(tile, item.kv_head + j) == 1;
    }
    if (direct) {
      item.partial_slot = -1;
    } else {
      FLARE_CHECK(int64_t{slots} + plan.item_heads <= kInt32Max, ErrorCode::kUnsupported,
                  "cascade_merge_map: partial slots exceed int32");
      item.partial_slot = slots;
      slots += plan.item_heads;
    }
  }
  plan.num_partial_slots = slots;

  // Merge items: per KV head, each piece some tile of which writes partial states (a piece's
  // tiles are then all partial: shared, or its one tile split).
  // Items covering every KV head (item_heads == heads) give every head the same chunks with
  // slots + h: one merge item a piece then stands for all heads (merge_heads), which keeps the
  // map 1 / heads the size (b64 decode under one prefix: 64 pieces, not 2,048).
  plan.merge_heads = plan.item_heads == heads ? static_cast<int>(heads) : 1;
  plan.merge_items.clear();
  plan.merge_indptr.assign(1, 0);
  plan.merge_slots.clear();
  plan.merge_row_offsets.clear();
  for (int64_t head = 0; head < heads; head += plan.merge_heads) {
    for (int64_t p = 0; p < num_pieces; ++p) {
      const int64_t begin = bounds[static_cast<size_t>(p)];
      const int64_t end = bounds[static_cast<size_t>(p) + 1];
      const int64_t last_tile = cover[static_cast<size_t>(p * num_levels + num_levels - 1)];
      if (last_tile < 0) continue;  // rows of no token (cannot happen: the last level covers all)
      const WorkItem& first_chunk = plan.work_items[static_cast<size_t>(
          chunks[static_cast<size_t>(chunk_indptr[key(last_tile, head)])].item)];
      if (first_chunk.partial_slot < 0) continue;  // written through
      const CascadeTile& owner = tiles[static_cast<size_t>(last_tile)];
      const int64_t request_first_row =
          int64_t{batch.qo_begin[static_cast<size_t>(owner.request)]} * group;
      for (int l = 0; l < num_levels; ++l) {
        const int64_t t = cover[static_cast<size_t>(p * num_levels + l)];
        if (t < 0) continue;
        const int64_t offset = begin - tiles[static_cast<size_t>(t)].global_begin;
        for (int64_t c = chunk_indptr[key(t, head)]; c < chunk_indptr[key(t, head) + 1]; ++c) {
          const Chunk& chunk = chunks[static_cast<size_t>(c)];
          const WorkItem& item = plan.work_items[static_cast<size_t>(chunk.item)];
          FLARE_CHECK(item.partial_slot >= 0, ErrorCode::kInternal,
                      "cascade_merge_map: a merged tile wrote through");
          plan.merge_slots.push_back(item.partial_slot + chunk.head);
          plan.merge_row_offsets.push_back(static_cast<int32_t>(offset));
        }
      }
      FLARE_CHECK(plan.merge_slots.size() <= static_cast<size_t>(kInt32Max),
                  ErrorCode::kUnsupported, "cascade_merge_map: merge entries exceed int32");
      plan.merge_items.push_back({owner.request, static_cast<int32_t>(head),
                                  static_cast<int32_t>(begin - request_first_row),
                                  static_cast<int32_t>(end - request_first_row)});
      plan.merge_indptr.push_back(static_cast<int32_t>(plan.merge_slots.size()));
    }
  }
}

}  // namespace flare
