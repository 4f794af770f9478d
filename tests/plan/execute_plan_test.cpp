// plan() + execute_plan_cpu equals reference_attention (float64 accumulation as the oracle)
// for random and adversarial length mixes, #CTA in {1, 7, 132, 264} in one or two waves, GQA
// 1/4/7/8, page sizes 1/16; outputs are bitwise identical across runs and thread counts; misuse
// is refused before anything is written.
#include "flare/reference/execute_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/plan/plan.h"
#include "flare/reference/attention.h"
#include "plan/plan_testing.h"
#include "testing/compare.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"

namespace flare {
namespace {

using plan_testing::LengthProblem;

constexpr int kHeadDim = 32;
const std::vector<int> kCtaCounts = {1, 7, 132, 264};

struct Mix {
  const char* name;
  std::vector<int32_t> qo;
  std::vector<int32_t> kv;
  bool causal = false;
  int window_left = -1;
};

std::vector<Mix> mixes() {
  testing::Rng rng(9);
  Mix random{"random", {}, {}, true};
  for (int i = 0; i < 12; ++i) {
    const auto kv = static_cast<int32_t>(rng.uniform_int(0, 300));
    random.kv.push_back(kv);
    random.qo.push_back(static_cast<int32_t>(rng.uniform_int(0, std::min(kv, 20))));
  }
  std::vector<int32_t> huge_kv(24, 3);
  huge_kv[5] = 2000;
  huge_kv[17] = 1;
  return {
      random,
      {"one_huge_among_tiny", std::vector<int32_t>(24, 1), huge_kv},
      {"all_length_one", std::vector<int32_t>(40, 1), std::vector<int32_t>(40, 1)},
      {"prefill_causal", {97, 1, 7, 130}, {97, 1, 7, 130}, true},
      {"append_causal", {7, 1, 33, 2}, {97, 511, 40, 2}, true},
      {"empty_requests", {0, 3, 5, 0, 1, 4}, {10, 0, 0, 0, 600, 17}, true},
      {"sliding_window", {40, 1, 9}, {200, 333, 9}, true, 31},
      {"non_causal_window", {5, 12}, {400, 30}, false, 50},
  };
}

// One attention problem and the buffers its views point into.
struct Case {
  LengthProblem lengths;
  HostTensor q;
  HostTensor qo_indptr;
  testing::TestKVCache cache;
  AttentionProblem problem;
  int64_t total_q = 0;

  Case(const Mix& mix, int group, int num_kv_heads, int page_size, uint64_t seed)
      : lengths(mix.qo, mix.kv, group * num_kv_heads, num_kv_heads, kHeadDim, page_size, mix.causal,
                mix.window_left) {
    for (const int32_t q_len : mix.qo) total_q += q_len;
    q = testing::random_tensor(DType::kF32, {total_q, group * num_kv_heads, kHeadDim}, seed);
    qo_indptr = testing::indptr_tensor(mix.qo);
    cache = testing::build_kv_cache(mix.kv, num_kv_heads, kHeadDim, page_size, seed + 1);
    problem.q = q.view();
    problem.qo_indptr = qo_indptr.view();
    problem.kv = cache.paged;
    problem.params.mask = mix.causal ? MaskMode::kCausal : MaskMode::kNone;
    problem.params.window_left = mix.window_left;
  }
};

struct Output {
  HostTensor o;
  HostTensor lse;

