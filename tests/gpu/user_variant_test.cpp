// User-defined variants (flare/variant/user_variant.h) on the GPU against the CPU float64
// reference of the built-in with the same math: soft-cap with the cap a run() scalar, ALiBi
// from RowContext's heads, and a per-request stride mask that is not a window (the prefill
// kernel checks every key), on decode (CUDA-core and tensor-core loops, whole-page items) and
// FA2 prefill (paged and ragged, odd lengths, GQA 1/4/8, page sizes 1/3/16). A run() with the
// wrong scalars throws before anything is written. Sigmoid attention (use_softmax = false) on
// both decode loops and both prefill paths, its split rows added up by the merges, and no lse.
// The shipped prefix-LM and document mask against the reference's masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/variant/library.h"
#include "gpu/decode_test_support.h"
#include "gpu/prefill_test_support.h"
#include "jit/variant_configs.h"
#include "testing/expect_error.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

struct DecodeVariantCase {
  UserVariant variant;
  std::vector<float> scalars;
  std::vector<TensorView> tensors;  // on the device
  AttentionParams reference;        // the built-in terms the variant reproduces
  int num_qo_heads = 16;
  int num_kv_heads = 4;
  int page_size = 16;
  bool tensor_cores = false;
  int kv_heads_per_item = 1;
};

// Runs `c` on lengths with odd tails (one request spanning many split chunks) and compares
// with the reference; returns nothing, EXPECTs inside.
void check_decode(const DecodeVariantCase& c) {
  const std::vector<int32_t> kv_lens = {1, 17, 255, 4099, 33, 1000};
  const int64_t batch = static_cast<int64_t>(kv_lens.size());
  testing::KVCacheSpec spec;
  spec.kv_lens = kv_lens;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim_qk = spec.head_dim_vo = 128;
  spec.dtype = DType::kBF16;
  spec.page_size = c.page_size;
  spec.seed = 7;
  const testing::TestKVCache cache = testing::build_kv_cache(spec);
  const gpu_testing::HostQuery q =
      gpu_testing::random_query(batch, c.num_qo_heads, 128, DType::kBF16, false, 11);
  const gpu_testing::Reference ref = gpu_testing::reference_decode(q.view, cache, c.reference);

  cuda::set_device(0);
  BatchDecodeConfig config;
  config.max_batch = static_cast<int>(batch);
  config.num_qo_heads = c.num_qo_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_dim = 128;
  config.page_size = c.page_size;
  config.use_tensor_cores = c.tensor_cores;
  config.kv_heads_per_item = c.kv_heads_per_item;
  config.variant = c.variant;
  BatchDecode decode(config);
  const gpu_testing::DeviceKV kv = gpu_testing::to_device(cache);
  const gpu_testing::DeviceCopy q_device = gpu_testing::to_device(q.storage, q.view);
  gpu_testing::DeviceOutputs out(batch, c.num_qo_heads, 128, DType::kBF16);
  cuda::device_synchronize();
  decode.plan(testing::int32_values(cache.page_indptr.view()),
              testing::int32_values(cache.last_page_len.view()), nullptr);
  out.poison(nullptr);
  RunOptions options;
  options.variant_scalars = c.scalars;
  options.variant_tensors = c.tensors;
  const bool softmax = c.reference.use_softmax;  // else no lse exists
  std::optional<TensorView> lse_out;
  if (softmax) lse_out = out.lse_view;
  decode.run(q_device.view, kv.paged, out.o_view, lse_out, nullptr, options);
  cuda::device_synchronize();
  const HostTensor o = out.o_host();
  const testing::ErrorStats o_err = testing::error_stats(o.view(), ref.o.view());
  EXPECT_EQ(testing::count_nan(o.view()), 0);
  // A weighted sum is not bounded by the values like a softmax average: relative to its size.
  const double scale = softmax ? 1.0 : std::max(1.0, testing::max_abs(ref.o.view()));
  EXPECT_LE(o_err.max_abs,
            scale * (c.tensor_cores ? gpu_testing::kOutputToleranceTensorCores : 1e-2))
      << c.variant.name << " " << o_err;
  if (!softmax) return;
  const HostTensor lse = out.lse_host();
  const testing::ErrorStats lse_err = testing::error_stats(lse.view(), ref.lse.view());
  const bool rotary = c.reference.pos_encoding == PosEncoding::kRopeLlama;
  EXPECT_LE(lse_err.max_abs, rotary ? gpu_testing::kLseToleranceRotary : 1e-3)
      << c.variant.name << " " << lse_err;
}

