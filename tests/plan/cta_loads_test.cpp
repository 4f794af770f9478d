// Algorithm 1's CTA loads (src/plan/cta_loads.h): the lightest CTA, ties to the lower index, in
// every mode (rounds of equal costs without the tree, zero costs, the tree), against a scan.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "src/plan/cta_loads.h"

namespace flare::plan_detail {
namespace {

// The lightest CTA by a scan: the smallest load, then the smallest index.
int32_t scan_lightest(const std::vector<uint64_t>& loads) {
  int32_t best = 0;
  for (size_t c = 1; c < loads.size(); ++c) {
    if (loads[c] < loads[static_cast<size_t>(best)]) best = static_cast<int32_t>(c);
  }
  return best;
}

// Adds `costs` in turn to the lightest CTA of both and checks they agree at every step.
void expect_like_a_scan(int num_ctas, const std::vector<uint64_t>& costs) {
  std::vector<uint64_t> nodes;
  CtaLoads ctas(num_ctas, nodes);
  std::vector<uint64_t> loads(static_cast<size_t>(num_ctas), 0);
  for (size_t i = 0; i < costs.size(); ++i) {
    const int32_t expected = scan_lightest(loads);
    ASSERT_EQ(ctas.lightest(), expected) << "step " << i << " of " << num_ctas << " CTAs";
    ASSERT_EQ(ctas.lightest_load(), loads[static_cast<size_t>(expected)]) << "step " << i;
    ctas.add_to_lightest(costs[i]);
    loads[static_cast<size_t>(expected)] += costs[i];
  }
  std::vector<uint64_t> out;
  ctas.loads(out);
  EXPECT_EQ(out, loads);
}

TEST(CtaLoads, RoundsOfEqualCostsThenUnequalOnesPickLikeAScan) {
  for (const int ctas : {1, 2, 3, 7, 64, 396}) {
    // Three rounds of one cost, a round of another, then a split round: the tree from there on.
    std::vector<uint64_t> costs(static_cast<size_t>(3 * ctas), 100);
    costs.insert(costs.end(), static_cast<size_t>(ctas), 37);
    for (int i = 0; i < 2 * ctas; ++i) costs.push_back(i % 3 == 0 ? 11 : 5);
    expect_like_a_scan(ctas, costs);
  }
}

TEST(CtaLoads, ZeroCostsAndRandomCostsPickLikeAScan) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int ctas = 1 + static_cast<int>(rng() % 40);
    std::vector<uint64_t> costs;
    const int n = static_cast<int>(rng() % 300);
    const bool alike = trial % 2 == 0;  // equal costs: rounds that end level
    for (int i = 0; i < n; ++i) {
      const uint64_t roll = rng() % 10;
      costs.push_back(roll == 0 ? 0 : alike ? 8 : 1 + rng() % 50);
    }
    expect_like_a_scan(ctas, costs);
  }
}

}  // namespace
}  // namespace flare::plan_detail
