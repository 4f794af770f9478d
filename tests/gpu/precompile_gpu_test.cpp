// precompile() on the GPU (flare/api/precompile.h): every kernel of the configurations lands in
// the JIT disk cache, so a second call compiles nothing, and the engines built from those
// configurations then plan batches of every tile size and run correctly.
#include <gtest/gtest.h>

#include <vector>

#include "flare/api/precompile.h"
#include "gpu/prefill_test_support.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

TEST(PrecompileGpu, FillsTheCacheForEveryTileAPlanMayPick) {
  SKIP_WITHOUT_GPU();
  prefill_testing::Case c;
  c.q_lens = {1, 7, 97, 300};  // 405 tokens x group 4 over 4 requests: the 128-row tile
  c.kv_lens = {1, 40, 130, 300};
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.use_softmax = false;
  c.variant = testing::user_sigmoid();
  c.variant_scalars = {0.25f};
  c.sigmoid_bias = 0.25f;
  const prefill_testing::Problem problem = prefill_testing::make_problem(c);
  const std::vector<BatchPrefillConfig> prefill = {prefill_testing::config_of(problem)};
  const PrecompileReport first = precompile({}, prefill, 0, 4);
  EXPECT_EQ(first.kernels, 5);  // four tile pairs and the merge
  EXPECT_EQ(first.compiled + first.from_cache, first.kernels);
  const PrecompileReport second = precompile({}, prefill, 0, 4);
  EXPECT_EQ(second.kernels, first.kernels);
  EXPECT_EQ(second.compiled, 0) << "the first call left kernels out of the cache";
  EXPECT_EQ(second.from_cache, second.kernels);
  prefill_testing::check(c);  // the engine of that config: loads, plans, matches the reference
  c.q_lens = {1, 1, 5, 2};    // 9 x 4 / 4 packed rows: the 16-row tile this time
  prefill_testing::check(c);
}

}  // namespace
}  // namespace flare
