// BatchPrefillConfig::rope_staging kAuto on the GPU: one BatchPrefill whose plans stage RoPE
// (causal prefills and long appends, each K row read by several query tiles) or rotate in the
// kernels (appends of a few tokens over long KV), in turn, the copies growing past their first
// size, every run against the CPU reference; the choice is fused_rope_key_reads' against
// kStageRopeMinKeyReads. Under use_cuda_graph, a captured staged run replayed after larger
// plans. (kStaged and kFused alone: PrefillGpu.StagedRope* / FusedRope*.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "gpu/prefill_test_support.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using namespace prefill_testing;

TEST(PrefillRopeStagingGpu, AutoChoosesPlanByPlanAndGrowsTheCopies) {
  SKIP_WITHOUT_GPU();
  struct Step {
    std::vector<int32_t> q_lens, kv_lens;
    bool staged;
  };
  // GQA 4: a request's packed rows are 4 x its tokens.
  const std::vector<Step> steps = {
      {{300, 200, 1}, {300, 200, 40}, true},  // causal prefills
      {{16, 8, 5}, {3000, 2000, 1}, false},   // one query tile a request
      {{256, 0, 3}, {4500, 33, 3}, true},     // 4536 keys: past the first copy's rows
      {{100, 50, 0}, {100, 50, 0}, true},     // back within the copies, an empty request
  };
  std::vector<Problem> problems;
  int64_t max_total_qo = 1;
  for (size_t i = 0; i < steps.size(); ++i) {
    Case c;
    c.kv = PrefillKV::kRagged;
    c.rope = true;
    c.rope_theta = 5e5f;
    c.q_lens = steps[i].q_lens;
    c.kv_lens = steps[i].kv_lens;
    c.seed = i + 1;
    problems.push_back(make_problem(c));
    max_total_qo = std::max<int64_t>(max_total_qo, problems.back().total_q);
  }
  BatchPrefillConfig config = config_of(problems[0]);
  config.max_total_qo = static_cast<int>(max_total_qo);
  ASSERT_EQ(config.rope_staging, RopeStaging::kAuto);
  BatchPrefill prefill(config);
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "step " << i);
    const Problem& p = problems[i];
    DeviceProblem d(p);
    plan(prefill, p, nullptr);
    const double reads =
        fused_rope_key_reads(testing::int32_values(p.qo_indptr.view()),
                             testing::int32_values(p.cache.ragged_indptr.view()),
                             config.num_qo_heads / config.num_kv_heads,
                             prefill.last_tiles().query_tile, MaskMode::kCausal, -1);
    EXPECT_EQ(prefill.last_plan_stages_rope(), steps[i].staged) << "key reads " << reads;
    EXPECT_EQ(prefill.last_plan_stages_rope(), reads >= kStageRopeMinKeyReads) << reads;
    d.run(prefill, p, nullptr);
    d.download();
    expect_matches(p, d);
  }
}

// Under use_cuda_graph the rotation reads its counts on the device: a run captured after a
// plan of one token a request, replayed after the full batch (more queries and keys, within
// max_total_qo and max_total_kv), computes the full batch; a plan of more keys than
// max_total_kv is refused by name first.
TEST(PrefillRopeStagingGpu, CudaGraphReplayAfterALargerPlan) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.kv = PrefillKV::kRagged;
  c.rope = true;
  c.q_lens = {300, 200, 1};
  c.kv_lens = {300, 260, 40};
  const Problem p = make_problem(c);
  BatchPrefillConfig config = config_of(p);
  config.use_cuda_graph = true;
  config.max_total_kv = 600;  // the problem's keys
  BatchPrefill prefill(config);
  DeviceProblem d(p);
  const cuda::OwnedStream stream;
  const std::vector<int32_t> qo = testing::int32_values(p.qo_indptr.view());
  const std::vector<int32_t> too_many = {0, 300, 560, 601};
  EXPECT_FLARE_ERROR(prefill.plan(qo, too_many, {}, stream.get()), ErrorCode::kInvalidArgument,
                     "exceed max_total_kv=600");
  const std::vector<int32_t> small = {0, 1, 2, 3};
  prefill.plan(small, small, {}, stream.get());
  // The config's choice: 167-token prefills of GQA 4 on 128-row tiles.
  EXPECT_TRUE(prefill.last_plan_stages_rope());
  const cuda::Graph graph(stream.get(), [&] { d.run(prefill, p, stream.get()); });
  plan(prefill, p, stream.get());
  EXPECT_TRUE(prefill.last_plan_stages_rope());
  d.poison();
  graph.launch(stream.get());
  d.download();
  expect_matches(p, d);
}

}  // namespace
}  // namespace flare
