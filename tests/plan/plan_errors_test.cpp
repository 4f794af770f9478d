// plan() refuses, with a code and a message naming the argument, every problem and option no
// kernel supports.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/plan/plan.h"
#include "plan/plan_testing.h"

namespace flare {
namespace {

using plan_testing::LengthProblem;

void expect_error(const std::function<void()>& call, ErrorCode code, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(PlanErrors, Heads) {
  LengthProblem p({1}, {10}, 12, 5);
  expect_error([&] { plan(p.problem, {}); }, ErrorCode::kInvalidArgument,
               "num_kv_heads must divide num_qo_heads");
  p.problem.num_kv_heads = 0;
  expect_error([&] { plan(p.problem, {}); }, ErrorCode::kInvalidArgument, "num_kv_heads");
}

TEST(PlanErrors, HeadDims) {
  for (const int bad : {0, 4, 12, 520, 1024}) {
    LengthProblem p({1}, {10}, 4, 4, bad);
    p.problem.head_dim_vo = 64;
    expect_error([&] { plan(p.problem, {}); }, ErrorCode::kUnsupported, "head_dim_qk");
    p.problem.head_dim_qk = 64;
    p.problem.head_dim_vo = bad;
    expect_error([&] { plan(p.problem, {}); }, ErrorCode::kUnsupported, "head_dim_vo");
  }
}

TEST(PlanErrors, Lengths) {
  LengthProblem negative_kv({1, 1}, {10, -3}, 4, 4);
  expect_error([&] { plan(negative_kv.problem, {}); }, ErrorCode::kInvalidArgument,
               "request 1 has a negative length");
  LengthProblem negative_q({-1}, {10}, 4, 4);
  expect_error([&] { plan(negative_q.problem, {}); }, ErrorCode::kInvalidArgument,
               "negative length");
  LengthProblem mismatched({1, 1}, {10}, 4, 4);
  expect_error([&] { plan(mismatched.problem, {}); }, ErrorCode::kInvalidArgument,
               "one entry per request");
  // 2^28 query tokens x group 16 packed rows do not fit int32.
  LengthProblem too_many_rows({1 << 28}, {10}, 16, 1);
  expect_error([&] { plan(too_many_rows.problem, {}); }, ErrorCode::kUnsupported,
               "more than int32");
}

TEST(PlanErrors, PageSizeAndWindow) {
  LengthProblem p({1}, {10}, 4, 4, 64, 0);
  expect_error([&] { plan(p.problem, {}); }, ErrorCode::kInvalidArgument, "page_size");
  LengthProblem w({1}, {10}, 4, 4, 64, 1, true, -2);
  expect_error([&] { plan(w.problem, {}); }, ErrorCode::kInvalidArgument, "window_left");
}

TEST(PlanErrors, DeviceAndOptions) {
  LengthProblem p({1}, {10}, 4, 4);
  expect_error([&] { plan(p.problem, {0, 1}); }, ErrorCode::kInvalidArgument, "num_sms");
  expect_error([&] { plan(p.problem, {8, 0}); }, ErrorCode::kInvalidArgument, "ctas_per_sm");
  PlanOptions options;
  options.num_sms_to_use = 9;
  expect_error(
      [&] {
        plan(p.problem, {8, 1}, options);
      },
      ErrorCode::kInvalidArgument, "num_sms_to_use");
  for (const int waves : {0, -1, 17}) {
    options = {};
    options.waves = waves;
    expect_error(
        [&] {
          plan(p.problem, {8, 1}, options);
        },
        ErrorCode::kInvalidArgument, "waves must be in [1, 16]");
  }
  options = {};
  options.query_tile = -1;
  expect_error(
      [&] {
        plan(p.problem, {8, 1}, options);
      },
      ErrorCode::kInvalidArgument, "query_tile");
  options = {};
  options.fixed_split_size = -5;
  expect_error(
      [&] {
        plan(p.problem, {8, 1}, options);
      },
      ErrorCode::kInvalidArgument, "fixed_split_size");
  options = {};
  options.fixed_split_size = 64;
  options.disable_split_kv = true;
  expect_error(
      [&] {
        plan(p.problem, {8, 1}, options);
      },
      ErrorCode::kInvalidArgument, "contradict");
  for (const auto& [alpha, beta] :
       std::vector<std::pair<float, float>>{{-1.0f, 1.0f},
                                            {1.0f, -1.0f},
                                            {0.0f, 0.0f},
                                            {1e-6f, 0.0f},
                                            {1.0f, 2e6f},
                                            {std::numeric_limits<float>::quiet_NaN(), 1.0f},
                                            {1.0f, std::numeric_limits<float>::infinity()}}) {
    options = {};
    options.alpha = alpha;
    options.beta = beta;
    expect_error(
        [&] {
          plan(p.problem, {8, 1}, options);
        },
        ErrorCode::kInvalidArgument, "cost coefficients");
  }
  for (const PlanOptions::QueueRates rates :
       {PlanOptions::QueueRates{1, 0, 0}, PlanOptions::QueueRates{0, 1, 0},
        PlanOptions::QueueRates{1, 1, -1}, PlanOptions::QueueRates{0, 0, 5},
        PlanOptions::QueueRates{std::numeric_limits<double>::infinity(), 1, 0}}) {
    options = {};
    options.queue_rates = rates;
    expect_error(
        [&] {
          plan(p.problem, {8, 1}, options);
        },
        ErrorCode::kInvalidArgument, "queue_rates");
  }
  for (const float item_cost : {-1.0f, 2e6f, std::numeric_limits<float>::quiet_NaN()}) {
    options = {};
    options.item_cost = item_cost;
    expect_error(
        [&] {
          plan(p.problem, {8, 1}, options);
        },
        ErrorCode::kInvalidArgument, "item_cost=");
  }
}

TEST(PlanErrors, WorkItemsBeyondInt32) {
  // fixed_split_size 1 over 2^30 tokens x 4 KV heads: more chunks than int32 counts hold.
  LengthProblem p({1}, {1 << 30}, 4, 4);
  PlanOptions options;
  options.fixed_split_size = 1;
  expect_error(
      [&] {
        plan(p.problem, {8, 1}, options);
      },
      ErrorCode::kUnsupported, "exceed int32 work items");
}

}  // namespace
}  // namespace flare