TEST(UserVariantDecode, SoftCapAsAUserVariantMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  DecodeVariantCase c;
  c.variant = testing::user_soft_cap();
  c.scalars = {30.0f};
  c.reference.logits_soft_cap = 30.0f;
  for (const bool tc : {false, true}) {
    c.tensor_cores = tc;
    c.page_size = tc ? 16 : 3;
    check_decode(c);
  }
}

TEST(UserVariantDecode, AlibiFromTheRowsHeadsMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  DecodeVariantCase c;
  c.variant = testing::user_alibi();
  c.reference.pos_encoding = PosEncoding::kAlibi;
  for (const auto& [qo, kv, tc, heads_per_item] :
       {std::tuple{16, 4, false, 1}, std::tuple{16, 16, false, 1}, std::tuple{32, 8, true, 1},
        std::tuple{32, 8, true, 2}, std::tuple{8, 8, true, 8}}) {
    c.num_qo_heads = qo;
    c.num_kv_heads = kv;
    c.tensor_cores = tc;
    c.kv_heads_per_item = heads_per_item;
    c.scalars = {static_cast<float>(qo), static_cast<float>(qo / kv)};
    SCOPED_TRACE(::testing::Message() << "H_qo " << qo << " H_kv " << kv << " tc " << tc
                                      << " heads/item " << heads_per_item);
    check_decode(c);
  }
}

// use_softmax = false: the loops accumulate the weights themselves, the 4099-token request's
// split chunks add up in the merge inside the decode launch.
TEST(UserVariantDecode, SigmoidWithoutSoftmaxMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  DecodeVariantCase c;
  c.variant = testing::user_sigmoid();
  c.scalars = {-1.5f};
  c.reference.use_softmax = false;
  c.reference.sigmoid_bias = -1.5f;
  for (const auto& [qo, kv, tc, page] :
       {std::tuple{16, 4, false, 3}, std::tuple{32, 8, true, 16}, std::tuple{8, 8, true, 1}}) {
    c.num_qo_heads = qo;
    c.num_kv_heads = kv;
    c.tensor_cores = tc;
    c.page_size = page;
    SCOPED_TRACE(::testing::Message() << "H_qo " << qo << " H_kv " << kv << " tc " << tc
                                      << " page " << page);
    check_decode(c);
  }
}

// The rotary hooks (kRotary, rotary_frequency) of a user's variant: q and K rotated on both
// loops and whole-page items.
TEST(UserVariantDecode, RotaryHooksMatchTheReferenceRope) {
  FLARE_REQUIRE_GPU();
  DecodeVariantCase c;
  c.variant = testing::user_rope();
  c.scalars = {5e5f, 2.0f};
  c.reference.pos_encoding = PosEncoding::kRopeLlama;
  c.reference.rope_theta = 5e5f;
  c.reference.rope_scale = 2.0f;
  for (const auto& [tc, heads_per_item] : {std::pair{false, 1}, std::pair{true, 1},
                                           std::pair{true, 4}}) {
    c.tensor_cores = tc;
    c.kv_heads_per_item = heads_per_item;
    SCOPED_TRACE(::testing::Message() << "tc " << tc << " heads/item " << heads_per_item);
    check_decode(c);
  }
}

// Slopes of `heads` heads, none a default ALiBi slope, on the host and the device.
struct Slopes {
  HostTensor host;
  gpu_testing::DeviceCopy device;
};
Slopes random_slopes(int heads) {
  cuda::set_device(0);
  Slopes s;
  s.host = HostTensor(DType::kF32, {heads});
  for (int h = 0; h < heads; ++h)
    s.host.data<float>()[h] = 0.01f + 0.37f * static_cast<float>(h % 5) / 5;
  s.device = gpu_testing::to_device(s.host);
  return s;
}

TEST(UserVariantDecode, SlopesFromAVariantTensorMatchTheReference) {
  FLARE_REQUIRE_GPU();
  const Slopes slopes = random_slopes(32);
  DecodeVariantCase c;
  c.variant = testing::user_alibi_slopes();
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.tensors = {slopes.device.view};
  c.reference.pos_encoding = PosEncoding::kAlibi;
  c.reference.alibi_slopes = slopes.host.view();
  for (const bool tc : {false, true}) {
    c.tensor_cores = tc;
    check_decode(c);
  }
}

