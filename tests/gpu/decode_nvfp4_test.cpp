// BatchDecode over NVFP4 KV (kv_dtype uint8: E2M1 codes, D / 2 bytes a row, with e4m3 block
// scales; include/flare/format/nvfp4.h) against the CPU float64 reference on the dequantized
// values: head dims 64-512, head groups of 1, 3 and 8 (items of at most 4 rows), pages of 1, 3
// and 16, NHD and HND, global scales, RoPE (K rotated after its conversion), soft-cap with a
// window, split items; outputs NaN-poisoned, reruns bitwise; the missing or misplaced scales
// refused by name. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "decode_test_support.h"
#include "flare/api/batch_decode.h"
#include "flare/format/nvfp4.h"
#include "flare/jit/cuda_sync.h"
#include "nvfp4_test_support.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using gpu_testing::DeviceOutputs;

struct Nvfp4Case {
  std::string name;
  std::vector<int32_t> kv_lens;
  int num_qo_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 128;
  int page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  DType q_dtype = DType::kF16;
  AttentionParams params;  // the reference's (k_scale, v_scale 1: it reads dequantized values)
  float k_global = 1.0f;   // the global decode scales the kernel gets (config.params)
  float v_global = 1.0f;
  int fixed_split_size = 0;
  uint64_t seed = 1;
};
std::ostream& operator<<(std::ostream& os, const Nvfp4Case& c) { return os << c.name; }

std::vector<Nvfp4Case> cases() {
  std::vector<Nvfp4Case> all;
  {
    Nvfp4Case c{"d128_gqa4_page16"};
    c.kv_lens = {1, 97, 1023, 5000, 0};
    all.push_back(c);
  }
  {
    Nvfp4Case c{"d64_gqa8_page1_hnd_scaled"};  // 8 rows: two items of 4 a KV head
    c.kv_lens = {3, 1500, 333};
    c.num_qo_heads = 16, c.head_dim = 64, c.page_size = 1, c.layout = KVLayout::kHND;
    c.k_global = 0.5f, c.v_global = 2.0f;
    all.push_back(c);
  }
  {
    Nvfp4Case c{"d256_gqa1_page3_bf16_rope"};
    c.kv_lens = {1, 300, 2049};
    c.num_qo_heads = c.num_kv_heads = 4, c.head_dim = 256, c.page_size = 3;
    c.q_dtype = DType::kBF16;
    c.params.pos_encoding = PosEncoding::kRopeLlama;
    all.push_back(c);
  }
  {
    Nvfp4Case c{"d512_gqa3_window_soft_cap_fixed_split"};  // rows padded to 4
    c.kv_lens = {54, 2048, 97};
    c.num_qo_heads = 6, c.num_kv_heads = 2, c.head_dim = 512;
    c.params.window_left = 533, c.params.logits_soft_cap = 30.0f;
    c.fixed_split_size = 256;
    c.k_global = 0.25f;
    all.push_back(c);
  }
  return all;
}

// The NVFP4 pages of a float32 test cache, K and V each with its global scale; the cache's
// values become the dequantized ones.
struct Nvfp4Pages {
  HostTensor k_codes, v_codes, k_scales, v_scales;
};

Nvfp4Pages quantize_cache(testing::TestKVCache& cache, float k_global, float v_global) {
  gpu_testing::Nvfp4Tensors k = gpu_testing::quantize_rows(cache.paged.k, k_global);
  gpu_testing::Nvfp4Tensors v = gpu_testing::quantize_rows(cache.paged.v, v_global);
  return {std::move(k.codes), std::move(v.codes), std::move(k.scales), std::move(v.scales)};
}

class BatchDecodeNvfp4 : public ::testing::TestWithParam<Nvfp4Case> {};

