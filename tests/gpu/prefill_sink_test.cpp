// Attention sinks in BatchPrefill (RunOptions::sink) against the CPU float64 reference merged
// with each head's sink state in float64: both kernel families, the write-through, register and
// staged epilogues (query tiles 16 and 128 on FA2, the Hopper family's default), split rows
// through the merge kernel, rows that see no key (o = 0, lse = sink), sinks far above and below
// the logits, GQA 1 / 4 / 8, page sizes 1 and 16, ragged KV; run() refusing a bad sink before
// launching, BatchDecode refusing any. Outputs NaN-poisoned. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "gpu/prefill_test_support.h"
#include "testing/expect_error.h"
#include "testing/random.h"

namespace flare {
namespace {

using namespace prefill_testing;

// Sinks for `heads` heads: normal(0, 2), with head 0 at +30 (its rows are almost all sink: o
// near 0) and head 1 at -30 (no effect), when there are that many heads.
std::vector<float> sinks(int heads, uint64_t seed) {
  testing::Rng rng(seed);
  std::vector<float> values(static_cast<size_t>(heads));
  for (float& v : values) v = static_cast<float>(2.0 * rng.normal());
  if (heads > 2) {
    values[0] = 30.0f;
    values[1] = -30.0f;
  }
  return values;
}

// p's reference merged with the sink state (v = 0, lse = sink[h]) of each row's head, in
// float64: lse' = log(exp(lse) + exp(sink)), o' = o exp(lse - lse').
void merge_sinks_into_reference(Problem& p, const std::vector<float>& sink) {
  const int64_t heads = p.c.num_qo_heads, dims = p.c.head_dim_vo;
  for (int64_t t = 0; t < p.total_q; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float& lse = p.lse_ref.data<float>()[t * heads + h];
      const double s = sink[static_cast<size_t>(h)];
      const double old = lse;
      const double merged = std::isinf(old) && old < 0
                                ? s
                                : std::max(old, s) + std::log1p(std::exp(-std::abs(old - s)));
      const double weight = std::isinf(old) ? 0.0 : std::exp(old - merged);
      for (int64_t d = 0; d < dims; ++d) {
        float& o = p.o_ref.data<float>()[(t * heads + h) * dims + d];
        o = static_cast<float>(o * weight);
      }
      lse = static_cast<float>(merged);
    }
  }
}

// Runs c with sinks against the merged reference; returns the plan's partial slots.
int64_t check_sinks(const Case& c) {
  Problem p = make_problem(c);
  const std::vector<float> sink = sinks(c.num_qo_heads, c.seed + 40);
  merge_sinks_into_reference(p, sink);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  HostTensor sink_host(DType::kF32, {c.num_qo_heads});
  std::copy(sink.begin(), sink.end(), sink_host.data<float>());
  const DeviceCopy sink_device(sink_host);
  plan(prefill, p, nullptr);
  RunOptions options;
  options.sink = sink_device.view(sink_host.view());
  d.run(prefill, p, nullptr, options);
  d.download();
  expect_matches(p, d);
  return prefill.last_plan().num_partial_slots;
}

Case paged_causal() {
  Case c;
  c.q_lens = {1, 17, 4, 33, 70};
  c.kv_lens = {300, 17, 1000, 129, 70};
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  return c;
}

TEST(PrefillSinkGpu, JoinsTheDenominatorOnTheFa2Family) {
  SKIP_WITHOUT_GPU();
  for (int query_tile : {16, 64, 128}) {  // 16: several KV warps, the staged epilogue
    Case c = paged_causal();
    c.backend = PrefillBackend::kFA2;
    c.query_tile = query_tile;
    SCOPED_TRACE(query_tile);
    check_sinks(c);
  }
}

TEST(PrefillSinkGpu, JoinsTheDenominatorOnTheHopperFamily) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_HOPPER();
  Case c = paged_causal();
  c.backend = PrefillBackend::kFA3;
  check_sinks(c);
  c.kv = PrefillKV::kRagged;
  c.num_kv_heads = 1;  // GQA 8
  c.seed = 3;
  check_sinks(c);
}

TEST(PrefillSinkGpu, SplitRowsTakeTheSinkInTheMerge) {
  SKIP_WITHOUT_GPU();
  for (PrefillBackend backend : {PrefillBackend::kFA2, PrefillBackend::kFA3}) {
    if (backend == PrefillBackend::kFA3 && !hopper()) continue;
    Case c = paged_causal();
    c.backend = backend;
    c.fixed_split_size = 64;
    SCOPED_TRACE(backend == PrefillBackend::kFA2 ? "fa2" : "fa3");
    EXPECT_GT(check_sinks(c), 0) << "no split: the merge's sink went untested";
  }
}

TEST(PrefillSinkGpu, RowsThatSeeNoKeyAreTheSink) {
  SKIP_WITHOUT_GPU();
  Case c;
  // kv_len 0 (every row empty); q_len > kv_len under causal (the first rows see nothing).
  c.q_lens = {0, 5, 3, 20, 2};
  c.kv_lens = {10, 0, 7, 9, 0};
  c.num_qo_heads = 4;
  c.num_kv_heads = 4;  // GQA 1
  c.page_size = 1;
  check_sinks(c);
  c.fixed_split_size = 4;
  check_sinks(c);
}

TEST(PrefillSinkGpu, RunRefusesABadSinkAndDecodeRefusesAny) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {3};
  c.kv_lens = {20};
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  HostTensor short_sink(DType::kF32, {c.num_qo_heads - 1});
  const DeviceCopy short_device(short_sink);
  RunOptions options;
  options.sink = short_device.view(short_sink.view());
  EXPECT_FLARE_ERROR(d.run(prefill, p, nullptr, options), ErrorCode::kInvalidArgument,
                     "sink must be a contiguous float32 [8]");
  HostTensor host_sink(DType::kF32, {c.num_qo_heads});
  options.sink = host_sink.view();  // on the host
  EXPECT_FLARE_ERROR(d.run(prefill, p, nullptr, options), ErrorCode::kInvalidArgument,
                     "sink must be on cuda:0");
  d.download();
  for (int64_t i = 0; i < d.lse_host.numel(); ++i) {
    EXPECT_TRUE(std::isnan(d.lse_host.data<float>()[i])) << "written at " << i;
  }

  BatchDecodeConfig config;
  config.max_batch = 1;
  config.num_qo_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 128;
  config.page_size = 16;
  BatchDecode decode(config);
  decode.plan(std::vector<int32_t>{0, 1}, std::vector<int32_t>{5}, nullptr);
  const DeviceCopy sink_device(host_sink);
  options.sink = sink_device.view(host_sink.view());
  EXPECT_FLARE_ERROR(decode.run(d.q.view(p.q.view()), PagedKVPages::of(d.paged),
                                d.o.view(d.o_host.view()), std::nullopt, nullptr, options),
                     ErrorCode::kUnsupported, "attention sinks");
}

}  // namespace
}  // namespace flare