// A planned decode of two requests with `variant`, its inputs on the device and its outputs
// NaN-poisoned: for run()'s argument errors.
struct PlannedDecode {
  explicit PlannedDecode(const UserVariant& variant)
      : cache(testing::build_kv_cache({5, 9}, 2, 128, 16)),
        q(gpu_testing::random_query(2, 8, 128, DType::kBF16, false, 3)),
        decode(config_of(variant)),
        kv(gpu_testing::to_device(cache)),
        q_device(gpu_testing::to_device(q.storage, q.view)),
        out(2, 8, 128, DType::kBF16) {
    cuda::device_synchronize();
    decode.plan(testing::int32_values(cache.page_indptr.view()),
                testing::int32_values(cache.last_page_len.view()), nullptr);
    out.poison(nullptr);
  }
  void run(const RunOptions& options) {
    decode.run(q_device.view, kv.paged, out.o_view, out.lse_view, nullptr, options);
  }
  static BatchDecodeConfig config_of(const UserVariant& variant) {
    cuda::set_device(0);
    BatchDecodeConfig config;
    config.max_batch = 2;
    config.num_qo_heads = 8;
    config.num_kv_heads = 2;
    config.head_dim = 128;
    config.page_size = 16;
    config.kv_dtype = DType::kF16;  // build_kv_cache's default; q is bfloat16 (CUDA-core loop)
    config.variant = variant;
    return config;
  }

  const testing::TestKVCache cache;
  const gpu_testing::HostQuery q;
  BatchDecode decode;
  const gpu_testing::DeviceKV kv;
  const gpu_testing::DeviceCopy q_device;
  gpu_testing::DeviceOutputs out;
};

TEST(UserVariantDecode, WrongScalarsThrowBeforeWriting) {
  FLARE_REQUIRE_GPU();
  PlannedDecode d(testing::user_soft_cap());
  RunOptions options;
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "variant 'user_soft_cap' takes 1 scalars (cap), variant_scalars holds 0");
  const float two[] = {30.0f, 1.0f};
  options.variant_scalars = two;
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument, "variant_scalars holds 2");
  const float nan[] = {std::numeric_limits<float>::quiet_NaN()};
  options.variant_scalars = nan;
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument, "scalar cap must be finite");
  const float cap[] = {30.0f};
  options.variant_scalars = cap;
  const TensorView extra = d.out.lse_view;
  options.variant_tensors = {&extra, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "takes 0 tensors, variant_tensors holds 1");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(d.out.o_host().view()), d.out.o_host().numel()) << "o was written";
}

TEST(UserVariantDecode, AVariantWithoutSoftmaxHasNoLse) {
  FLARE_REQUIRE_GPU();
  PlannedDecode d(testing::user_sigmoid());
  RunOptions options;
  const float bias[] = {0.0f};
  options.variant_scalars = bias;
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "lse was given, but variant 'user_sigmoid' has use_softmax = false");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(d.out.o_host().view()), d.out.o_host().numel()) << "o was written";
}

