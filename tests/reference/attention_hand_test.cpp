// Tiny attention problems whose outputs follow by hand: chosen values, one request, D = 8,
// checked to float precision against closed forms (no naive loop involved).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "flare/reference/attention.h"
#include "testing/compare.h"
#include "testing/index_arrays.h"

namespace flare {
namespace {

using testing::indptr_tensor;
using testing::poison;

constexpr int64_t kDim = 8;

// One request, one head, D = 8: q [q_len, 1, 8], ragged K/V [kv_len, 1, 8], float32.
struct TinyProblem {
  HostTensor q, k, v, o, lse, qo_indptr, kv_indptr;

  TinyProblem(const std::vector<std::vector<float>>& queries,
              const std::vector<std::vector<float>>& keys,
              const std::vector<std::vector<float>>& values)
      : q(DType::kF32, {static_cast<int64_t>(queries.size()), 1, kDim}),
        k(DType::kF32, {static_cast<int64_t>(keys.size()), 1, kDim}),
        v(DType::kF32, {static_cast<int64_t>(values.size()), 1, kDim}),
        o(DType::kF32, {static_cast<int64_t>(queries.size()), 1, kDim}),
        lse(DType::kF32, {static_cast<int64_t>(queries.size()), 1}),
        qo_indptr(indptr_tensor({static_cast<int32_t>(queries.size())})),
        kv_indptr(indptr_tensor({static_cast<int32_t>(keys.size())})) {
    fill(q, queries);
    fill(k, keys);
    fill(v, values);
  }

  static void fill(HostTensor& t, const std::vector<std::vector<float>>& rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t d = 0; d < kDim; ++d) {
        t.set(static_cast<int64_t>(i) * kDim + d,
              d < static_cast<int64_t>(rows[i].size()) ? rows[i][d] : 0.0f);
      }
    }
  }

  void run(const AttentionParams& params) {
    poison(o.view());
    poison(lse.view());
    const AttentionProblem problem{q.view(), qo_indptr.view(),
                                   RaggedKV{k.view(), v.view(), kv_indptr.view()}, params};
    reference_attention(problem, AttentionOutput{o.view(), lse.view()}, {});
  }
  float out(int64_t token, int64_t d) const { return o.get(token * kDim + d); }
};

AttentionParams unit_scale() {
  AttentionParams params;
  params.sm_scale = 1.0f;
  return params;
}

TEST(ReferenceAttentionHand, OneKeyCopiesItsValueAndLseIsTheLogit) {
  TinyProblem p({{2, 1}}, {{0.5f, 3}}, {{1, 2, 3, 4, 5, 6, 7, 8}});
  p.run(unit_scale());
  for (int64_t d = 0; d < kDim; ++d) EXPECT_EQ(p.out(0, d), static_cast<float>(d + 1));
  EXPECT_EQ(p.lse.get(0), 4.0f);  // 2 * 0.5 + 1 * 3
}

TEST(ReferenceAttentionHand, TwoEqualLogitsAverageTheValues) {
  // q . k0 = q . k1 = 1: weights 1/2 each, lse = 1 + ln 2.
  TinyProblem p({{1}}, {{1}, {1, 5}}, {{2, 0, 4}, {0, 2, 8}});
  p.run(unit_scale());
  const std::vector<float> expected = {1, 1, 6, 0, 0, 0, 0, 0};
  for (int64_t d = 0; d < kDim; ++d) EXPECT_EQ(p.out(0, d), expected[d]);
  EXPECT_FLOAT_EQ(p.lse.get(0), static_cast<float>(1.0 + std::log(2.0)));
}

TEST(ReferenceAttentionHand, TwoKeysWeightedByTheirExponentials) {
  // Logits 1 and 0 (sm_scale 0.5 on q . k = 2 and 0): weights e/(e+1) and 1/(e+1).
  AttentionParams params;
  params.sm_scale = 0.5f;
  TinyProblem p({{2}}, {{1}, {0, 1}}, {{1, 0}, {0, 1}});
  p.run(params);
  const double e = std::exp(1.0);
  EXPECT_FLOAT_EQ(p.out(0, 0), static_cast<float>(e / (e + 1)));
  EXPECT_FLOAT_EQ(p.out(0, 1), static_cast<float>(1 / (e + 1)));
  for (int64_t d = 2; d < kDim; ++d) EXPECT_EQ(p.out(0, d), 0.0f);
  EXPECT_FLOAT_EQ(p.lse.get(0), static_cast<float>(std::log(e + 1)));
}

TEST(ReferenceAttentionHand, DefaultScaleIsOneOverSqrtHeadDim) {
  // q . k = sqrt(8), so the logit is sqrt(8) / sqrt(8) = 1.
  const float root = static_cast<float>(std::sqrt(8.0));
  TinyProblem p({{root}}, {{1}}, {{3}});
  p.run(AttentionParams{});
  EXPECT_EQ(p.out(0, 0), 3.0f);
  EXPECT_FLOAT_EQ(p.lse.get(0), 1.0f);
}

