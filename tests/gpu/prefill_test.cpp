// BatchPrefill on the GPU against the CPU float64 reference: paged (page sizes 1/16, NHD/HND,
// strided) and ragged KV, prefill (q_len = kv_len) and append (q_len < kv_len), odd and mixed
// lengths, empty requests, GQA 1/4/7/8, head dims 64/128/256/512/192-128, f16/bf16, every mask and
// variant flag, every query tile, split-KV through the merge kernel, determinism, CUDA graphs,
// logits large enough that the lazily rescaled running max moves mid-stream.
// Outputs are NaN-poisoned before each run. Skips without a CUDA device.

// Tolerances: tests/gpu/prefill_test_support.h.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "gpu/prefill_test_support.h"
#include "testing/elements.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using namespace prefill_testing;

TEST(PrefillGpu, CausalPrefillPagedOddLengthsGqa4) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 97, 511, 1023};
  c.kv_lens = c.q_lens;
  check(c);
}

TEST(PrefillGpu, CausalAppendPagedPageSize1Gqa7) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 128, 33, 5};
  c.kv_lens = {100, 511, 2049, 33, 1023};
  c.num_qo_heads = 7;
  c.num_kv_heads = 1;
  c.page_size = 1;
  check(c);
}

TEST(PrefillGpu, RaggedNoMaskF16HeadDim64Gqa8) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {97, 1, 300, 7};
  c.kv_lens = {97, 50, 511, 1023};
  c.num_qo_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim_qk = c.head_dim_vo = 64;
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.mask = MaskMode::kNone;
  check(c);
}

TEST(PrefillGpu, HeadDim256CausalGqa1) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {300, 17, 64};
  c.kv_lens = {300, 511, 200};
  c.num_qo_heads = c.num_kv_heads = 3;
  c.head_dim_qk = c.head_dim_vo = 256;
  check(c);
}

TEST(PrefillGpu, HeadDim192To128RaggedAndPaged) {
  SKIP_WITHOUT_GPU();
  for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPaged}) {
    Case c;
    c.q_lens = {200, 9};
    c.kv_lens = {333, 9};
    c.head_dim_qk = 192;
    c.kv = kv;
    check(c);
  }
}

// Head dim 512: two passes of kernels 512 / 256 over halves of v and o (src/api/prefill_config.h),
// on the FA2 family under any test backend (kAuto picks it).
TEST(PrefillGpu, HeadDim512CausalPagedGqa4SplitAndMerged) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 97, 300, 0};
  c.kv_lens = {1, 1023, 2049, 17};
  c.head_dim_qk = c.head_dim_vo = 512;
  c.backend = PrefillBackend::kAuto;
  c.fixed_split_size = 256;  // split KV: each pass merges its own partial rows
  check(c);
  c.fixed_split_size = 0;
  c.layout = KVLayout::kHND;
  c.page_size = 3;
  c.query_tile = 16;
  check(c);
}

TEST(PrefillGpu, HeadDim512RaggedWindowSoftCapF16) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {199, 1, 64};
  c.kv_lens = {199, 1999, 64};
  c.num_qo_heads = c.num_kv_heads = 4;
  c.head_dim_qk = c.head_dim_vo = 512;
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.window_left = 37;
  c.soft_cap = 30.0f;
  c.backend = PrefillBackend::kAuto;
  check(c);
  c.mask = MaskMode::kNone;
  c.window_left = -1;
  c.strided = true;
  check(c);
}

TEST(PrefillGpu, HeadDim512CustomMaskAndRope) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {5, 33, 64};
  c.kv_lens = {70, 100, 64};
  c.num_qo_heads = 8;
  c.num_kv_heads = 1;
  c.head_dim_qk = c.head_dim_vo = 512;
  c.mask = MaskMode::kCustom;
  c.backend = PrefillBackend::kAuto;
  check(c);
  c.mask = MaskMode::kCausal;
  c.rope = true;
  c.query_tile = 64;
  check(c);
}

TEST(PrefillGpu, CustomMaskTreeAttention) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {5, 33, 64, 1};
  c.kv_lens = {70, 100, 64, 9};
  c.mask = MaskMode::kCustom;
  check(c);
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.query_tile = 64;
  check(c);
}

TEST(PrefillGpu, CustomMaskQueryTile128) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {200, 129};
  c.kv_lens = {333, 129};
  c.mask = MaskMode::kCustom;
  c.query_tile = 128;
  check(c);
}