TEST(UserVariantDecode, VariantTensorsAreCheckedForDtypeDeviceAndShape) {
  FLARE_REQUIRE_GPU();
  UserVariant variant = testing::user_alibi_slopes();
  variant.tensors[0].shape = {8};
  PlannedDecode d(variant);
  RunOptions options;
  const TensorView wrong_dtype = d.q_device.view;
  options.variant_tensors = {&wrong_dtype, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor slopes must be float32, got bfloat16");
  const Slopes slopes = random_slopes(8);
  const TensorView on_host = slopes.host.view();
  options.variant_tensors = {&on_host, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor slopes must be on cuda:0, got cpu");
  const Slopes longer = random_slopes(16);
  options.variant_tensors = {&longer.device.view, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor slopes must have shape [8], got [16]");
  TensorView strided = longer.device.view;
  strided.shape[0] = 8;
  strided.strides[0] = 2;
  options.variant_tensors = {&strided, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor slopes must be contiguous");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(d.out.o_host().view()), d.out.o_host().numel()) << "o was written";
}

// Symbolic extents resolve against the plan: the batch (2) and the query heads (8).
TEST(UserVariantDecode, SymbolicExtentsAreTheBatchAndTheHeads) {
  FLARE_REQUIRE_GPU();
  UserVariant variant = testing::user_alibi_slopes();
  variant.tensors[0].shape = {kQoHeadsExtent};
  PlannedDecode d(variant);
  RunOptions options;
  const Slopes wrong = random_slopes(16);
  options.variant_tensors = {&wrong.device.view, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor slopes must have shape [num_qo_heads=8], got [16]");
  const Slopes right = random_slopes(8);
  options.variant_tensors = {&right.device.view, 1};
  EXPECT_NO_THROW(d.run(options));
  UserVariant by_request = testing::user_alibi_slopes();
  by_request.tensors[0].shape = {kBatchExtent};
  PlannedDecode e(by_request);
  EXPECT_FLARE_ERROR(e.run(options), ErrorCode::kInvalidArgument,
                     "tensor slopes must have shape [batch=2], got [8]");
}

using prefill_testing::Case;

TEST(UserVariantPrefill, SoftCapAsAUserVariantMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 97, 300};
  c.kv_lens = {1, 7, 130, 300};
  c.soft_cap = 30.0f;
  c.variant = testing::user_soft_cap();
  c.variant_scalars = {30.0f};
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  c.num_kv_heads = 8;  // GQA 1
  c.mask = MaskMode::kNone;
  c.dtype = DType::kF16;
  prefill_testing::check(c);
}

TEST(UserVariantPrefill, RotaryHooksMatchTheReferenceRope) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 97, 300};
  c.kv_lens = {1, 60, 130, 300};
  c.rope = true;
  c.rope_theta = 5e5f;
  c.rope_scale = 2.0f;
  c.variant = testing::user_rope();
  c.variant_scalars = {5e5f, 2.0f};
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  prefill_testing::check(c);
}

TEST(UserVariantPrefill, AlibiFromTheRowsHeadsMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {33, 5, 64};
  c.kv_lens = {40, 200, 64};
  c.num_qo_heads = 16;
  c.num_kv_heads = 2;  // GQA 8
  c.page_size = 3;
  c.alibi = true;
  c.variant = testing::user_alibi();
  c.variant_scalars = {16.0f, 8.0f};
  prefill_testing::check(c);
}

TEST(UserVariantPrefill, SlopesFromAVariantTensorMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const Slopes slopes = random_slopes(8);
  Case c;
  c.q_lens = {1, 40, 129};
  c.kv_lens = {90, 40, 300};
  c.alibi = true;
  c.alibi_slopes = slopes.host.view();
  c.variant = testing::user_alibi_slopes();
  c.variant_tensors = {slopes.device.view};
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  prefill_testing::check(c);
}

// use_softmax = false: causal paged with the default plan, then ragged with fixed splits, whose
// partial sums the merge kernel adds (MergeParams::sum_partials).
TEST(UserVariantPrefill, SigmoidWithoutSoftmaxMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 97, 300};
  c.kv_lens = {1, 40, 130, 300};
  c.num_qo_heads = 16;
  c.num_kv_heads = 4;
  c.page_size = 3;
  c.use_softmax = false;
  c.sigmoid_bias = 0.75f;
  c.variant = testing::user_sigmoid();
  c.variant_scalars = {0.75f};
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  c.mask = MaskMode::kNone;
  c.fixed_split_size = 64;
  c.dtype = DType::kF16;
  prefill_testing::check(c, [](const BatchPrefill& prefill) {
    EXPECT_GT(prefill.last_plan().num_partial_slots, 0) << "no split: the merge went untested";
  });
}

// The shipped prefix-LM (flare/variant/library.h) against the reference given the same mask as
// custom bits: each request's prefix seen by all its queries, the rest causally.
TEST(UserVariantPrefill, LibraryPrefixLmMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  const std::vector<int32_t> prefix = {5, 0, 200, 64};
  HostTensor prefix_host(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) prefix_host.data<int32_t>()[i] = prefix[static_cast<size_t>(i)];
  const gpu_testing::DeviceCopy prefix_device = gpu_testing::to_device(prefix_host);
  Case c;
  c.q_lens = {17, 128, 250, 64};
  c.kv_lens = {300, 128, 250, 64};
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.mask = MaskMode::kNone;  // the variant's mask holds the causal part
  c.variant = variants::prefix_lm();
  c.variant_tensors = {prefix_device.view};
  c.mask_rule = [prefix](int64_t request, int64_t q_pos, int64_t kv_pos) {
    return kv_pos < prefix[static_cast<size_t>(request)] || kv_pos <= q_pos;
  };
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  c.query_tile = 16;
  prefill_testing::check(c);
  // KV chunks of 64: the chunks past a tile's visible end (visible_end: max(q_pos + 1, prefix))
  // become items of no tiles, whose empty states merge with the others.
  c.fixed_split_size = 64;
  prefill_testing::check(c);
  c.query_tile = 0;  // the default tiles (the Hopper family on sm_90)
  prefill_testing::check(c);
}

// A causal library variant (its tensors and reference in `c`) on both prefill paths, split and
// not, pages of 16 and 1; a plan without the causal mask is refused.
void check_causal_library_prefill(Case c) {
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  c.query_tile = 128;
  prefill_testing::check(c);
  c.query_tile = 16;
  c.fixed_split_size = 64;
  c.page_size = 1;
  c.kv = PrefillKV::kPaged;
  prefill_testing::check(c);
  BatchPrefillConfig config = testing::prefill_config(*c.variant, PrefillKV::kRagged);
  config.params.mask = MaskMode::kNone;
  EXPECT_FLARE_ERROR(BatchPrefill prefill(config), ErrorCode::kInvalidArgument,
                     "requires the causal mask");
}

// `c` on both decode loops (pages of 3 and 16), then on whole-page items.
void check_decode_loops(DecodeVariantCase c) {
  for (const bool tc : {false, true}) {
    c.tensor_cores = tc;
    c.page_size = tc ? 16 : 3;
    check_decode(c);
  }
  c.kv_heads_per_item = 2;  // whole-page items
  check_decode(c);
}

// T5's bucket table [heads, 32] on the host and distance_bias()'s table from it on the device
// (flare::variants::t5_distance_bias): the reference computes T5's buckets itself.
struct T5Tables {
  T5Tables(int heads, double max_distance, uint64_t seed)
      : buckets(testing::random_tensor(DType::kF32, {heads, 32}, seed)) {
    const float* b = buckets.data<float>();
    const std::vector<float> bias = variants::t5_distance_bias(
        std::vector<float>(b, b + buckets.numel()), heads, max_distance);
    HostTensor host(DType::kF32, {heads, static_cast<int64_t>(bias.size()) / heads});
    std::copy(bias.begin(), bias.end(), host.data<float>());
    by_distance = gpu_testing::to_device(host);
  }
  HostTensor buckets;
  gpu_testing::DeviceCopy by_distance;
};

// distance_bias() with T5's table against the reference's T5 buckets: near keys (one load),
// far tiles (the row's last entry: the Hopper family's offset path), both prefill families,
// split and not, pages of 1 and 16; max distances under and over a 128-key tile.
TEST(UserVariantPrefill, LibraryDistanceBiasIsT5WithItsTable) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  for (const double max_distance : {40.0, 200.0}) {
    SCOPED_TRACE("max_distance " + std::to_string(max_distance));
    const T5Tables tables(8, max_distance, 31);
    Case c;
    c.q_lens = {17, 600, 250, 1, 64};
    c.kv_lens = {300, 600, 1200, 77, 64};
    c.variant = variants::distance_bias();
    c.variant_tensors = {tables.by_distance.view};
    c.relative_bias = tables.buckets.view();
    c.relative_max_distance = static_cast<float>(max_distance);
    check_causal_library_prefill(c);
  }
}

