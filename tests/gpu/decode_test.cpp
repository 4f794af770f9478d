// BatchDecode on the GPU against the CPU float64 reference: head dims, GQA ratios, page sizes,
// layouts, dtypes (fp8 against the dequantized values), strided views, variants, split and
// write-through items, empty requests; NaN-poisoned outputs and bitwise-identical reruns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "decode_test_support.h"
#include "flare/api/batch_decode.h"
#include "flare/jit/cuda_sync.h"

namespace flare {
namespace {

using gpu_testing::DeviceOutputs;

// Tolerances on unit-variance inputs (issue 4): outputs are rounded to f16/bf16, so their
// error is dominated by that rounding; fp8 KV is compared with the reference on the same
// (dequantized) fp8 values.
constexpr double kOutputTolerance16 = 1e-2;
constexpr double kOutputToleranceFp8 = 2e-2;
constexpr double kLseTolerance = 1e-3;  // float32 accumulation, natural log

struct DecodeCase {
  std::string name;
  std::vector<int32_t> kv_lens;
  int num_qo_heads = 32;
  int num_kv_heads = 8;
  int head_dim = 128;
  int page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  bool strided = false;   // padded q and KV views (16-bit KV)
  bool combined = false;  // K and V sliced from one [pages, 2, ...] tensor
  bool with_lse = true;
  AttentionParams params;
  int fixed_split_size = 0;
  bool disable_split_kv = false;
  bool tensor_cores = false;  // BatchDecodeConfig::use_tensor_cores
  int kv_heads_per_item = 1;  // BatchDecodeConfig::kv_heads_per_item (whole-page items)
  float q_magnitude = 1.0f;   // q = normal(0, 1) * q_magnitude
  uint64_t seed = 1;
};

std::ostream& operator<<(std::ostream& os, const DecodeCase& c) { return os << c.name; }

std::vector<int32_t> lengths(int64_t batch, int32_t lo, int32_t hi, uint64_t seed) {
  return testing::random_lengths(batch, testing::LengthDistribution::kUniform, lo, hi, seed);
}

// The most KV heads per whole-page item a tensor-core case allows: a power of two up to 8
// dividing its KV heads, head groups of at most 8, stages within 64 KiB (BatchDecodeConfig).
int whole_page_heads(const DecodeCase& c) {
  if (c.num_qo_heads / c.num_kv_heads > 8) return 1;
  const bool fp8 = is_fp8(c.kv_dtype);
  const int tokens = fp8 && c.head_dim <= 128 ? 32 : 16;
  const int row_bytes = c.head_dim * (fp8 ? 1 : 2);
  for (int heads : {8, 4, 2}) {
    if (c.num_kv_heads % heads == 0 && 2 * heads * tokens * row_bytes <= 64 * 1024) return heads;
  }
  return 1;
}

std::vector<DecodeCase> cases() {
  std::vector<DecodeCase> all;
  const auto add = [&all](DecodeCase c) {
    c.seed = all.size() + 11;
    all.push_back(std::move(c));
  };
  {
    DecodeCase c{"d128_gqa4_page16_nhd_bf16_odd_lengths"};
    c.kv_lens = {1, 7, 97, 1023, 32769, 0, 511};
    add(c);
  }
  {
    DecodeCase c{"d64_gqa1_page1_hnd_f16"};
    c.kv_lens = {7, 97, 1023, 1, 0, 5, 2048};
    c.num_qo_heads = 8, c.num_kv_heads = 8, c.head_dim = 64, c.page_size = 1;
    c.layout = KVLayout::kHND, c.q_dtype = DType::kF16, c.kv_dtype = DType::kF16;
    add(c);
  }
  {
    DecodeCase c{"d256_gqa8_page64_nhd_bf16"};
    c.kv_lens = {1023, 97, 1, 7, 4096};
    c.num_qo_heads = 16, c.num_kv_heads = 2, c.head_dim = 256, c.page_size = 64;
    add(c);
  }
  {
    DecodeCase c{"d128_gqa7_page16_hnd_f16q_bf16kv_batch37"};
    c.kv_lens = lengths(37, 1, 3000, 5);
    c.num_qo_heads = 28, c.num_kv_heads = 4, c.layout = KVLayout::kHND;
    c.q_dtype = DType::kF16;
    add(c);
  }
  {
    DecodeCase c{"d128_gqa4_e4m3_combined_scaled"};
    c.kv_lens = {1, 7, 97, 1023, 4097};
    c.kv_dtype = DType::kE4M3, c.combined = true;
    c.params.k_scale = 0.5f, c.params.v_scale = 2.0f;
    add(c);
  }
  {
    DecodeCase c{"d64_gqa8_page3_e5m2_f16q"};
    c.kv_lens = {1, 2, 3, 97, 1000, 0};
    c.num_qo_heads = 64, c.num_kv_heads = 8, c.head_dim = 64, c.page_size = 3;
    c.q_dtype = DType::kF16, c.kv_dtype = DType::kE5M2;
    add(c);
  }
  {
    DecodeCase c{"d256_gqa4_hnd_e4m3"};
    c.kv_lens = {1023, 1, 2500};
    c.num_qo_heads = 8, c.num_kv_heads = 2, c.head_dim = 256, c.layout = KVLayout::kHND;
    c.kv_dtype = DType::kE4M3;
    add(c);
  }
  {
    DecodeCase c{"d128_gqa4_batch256_no_lse"};
    c.kv_lens = lengths(256, 0, 600, 7);
    c.with_lse = false;
    add(c);
  }
  {
    DecodeCase c{"d128_gqa8_hnd_strided_q_and_kv"};
    c.kv_lens = {97, 1023, 1, 3000};
    c.num_qo_heads = 32, c.num_kv_heads = 4, c.layout = KVLayout::kHND, c.strided = true;
    add(c);
  }
  {
    DecodeCase c{"d64_gqa4_nhd_strided_f16"};
    c.kv_lens = {5, 700, 33};
    c.num_qo_heads = 8, c.num_kv_heads = 2, c.head_dim = 64, c.strided = true;
    c.q_dtype = DType::kF16, c.kv_dtype = DType::kF16;
    add(c);
  }
  {
    DecodeCase c{"soft_cap"};
    c.kv_lens = {1, 97, 1023, 5000};
    c.params.logits_soft_cap = 1.5f;
    add(c);
  }
  {
    DecodeCase c{"sliding_window"};
    c.kv_lens = {1, 97, 255, 256, 257, 1023, 9000};
    c.params.window_left = 255;
    add(c);
  }
  {
    DecodeCase c{"alibi_default_slopes"};
    c.kv_lens = {1, 97, 1023, 3000};
    c.params.pos_encoding = PosEncoding::kAlibi;
    add(c);
  }
  {
    // Fused RoPE: q at kv_len - 1, key j at j, across split chunks (5000) and page ends.
    DecodeCase c{"rope_llama"};
    c.kv_lens = {1, 97, 1023, 5000, 0};
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    add(c);
  }
  {
    DecodeCase c{"rope_scaled_theta5e5_d64_gqa8_page3_window_f16"};
    c.kv_lens = {2, 333, 2049};
    c.num_qo_heads = 16, c.num_kv_heads = 2, c.head_dim = 64, c.page_size = 3;
    c.q_dtype = DType::kF16, c.kv_dtype = DType::kF16;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    c.params.rope_scale = 2.5f, c.params.rope_theta = 5e5f;
    c.params.window_left = 200;
    add(c);
  }
  {
    // Llama 3.1's frequency scaling (factor 8, 8192 original positions) past 8192 tokens.
    DecodeCase c{"rope_llama31_kv20000"};
    c.kv_lens = {20000, 9000, 5};
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    c.params.rope_theta = 5e5f, c.params.rope_scale = 8.0f;
    c.params.rope_llama31 = AttentionParams::Llama31Scaling{};
    add(c);
  }
  {
    DecodeCase c{"rope_d256_gqa1_hnd_kv40000"};
    c.kv_lens = {40000, 3};
    c.num_qo_heads = 2, c.num_kv_heads = 2, c.head_dim = 256, c.layout = KVLayout::kHND;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    add(c);
  }
  {
    // Fused RoPE on fp8 K: rotated after its conversion (in registers on both loops).
    DecodeCase c{"rope_e4m3_split"};
    c.kv_lens = {1, 97, 1023, 5000, 0};
    c.kv_dtype = DType::kE4M3;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    add(c);
  }
  {
    DecodeCase c{"rope_theta5e5_d64_gqa8_page3_e5m2_f16q"};
    c.kv_lens = {2, 333, 2049};
    c.num_qo_heads = 16, c.num_kv_heads = 2, c.head_dim = 64, c.page_size = 3;
    c.q_dtype = DType::kF16, c.kv_dtype = DType::kE5M2;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    c.params.rope_theta = 5e5f;
    add(c);
  }
  {
    DecodeCase c{"rope_d256_gqa4_hnd_e4m3_scaled"};
    c.kv_lens = {1023, 1, 2500};
    c.num_qo_heads = 8, c.num_kv_heads = 2, c.head_dim = 256, c.layout = KVLayout::kHND;
    c.kv_dtype = DType::kE4M3;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    c.params.k_scale = 0.5f;
    add(c);
  }
  {
    DecodeCase c{"all_variants_gqa16_e4m3"};
    c.kv_lens = {1, 500, 4000, 0};
    c.num_qo_heads = 64, c.num_kv_heads = 4, c.kv_dtype = DType::kE4M3;
    c.params.logits_soft_cap = 5.0f;
    c.params.window_left = 1000;
    c.params.pos_encoding = PosEncoding::kAlibi;
    c.params.sm_scale = 0.05f;
    add(c);
  }
  {
    // use_softmax = false: sums of sigmoid weights, split chunks added by the merge; no lse.
    DecodeCase c{"sigmoid"};
    c.kv_lens = {1, 97, 1023, 5000, 0};
    c.params.use_softmax = false;
    c.params.sigmoid_bias = -2.0f;
    c.with_lse = false;
    add(c);
  }
  {
    DecodeCase c{"sigmoid_soft_cap_tensor_cores_fixed_split"};
    c.kv_lens = {1, 300, 2049};
    c.params.use_softmax = false;
    c.params.sigmoid_bias = 0.5f;
    c.params.logits_soft_cap = 5.0f;
    c.tensor_cores = true;
    c.fixed_split_size = 256;
    c.with_lse = false;
    add(c);
  }
  {
    DecodeCase c{"d64_gqa12_two_row_tiles"};
    c.kv_lens = {3, 1500, 97};
    c.num_qo_heads = 24, c.num_kv_heads = 2, c.head_dim = 64;
    add(c);
  }
  {
    DecodeCase c{"fixed_split_size"};
    c.kv_lens = {1, 97, 1023, 2049};
    c.num_qo_heads = 8, c.num_kv_heads = 2;
    c.fixed_split_size = 256;
    add(c);
  }
  {
    DecodeCase c{"disable_split_kv"};
    c.kv_lens = {1, 97, 1023, 20000};
    c.disable_split_kv = true;
    add(c);
  }
  {
    DecodeCase c{"d256_gqa1_batch1_kv32769"};
    c.kv_lens = {32769};
    c.num_qo_heads = 4, c.num_kv_heads = 4, c.head_dim = 256;
    add(c);
  }
  {
    // One KV head: ~360 chunks of one tile, merged in many passes of staged partial rows.
    DecodeCase c{"d128_gqa1_batch1_kv40000_many_slots"};
    c.kv_lens = {40000};
    c.num_qo_heads = 1, c.num_kv_heads = 1;
    add(c);
  }
  {
    // Equal lengths: each tile cut evenly over the CTAs (the planner's even-split candidate).
    DecodeCase c{"uniform_lengths_even_split"};
    c.kv_lens = std::vector<int32_t>(12, 3001);
    add(c);
  }
  {
    // 560 tiles: more than the resident CTAs, so the tensor-core twin runs two waves (decode
    // v14), with Zipf's longest requests split and merged across them.
    DecodeCase c{"zipf_batch70_fills_the_grid"};
    c.kv_lens = testing::random_lengths(70, testing::LengthDistribution::kZipf, 1, 5000, 3);
    add(c);
  }
  {
    DecodeCase c{"all_empty"};
    c.kv_lens = {0, 0, 0};
    add(c);
  }
  {
    // bf16 q beyond f16's range (65504): the tensor-core loop runs fp8 KV in f16, with q
    // scaled by a power of two per item (kernels/decode_mma.cuh).
    DecodeCase c{"bf16_q_above_f16_range_e4m3"};
    c.kv_lens = {1, 97, 2049, 0};
    c.q_magnitude = 3e5f;
    c.params.sm_scale = 1.0f / (3e5f * std::sqrt(128.0f));
    c.kv_dtype = DType::kE4M3;
    add(c);
  }
  {
    // bf16 q far below f16's normal range (6.1e-5): scaled up, not rounded to subnormals.
    DecodeCase c{"bf16_q_below_f16_range_e5m2_gqa8"};
    c.kv_lens = {3, 1500, 333};
    c.num_qo_heads = 16, c.num_kv_heads = 2;
    c.q_magnitude = 1e-6f;
    c.params.sm_scale = 1.0f / (1e-6f * std::sqrt(128.0f));
    c.kv_dtype = DType::kE5M2;
    add(c);
  }
  // Every case again on the tensor-core loop whose q and KV share a 16-bit type or whose KV
  // is fp8 (same inputs: the seed is kept).
  const size_t cuda_core_cases = all.size();
  for (size_t i = 0; i < cuda_core_cases; ++i) {
    if (all[i].q_dtype != all[i].kv_dtype && !is_fp8(all[i].kv_dtype)) continue;
    DecodeCase c = all[i];
    c.name = "mma_" + c.name;
    c.tensor_cores = true;
    all.push_back(std::move(c));
  }
  // And on whole-page items of the most KV heads each case allows (decode v16).
  const size_t mma_end = all.size();
  for (size_t i = cuda_core_cases; i < mma_end; ++i) {
    DecodeCase c = all[i];
    c.kv_heads_per_item = whole_page_heads(c);
    if (c.kv_heads_per_item == 1) continue;
    c.name = "pages" + std::to_string(c.kv_heads_per_item) + "_" + c.name;
    all.push_back(std::move(c));
  }
  // D 512: the CUDA-core loop only (two 8-dim chunks a lane, items of at most 4 rows).
  {
    DecodeCase c{"d512_gqa8_page3_rope_split"};  // 8 rows a KV head: two items of 4
    c.kv_lens = {1, 97, 1023, 5000, 0};
    c.num_qo_heads = 16, c.num_kv_heads = 2, c.head_dim = 512, c.page_size = 3;
    c.q_dtype = DType::kF16, c.kv_dtype = DType::kF16;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    add(c);
  }
  {
    DecodeCase c{"d512_gqa1_hnd_window_soft_cap"};
    c.kv_lens = {3, 1999, 54, 16384};
    c.num_qo_heads = 4, c.num_kv_heads = 4, c.head_dim = 512, c.layout = KVLayout::kHND;
    c.params.window_left = 533;
    c.params.logits_soft_cap = 30.0f;
    add(c);
  }
  {
    DecodeCase c{"d512_gqa3_e4m3_rope_scaled"};  // rows padded to 4; fp8 K rotated in registers
    c.kv_lens = {1, 300, 2049};
    c.num_qo_heads = 6, c.num_kv_heads = 2, c.head_dim = 512, c.page_size = 16;
    c.kv_dtype = DType::kE4M3;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    c.params.k_scale = 0.5f;
    add(c);
  }
  {
    DecodeCase c{"d512_gqa2_strided_alibi_fixed_split"};
    c.kv_lens = {1, 1023, 4097};
    c.num_qo_heads = 4, c.num_kv_heads = 2, c.head_dim = 512, c.page_size = 8;
    c.strided = true;
    c.params.pos_encoding = PosEncoding::kAlibi;
    c.fixed_split_size = 256;
    add(c);
  }
  {
    // Two super heads of 4 KV heads each, split and merged, HND pages.
    DecodeCase c{"pages4_of_8_hnd_split"};
    c.kv_lens = {1, 4097, 97, 20000};
    c.layout = KVLayout::kHND;
    c.tensor_cores = true, c.kv_heads_per_item = 4;
    add(c);
  }
  {
    // Items of 2 KV heads, group 7 (rows padded to 8 per head), page 5.
    DecodeCase c{"pages2_gqa7_page5"};
    c.kv_lens = {1, 7, 3001, 650};
    c.num_qo_heads = 28, c.num_kv_heads = 4, c.page_size = 5;
    c.tensor_cores = true, c.kv_heads_per_item = 2;
    add(c);
  }
  return all;
}

class BatchDecodeVsReference : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(BatchDecodeVsReference, MatchesFloat64ReferenceAndRerunsBitwise) {
  FLARE_REQUIRE_GPU();
  const DecodeCase& c = GetParam();
  const int64_t batch = static_cast<int64_t>(c.kv_lens.size());