TEST(ReferenceAttentionHand, CausalBottomRightAligned) {
  // q_len 2, kv_len 3: query 0 sits at position 1 (sees keys 0, 1), query 1 at 2 (all).
  AttentionParams params = unit_scale();
  params.mask = MaskMode::kCausal;
  TinyProblem p({{0}, {0}}, {{1}, {2}, {3}}, {{3}, {6}, {9}});
  p.run(params);
  EXPECT_FLOAT_EQ(p.out(0, 0), 4.5f);  // zero logits: plain averages
  EXPECT_FLOAT_EQ(p.out(1, 0), 6.0f);
  EXPECT_FLOAT_EQ(p.lse.get(0), static_cast<float>(std::log(2.0)));
  EXPECT_FLOAT_EQ(p.lse.get(1), static_cast<float>(std::log(3.0)));
}

TEST(ReferenceAttentionHand, QueriesBeforeTheFirstKeyAreFullyMasked) {
  // q_len 3 > kv_len 1 under causal: queries 0, 1 have positions -2, -1 and see nothing.
  AttentionParams params = unit_scale();
  params.mask = MaskMode::kCausal;
  TinyProblem p({{1}, {1}, {1}}, {{1}}, {{5, 5, 5, 5, 5, 5, 5, 5}});
  p.run(params);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t token = 0; token < 2; ++token) {
    for (int64_t d = 0; d < kDim; ++d) EXPECT_EQ(p.out(token, d), 0.0f);
    EXPECT_EQ(p.lse.get(token), -inf);
  }
  EXPECT_EQ(p.out(2, 0), 5.0f);
  EXPECT_EQ(p.lse.get(2), 1.0f);
}

TEST(ReferenceAttentionHand, SlidingWindowKeepsTheLastKeys) {
  // One query at position 3 with window_left 1 sees keys 2 and 3 only.
  AttentionParams params = unit_scale();
  params.window_left = 1;
  TinyProblem p({{0}}, {{0}, {0}, {0}, {0}}, {{100}, {100}, {1}, {3}});
  p.run(params);
  EXPECT_EQ(p.out(0, 0), 2.0f);
  EXPECT_FLOAT_EQ(p.lse.get(0), static_cast<float>(std::log(2.0)));
}

TEST(ReferenceAttentionHand, SoftCapAndAlibiFollowTheDocumentedOrder) {
  // Logit q . k = 4; ALiBi slope 0.5 at distance j - q_pos = -1 gives 3.5; then the cap:
  // 2 tanh(3.5 / 2). The key at the query's own position keeps logit 0 -> 2 tanh(0) = 0.
  HostTensor slopes(DType::kF32, {1});
  slopes.set(0, 0.5f);
  AttentionParams params = unit_scale();
  params.pos_encoding = PosEncoding::kAlibi;
  params.alibi_slopes = slopes.view();
  params.logits_soft_cap = 2.0f;
  TinyProblem p({{2}}, {{2}, {0}}, {{1}, {0}});
  p.run(params);
  const double capped = 2.0 * std::tanh(3.5 / 2.0);
  const double sum = std::exp(capped) + 1.0;
  EXPECT_FLOAT_EQ(p.out(0, 0), static_cast<float>(std::exp(capped) / sum));
  EXPECT_FLOAT_EQ(p.lse.get(0), static_cast<float>(std::log(sum)));
}

TEST(ReferenceAttentionHand, SigmoidSumsGatedValuesWithoutNormalizing) {
  // Logits 0 and ln 3 with bias 0: gates 1/2 and 3/4.
  AttentionParams params = unit_scale();
  params.use_softmax = false;
  TinyProblem p({{1}}, {{0}, {static_cast<float>(std::log(3.0))}}, {{4}, {4}});
  poison(p.o.view());
  const AttentionProblem problem{p.q.view(), p.qo_indptr.view(),
                                 RaggedKV{p.k.view(), p.v.view(), p.kv_indptr.view()}, params};
  reference_attention(problem, AttentionOutput{p.o.view(), std::nullopt}, {});
  EXPECT_FLOAT_EQ(p.out(0, 0), 5.0f);  // 4 * (1/2 + 3/4)
  EXPECT_EQ(p.out(0, 1), 0.0f);
}

TEST(ReferenceAttentionHand, RopeRotatesPairsHalfADimensionApart) {
  // D = 8, theta = 1: every pair (d, d + 4) rotates by the position itself (inv_freq 1).
  // q at position 1 is (1, 0, 0, 0 | 0, ...) -> (cos 1, .. | sin 1, ..); k at position 0 is
  // unrotated (1, 0, ...), so the logit is cos 1 (times sm_scale 1).
  AttentionParams params = unit_scale();
  params.pos_encoding = PosEncoding::kRopeLlama;
  params.rope_theta = 1.0f;
  params.mask = MaskMode::kCausal;
  TinyProblem p({{1}}, {{1}, {0}}, {{1}, {0}});
  p.run(params);
  // Keys 0 and 1 (position 1, rotated by 1: zero vector stays zero): logits cos 1 and 0.
  const double w = std::exp(std::cos(1.0));
  EXPECT_FLOAT_EQ(p.out(0, 0), static_cast<float>(w / (w + 1)));
  EXPECT_FLOAT_EQ(p.lse.get(0), static_cast<float>(std::log(w + 1)));
}

TEST(ReferenceAttentionHand, EmptyKvGivesZeroOutputAndMinusInfinityLse) {
  TinyProblem p({{1, 2, 3}}, {}, {});
  p.run(unit_scale());
  for (int64_t d = 0; d < kDim; ++d) EXPECT_EQ(p.out(0, d), 0.0f);
  EXPECT_EQ(p.lse.get(0), -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace flare
