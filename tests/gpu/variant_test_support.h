// User variants on the GPU, shared by tests/gpu/user_variant_test.cpp and
// library_variant_test.cpp: a decode case against the CPU float64 reference of the built-in
// terms the variant reproduces (both loops, whole-page items), and a planned decode whose run()
// argument errors the tests provoke.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/variant/user_variant.h"
#include "gpu/decode_test_support.h"

namespace flare::variant_testing {

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
inline void check_decode(const DecodeVariantCase& c) {
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

// `c` on both decode loops (pages of 3 and 16), then on whole-page items.
inline void check_decode_loops(DecodeVariantCase c) {
  for (const bool tc : {false, true}) {
    c.tensor_cores = tc;
    c.page_size = tc ? 16 : 3;
    check_decode(c);
  }
  c.kv_heads_per_item = 2;  // whole-page items
  check_decode(c);
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

}  // namespace flare::variant_testing