  testing::KVCacheSpec spec;
  spec.kv_lens = c.kv_lens;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim_qk = spec.head_dim_vo = c.head_dim;
  spec.dtype = c.kv_dtype;
  spec.page_size = c.page_size;
  spec.layout = c.layout;
  spec.combined = c.combined;
  spec.strided = c.strided;
  spec.seed = c.seed;
  const testing::TestKVCache cache = testing::build_kv_cache(spec);
  const gpu_testing::HostQuery q = gpu_testing::random_query(
      batch, c.num_qo_heads, c.head_dim, c.q_dtype, c.strided, c.seed + 100, c.q_magnitude);
  const gpu_testing::Reference ref = gpu_testing::reference_decode(q.view, cache, c.params);

  cuda::set_device(0);
  BatchDecodeConfig config;
  config.max_batch = static_cast<int>(batch);
  config.num_qo_heads = c.num_qo_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_dim = c.head_dim;
  config.page_size = c.page_size;
  config.q_dtype = c.q_dtype;
  config.kv_dtype = c.kv_dtype;
  config.layout = c.layout;
  config.params = c.params;
  config.fixed_split_size = c.fixed_split_size;
  config.disable_split_kv = c.disable_split_kv;
  config.use_tensor_cores = c.tensor_cores;
  config.kv_heads_per_item = c.kv_heads_per_item;
  BatchDecode decode(config);

