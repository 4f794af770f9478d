// Load balance of the targets: decode with GQA 4 on 132 CTAs, batch 16..256, max CTA
// cost / mean CTA cost <= 1.10 for Zipf-distributed KV lengths (mean 1024) and <= 1.05 for
// uniform (and constant) lengths. Each case prints its worst ratio (docs/perf.md, "Planner").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "flare/plan/plan.h"
#include "plan/plan_testing.h"
#include "testing/random.h"

namespace flare {
namespace {

using plan_testing::LengthProblem;

constexpr int kCtas = 132;
const std::vector<int64_t> kBatches = {16, 17, 24, 32, 48, 64, 100, 128, 140, 200, 256};
constexpr int kSeeds = 5;

double imbalance(const Plan& result) {
  const double max = *std::max_element(result.cta_cost.begin(), result.cta_cost.end());
  const double mean = std::accumulate(result.cta_cost.begin(), result.cta_cost.end(), 0.0) /
                      static_cast<double>(result.cta_cost.size());
  return max / mean;
}

enum class Lengths { kZipf, kUniform, kUniformNarrow, kConstant };

std::vector<int32_t> lengths_for(Lengths kind, int64_t batch, uint64_t seed) {
  using testing::LengthDistribution;
  switch (kind) {
    case Lengths::kZipf:
      return plan_testing::zipf_lengths(batch, 1024.0, seed);
    case Lengths::kUniform:
      return testing::random_lengths(batch, LengthDistribution::kUniform, 1, 2047, seed);
    case Lengths::kUniformNarrow:
      return testing::random_lengths(batch, LengthDistribution::kUniform, 512, 1536, seed);
    case Lengths::kConstant:
      return testing::random_lengths(batch, LengthDistribution::kConstant, 1024, 1024, seed);
  }
  return {};
}

// Worst max/mean over batches, seeds and page sizes 1 and 16 of decode (q_len 1) with
// `num_kv_heads` KV heads and GQA 4.
double worst_imbalance(Lengths kind, int num_kv_heads, const char* name) {
  double worst = 0.0;
  for (const int page_size : {1, 16}) {
    for (const int64_t batch : kBatches) {
      for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
        LengthProblem p(std::vector<int32_t>(static_cast<size_t>(batch), 1),
                        lengths_for(kind, batch, seed), 4 * num_kv_heads, num_kv_heads, 128,
                        page_size);
        const Plan result = plan(p.problem, {kCtas, 1});
        EXPECT_LE(result.num_partial_slots, 2 * kCtas);
        worst = std::max(worst, imbalance(result));
      }
    }
  }
  std::printf("[ balance  ] %-15s H_kv=%d: worst max/mean CTA cost %.4f\n", name, num_kv_heads,
              worst);
  return worst;
}

TEST(Balance, ZipfLengthsWithinTenPercent) {
  EXPECT_LE(worst_imbalance(Lengths::kZipf, 8, "zipf"), 1.10);
}

TEST(Balance, UniformLengthsWithinFivePercent) {
  EXPECT_LE(worst_imbalance(Lengths::kUniform, 8, "uniform 1-2047"), 1.05);
  EXPECT_LE(worst_imbalance(Lengths::kUniformNarrow, 8, "uniform 512-1536"), 1.05);
  EXPECT_LE(worst_imbalance(Lengths::kConstant, 8, "constant 1024"), 1.05);
}

TEST(Balance, FewKvHeadsStillBalance) {
  // Fewer tiles than CTAs (H_kv 2: 32 tiles at batch 16): the fill splits carry the balance.
  EXPECT_LE(worst_imbalance(Lengths::kZipf, 2, "zipf"), 1.10);
  EXPECT_LE(worst_imbalance(Lengths::kUniform, 2, "uniform 1-2047"), 1.10);
}

TEST(Balance, FewTilesWithCostlyItemsAreCutEvenly) {
  // 16 x 4096 tokens, 8 KV heads on 396 CTAs, an item costing 160 tokens (alpha 40 x 4 rows,
  // as BatchDecode sets it): L_kv = W / #CTA would leave 112-token remainders that pile up;
  // three equal chunks per tile give each CTA at most one item.
  LengthProblem p(std::vector<int32_t>(16, 1), std::vector<int32_t>(16, 4096), 32, 8, 128, 16);
  PlanOptions options;
  options.query_tile = 4;
  options.alpha = 40.0f;
  const Plan result = plan(p.problem, {kCtas, 3}, options);
  EXPECT_LE(imbalance(result), 1.05);
  for (int cta = 0; cta < result.num_ctas; ++cta) {
    EXPECT_LE(result.cta_indptr[static_cast<size_t>(cta) + 1] -
                  result.cta_indptr[static_cast<size_t>(cta)],
              1);
  }
}

TEST(Balance, OneHugeRequestAmongTinyOnes) {
  std::vector<int32_t> kv(64, 8);
  kv[13] = 200000;
  LengthProblem p(std::vector<int32_t>(64, 1), kv, 32, 8, 128, 16);
  const Plan result = plan(p.problem, {kCtas, 1});
  EXPECT_LE(imbalance(result), 1.05);
}

}  // namespace
}  // namespace flare