// Head dim 256 with a custom mask on the FA2 family at 64- and 128-row tiles (on sm_90 its mask
// rows are gathered after Q.K^T: kernels/prefill.cuh process_tile), ALiBi and a soft cap.
TEST(PrefillGpu, CustomMaskHeadDim256Fa2) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {130, 9, 77};
  c.kv_lens = {500, 300, 77};
  c.head_dim_qk = c.head_dim_vo = 256;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.mask = MaskMode::kCustom;
  c.backend = PrefillBackend::kFA2;
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.alibi = true;
  c.soft_cap = 30.0f;
  for (const int tile : {64, 128}) {
    c.query_tile = tile;
    c.seed = static_cast<uint64_t>(tile);
    SCOPED_TRACE(::testing::Message() << "query tile " << tile);
    check(c);
  }
}

// Unit-scale logits (sm_scale 1 on unit-variance q, k: standard deviation sqrt(D)) make the
// running row max climb by more than the lazy-rescale threshold long after the first tile, so
// the O rescale runs mid-stream on every query tile shape.
TEST(PrefillGpu, LargeLogitsRescaleMidStream) {
  SKIP_WITHOUT_GPU();
  for (const int tile : {64, 128}) {
    Case c;
    c.q_lens = {1023, 300};
    c.kv_lens = {1023, 700};
    c.sm_scale = 1.0f;
    c.query_tile = tile;
    c.kv = PrefillKV::kRagged;
    SCOPED_TRACE(::testing::Message() << "tile " << tile);
    check(c);
  }
}

TEST(PrefillGpu, SlidingWindowSoftCapAlibiCausal) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {300, 40, 1};
  c.kv_lens = {300, 1000, 77};
  c.num_qo_heads = 8;
  c.num_kv_heads = 8;
  c.window_left = 100;
  c.soft_cap = 30.0f;
  c.alibi = true;
  check(c);
  c.mask = MaskMode::kNone;  // window without causal
  c.alibi = false;
  check(c);
}

// RoPE over GQA 7 at head dims 64 / 256 / 192-128 (pages of 1 token), then with Llama 3.1's
// frequency scaling past its 8192 original positions, split across CTAs (each chunk rotates its
// own keys; pages of 16): the KV kind and rope_staging of `base`.
void check_rope_head_dims_and_splits(const Case& base) {
  for (const auto& [qk, vo] : {std::pair{64, 64}, std::pair{256, 256}, std::pair{192, 128}}) {
    Case d = base;
    d.q_lens = {33, 200, 2};
    d.kv_lens = {100, 200, 1500};
    d.num_qo_heads = 7;
    d.num_kv_heads = 1;
    d.page_size = 1;
    d.head_dim_qk = qk;
    d.head_dim_vo = vo;
    SCOPED_TRACE(::testing::Message() << "head dims " << qk << "/" << vo);
    check(d);
  }
  Case split = base;
  split.page_size = 16;
  split.q_lens = {5, 16};
  split.kv_lens = {9000, 3000};
  split.rope_theta = 5e5f;
  split.rope_scale = 8.0f;
  split.rope_llama31 = true;
  split.fixed_split_size = 512;
  check(split, [](const BatchPrefill& prefill) {
    EXPECT_GT(prefill.last_plan().num_partial_slots, 0) << "no split: the merge went untested";
  });
}

// Fused RoPE (pos_encoding kRopeLlama, rope_staging kFused): query token i of a request at
// kv_len - q_len + i and key j at j, on prefill and append, paged (page 1 and 16) and ragged,
// every head dim, with a window, and split across CTAs.
TEST(PrefillGpu, FusedRopeEveryPathAndHeadDim) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 97, 300};
  c.kv_lens = {1, 50, 511, 300};
  c.rope = true;
  c.rope_staging = RopeStaging::kFused;
  check(c, [](const BatchPrefill& prefill) { EXPECT_FALSE(prefill.last_plan_stages_rope()); });
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.rope_theta = 5e5f;
  c.rope_scale = 2.5f;
  c.window_left = 60;
  check(c, [](const BatchPrefill& prefill) { EXPECT_FALSE(prefill.last_plan_stages_rope()); });
  Case paged;
  paged.rope = true;
  check_rope_head_dims_and_splits(paged);
  Case ragged;
  ragged.kv = PrefillKV::kRagged;
  ragged.rope = true;
  ragged.rope_staging = RopeStaging::kFused;
  check_rope_head_dims_and_splits(ragged);
}

