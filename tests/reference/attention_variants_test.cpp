// Every option of attention_params.h against the naive float64 attention: masks (causal,
// sliding window, custom bits), soft cap, ALiBi, RoPE, sigmoid, explicit sm_scale, on decode,
// append (q_len < kv_len) and prefill (q_len = kv_len) batches with odd lengths and GQA ratios.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attention_case.h"

namespace flare {
namespace {

using testing::AttentionCaseSpec;
using testing::expect_matches_naive;
using testing::KVSource;

// fp32 accumulation of unit-normal inputs at D <= 128: float rounding of logits, exp and sums.
constexpr double kF32Tolerance = 2e-5;
// fp64 accumulation: beyond the rounding of the float32 output, only summation order differs.
constexpr double kF64Tolerance = 1e-10;

// A mixed batch: decode, append, prefill, an empty request and q_len > kv_len.
AttentionCaseSpec mixed_batch(int64_t qo_heads, int64_t kv_heads) {
  AttentionCaseSpec spec;
  spec.q_lens = {1, 7, 97, 0, 5, 3};
  spec.kv_lens = {511, 97, 97, 7, 0, 1};
  spec.num_qo_heads = qo_heads;
  spec.num_kv_heads = kv_heads;
  spec.page_size = 3;
  return spec;
}

TEST(ReferenceAttentionVariants, PlainSoftmaxOverGqaRatios) {
  for (int64_t ratio : {1, 4, 7, 8}) {
    SCOPED_TRACE("group " + std::to_string(ratio));
    AttentionCaseSpec spec = mixed_batch(ratio * 2, 2);
    spec.seed = static_cast<uint64_t>(ratio);
    expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionVariants, DecodeOverOddKvLengths) {
  AttentionCaseSpec spec;
  spec.q_lens = {1, 1, 1, 1, 1};
  spec.kv_lens = {1, 7, 97, 511, 0};
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = spec.head_dim_vo = 128;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, CausalAppendAndPrefill) {
  for (int32_t kv_len : {7, 97, 511}) {
    SCOPED_TRACE("kv_len " + std::to_string(kv_len));
    AttentionCaseSpec spec;
    spec.q_lens = {kv_len, std::max(1, kv_len / 3), 1};  // prefill, append, decode
    spec.kv_lens = {kv_len, kv_len, kv_len};
    spec.num_qo_heads = 4;
    spec.num_kv_heads = 4;
    spec.params.mask = MaskMode::kCausal;
    spec.seed = static_cast<uint64_t>(kv_len);
    expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionVariants, CausalWithMoreQueriesThanKeysMasksTheEarlyRows) {
  AttentionCaseSpec spec;
  spec.q_lens = {9, 4};
  spec.kv_lens = {5, 0};
  spec.num_qo_heads = 7;
  spec.num_kv_heads = 1;
  spec.params.mask = MaskMode::kCausal;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, SlidingWindowWithAndWithoutCausal) {
  for (MaskMode mask : {MaskMode::kNone, MaskMode::kCausal}) {
    for (int32_t window : {0, 1, 16, 200}) {
      SCOPED_TRACE("causal " + std::to_string(mask == MaskMode::kCausal) + " window " +
                   std::to_string(window));
      AttentionCaseSpec spec = mixed_batch(4, 1);
      spec.params.mask = mask;
      spec.params.window_left = window;
      spec.seed = static_cast<uint64_t>(window) + 100;
      expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
    }
  }
}

TEST(ReferenceAttentionVariants, LogitsSoftCap) {
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.logits_soft_cap = 1.5f;
  spec.params.sm_scale = 0.5f;  // large logits so the cap bends them
  spec.params.mask = MaskMode::kCausal;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, AlibiWithDefaultSlopes) {
  // 12 heads: not a power of two, so the second slope sequence is exercised too.
  for (int64_t qo_heads : {8, 12}) {
    SCOPED_TRACE("heads " + std::to_string(qo_heads));
    AttentionCaseSpec spec = mixed_batch(qo_heads, 4);
    spec.params.pos_encoding = PosEncoding::kAlibi;
    spec.params.mask = MaskMode::kCausal;
    expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionVariants, AlibiWithGivenSlopesAndSoftCap) {
  AttentionCaseSpec spec = mixed_batch(7, 1);
  spec.params.pos_encoding = PosEncoding::kAlibi;
  spec.give_alibi_slopes = true;
  spec.params.logits_soft_cap = 5.0f;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, CustomMaskBitsWithFullyMaskedRows) {
  for (double density : {0.03, 0.5, 1.0}) {
    SCOPED_TRACE("density " + std::to_string(density));
    AttentionCaseSpec spec = mixed_batch(8, 2);
    spec.params.mask = MaskMode::kCustom;
    spec.mask_density = density;
    expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionVariants, CustomMaskWithSlidingWindow) {
  AttentionCaseSpec spec = mixed_batch(4, 4);
  spec.params.mask = MaskMode::kCustom;
  spec.params.window_left = 5;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, SigmoidWithBiasAndCausalMask) {
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.use_softmax = false;
  spec.params.sigmoid_bias = -1.25f;
  spec.params.mask = MaskMode::kCausal;
  spec.with_lse = false;
  // Sums of up to 511 gated values: absolute error grows with the number of keys.
  expect_matches_naive(spec, 2e-4, 0.0);
}

// Prefix-LM (the CPU side of flare::variants::prefix_lm): prefixes from 0 to past the request,
// with and without softmax.
TEST(ReferenceAttentionVariants, PrefixLmWidensTheCausalMask) {
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.mask = MaskMode::kCausal;
  spec.give_prefix_len = true;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  spec.params.use_softmax = false;
  spec.with_lse = false;
  expect_matches_naive(spec, 2e-4, 0.0);
}

// Document mask (the CPU side of flare::variants::document_mask): short documents, a row
// shorter than the longest request, causal and not, with softmax and without.
TEST(ReferenceAttentionVariants, DocumentIdsKeepKeysInTheQuerysDocument) {
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.mask = MaskMode::kCausal;
  spec.give_document_id = true;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance, KVSource::kRagged);
  spec.params.mask = MaskMode::kNone;
  spec.params.window_left = 3;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  spec.params.use_softmax = false;
  spec.with_lse = false;
  expect_matches_naive(spec, 2e-4, 0.0);
}

// T5's relative position bias (the CPU side of flare::variants::relative_position_bias), causal
// and not, with ALiBi and soft-cap alongside, two max distances.
TEST(ReferenceAttentionVariants, RelativePositionBiasT5Buckets) {
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.mask = MaskMode::kCausal;
  spec.give_relative_bias = true;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  spec.params.mask = MaskMode::kNone;
  spec.params.relative_max_distance = 40.0f;
  spec.params.pos_encoding = PosEncoding::kAlibi;
  spec.params.logits_soft_cap = 20.0f;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, RelativeBiasBucketsAreT5s) {
  // transformers' _relative_position_bucket(-n, bidirectional=False, 32, 128) at its edges.
  EXPECT_EQ(relative_bias_bucket(-5, 128), 0);
  EXPECT_EQ(relative_bias_bucket(0, 128), 0);
  EXPECT_EQ(relative_bias_bucket(15, 128), 15);
  EXPECT_EQ(relative_bias_bucket(16, 128), 16);
  EXPECT_EQ(relative_bias_bucket(31, 128), 21);  // 16 + floor(ln(31/16) / ln(8) * 16)
  EXPECT_EQ(relative_bias_bucket(127, 128), 31);
  EXPECT_EQ(relative_bias_bucket(100000, 128), 31);
}

TEST(ReferenceAttentionVariants, RopeLlamaDefaultThetaAndOffsets) {
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.pos_encoding = PosEncoding::kRopeLlama;
  spec.params.mask = MaskMode::kCausal;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  spec.give_rope_offsets = true;
  spec.params.rope_theta = 5e5f;
  spec.params.rope_scale = 4.0f;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, RopeWithHeadDims8And256) {
  for (int64_t head_dim : {8, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    AttentionCaseSpec spec;
    spec.q_lens = {3, 1};
    spec.kv_lens = {40, 97};
    spec.num_qo_heads = 4;
    spec.num_kv_heads = 2;
    spec.head_dim_qk = spec.head_dim_vo = head_dim;
    spec.params.pos_encoding = PosEncoding::kRopeLlama;
    spec.give_rope_offsets = true;
    expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionVariants, DifferentQkAndVoHeadDims) {
  AttentionCaseSpec spec = mixed_batch(4, 2);
  spec.head_dim_qk = 192;
  spec.head_dim_vo = 128;
  spec.params.mask = MaskMode::kCausal;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, ExplicitSmScale) {
  AttentionCaseSpec spec = mixed_batch(4, 1);
  spec.params.sm_scale = 0.3f;
  expect_matches_naive(spec, kF32Tolerance, kF32Tolerance);
}

TEST(ReferenceAttentionVariants, Float64AccumulationMatchesToRounding) {
  ReferenceOptions fp64;
  fp64.accumulation = Accumulation::kF64;
  AttentionCaseSpec spec = mixed_batch(8, 2);
  spec.params.mask = MaskMode::kCausal;
  spec.params.window_left = 40;
  spec.params.logits_soft_cap = 3.0f;
  spec.params.pos_encoding = PosEncoding::kRopeLlama;
  spec.give_rope_offsets = true;
  // Float32 outputs of float64 sums: only the final rounding (which expect_near allows for)
  // separates them from the naive float64 result.
  expect_matches_naive(spec, kF64Tolerance, kF64Tolerance, KVSource::kPaged, fp64);

  AttentionCaseSpec alibi = mixed_batch(12, 4);
  alibi.params.pos_encoding = PosEncoding::kAlibi;
  alibi.params.mask = MaskMode::kCustom;
  expect_matches_naive(alibi, kF64Tolerance, kF64Tolerance, KVSource::kRagged, fp64);
}

}  // namespace
}  // namespace flare