TEST_P(BatchDecodeNvfp4, MatchesTheReferenceOnDequantizedValues) {
  FLARE_REQUIRE_GPU();
  const Nvfp4Case& c = GetParam();
  const int64_t batch = static_cast<int64_t>(c.kv_lens.size());
  testing::KVCacheSpec spec;
  spec.kv_lens = c.kv_lens;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim_qk = spec.head_dim_vo = c.head_dim;
  spec.dtype = DType::kF32;
  spec.page_size = c.page_size;
  spec.layout = c.layout;
  spec.seed = c.seed;
  spec.scale = 2.0f;
  testing::TestKVCache cache = testing::build_kv_cache(spec);
  const Nvfp4Pages host = quantize_cache(cache, c.k_global, c.v_global);
  const gpu_testing::HostQuery q =
      gpu_testing::random_query(batch, c.num_qo_heads, c.head_dim, c.q_dtype, false, c.seed + 100);
  const gpu_testing::Reference ref = gpu_testing::reference_decode(q.view, cache, c.params);

  cuda::set_device(0);
  BatchDecodeConfig config;
  config.max_batch = static_cast<int>(batch);
  config.num_qo_heads = c.num_qo_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_dim = c.head_dim;
  config.page_size = c.page_size;
  config.q_dtype = c.q_dtype;
  config.kv_dtype = DType::kU8;
  config.layout = c.layout;
  config.params = c.params;
  config.params.k_scale = c.k_global;
  config.params.v_scale = c.v_global;
  config.fixed_split_size = c.fixed_split_size;
  BatchDecode decode(config);

  const gpu_testing::DeviceCopy k_codes = gpu_testing::to_device(host.k_codes);
  const gpu_testing::DeviceCopy v_codes = gpu_testing::to_device(host.v_codes);
  const gpu_testing::DeviceCopy k_scales = gpu_testing::to_device(host.k_scales);
  const gpu_testing::DeviceCopy v_scales = gpu_testing::to_device(host.v_scales);
  const gpu_testing::DeviceCopy indices = gpu_testing::to_device(cache.page_indices);
  const gpu_testing::DeviceCopy q_device = gpu_testing::to_device(q.storage, q.view);
  PagedKVPages pages{k_codes.view, v_codes.view, c.layout, indices.view};
  pages.k_scales = k_scales.view;
  pages.v_scales = v_scales.view;
  DeviceOutputs out(batch, c.num_qo_heads, c.head_dim, c.q_dtype);
  const cuda::OwnedStream stream;
  cuda::device_synchronize();
  decode.plan(testing::int32_values(cache.page_indptr.view()),
              testing::int32_values(cache.last_page_len.view()), stream.get());

  std::optional<HostTensor> first_o;
  for (int attempt = 0; attempt < 2; ++attempt) {
    out.poison(stream.get());
    decode.run(q_device.view, pages, out.o_view, out.lse_view, stream.get());
    cuda::stream_synchronize(stream.get());
    HostTensor o = out.o_host();
    if (attempt == 0) {
      const testing::ErrorStats o_err = testing::error_stats(o.view(), ref.o.view());
      EXPECT_EQ(testing::count_nan(o.view()), 0) << "unwritten or NaN outputs";
      EXPECT_LE(o_err.max_abs, 1e-2) << c.name << ": o " << o_err;
      const testing::ErrorStats lse_err =
          testing::error_stats(out.lse_host().view(), ref.lse.view());
      const double lse_tolerance = c.params.pos_encoding == PosEncoding::kRopeLlama
                                       ? gpu_testing::kLseToleranceRotary
                                       : 1e-3;
      EXPECT_LE(lse_err.max_abs, lse_tolerance) << c.name << ": lse " << lse_err;
      first_o.emplace(std::move(o));
    } else {
      EXPECT_TRUE(gpu_testing::bytes_equal(o, *first_o)) << c.name << ": o differs between runs";
    }
  }
  decode.check();

  // Scales missing, or given for 16-bit KV: refused by name, nothing launched.
  PagedKVPages without = pages;
  without.k_scales = without.v_scales = TensorView{};
  EXPECT_FLARE_ERROR(decode.run(q_device.view, without, out.o_view, std::nullopt, stream.get()),
                     ErrorCode::kInvalidArgument, "block scales (kv_cache_sf)");
}

INSTANTIATE_TEST_SUITE_P(Cases, BatchDecodeNvfp4, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Nvfp4Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace flare