// rope_staging kStaged (q and k rotated into copies by apply_rope's kernel, the kernels without
// RoPE):
// ragged, GQA 4 and 7, odd lengths and an empty request, every head dim, every query tile, a
// window, Llama 3.1's frequencies with split KV, on whichever family the backend under test
// picks.
TEST(PrefillGpu, StagedRopeMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.kv = PrefillKV::kRagged;
  c.q_lens = {150, 64, 1, 300, 0};
  c.kv_lens = {400, 64, 129, 300, 17};
  c.rope = true;
  c.rope_staging = RopeStaging::kStaged;
  const auto staged = [](const BatchPrefill& prefill) {
    EXPECT_TRUE(prefill.last_plan_stages_rope());
  };
  for (const int tile : {0, 16, 64, 128}) {
    if (tile == 16 && backend_of(c) == PrefillBackend::kFA3) continue;  // FA2's tiles only
    c.query_tile = tile;
    SCOPED_TRACE(::testing::Message() << "query tile " << tile);
    check(c, staged);
  }
  c.query_tile = 0;
  c.dtype = DType::kF16;
  c.rope_theta = 5e5f;
  c.rope_scale = 2.5f;
  c.window_left = 60;
  check(c, staged);
  Case ragged;
  ragged.kv = PrefillKV::kRagged;
  ragged.rope = true;
  ragged.rope_staging = RopeStaging::kStaged;
  check_rope_head_dims_and_splits(ragged);
}

// The built-in sigmoid attention (params.use_softmax = false): with a window and soft-cap,
// causal paged; then ragged with fixed splits, whose partial sums the merge kernel adds.
TEST(PrefillGpu, SigmoidAttentionWithoutSoftmax) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {300, 40, 1, 0};
  c.kv_lens = {300, 1000, 77, 5};
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.page_size = 3;
  c.use_softmax = false;
  c.sigmoid_bias = -1.0f;
  c.window_left = 100;
  c.soft_cap = 30.0f;
  check(c);
  c.kv = PrefillKV::kRagged;
  c.window_left = -1;
  c.soft_cap = 0.0f;
  c.fixed_split_size = 128;
  c.dtype = DType::kF16;
  check(c, [](const BatchPrefill& prefill) {
    EXPECT_GT(prefill.last_plan().num_partial_slots, 0) << "no split: the merge went untested";
  });
}

TEST(PrefillGpu, EmptyRequestsAndQueriesBeyondTheCache) {
  SKIP_WITHOUT_GPU();
  Case c;
  // q_len 0; kv_len 0 (o = 0, lse = -inf); q_len > kv_len under causal (the first tokens see
  // nothing).
  c.q_lens = {0, 5, 3, 20, 0};
  c.kv_lens = {10, 0, 7, 9, 0};
  check(c);
}

TEST(PrefillGpu, EveryQueryTile) {
  SKIP_WITHOUT_GPU();
  for (const int tile : {16, 32, 64, 128}) {
    for (const int head_dim : {64, 128, 256}) {
      Case c;
      c.q_lens = {77, 130};
      c.kv_lens = {200, 130};
      c.head_dim_qk = c.head_dim_vo = head_dim;
      c.query_tile = tile;
      c.seed = static_cast<uint64_t>(tile + head_dim);
      SCOPED_TRACE(::testing::Message() << "tile " << tile << " D " << head_dim);
      check(c, [tile](const BatchPrefill& prefill) {
        EXPECT_EQ(prefill.last_tiles().query_tile, tile);
      });
    }
  }
}

TEST(PrefillGpu, HndStridedLayout) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {31, 100};
  c.kv_lens = {60, 100};
  c.layout = KVLayout::kHND;
  c.strided = true;
  check(c);
  c.kv = PrefillKV::kRagged;
  check(c);
}

TEST(PrefillGpu, LongCacheShortAppendSplitsKvAndMerges) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {64};
  c.kv_lens = {8191};
  c.num_qo_heads = 8;
  c.num_kv_heads = 1;
  check(c, [](const BatchPrefill& prefill) {
    EXPECT_FALSE(prefill.last_plan().merge_items.empty()) << "expected split-KV";
  });
  c.kv = PrefillKV::kRagged;
  c.mask = MaskMode::kNone;
  check(c,
        [](const BatchPrefill& prefill) { EXPECT_FALSE(prefill.last_plan().merge_items.empty()); });
}

TEST(PrefillGpu, FixedSplitSizeIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {100, 3, 250};
  c.kv_lens = {900, 700, 250};
  c.fixed_split_size = 64;
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  d.run(prefill, p, nullptr);
  d.download();
  expect_matches(p, d);
  EXPECT_FALSE(prefill.last_plan().merge_items.empty());
  const HostTensor first = testing::to_contiguous(d.o_host.view());
  d.poison();
  d.run(prefill, p, nullptr);
  d.download();
  const size_t bytes = static_cast<size_t>(first.numel()) * dtype_bytes(first.dtype());
  EXPECT_EQ(std::memcmp(first.data<std::byte>(), d.o_host.data<std::byte>(), bytes), 0);
}

