// validate_attention through reference_attention: each malformed argument throws its error
// code with the argument named in the message, and the NaN-poisoned o and lse stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "attention_case.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using testing::AttentionCase;
using testing::AttentionCaseSpec;
using testing::count_nan;
using testing::element_count;
using testing::KVSource;

constexpr ErrorCode kInvalid = ErrorCode::kInvalidArgument;
constexpr ErrorCode kUnsupported = ErrorCode::kUnsupported;

AttentionCaseSpec valid_spec() {
  AttentionCaseSpec spec;
  spec.q_lens = {1, 3, 0};
  spec.kv_lens = {5, 9, 2};
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.page_size = 3;
  return spec;
}

class ReferenceAttentionValidation : public ::testing::Test {
 protected:
  ReferenceAttentionValidation() : case_(valid_spec()) {}

  // Runs with NaN-poisoned outputs, expects the error, and that nothing was written.
  void expect_rejected(const AttentionProblem& problem, const AttentionOutput& out, ErrorCode code,
                       const std::string& substring, ReferenceOptions options = {}) {
    testing::poison(out.o);
    if (out.lse) testing::poison(*out.lse);
    EXPECT_FLARE_ERROR(reference_attention(problem, out, options), code, substring);
    EXPECT_EQ(count_nan(out.o), element_count(out.o)) << "o was written";
    if (out.lse) {
      EXPECT_EQ(count_nan(*out.lse), element_count(*out.lse)) << "lse was written";
    }
  }
  void expect_rejected(const AttentionProblem& problem, ErrorCode code,
                       const std::string& substring) {
    expect_rejected(problem, case_.output(), code, substring);
  }

  AttentionCase case_;
};

TEST_F(ReferenceAttentionValidation, TheValidCaseRuns) {
  EXPECT_NO_THROW(case_.run());
  EXPECT_NO_THROW(case_.run(KVSource::kRagged));
}

TEST_F(ReferenceAttentionValidation, Queries) {
  AttentionProblem p = case_.problem();
  p.q = case_.problem().q.select(2, 0);
  expect_rejected(p, kInvalid, "q must have rank 3 [total_q, num_qo_heads, head_dim_qk]");
  p = case_.problem();
  p.q.dtype = DType::kI32;
  expect_rejected(p, kInvalid, "q dtype must be float32, float16 or bfloat16, got int32");
  p.q.dtype = DType::kE4M3;
  expect_rejected(p, kUnsupported, "q dtype must be float32, float16 or bfloat16");
  p = case_.problem();
  p.q.device = Device::cuda(0);
  expect_rejected(p, kInvalid, "q must be on the CPU");
}

TEST_F(ReferenceAttentionValidation, QueryIndptr) {
  HostTensor wrong_last = testing::int32_tensor({0, 1, 4, 5});
  AttentionProblem p = case_.problem();
  p.qo_indptr = wrong_last.view();
  expect_rejected(p, kInvalid, "qo_indptr[3] must equal total_q (q.shape[0]) = 4, got 5");
  HostTensor decreasing = testing::int32_tensor({0, 3, 1, 4});
  p.qo_indptr = decreasing.view();
  expect_rejected(p, kInvalid, "qo_indptr must be non-decreasing");
  HostTensor wide(DType::kI64, {4});
  p.qo_indptr = wide.view();
  expect_rejected(p, kInvalid, "qo_indptr must be int32");
  HostTensor short_batch = testing::int32_tensor({0, 1, 4});
  p.qo_indptr = short_batch.view();
  expect_rejected(p, kInvalid, "KV batch (requests in the KV indptr) must equal the qo batch");
}

TEST_F(ReferenceAttentionValidation, Heads) {
  AttentionCaseSpec spec = valid_spec();
  spec.num_qo_heads = 30;
  spec.num_kv_heads = 8;
  AttentionCase heads_case(spec);
  expect_rejected(heads_case.problem(), heads_case.output(), kInvalid,
                  "num_qo_heads (30) must be a multiple of num_kv_heads (8)");
}

TEST_F(ReferenceAttentionValidation, HeadDims) {
  for (int64_t head_dim : {4, 12, 520}) {
    AttentionCaseSpec spec = valid_spec();
    spec.head_dim_qk = spec.head_dim_vo = head_dim;
    AttentionCase dims_case(spec);
    expect_rejected(
        dims_case.problem(), dims_case.output(), kUnsupported,
        "q head_dim_qk must be a multiple of 8 in [8, 512], got " + std::to_string(head_dim));
  }
  AttentionCaseSpec spec = valid_spec();
  spec.head_dim_vo = 20;
  AttentionCase vo_case(spec);
  expect_rejected(vo_case.problem(), vo_case.output(), kUnsupported,
                  "v head_dim_vo must be a multiple of 8");
  // q's head dim differs from the cache's.
  AttentionCaseSpec wide = valid_spec();
  wide.head_dim_qk = wide.head_dim_vo = 128;
  AttentionCase wide_case(wide);
  AttentionProblem p = wide_case.problem();
  p.kv = case_.problem().kv;
  expect_rejected(p, wide_case.output(), kInvalid,
                  "q head_dim_qk (128) must equal k head_dim_qk (64)");
}

