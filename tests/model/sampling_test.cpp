// The megakernel's sampler on the CPU (flare/model/sampling.h, kernels/sampling_noise.cuh):
// Philox4x32-10 against Random123's known answers, the greedy rule, the parameter checks, and
// that the rejection rounds sample softmax(logits / T) renormalized over the top-k / top-p set
// (frequencies over 40,000 draws against the exact probabilities).
#include "flare/model/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/sampling_noise.cuh"
#include "testing/expect_error.h"

namespace flare::model {
namespace {

TEST(SamplingNoise, PhiloxMatchesRandom123KnownAnswers) {
  struct Case {
    unsigned counter[4], key[2], expected[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Case& c : cases) {
    unsigned x[4] = {c.counter[0], c.counter[1], c.counter[2], c.counter[3]};
    sampling::philox4x32_10(x, c.key[0], c.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(x[i], c.expected[i]) << "word " << i;
  }
}

TEST(SamplingNoise, UniformsStayInsideTheOpenInterval) {
  EXPECT_GT(sampling::uniform_open(0u), 0.f);
  EXPECT_LT(sampling::uniform_open(0xffffffffu), 1.f);
  EXPECT_TRUE(std::isfinite(sampling::gumbel_noise(0, 0, 0, 0, 0)));
  // Every argument changes the draw.
  const float base = sampling::gumbel_noise(7, 1, 2, 3, 4);
  EXPECT_NE(base, sampling::gumbel_noise(8, 1, 2, 3, 4));
  EXPECT_NE(base, sampling::gumbel_noise(7, 0, 2, 3, 4));
  EXPECT_NE(base, sampling::gumbel_noise(7, 1, 3, 3, 4));
  EXPECT_NE(base, sampling::gumbel_noise(7, 1, 2, 4, 4));
  EXPECT_NE(base, sampling::gumbel_noise(7, 1, 2, 3, 5));
  EXPECT_NE(base, sampling::gumbel_noise(7ull << 32, 1, 2, 3, 4));
}

TEST(SampleReference, GreedyTakesTheLowestIdOfTheLargestAndSkipsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {1.f, nan, 3.f, 3.f, -2.f};
  EXPECT_EQ(sample_reference(logits.data(), 5, {}, 0, 0), 2);
  const std::vector<float> all_nan = {nan, nan};
  EXPECT_EQ(sample_reference(all_nan.data(), 2, {}, 0, 0), -1);
  EXPECT_EQ(sample_reference(all_nan.data(), 2, {1.f, 0, 0.5f, 3}, 0, 0), -1);
  // Sampling never takes a NaN or -inf row.
  const std::vector<float> mixed = {nan, -std::numeric_limits<float>::infinity(), 0.f, nan};
  for (int position = 0; position < 50; ++position) {
    EXPECT_EQ(sample_reference(mixed.data(), 4, {2.f, 0, 1.f, 1}, 0, position), 2);
  }
}

TEST(SampleReference, ChecksItsParametersNamingThem) {
  const float logits[2] = {0.f, 1.f};
  EXPECT_FLARE_ERROR(sample_reference(logits, 2, {-1.f, 0, 1.f, 0}, 0, 0),
                     ErrorCode::kInvalidArgument,
                     "temperature must be 0 (greedy) or finite and >= 1e-05, got -1");
  EXPECT_FLARE_ERROR(sample_reference(logits, 2, {1e-7f, 0, 1.f, 0}, 0, 0),
                     ErrorCode::kInvalidArgument, "temperature must be 0 (greedy) or finite");
  EXPECT_FLARE_ERROR(
      sample_reference(logits, 2, {std::numeric_limits<float>::infinity(), 0, 1.f, 0}, 0, 0),
      ErrorCode::kInvalidArgument, "temperature must be 0 (greedy) or finite");
  EXPECT_EQ(sample_reference(logits, 2, {kMinSamplingTemperature, 0, 1.f, 0}, 0, 0), 1);
  EXPECT_FLARE_ERROR(sample_reference(logits, 2, {1.f, -3, 1.f, 0}, 0, 0),
                     ErrorCode::kInvalidArgument, "top_k must be >= 0 (0: off), got -3");
  EXPECT_FLARE_ERROR(sample_reference(logits, 2, {1.f, 0, 0.f, 0}, 0, 0),
                     ErrorCode::kInvalidArgument, "top_p must be in (0, 1]");
  EXPECT_FLARE_ERROR(sample_reference(logits, 2, {1.f, 0, 1.5f, 0}, 0, 0),
                     ErrorCode::kInvalidArgument, "top_p must be in (0, 1]");
  EXPECT_FLARE_ERROR(sample_reference(logits, 2, {0.f, 0, 0.9f, 0}, 0, 0),
                     ErrorCode::kInvalidArgument, "temperature 0 is the greedy argmax");
  EXPECT_FLARE_ERROR(check_sampling({0.f, 5, 1.f, 0}, "LlamaDecoder.step"),
                     ErrorCode::kInvalidArgument, "LlamaDecoder.step: top_k (5)");
}

// The exact probabilities of the filtered distribution: softmax(logits / T) over the tokens
// that pass top-k and top-p (no ties among the logits here).
std::vector<double> filtered_probabilities(const std::vector<float>& logits, float t, int top_k,
                                           float top_p) {
  const int n = static_cast<int>(logits.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> p(n);
  double total = 0;
  for (int i = 0; i < n; ++i) total += p[i] = std::exp(logits[i] / t);
  std::vector<double> out(n, 0.0);
  double above = 0, kept = 0;
  for (int r = 0; r < n; ++r) {
    const int i = order[r];
    if ((top_k == 0 || r < top_k) && above < top_p * total) kept += out[i] = p[i];
    above += p[i];
  }
  for (double& v : out) v /= kept;
  return out;
}

TEST(SampleReference, DrawsFollowTheFilteredSoftmax) {
  const std::vector<float> logits = {0.3f, 2.1f, -1.0f, 1.4f, 0.9f, -0.2f, 1.8f};
  struct Case {
    float t;
    int top_k;
    float top_p;
  };
  const Case cases[] = {
      {1.f, 0, 1.f}, {0.7f, 0, 0.8f}, {1.5f, 3, 1.f}, {1.2f, 4, 0.6f}, {2.f, 0, 0.3f}};
  constexpr int kDraws = 40000;
  int most_rounds = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("t " + std::to_string(c.t) + " top_k " + std::to_string(c.top_k) + " top_p " +
                 std::to_string(c.top_p));
    const std::vector<double> expected = filtered_probabilities(logits, c.t, c.top_k, c.top_p);
    std::vector<int> counts(logits.size(), 0);
    for (int d = 0; d < kDraws; ++d) {
      int rounds = 0;
      const int token = sample_reference(logits.data(), static_cast<int>(logits.size()),
                                         {c.t, c.top_k, c.top_p, 1234}, d % 8, d / 8, &rounds);
      ASSERT_GE(token, 0);
      ++counts[token];
      most_rounds = std::max(most_rounds, rounds);
    }
    double chi2 = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (expected[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the set";
        continue;
      }
      const double e = expected[i] * kDraws;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
    }
    // At most 6 degrees of freedom: P(chi2 > 30) < 5e-5 for a correct sampler.
    EXPECT_LT(chi2, 30.0);
  }
  EXPECT_GT(most_rounds, 1);  // the rejection path ran
}

TEST(SampleReference, TopKOneAndATinyTopPAreGreedy) {
  const std::vector<float> logits = {0.5f, 0.2f, 0.9f, 0.85f, -1.f};
  for (int position = 0; position < 200; ++position) {
    EXPECT_EQ(sample_reference(logits.data(), 5, {1.f, 1, 1.f, 9}, 1, position), 2);
    EXPECT_EQ(sample_reference(logits.data(), 5, {3.f, 0, 1e-6f, 9}, 1, position), 2);
  }
}

}  // namespace
}  // namespace flare::model