TEST(UserVariantDecode, LibraryDistanceBiasIsT5WithItsTable) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const T5Tables tables(16, 100.0, 37);
  DecodeVariantCase c;
  c.variant = variants::distance_bias();
  c.tensors = {tables.by_distance.view};
  c.reference.relative_bias = tables.buckets.view();
  c.reference.relative_max_distance = 100.0f;
  check_decode_loops(c);
}

// A table (kTableExtent) holds at least one column and fewer than 2^31 entries: run() refuses
// others by name before any launch (the view's shape alone: nothing is read).
TEST(UserVariantDecode, DistanceTablesAreCheckedBeforeAnyLaunch) {
  FLARE_REQUIRE_GPU();
  PlannedDecode d(variants::distance_bias());
  cuda::DeviceBuffer buffer(64);
  RunOptions options;
  const TensorView empty = TensorView::contiguous(buffer.data(), DType::kF32, {8, 0}, Device::cuda(0));
  options.variant_tensors = {&empty, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor bias must have shape [num_qo_heads=8, at least 1], got [8, 0]");
  const TensorView huge =
      TensorView::contiguous(buffer.data(), DType::kF32, {8, int64_t{1} << 28}, Device::cuda(0));
  options.variant_tensors = {&huge, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor bias holds 2147483648 elements; a table (kTableExtent) holds at "
                     "most 2^31 - 1");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(d.out.o_host().view()), d.out.o_host().numel()) << "o was written";
}

