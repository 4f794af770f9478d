// Query tile selection and the KV range each packed-row tile sees.
#include "src/plan/tiles.h"

#include <algorithm>

namespace flare::plan_detail {

int choose_query_tile(const PlanProblem& problem, int group, int requested) {
  if (requested > 0) return requested;
  int64_t packed_rows = 0;
  int64_t requests_with_queries = 0;
  for (const int32_t q_len : problem.qo_len) {
    packed_rows += int64_t{q_len} * group;
    requests_with_queries += q_len > 0;
  }
  // tile >= average  <=>  tile * requests >= packed_rows (exact, no division).
  for (const int tile : kAutoQueryTiles) {
    if (tile * requests_with_queries >= packed_rows) return tile;
  }
  return kAutoQueryTiles[std::size(kAutoQueryTiles) - 1];
}

TileSummary build_tiles(const PlanProblem& problem, int group, int query_tile, int64_t tile_count,
                        std::vector<Tile>& tiles) {
  tiles.resize(static_cast<size_t>(tile_count));
  Tile* tile = tiles.data();
  TileSummary summary;
  // A tile starts query_tile packed rows after the last: step_tokens tokens and step_rows rows
  // later, so its first row's token and row within the token follow without a division.
  const int64_t step_tokens = query_tile / group;
  const int64_t step_rows = query_tile % group;
  const int32_t batch = static_cast<int32_t>(problem.qo_len.size());
  for (int32_t request = 0; request < batch; ++request) {
    const int64_t q_len = problem.qo_len[static_cast<size_t>(request)];
    const int64_t kv_len = problem.kv_len[static_cast<size_t>(request)];
    const int64_t packed_rows = q_len * group;
    // Query token t sits at KV position first_position + t: kv_len - q_len (bottom-right
    // alignment) unless the problem says otherwise.
    const int64_t first_position =
        problem.q_offset.empty() ? kv_len - q_len : problem.q_offset[static_cast<size_t>(request)];
    int64_t first_token = 0;  // of the tile's first packed row
    int64_t first_row = 0;    // that row's place in its token's group
    for (int64_t row_begin = 0; row_begin < packed_rows; row_begin += query_tile) {
      int64_t end_row = first_row + step_rows;  // the next tile's first row, as above
      const int64_t end_token = first_token + step_tokens + (end_row >= group);
      if (end_row >= group) end_row -= group;
      const int64_t row_end = std::min(packed_rows, row_begin + query_tile);
      const int64_t last_token =
          row_end == packed_rows ? q_len - 1 : end_token - (end_row == 0 ? 1 : 0);
      int64_t kv_end = kv_len;
      if (problem.causal) kv_end = std::clamp<int64_t>(first_position + last_token + 1, 0, kv_len);
      int64_t kv_begin = 0;
      if (problem.window_left >= 0) {
        kv_begin =
            std::clamp<int64_t>(first_position + first_token - problem.window_left, 0, kv_len);
      }
      if (kv_begin >= kv_end) kv_begin = kv_end = 0;
      *tile++ = {request,
                 0,
                 static_cast<int32_t>(row_begin),
                 static_cast<int32_t>(row_end),
                 static_cast<int32_t>(kv_begin),
                 static_cast<int32_t>(kv_end),
                 -1,
                 0};
      summary.total_rows += row_end - row_begin;
      summary.total_kv += kv_end - kv_begin;
      summary.max_kv_end = std::max(summary.max_kv_end, static_cast<int32_t>(kv_end));
      summary.longest = std::max(summary.longest, static_cast<int32_t>(kv_end - kv_begin));
      first_token = end_token;
      first_row = end_row;
    }
  }
  return summary;
}

}  // namespace flare::plan_detail
