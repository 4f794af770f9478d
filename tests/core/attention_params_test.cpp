// AttentionParams::resolved_sm_scale and default_alibi_slope (variant layer; tested here with the
// rest of the host basics because it has no folder of its own).
#include "flare/variant/attention_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "flare/core/error.h"

namespace flare {
namespace {

TEST(AttentionParamsTest, DefaultScaleIsInverseSqrtHeadDim) {
  const AttentionParams params;
  EXPECT_EQ(params.resolved_sm_scale(128), static_cast<float>(1.0 / std::sqrt(128.0)));
  EXPECT_EQ(params.resolved_sm_scale(64), 0.125f);
  EXPECT_EQ(params.resolved_sm_scale(1), 1.0f);
  EXPECT_THROW(params.resolved_sm_scale(0), Error);
}

TEST(AttentionParamsTest, ExplicitScaleWins) {
  AttentionParams params;
  params.sm_scale = 0.3f;
  EXPECT_EQ(params.resolved_sm_scale(128), 0.3f);
}

// The ALiBi reference code (Press et al., ofirpress/attention_with_linear_biases on GitHub),
// transcribed: power-of-two counts get a geometric sequence starting at 2^(-8/n); others take
// the closest smaller power of two and then every other slope of twice that count.
std::vector<double> paper_alibi_slopes(int n) {
  auto power_of_two_slopes = [](int count) {
    const double start = std::pow(2.0, -std::pow(2.0, -(std::log2(count) - 3)));
    std::vector<double> slopes;
    for (int i = 0; i < count; ++i) slopes.push_back(start * std::pow(start, i));
    return slopes;
  };
  if (std::exp2(std::floor(std::log2(n))) == n) return power_of_two_slopes(n);
  const int closest = static_cast<int>(std::exp2(std::floor(std::log2(n))));
  std::vector<double> slopes = power_of_two_slopes(closest);
  const std::vector<double> doubled = paper_alibi_slopes(2 * closest);
  for (int i = 0; static_cast<int>(slopes.size()) < n; i += 2) slopes.push_back(doubled[i]);
  return slopes;
}

TEST(AttentionParamsTest, DefaultAlibiSlopesFollowThePaper) {
  for (int num_heads : {1, 2, 7, 8, 12, 32, 40, 97}) {
    const std::vector<double> expected = paper_alibi_slopes(num_heads);
    for (int h = 0; h < num_heads; ++h) {
      EXPECT_NEAR(default_alibi_slope(h, num_heads), expected[h], 1e-7 * expected[h])
          << "head " << h << " of " << num_heads;
    }
  }
  EXPECT_EQ(default_alibi_slope(0, 8), 0.5f);
  EXPECT_EQ(default_alibi_slope(7, 8), 1.0f / 256);
}

TEST(AttentionParamsTest, AlibiRejectsBadHeads) {
  EXPECT_THROW(default_alibi_slope(8, 8), Error);
  EXPECT_THROW(default_alibi_slope(-1, 8), Error);
  EXPECT_THROW(default_alibi_slope(0, 0), Error);
}

}  // namespace
}  // namespace flare