  const gpu_testing::DeviceKV kv = gpu_testing::to_device(cache);
  const gpu_testing::DeviceCopy q_device = gpu_testing::to_device(q.storage, q.view);
  DeviceOutputs out(batch, c.num_qo_heads, c.head_dim, c.q_dtype);
  const cuda::OwnedStream stream;
  cuda::device_synchronize();  // pageable copies may still be in flight on return
  const std::vector<int32_t> indptr = testing::int32_values(cache.page_indptr.view());
  const std::vector<int32_t> last = testing::int32_values(cache.last_page_len.view());
  decode.plan(indptr, last, stream.get());

  std::optional<HostTensor> first_o, first_lse;
  for (int attempt = 0; attempt < 2; ++attempt) {
    out.poison(stream.get());
    decode.run(q_device.view, kv.paged, out.o_view,
               c.with_lse ? std::optional<TensorView>(out.lse_view) : std::nullopt, stream.get());
    cuda::stream_synchronize(stream.get());
    HostTensor o = out.o_host();
    HostTensor lse = out.lse_host();
    if (attempt == 0) {
      const testing::ErrorStats o_err = testing::error_stats(o.view(), ref.o.view());
      // A sigmoid sum is not bounded by the values like a softmax average: relative to its size.
      const double scale =
          c.params.use_softmax ? 1.0 : std::max(1.0, testing::max_abs(ref.o.view()));
      const double tolerance = scale * (is_fp8(c.kv_dtype) ? kOutputToleranceFp8
                                        : c.tensor_cores ? gpu_testing::kOutputToleranceTensorCores
                                                         : kOutputTolerance16);
      EXPECT_EQ(testing::count_nan(o.view()), 0) << "unwritten or NaN outputs";
      EXPECT_LE(o_err.max_abs, tolerance) << o_err;
      if (c.with_lse) {
        const testing::ErrorStats lse_err = testing::error_stats(lse.view(), ref.lse.view());
        EXPECT_LE(lse_err.max_abs, c.params.pos_encoding == PosEncoding::kRopeLlama
                                       ? gpu_testing::kLseToleranceRotary
                                       : kLseTolerance)
            << lse_err;
      } else {
        EXPECT_EQ(testing::count_nan(lse.view()), lse.numel()) << "lse written without lse";
      }
      const Plan& plan = decode.last_plan();
      RecordProperty("work_items", static_cast<int>(plan.work_items.size()));
      RecordProperty("merge_items", static_cast<int>(plan.merge_items.size()));
      RecordProperty("o_max_abs", std::to_string(o_err.max_abs));
      first_o = std::move(o);
      first_lse = std::move(lse);
    } else {
      EXPECT_TRUE(gpu_testing::bytes_equal(o, *first_o)) << "o differs between identical runs";
      if (c.with_lse) {
        EXPECT_TRUE(gpu_testing::bytes_equal(lse, *first_lse)) << "lse differs between runs";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BatchDecodeVsReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace flare