  Output(int64_t total_q, int64_t num_qo_heads, DType dtype = DType::kF32)
      : o(dtype, {total_q, num_qo_heads, kHeadDim}), lse(DType::kF32, {total_q, num_qo_heads}) {
    testing::poison(o.view());
    testing::poison(lse.view());
  }
  AttentionOutput view() const { return {o.view(), lse.view()}; }
};

Output reference_output(const Case& c, Accumulation accumulation = Accumulation::kF64) {
  Output out(c.total_q, c.lengths.problem.num_qo_heads);
  reference_attention(c.problem, out.view(), {accumulation, 2});
  return out;
}

void expect_close(const Output& actual, const Output& expected, double tolerance,
                  const std::string& what) {
  const testing::ErrorStats o = testing::error_stats(actual.o.view(), expected.o.view());
  const testing::ErrorStats lse = testing::error_stats(actual.lse.view(), expected.lse.view());
  EXPECT_LE(o.relative_l2, tolerance) << what << " o: " << o;
  EXPECT_LE(o.max_abs, tolerance) << what << " o: " << o;
  EXPECT_LE(lse.relative_l2, tolerance) << what << " lse: " << lse;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data<std::byte>(), b.data<std::byte>(),
                     static_cast<size_t>(a.numel()) * dtype_bytes(a.dtype())) == 0;
}

struct MatrixParam {
  size_t mix;
  int group;
  int page_size;
};

std::string param_name(const MatrixParam& p) {
  return std::string(mixes()[p.mix].name) + "_gqa" + std::to_string(p.group) + "_page" +
         std::to_string(p.page_size);
}
void PrintTo(const MatrixParam& p, std::ostream* os) { *os << param_name(p); }

class PlanMatchesReference : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(PlanMatchesReference, EveryCtaCount) {
  const Mix mix = mixes()[GetParam().mix];
  const int group = GetParam().group;
  const int num_kv_heads = group == 1 ? 3 : 2;
  const Case c(mix, group, num_kv_heads, GetParam().page_size, 100 + GetParam().mix);
  const Output expected = reference_output(c);
  for (const int ctas : kCtaCounts) {
    // Two waves of per-CTA queues, or one queue (waves 0 here).
    for (const int waves : {1, 2, 0}) {
      PlanOptions options;
      options.waves = std::max(waves, 1);
      options.one_queue = waves == 0;
      options.kv_tile = 16;
      const Plan result = plan(c.lengths.problem, {ctas, 1}, options);
      ASSERT_NO_FATAL_FAILURE(
          plan_testing::check_plan(result, c.lengths.problem, options, ctas * options.waves));
      Output actual(c.total_q, c.lengths.problem.num_qo_heads);
      execute_plan_cpu(result, c.problem, actual.view(), {Accumulation::kF32, 2});
      expect_close(actual, expected, 1e-5,
                   std::string(mix.name) + " ctas=" + std::to_string(ctas) + " waves=" +
                       std::to_string(waves) + " item_heads=" + std::to_string(result.item_heads));
    }
  }
}

std::vector<MatrixParam> matrix() {
  std::vector<MatrixParam> params;
  for (size_t mix = 0; mix < mixes().size(); ++mix) {
    for (const int group : {1, 4, 7, 8}) {
      for (const int page : {1, 16}) params.push_back({mix, group, page});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Mixes, PlanMatchesReference, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return param_name(info.param);
                         });

TEST(ExecutePlan, Float64AccumulationAndOptions) {
  const Case c(mixes()[4], 4, 2, 3, 7);  // append, page size 3
  const Output expected = reference_output(c);
  PlanOptions fixed;
  fixed.fixed_split_size = 17;
  PlanOptions small_tiles;
  small_tiles.query_tile = 5;
  PlanOptions unsplit;
  unsplit.disable_split_kv = true;
  PlanOptions fixed_queue = fixed;  // on one CTA: split items covering both KV heads
  fixed_queue.one_queue = true;
  fixed_queue.kv_tile = 8;
  for (const PlanOptions& options : {PlanOptions{}, fixed, small_tiles, unsplit, fixed_queue}) {
    const Plan result = plan(c.lengths.problem, {options.one_queue ? 1 : 7, 1}, options);
    if (options.one_queue) {
      ASSERT_EQ(result.item_heads, 2);
      ASSERT_GT(result.num_partial_slots, 0);
    }
    Output actual(c.total_q, c.lengths.problem.num_qo_heads);
    execute_plan_cpu(result, c.problem, actual.view(), {Accumulation::kF64, 2});
    expect_close(actual, expected, 1e-6, "float64 accumulation");
  }
}

TEST(ExecutePlan, OneQueueFillSplitsOverHeadGroups) {
  // 4 KV heads on 6 CTAs: Algorithm 1 runs over groups of 2 heads on 3 CTAs, so each item
  // covers two of the four heads (kv_head 0 or 2) and a split item writes two partial slots.
  const Mix alike{"alike_q1", std::vector<int32_t>(5, 1), std::vector<int32_t>(5, 300)};
  const Case c(alike, 2, 4, 16, 31);  // 20 (request, head) pieces: 3.3 a CTA
  const Output expected = reference_output(c);
  PlanOptions options;
  options.one_queue = true;
  options.kv_tile = 16;
  const Plan result = plan(c.lengths.problem, {6, 1}, options);
  ASSERT_NO_FATAL_FAILURE(plan_testing::check_plan(result, c.lengths.problem, options, 6));
  ASSERT_EQ(result.item_heads, 2);
  ASSERT_GT(result.num_partial_slots, 0);
  Output actual(c.total_q, c.lengths.problem.num_qo_heads);
  execute_plan_cpu(result, c.problem, actual.view(), {Accumulation::kF64, 2});
  expect_close(actual, expected, 1e-6, "head groups of 2");
}

TEST(ExecutePlan, RaggedKvAndHalfPrecisionOutput) {
  Case c(mixes()[3], 4, 2, 16, 21);  // causal prefill
  c.problem.kv = c.cache.ragged;
  const Output expected = reference_output(c);
  const Plan result = plan(c.lengths.problem, {132, 1});
  ASSERT_GT(result.num_partial_slots, 0);
  Output actual(c.total_q, c.lengths.problem.num_qo_heads, DType::kBF16);
  execute_plan_cpu(result, c.problem, actual.view(), {Accumulation::kF32, 2});
  // bf16 keeps 8 significant bits: half an ulp of values below 4 is 2^-7.
  const testing::ErrorStats o = testing::error_stats(actual.o.view(), expected.o.view());
  EXPECT_LE(o.max_abs, 1.0 / 128) << o;
  EXPECT_LE(testing::relative_l2_error(actual.lse.view(), expected.lse.view()), 1e-5);
}

TEST(ExecutePlan, BitwiseIdenticalAcrossRunsAndThreadCounts) {
  const Case c(mixes()[0], 4, 2, 16, 33);
  const Plan result = plan(c.lengths.problem, {132, 1});
  ASSERT_GT(result.merge_items.size(), 0u) << "the case must exercise merges";
  Output first(c.total_q, c.lengths.problem.num_qo_heads);
  execute_plan_cpu(result, c.problem, first.view(), {Accumulation::kF32, 1});
  for (const int threads : {1, 2, 3, 8, 0}) {
    const Plan again = plan(c.lengths.problem, {132, 1});
    Output out(c.total_q, c.lengths.problem.num_qo_heads);
    execute_plan_cpu(again, c.problem, out.view(), {Accumulation::kF32, threads});
    EXPECT_TRUE(same_bytes(out.o, first.o)) << threads << " threads";
    EXPECT_TRUE(same_bytes(out.lse, first.lse)) << threads << " threads";
  }
}

TEST(ExecutePlan, WithoutSoftmaxNeedsAnUnsplitPlan) {
  Case c(mixes()[1], 4, 2, 16, 41);
  c.problem.params.use_softmax = false;
  const int64_t heads = c.lengths.problem.num_qo_heads;
  HostTensor expected(DType::kF32, {c.total_q, heads, kHeadDim});
  reference_attention(c.problem, {expected.view(), std::nullopt}, {Accumulation::kF64, 2});

  HostTensor o(DType::kF32, {c.total_q, heads, kHeadDim});
  testing::poison(o.view());
  const Plan split = plan(c.lengths.problem, {132, 1});
  try {
    execute_plan_cpu(split, c.problem, {o.view(), std::nullopt});
    ADD_FAILURE() << "a split-KV plan was accepted without softmax";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("disable_split_kv"), std::string::npos);
  }
  EXPECT_EQ(testing::count_nan(o.view()), o.numel()) << "nothing written on error";

  PlanOptions options;
  options.disable_split_kv = true;
  execute_plan_cpu(plan(c.lengths.problem, {132, 1}, options), c.problem, {o.view(), std::nullopt},
                   {Accumulation::kF32, 2});
  EXPECT_LE(testing::relative_l2_error(o.view(), expected.view()), 1e-5);
}

TEST(ExecutePlan, PlanForAnotherProblemIsRefused) {
  const Case c(mixes()[2], 4, 2, 16, 51);
  Output out(c.total_q, c.lengths.problem.num_qo_heads);
  LengthProblem other_heads(c.lengths.qo_len, c.lengths.kv_len, 8, 1, kHeadDim, 16);
  EXPECT_THROW(execute_plan_cpu(plan(other_heads.problem, {7, 1}), c.problem, out.view()), Error);
  std::vector<int32_t> longer = c.lengths.kv_len;
  longer[0] += 5;
  LengthProblem other_lengths(c.lengths.qo_len, longer, 8, 2, kHeadDim, 16);
  EXPECT_THROW(execute_plan_cpu(plan(other_lengths.problem, {7, 1}), c.problem, out.view()), Error);
  EXPECT_EQ(testing::count_nan(out.o.view()), out.o.numel()) << "nothing written on error";
}

}  // namespace
}  // namespace flare
