// User-defined variants (flare/variant/user_variant.h) on the GPU against the CPU float64
// reference of the built-in with the same math: soft-cap with the cap a run() scalar, ALiBi
// from RowContext's heads, and a per-request stride mask that is not a window (the prefill
// kernel checks every key), on decode (CUDA-core and tensor-core loops, whole-page items) and
// FA2 prefill (paged and ragged, odd lengths, GQA 1/4/8, page sizes 1/3/16). A run() with the
// wrong scalars throws before anything is written. Sigmoid attention (use_softmax = false) on
// both decode loops and both prefill paths, its split rows added up by the merges, and no lse.
// The shipped variants (flare/variant/library.h): library_variant_test.cpp.
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
#include "gpu/variant_test_support.h"
#include "jit/variant_configs.h"
#include "testing/expect_error.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

using variant_testing::check_decode;
using variant_testing::DecodeVariantCase;
using variant_testing::PlannedDecode;

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
