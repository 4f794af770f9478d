// BatchPrefillConfig::single_plan under use_cuda_graph (single_prefill_with_kv_cache's objects):
// run() skips the merge launch where the one plan split nothing and launches it where it did,
// both against the CPU float64 reference (NaN-poisoned outputs); a second plan() is refused
// before anything changes. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <vector>

#include "flare/api/batch_prefill.h"
#include "gpu/prefill_test_support.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using namespace prefill_testing;

// Plans c once on a single-plan CUDA-graph config, runs, compares; returns the plan's partial
// slots.
int64_t check_single_plan(const Case& c) {
  const Problem p = make_problem(c);
  BatchPrefillConfig config = config_of(p);
  config.use_cuda_graph = true;
  config.single_plan = true;
  BatchPrefill prefill(config);
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  d.run(prefill, p, nullptr);
  d.download();
  expect_matches(p, d);
  EXPECT_FLARE_ERROR(plan(prefill, p, nullptr), ErrorCode::kInvalidArgument,
                     "single_plan is set and this object was planned already");
  d.poison();  // the refused plan left the first one in place
  d.run(prefill, p, nullptr);
  d.download();
  expect_matches(p, d);
  return prefill.last_plan().num_partial_slots;
}

TEST(PrefillSinglePlanGpu, UnsplitAndSplitPlansUnderCudaGraphs) {
  SKIP_WITHOUT_GPU();
  Case c;  // one request, ragged, as single_prefill_with_kv_cache plans it
  c.kv = PrefillKV::kRagged;
  c.q_lens = {77};
  c.kv_lens = {300};
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.disable_split_kv = true;
  EXPECT_EQ(check_single_plan(c), 0) << "the unsplit case split";
  c.disable_split_kv = false;
  c.fixed_split_size = 64;
  EXPECT_GT(check_single_plan(c), 0) << "no split: the merge launch went untested";
}

}  // namespace
}  // namespace flare
