// Storage dtypes: bf16/f16 queries, keys and outputs, and fp8 e4m3/e5m2 KV caches with
// k_scale/v_scale, each against the naive float64 attention on the same stored values.
#include <gtest/gtest.h>

#include <string>

#include "attention_case.h"

namespace flare {
namespace {

using testing::AttentionCaseSpec;
using testing::expect_matches_naive;
using testing::KVSource;

constexpr double kF32Tolerance = 2e-5;

AttentionCaseSpec dtype_case(DType q_dtype, DType kv_dtype, DType o_dtype) {
  AttentionCaseSpec spec;
  spec.q_lens = {1, 7, 3};
  spec.kv_lens = {97, 7, 40};
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.page_size = 16;
  spec.q_dtype = q_dtype;
  spec.kv_dtype = kv_dtype;
  spec.o_dtype = o_dtype;
  spec.params.mask = MaskMode::kCausal;
  return spec;
}

TEST(ReferenceAttentionDtypes, HalfPrecisionInputsAndOutputs) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    // Inputs in half precision, float32 output: only accumulation error remains.
    expect_matches_naive(dtype_case(dtype, dtype, DType::kF32), kF32Tolerance, kF32Tolerance);
    // Output rounded to the half type as well (expect_near adds its rounding error).
    expect_matches_naive(dtype_case(dtype, dtype, dtype), kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionDtypes, MixedQueryAndCacheDtypes) {
  expect_matches_naive(dtype_case(DType::kBF16, DType::kF32, DType::kF16), kF32Tolerance,
                       kF32Tolerance);
  expect_matches_naive(dtype_case(DType::kF32, DType::kF16, DType::kBF16), kF32Tolerance,
                       kF32Tolerance, KVSource::kRagged);
}

TEST(ReferenceAttentionDtypes, Fp8KvDequantizedWithScales) {
  for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
    for (KVSource source : {KVSource::kPaged, KVSource::kRagged}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)));
      AttentionCaseSpec spec = dtype_case(DType::kBF16, dtype, DType::kF32);
      spec.kv_value_scale = 8.0f;  // stored values use more of the fp8 range
      spec.params.k_scale = 0.125f;
      spec.params.v_scale = 0.37f;
      expect_matches_naive(spec, kF32Tolerance, kF32Tolerance, source);
      spec.params.pos_encoding = PosEncoding::kRopeLlama;
      spec.page_size = 1;
      expect_matches_naive(spec, kF32Tolerance, kF32Tolerance, source);
    }
  }
}

}  // namespace
}  // namespace flare