TEST_F(ReferenceAttentionValidation, Outputs) {
  const AttentionProblem p = case_.problem();
  HostTensor o_short(DType::kF32, {3, 8, 64}), lse(DType::kF32, {4, 8});
  expect_rejected(
      p, AttentionOutput{o_short.view(), lse.view()}, kInvalid,
      "o must have shape [4, 8, 64] [total_q, num_qo_heads, head_dim_vo], got [3, 8, 64]");
  HostTensor o_fp8(DType::kE5M2, {4, 8, 64});
  expect_rejected(p, AttentionOutput{o_fp8.view(), std::nullopt}, kUnsupported, "o dtype");
  HostTensor o(DType::kF32, {4, 8, 64}), lse_half(DType::kF16, {4, 8}),
      lse_wide(DType::kF32, {4, 9});
  expect_rejected(p, AttentionOutput{o.view(), lse_half.view()}, kInvalid,
                  "lse must be float32, got float16");
  expect_rejected(p, AttentionOutput{o.view(), lse_wide.view()}, kInvalid,
                  "lse must have shape [4, 8]");
  AttentionProblem sigmoid = p;
  sigmoid.params.use_softmax = false;
  expect_rejected(sigmoid, AttentionOutput{o.view(), lse.view()}, kInvalid,
                  "lse must not be given when use_softmax is false");
  TensorView o_on_gpu = o.view();
  o_on_gpu.device = Device::cuda(1);
  testing::poison(o.view());
  EXPECT_FLARE_ERROR(reference_attention(p, AttentionOutput{o_on_gpu, std::nullopt}), kInvalid,
                     "o must be on the CPU");
  EXPECT_EQ(count_nan(o.view()), o.numel());
}

TEST_F(ReferenceAttentionValidation, PagedCache) {
  AttentionProblem p = case_.problem();
  PagedKV& paged = std::get<PagedKV>(p.kv);
  const PagedKV valid = paged;
  paged.k.device = Device::cuda(0);
  expect_rejected(p, kInvalid, "k_cache must be on the CPU");
  paged = valid;
  paged.v.dtype = DType::kBF16;
  expect_rejected(p, kInvalid, "v_cache must have the dtype of k_cache");
  paged = valid;
  HostTensor bad_indices = testing::to_contiguous(valid.table.indices);
  bad_indices.data<int32_t>()[2] = 1000;
  paged.table.indices = bad_indices.view();
  expect_rejected(p, kInvalid, "kv_indices[2]=1000 is out of range");
  paged = valid;
  HostTensor bad_last = testing::int32_tensor({2, 0, 2});
  paged.table.last_block_len = bad_last.view();
  expect_rejected(p, kInvalid, "kv_last_page_len[1]=0 must be in [1, 3]");
}

TEST_F(ReferenceAttentionValidation, RaggedCache) {
  AttentionProblem p = case_.problem(KVSource::kRagged);
  RaggedKV& ragged = std::get<RaggedKV>(p.kv);
  HostTensor short_indptr = testing::int32_tensor({0, 5, 14, 15});
  ragged.indptr = short_indptr.view();
  expect_rejected(p, kInvalid, "kv_indptr[3]=15 must equal the number of rows of k (16)");
  p = case_.problem(KVSource::kRagged);
  std::get<RaggedKV>(p.kv).v = std::get<RaggedKV>(p.kv).v.select(0, 0);
  expect_rejected(p, kInvalid, "v must have rank 3");
}