// Packed documents for document_mask(): per request, runs of 1-300 positions with one id
// each, in rows of `columns` (a request longer than that has positions past the row: documents
// of their own), the reference's ids and the starts the variant reads, on the device.
struct Documents {
  Documents(const std::vector<int32_t>& kv_lens, int64_t columns_in, uint64_t seed)
      : columns(columns_in),
        ids(DType::kI32, {static_cast<int64_t>(kv_lens.size()), columns_in}) {
    std::vector<int32_t> all(static_cast<size_t>(ids.numel()));
    uint64_t state = seed;
    for (size_t r = 0; r < kv_lens.size(); ++r) {
      int32_t id = 0;
      int64_t left = 0;
      for (int64_t j = 0; j < columns; ++j) {
        if (left == 0) {
          state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          left = 1 + static_cast<int64_t>((state >> 33) % 300);
          ++id;
        }
        --left;
        all[r * columns + j] = id;
      }
    }
    std::copy(all.begin(), all.end(), ids.data<int32_t>());
    const std::vector<int32_t> starts =
        variants::document_starts(all, static_cast<int64_t>(kv_lens.size()), columns);
    HostTensor starts_host(DType::kI32, ids.shape());
    std::copy(starts.begin(), starts.end(), starts_host.data<int32_t>());
    starts_device = gpu_testing::to_device(starts_host);
  }
  // Causal and inside one document (positions past the row: alone).
  bool visible(int64_t request, int64_t q_pos, int64_t kv_pos) const {
    if (kv_pos > q_pos) return false;
    if (kv_pos == q_pos) return true;
    if (q_pos >= columns) return false;
    const int32_t* row = ids.data<int32_t>() + request * columns;
    return row[q_pos] == row[kv_pos];
  }

  int64_t columns;
  HostTensor ids;
  gpu_testing::DeviceCopy starts_device;
};

TEST(UserVariantDecode, LibraryDocumentMaskMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);  // Documents copies to the device (alone in a shard, no test set it)
  // check_decode's lengths; 4099 runs past the rows (its last 99 positions alone).
  const Documents docs({1, 17, 255, 4099, 33, 1000}, 4000, 5);
  DecodeVariantCase c;
  c.variant = variants::document_mask();
  c.tensors = {docs.starts_device.view};
  c.reference.document_id = docs.ids.view();
  check_decode_loops(c);
}

// Tiles that skip earlier documents, straddle a start or lie inside one document, on both
// prefill paths, split and not; a non-causal plan is refused.
TEST(UserVariantPrefill, LibraryDocumentMaskMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  Case c;
  c.q_lens = {17, 600, 250, 1, 64};
  c.kv_lens = {300, 600, 1200, 77, 64};
  const Documents docs(c.kv_lens, 1100, 9);
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.variant = variants::document_mask();
  c.variant_tensors = {docs.starts_device.view};
  c.mask_rule = [&docs](int64_t request, int64_t q_pos, int64_t kv_pos) {
    return docs.visible(request, q_pos, kv_pos);
  };
  check_causal_library_prefill(c);
}

TEST(UserVariantPrefill, AMaskThatIsNotAWindowIsCheckedOnEveryKey) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {17, 128, 1, 250};
  c.kv_lens = {300, 128, 77, 250};
  c.variant = testing::user_stride_mask();
  c.mask_rule = [](int64_t request, int64_t q_pos, int64_t kv_pos) {
    return kv_pos <= q_pos && testing::stride_mask_visible(request, kv_pos);
  };
  prefill_testing::check(c);  // causal and the variant's mask
  c.mask = MaskMode::kNone;
  c.kv = PrefillKV::kRagged;
  c.mask_rule = [](int64_t request, int64_t, int64_t kv_pos) {
    return testing::stride_mask_visible(request, kv_pos);
  };
  c.query_tile = 128;
  prefill_testing::check(c);
  c.kv = PrefillKV::kPaged;
  c.page_size = 1;
  c.query_tile = 16;
  prefill_testing::check(c);
}

}  // namespace
}  // namespace flare
