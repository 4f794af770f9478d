// AttentionParams::resolved_sm_scale, default_alibi_slope, rope_frequency and check_rope_params
// (variant layer; tested here with the rest of the host basics because it has no folder of its
// own).
#include "flare/variant/attention_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
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

// Meta's Llama 3.1 reference (apply_scaling in llama/model.py), transcribed per frequency:
// wavelengths shorter than old_len / high_freq_factor keep their frequency, longer than old_len
// / low_freq_factor are divided by the factor, and those between blend the two linearly in
// old_len / wavelength.
double llama31_frequency(double base, double factor, double low, double high, double old_len) {
  const double wavelength = 2 * M_PI / base;
  if (wavelength < old_len / high) return base;
  if (wavelength > old_len / low) return base / factor;
  const double smooth = (old_len / wavelength - low) / (high - low);
  return (1 - smooth) * base / factor + smooth * base;
}

TEST(AttentionParamsTest, RopeFrequencyLlamaAndLlama31) {
  AttentionParams params;
  params.pos_encoding = PosEncoding::kRopeLlama;
  params.rope_theta = 5e5f;
  params.rope_scale = 2.0f;
  for (const int pair : {0, 1, 17, 63}) {
    const double base = std::pow(5e5, -2.0 * pair / 128);
    EXPECT_DOUBLE_EQ(rope_frequency(params, pair, 128), base / 2.0) << pair;
  }
  // Llama 3.1 8B: factor 8, low 1, high 4, 8192 original positions; all three regimes occur
  // across 64 pairs (the high frequencies kept, the low ones divided by 8, a blend between).
  params.rope_scale = 8.0f;
  params.rope_llama31 = AttentionParams::Llama31Scaling{1.0f, 4.0f, 8192.0f};
  int kept = 0, divided = 0, blended = 0;
  for (int pair = 0; pair < 64; ++pair) {
    const double base = std::pow(5e5, -2.0 * pair / 128);
    const double expected = llama31_frequency(base, 8, 1, 4, 8192);
    EXPECT_NEAR(rope_frequency(params, pair, 128), expected, 1e-15 * base) << pair;
    kept += expected == base;
    divided += expected == base / 8;
    blended += expected != base && expected != base / 8;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(AttentionParamsTest, RopeParamsAreChecked) {
  AttentionParams params;
  params.pos_encoding = PosEncoding::kRopeLlama;
  EXPECT_NO_THROW(check_rope_params(params, "x: "));
  params.rope_theta = -1.0f;
  EXPECT_THROW(check_rope_params(params, "x: "), Error);
  params.rope_theta = 1e4f;
  params.rope_scale = 0.0f;
  EXPECT_THROW(check_rope_params(params, "x: "), Error);
  params.rope_scale = 8.0f;
  params.rope_llama31 = AttentionParams::Llama31Scaling{4.0f, 1.0f, 8192.0f};  // low > high
  try {
    check_rope_params(params, "x: ");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x: rope_llama31 needs finite 0 < low_freq_factor"),
              std::string::npos)
        << e.what();
  }
  params.rope_llama31 = AttentionParams::Llama31Scaling{1.0f, 4.0f, 0.0f};
  EXPECT_THROW(check_rope_params(params, "x: "), Error);
}

}  // namespace
}  // namespace flare