TEST_F(ReferenceAttentionValidation, CustomMask) {
  AttentionProblem p = case_.problem();
  p.params.mask = MaskMode::kCustom;
  expect_rejected(p, kInvalid, "mask MaskMode::kCustom needs both custom_mask and mask_indptr");
  // Segments: request 0 holds ceil(1 * 5 / 8) = 1 byte, request 1 ceil(27 / 8) = 4, request 2 0.
  HostTensor bits(DType::kU8, {5});
  HostTensor good_indptr = testing::int32_tensor({0, 1, 5, 5});
  HostTensor bad_indptr = testing::int32_tensor({0, 1, 4, 4});
  p.params.custom_mask = bits.view();
  p.params.mask_indptr = bad_indptr.view();
  expect_rejected(p, kInvalid,
                  "custom_mask segment of request 1 (mask_indptr[2] - mask_indptr[1]) must hold "
                  "ceil(q_len * kv_len / 8) = ceil(3 * 9 / 8) = 4 bytes, got 3");
  HostTensor too_long = testing::int32_tensor({0, 1, 6, 6});
  p.params.mask_indptr = too_long.view();
  expect_rejected(p, kInvalid, "mask_indptr[3]=6 must be <= 5");
  HostTensor wrong_dtype(DType::kI32, {5});
  p.params.mask_indptr = good_indptr.view();
  p.params.custom_mask = wrong_dtype.view();
  expect_rejected(p, kInvalid, "custom_mask must be uint8, got int32");
  p.params.custom_mask = bits.view();
  p.params.mask = MaskMode::kCausal;
  expect_rejected(p, kInvalid, "custom_mask / mask_indptr are given but mask is not");
  p.params.mask = MaskMode::kCustom;
  bits.data<uint8_t>()[0] = 0xff;
  EXPECT_NO_THROW(reference_attention(p, case_.output()));
}

TEST_F(ReferenceAttentionValidation, PositionEncodingTensors) {
  AttentionProblem p = case_.problem();
  HostTensor slopes_short(DType::kF32, {7}), slopes_half(DType::kF16, {8});
  p.params.pos_encoding = PosEncoding::kAlibi;
  p.params.alibi_slopes = slopes_short.view();
  expect_rejected(p, kInvalid, "alibi_slopes must have shape [8] [num_qo_heads], got [7]");
  p.params.alibi_slopes = slopes_half.view();
  expect_rejected(p, kInvalid, "alibi_slopes must be float32");
  HostTensor offsets = testing::int32_tensor({1, 2, 3});
  HostTensor offsets_long = testing::int32_tensor({1, 2, 3, 4});
  p.params.alibi_slopes.reset();
  p.params.rope_offsets = offsets.view();
  expect_rejected(p, kInvalid, "rope_offsets is given but pos_encoding is not");
  p.params.pos_encoding = PosEncoding::kRopeLlama;
  p.params.rope_offsets = offsets_long.view();
  expect_rejected(p, kInvalid, "rope_offsets must have shape [3] [batch], got [4]");
  p.params.rope_offsets = offsets.view();
  p.params.rope_theta = 0.0f;
  expect_rejected(p, kInvalid, "rope_theta must be finite and > 0, got 0");
  p.params.rope_theta = 1e4f;
  p.params.rope_scale = -1.0f;
  expect_rejected(p, kInvalid, "rope_scale must be finite and > 0, got -1");
}

TEST_F(ReferenceAttentionValidation, PrefixAndRelativeBiasTensors) {
  AttentionProblem p = case_.problem();
  HostTensor prefix = testing::int32_tensor({1, 2, 3});
  HostTensor prefix_long = testing::int32_tensor({1, 2, 3, 4});
  p.params.prefix_len = prefix.view();
  expect_rejected(p, kInvalid, "prefix_len is given but mask is not MaskMode::kCausal");
  p.params.mask = MaskMode::kCausal;
  p.params.prefix_len = prefix_long.view();
  expect_rejected(p, kInvalid, "prefix_len must have shape [3] [batch], got [4]");
  p = case_.problem();
  HostTensor table(DType::kF32, {8, 32}), narrow(DType::kF32, {8, 16});
  p.params.relative_bias = narrow.view();
  expect_rejected(p, kInvalid, "relative_bias must have shape [8, 32] [num_qo_heads, 32]");
  p.params.relative_bias = table.view();
  p.params.relative_max_distance = 16.0f;
  expect_rejected(p, kInvalid, "relative_max_distance must be finite and > 16, got 16");
}

TEST_F(ReferenceAttentionValidation, ScalarOptions) {
  AttentionProblem p = case_.problem();
  p.params.window_left = -2;
  expect_rejected(p, kInvalid, "window_left must be >= -1 (-1 = no window), got -2");
  p = case_.problem();
  p.params.logits_soft_cap = -1.0f;
  expect_rejected(p, kInvalid, "logits_soft_cap must be >= 0 (0 = off), got -1");
  p = case_.problem();
  p.params.sm_scale = NAN;
  expect_rejected(p, kInvalid, "sm_scale must be finite");
  p = case_.problem();
  p.params.k_scale = INFINITY;
  expect_rejected(p, kInvalid, "k_scale must be finite");
  ReferenceOptions options;
  options.num_threads = -1;
  expect_rejected(case_.problem(), case_.output(), kInvalid,
                  "ReferenceOptions::num_threads must be >= 0", options);
}

}  // namespace
}  // namespace flare