TEST(PrefillGpu, CudaGraphReplaysAcrossPlans) {
  SKIP_WITHOUT_GPU();
  Case big;
  big.q_lens = {64, 200, 1};
  big.kv_lens = {1000, 200, 3000};
  Case small = big;
  small.q_lens = {30, 1, 150};
  small.kv_lens = {30, 2500, 151};
  const Problem pb = make_problem(big);
  const Problem ps = make_problem(small);
  BatchPrefillConfig config = config_of(pb);
  config.use_cuda_graph = true;
  config.query_tile = 64;
  BatchPrefill prefill(config);
  DeviceProblem db(pb);
  cuda::OwnedStream stream;
  plan(prefill, pb, stream.get());
  const cuda::Graph graph(stream.get(), [&] { db.run(prefill, pb, stream.get()); });
  graph.launch(stream.get());
  db.download();
  expect_matches(pb, db);

  // The second batch fits the first's buffers: copy it in place and re-plan.
  DeviceProblem ds(ps);
  plan(prefill, ps, stream.get());
  const auto copy = [](const DeviceCopy& from, const DeviceCopy& to, size_t bytes) {
    std::vector<std::byte> host(bytes);
    cuda::memcpy_dtoh(host.data(), from.buffer.data(), bytes);
    cuda::memcpy_htod(to.buffer.data(), host.data(), bytes);
  };
  ASSERT_LE(ps.total_q, pb.total_q);
  ASSERT_LE(ps.cache.pages_storage.numel(), pb.cache.pages_storage.numel());
  const auto bytes_of = [](const HostTensor& t) {
    return static_cast<size_t>(t.numel()) * dtype_bytes(t.dtype());
  };
  copy(ds.q, db.q, bytes_of(ps.q));
  copy(ds.qo_indptr, db.qo_indptr, bytes_of(ps.qo_indptr));
  copy(ds.pages, db.pages, bytes_of(ps.cache.pages_storage));
  copy(ds.v_pages, db.v_pages, bytes_of(ps.cache.v_pages_storage));
  copy(ds.page_indptr, db.page_indptr, bytes_of(ps.cache.page_indptr));
  copy(ds.page_indices, db.page_indices, bytes_of(ps.cache.page_indices));
  copy(ds.last_page_len, db.last_page_len, bytes_of(ps.cache.last_page_len));
  db.poison();
  graph.launch(stream.get());
  db.download();
  // Compare the rows of the smaller batch only.
  const TensorView o_rows = db.o_host.view().slice(0, 0, ps.total_q);
  const TensorView lse_rows = db.lse_host.view().slice(0, 0, ps.total_q);
  const testing::ErrorStats o = testing::error_stats(o_rows, ps.o_ref.view());
  EXPECT_LE(o.max_abs, tolerance_abs(small.dtype)) << o;
  EXPECT_LE(o.relative_l2, tolerance_l2(small.dtype)) << o;
  EXPECT_LE(testing::max_abs_error(lse_rows, ps.lse_ref.view()), kLseTolerance);
}

TEST(PrefillGpu, RunChecksArgumentsBeforeLaunching) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {10};
  c.kv_lens = {20};
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  EXPECT_THROW(d.run(prefill, p, nullptr), Error);  // run() before plan()
  plan(prefill, p, nullptr);
  EXPECT_THROW(prefill.run(d.q.view(p.q.view()), d.ragged.k, d.ragged.v, d.o.view(d.o_host.view()),
                           std::nullopt, nullptr),
               Error);  // ragged KV on a paged prefill
  // A page stride of 2^30 elements (2 GiB per page) exceeds the kernel's 32-bit page offsets.
  PagedKVPages huge = PagedKVPages::of(d.paged);
  huge.k.strides[0] = int64_t{1} << 30;
  EXPECT_FLARE_ERROR(
      prefill.run(d.q.view(p.q.view()), huge, d.o.view(d.o_host.view()), std::nullopt, nullptr),
      ErrorCode::kUnsupported, "2^31 bytes");
  // Fewer page ids than the plan reads: named, nothing launched.
  PagedKVPages short_indices = PagedKVPages::of(d.paged);
  short_indices.indices.shape[0] = 0;
  EXPECT_FLARE_ERROR(prefill.run(d.q.view(p.q.view()), short_indices, d.o.view(d.o_host.view()),
                                 std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "kv indices");
  const std::vector<int32_t> bad_qo = {0, 5, 3};
  const std::vector<int32_t> kv_indptr = {0, 1, 2};
  const std::vector<int32_t> last_page_len = {16, 4};
  EXPECT_THROW(prefill.plan(bad_qo, kv_indptr, last_page_len, nullptr), Error);
}

}  // namespace
}  // namespace flare
