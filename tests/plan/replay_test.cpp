// The rate-sharing replay behind PlanOptions::queue_rates (src/plan/schedule.h): between
// consecutive CTA ends, the n CTAs still busy each run at min(cta rate, device rate / n).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "src/plan/schedule.h"

namespace flare::plan_detail {
namespace {

ScheduleScratch with_loads(const std::vector<double>& loads, int fraction_bits = 16) {
  ScheduleScratch scratch;
  scratch.fraction_bits = fraction_bits;
  for (const double load : loads) {
    scratch.loads.push_back(static_cast<uint64_t>(load * (uint64_t{1} << fraction_bits)));
  }
  return scratch;
}

TEST(Replay, BusyCtasShareTheDeviceRateUntilEachEnds) {
  // Loads 4, 1, 2 at 1 a us a CTA, 2 together: three share 2 until the first ends (1 unit each:
  // 1.5 us), two run at 1 (1 more unit: 1 us), the last alone (2 units: 2 us).
  EXPECT_DOUBLE_EQ(replay_loads(with_loads({4, 1, 2}), 1.0, 2.0), 4.5);
  // Unbounded device: the busiest CTA at its own rate.
  EXPECT_DOUBLE_EQ(replay_loads(with_loads({4, 1, 2}), 1.0, 1e9), 4.0);
  // Idle CTAs (load 0) take no share.
  EXPECT_DOUBLE_EQ(replay_loads(with_loads({0, 0, 3}), 1.0, 2.0), 3.0);
  EXPECT_DOUBLE_EQ(replay_loads(with_loads({}), 1.0, 2.0), 0.0);
}

TEST(Replay, EqualPiecesReplayAsTheirLoads) {
  // 10 pieces of cost 2 on 4 CTAs: loads 6, 6, 4, 4.
  EXPECT_DOUBLE_EQ(replay_equal_pieces(10, 4, 2.0, 1.0, 100.0), 6.0);
  EXPECT_DOUBLE_EQ(replay_equal_pieces(10, 4, 2.0, 1.0, 100.0),
                   replay_loads(with_loads({6, 6, 4, 4}), 1.0, 100.0));
  for (const double device : {0.5, 1.0, 2.5, 3.0, 8.0}) {
    EXPECT_DOUBLE_EQ(replay_equal_pieces(10, 4, 2.0, 1.0, device),
                     replay_loads(with_loads({6, 6, 4, 4}), 1.0, device))
        << device;
  }
  // Fewer pieces than CTAs: one round of the pieces alone.
  EXPECT_DOUBLE_EQ(replay_equal_pieces(3, 8, 2.0, 1.0, 1.5), 2.0 / 0.5);
  EXPECT_DOUBLE_EQ(replay_equal_pieces(0, 8, 2.0, 1.0, 1.5), 0.0);
}

// assign_chunks's give-up cost (plan.cpp's comparison of two schedules): at or below the
// busiest CTA's cost the schedule stops and returns +infinity; above it, the same schedule.
TEST(AssignChunks, GivesUpOnceACtaReachesTheBound) {
  std::vector<Tile> tiles;
  for (int32_t r = 0; r < 40; ++r) {
    tiles.push_back({r, 0, r, r + 1, 0, 64 + 37 * r, -1, 0});  // request r: one row, uneven KV
  }
  ScheduleParams params;
  params.num_kv_heads = 2;
  params.num_ctas = 16;
  params.page_size = 16;
  params.kv_chunk = 512;
  params.fill_split = true;
  params.max_split_chunks = 32;
  params.item_cost = 8.0;
  ScheduleScratch full;
  const double busiest = assign_chunks(tiles, params, full);
  ASSERT_GT(busiest, 0.0);
  ScheduleScratch scratch;
  EXPECT_EQ(assign_chunks(tiles, params, scratch, busiest),
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(assign_chunks(tiles, params, scratch, busiest / 2),
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(assign_chunks(tiles, params, scratch, std::nextafter(busiest, 1e300)), busiest);
  EXPECT_EQ(scratch.loads, full.loads);
  EXPECT_EQ(scratch.assigned_count, full.assigned_count);
}

}  // namespace
}  // namespace flare::plan_detail
