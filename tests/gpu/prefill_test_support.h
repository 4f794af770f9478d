// GPU prefill tests' shared pieces: a case description, its CPU float64 reference, the device
// copies of its inputs (outputs NaN-poisoned), plan / run / compare helpers.
//
// Tolerances (unit-variance inputs, float64 reference on the same rounded inputs): bf16 max abs
// <= 2e-2 and relative L2 <= 1e-2 (o is rounded to bf16, P to bf16 before P.V); f16 max abs
// <= 4e-3 and relative L2 <= 2e-3; lse (float32) max abs <= 2e-3.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "flare/reference/attention.h"
#include "gpu/decode_test_support.h"
#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"

namespace flare::prefill_testing {

using testing::KVCacheSpec;
using testing::TestKVCache;

struct Case {
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  int num_qo_heads = 8;
  int num_kv_heads = 2;
  int head_dim_qk = 128;
  int head_dim_vo = 128;
  PrefillKV kv = PrefillKV::kPaged;
  int page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  bool strided = false;
  DType dtype = DType::kBF16;
  MaskMode mask = MaskMode::kCausal;
  int window_left = -1;
  float soft_cap = 0.0f;
  float sm_scale = 0.0f;  // 0: 1 / sqrt(head_dim_qk)
  bool alibi = false;
  bool rope = false;  // fused RoPE (pos_encoding kRopeLlama) with these:
  float rope_theta = 1e4f;
  float rope_scale = 1.0f;
  bool rope_llama31 = false;  // Llama 3.1's frequency scaling (its defaults)
  // Sigmoid attention in the reference (use_softmax = false, o = sum sigmoid(s + bias) v, no
  // lse): the run then passes no lse and o is compared relative to its largest value.
  bool use_softmax = true;
  float sigmoid_bias = 0.0f;
  int query_tile = 0;
  // q as a view into a larger buffer when >= 0: one token and one head more, this many
  // elements more a head row, starting at token 1 and head 1 (its head stride then decides
  // whether the Hopper family copies Q in bulk: a multiple of 16 bytes, or gathers it).
  int q_dim_pad = -1;
  // Unset: FLARE_TEST_PREFILL_BACKEND (auto | fa2 | fa3) when set, else kAuto; scripts/
  // gpu_check.sh runs the suite under fa2 as well, so both families stay covered on Hopper.
  std::optional<PrefillBackend> backend;
  int fixed_split_size = 0;
  bool disable_split_kv = false;
  int num_sms_to_use = 0;  // 0: every SM (fewer: each CTA takes more work items in turn)
  RopeStaging rope_staging = RopeStaging::kAuto;  // with rope: BatchPrefillConfig::rope_staging
  uint64_t seed = 1;
  // A user variant compiled in place of the built-in (soft_cap, window and alibi above then
  // describe the reference only), its run() scalars, and a mask the variant applies: the
  // reference takes it as custom bits (rule(request, q_pos, kv_pos): visible), the kernel
  // `mask`.
  std::optional<UserVariant> variant;
  std::vector<float> variant_scalars;
  std::vector<TensorView> variant_tensors;  // on the device
  std::optional<TensorView> alibi_slopes;   // the reference's explicit slopes (alibi)
  std::function<bool(int64_t, int64_t, int64_t)> mask_rule;  // (request, q_pos, kv_pos)
  // The reference's T5 bias (AttentionParams::relative_bias, float32 [H_qo, 32] on the host).
  std::optional<TensorView> relative_bias;
  float relative_max_distance = 128.0f;
};

// Device copy of a host buffer; views into the host buffer are rebased onto it.
struct DeviceCopy {
  cuda::DeviceBuffer buffer;
  const void* host_base = nullptr;

  DeviceCopy() = default;
  explicit DeviceCopy(const HostTensor& host) {
    const size_t bytes = static_cast<size_t>(host.numel()) * dtype_bytes(host.dtype());
    buffer = cuda::DeviceBuffer(std::max<size_t>(bytes, 16));
    host_base = host.data<std::byte>();
    if (bytes > 0) cuda::memcpy_htod(buffer.data(), host_base, bytes);
  }
  TensorView view(const TensorView& host_view) const {
    return testing::rebase_view(host_view, host_base, buffer.data(), Device::cuda(0));
  }
};

inline double tolerance_abs(DType dtype) { return dtype == DType::kBF16 ? 2e-2 : 4e-3; }
inline double tolerance_l2(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 2e-3; }
inline constexpr double kLseTolerance = 2e-3;

// Run outputs: the device o and lse filled with NaN from their host tensors (in place: a
// captured graph keeps the addresses), and copied back after the device is idle.
inline void poison_outputs(HostTensor& o_host, HostTensor& lse_host, const DeviceCopy& o,
                           const DeviceCopy& lse) {
  o_host.fill(std::numeric_limits<float>::quiet_NaN());
  lse_host.fill(std::numeric_limits<float>::quiet_NaN());
  cuda::memcpy_htod(o.buffer.data(), o_host.data<std::byte>(),
                    static_cast<size_t>(o_host.numel()) * dtype_bytes(o_host.dtype()));
  cuda::memcpy_htod(lse.buffer.data(), lse_host.data<std::byte>(),
                    static_cast<size_t>(lse_host.numel()) * sizeof(float));
}
inline void download_outputs(HostTensor& o_host, HostTensor& lse_host, const DeviceCopy& o,
                             const DeviceCopy& lse) {
  cuda::device_synchronize();
  cuda::memcpy_dtoh(o_host.data<std::byte>(), o.buffer.data(),
                    static_cast<size_t>(o_host.numel()) * dtype_bytes(o_host.dtype()));
  cuda::memcpy_dtoh(lse_host.data<std::byte>(), lse.buffer.data(),
                    static_cast<size_t>(lse_host.numel()) * sizeof(float));
}

// Everything one case needs on both sides.
struct Problem {
  Case c;
  TestKVCache cache;
  HostTensor q, qo_indptr, mask_bits, mask_indptr;
  TensorView q_view;  // of q: all of it, or Case::q_dim_pad's view
  HostTensor o_ref, lse_ref;
  AttentionParams params;
  int64_t total_q = 0;

  // Replaces q (and its view, which would otherwise still point at the old buffer).
  void set_q(HostTensor tensor) {
    q = std::move(tensor);
    q_view = q.view();
  }
  // q_view, checked to lie inside q (a view left behind by an assignment to q fails here).
  const TensorView& checked_q_view() const {
    const auto* begin = q.data<std::byte>();
    const auto* data = static_cast<const std::byte*>(q_view.data);
    EXPECT_TRUE(q_view.dtype == q.dtype() && data >= begin &&
                data < begin + q.numel() * static_cast<int64_t>(dtype_bytes(q.dtype())))
        << "Problem::q_view is not a view of Problem::q: assign q through set_q()";
    return q_view;
  }
};

// The float64-accumulated reference of p's q, cache and params into p.o_ref / p.lse_ref.
inline void compute_reference(Problem& p) {
  AttentionProblem problem;
  problem.q = p.checked_q_view();
  problem.qo_indptr = p.qo_indptr.view();
  if (p.c.kv == PrefillKV::kPaged) {
    problem.kv = p.cache.paged;
  } else {
    problem.kv = p.cache.ragged;
  }
  problem.params = p.params;
  ReferenceOptions options;
  options.accumulation = Accumulation::kF64;
  AttentionOutput out{p.o_ref.view(), p.lse_ref.view()};
  if (!p.c.use_softmax) out.lse.reset();
  reference_attention(problem, out, options);
}

// For soft-cap cases whose requests 0 and 1 each hold one query token and one key (bfloat16):
// q = -256 k and q = 256 k put their logit at -cap and +cap, the ends of the softmax's range
// (kernels/variant.cuh has_logits_bound); the reference is recomputed and the premise checked.
inline void put_logits_at_the_cap(Problem& p) {
  const Case& c = p.c;
  ASSERT_EQ(c.dtype, DType::kBF16);
  ASSERT_TRUE(c.q_lens.size() >= 2 && c.q_lens[0] == 1 && c.q_lens[1] == 1 && c.kv_lens[0] == 1 &&
              c.kv_lens[1] == 1);
  const TensorView k = p.cache.ragged.k;  // request r's one key is token r
  const int64_t group = c.num_qo_heads / c.num_kv_heads;
  for (int64_t request = 0; request < 2; ++request) {
    const float sign = request == 0 ? -256.0f : 256.0f;
    for (int64_t head = 0; head < c.num_qo_heads; ++head) {
      for (int64_t d = 0; d < c.head_dim_qk; ++d) {
        const uint16_t key = k.ptr<uint16_t>()[k.offset({request, head / group, d})];
        p.q.data<uint16_t>()[p.q_view.offset({request, head, d})] =
            float_to_bf16_bits(sign * bf16_bits_to_float(key));
      }
    }
  }
  compute_reference(p);
  // The premise: -cap and +cap (the tanh of q.k * scale / cap, q.k * scale ~ -+2900).
  for (int64_t head = 0; head < c.num_qo_heads; ++head) {
    EXPECT_NEAR(p.lse_ref.data<float>()[head], -c.soft_cap, 0.005f * c.soft_cap);
    EXPECT_NEAR(p.lse_ref.data<float>()[c.num_qo_heads + head], c.soft_cap, 0.005f * c.soft_cap);
  }
}

inline Problem make_problem(const Case& c) {
  Problem p;
  p.c = c;
  KVCacheSpec spec;
  spec.kv_lens = c.kv_lens;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim_qk = c.head_dim_qk;
  spec.head_dim_vo = c.head_dim_vo;
  spec.dtype = c.dtype;
  spec.page_size = c.page_size;
  spec.layout = c.layout;
  spec.strided = c.strided;
  spec.seed = c.seed;
  p.cache = testing::build_kv_cache(spec);
  p.qo_indptr = testing::indptr_tensor(c.q_lens);
  p.total_q = p.qo_indptr.data<int32_t>()[c.q_lens.size()];
  if (c.q_dim_pad < 0) {
    p.set_q(
        testing::random_tensor(c.dtype, {p.total_q, c.num_qo_heads, c.head_dim_qk}, c.seed + 10));
  } else {
    p.q = testing::random_tensor(
        c.dtype, {p.total_q + 1, c.num_qo_heads + 1, c.head_dim_qk + c.q_dim_pad}, c.seed + 10);
    p.q_view = testing::sub_view(p.q, {1, 1, 0}, {p.total_q, c.num_qo_heads, c.head_dim_qk});
  }

  p.params.mask = c.mask;
  p.params.window_left = c.window_left;
  p.params.logits_soft_cap = c.soft_cap;
  p.params.sm_scale = c.sm_scale;
  if (c.alibi) p.params.pos_encoding = PosEncoding::kAlibi;
  if (c.rope) p.params.pos_encoding = PosEncoding::kRopeLlama;
  p.params.rope_theta = c.rope_theta;
  p.params.rope_scale = c.rope_scale;
  if (c.rope_llama31) p.params.rope_llama31 = AttentionParams::Llama31Scaling{};
  p.params.alibi_slopes = c.alibi_slopes;
  p.params.relative_bias = c.relative_bias;
  p.params.relative_max_distance = c.relative_max_distance;
  p.params.use_softmax = c.use_softmax;
  p.params.sigmoid_bias = c.sigmoid_bias;
  if (c.mask == MaskMode::kCustom || c.mask_rule) {
    std::vector<int32_t> bytes_per_request;
    for (size_t i = 0; i < c.q_lens.size(); ++i) {
      bytes_per_request.push_back(
          static_cast<int32_t>((int64_t{c.q_lens[i]} * c.kv_lens[i] + 7) / 8));
    }
    p.mask_indptr = testing::indptr_tensor(bytes_per_request);
    const int64_t total = p.mask_indptr.data<int32_t>()[c.q_lens.size()];
    p.mask_bits = HostTensor(DType::kU8, {std::max<int64_t>(total, 1)});
    testing::Rng rng(c.seed + 20);
    for (int64_t i = 0; i < total; ++i) {
      p.mask_bits.data<uint8_t>()[i] = static_cast<uint8_t>(rng.uniform_int(0, 255));
    }
    if (c.mask_rule) {  // bit i * kv_len + j of each request: query i at kv_len - q_len + i
      for (size_t r = 0; r < c.q_lens.size(); ++r) {
        uint8_t* bits = p.mask_bits.data<uint8_t>() + p.mask_indptr.data<int32_t>()[r];
        for (int64_t i = 0; i < c.q_lens[r]; ++i) {
          for (int64_t j = 0; j < c.kv_lens[r]; ++j) {
            const int64_t bit = i * c.kv_lens[r] + j;
            const bool on = c.mask_rule(static_cast<int64_t>(r), c.kv_lens[r] - c.q_lens[r] + i, j);
            bits[bit / 8] = static_cast<uint8_t>((bits[bit / 8] & ~(1 << (bit % 8))) |
                                                 (on ? 1 << (bit % 8) : 0));
          }
        }
      }
      p.params.mask = MaskMode::kCustom;
    }
    p.params.custom_mask = p.mask_bits.view();
    p.params.mask_indptr = p.mask_indptr.view();
  }

  p.o_ref = HostTensor(DType::kF32, {p.total_q, c.num_qo_heads, c.head_dim_vo});
  p.lse_ref = HostTensor(DType::kF32, {p.total_q, c.num_qo_heads});
  compute_reference(p);
  return p;
}

inline PrefillBackend backend_of(const Case& c) {
  if (c.backend) return *c.backend;
  const char* name = std::getenv("FLARE_TEST_PREFILL_BACKEND");
  const std::string value = name != nullptr ? name : "auto";
  if (value == "fa2") return PrefillBackend::kFA2;
  if (value == "fa3") return PrefillBackend::kFA3;
  if (value != "auto") {
    ADD_FAILURE() << "FLARE_TEST_PREFILL_BACKEND must be auto, fa2 or fa3, got " << value;
  }
  return PrefillBackend::kAuto;
}

inline BatchPrefillConfig config_of(const Problem& p) {
  const Case& c = p.c;
  BatchPrefillConfig config;
  config.max_batch = static_cast<int>(c.q_lens.size());
  config.max_total_qo = static_cast<int>(std::max<int64_t>(p.total_q, 1));
  config.num_qo_heads = c.num_qo_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_dim_qk = c.head_dim_qk;
  config.head_dim_vo = c.head_dim_vo;
  config.kv = c.kv;
  config.page_size = c.page_size;
  config.layout = c.layout;
  config.dtype = c.dtype;
  config.params = p.params;
  config.params.custom_mask.reset();
  config.params.mask_indptr.reset();
  if (c.variant) {  // the variant replaces the built-in terms the reference applies
    config.variant = c.variant;
    config.params.mask = c.mask;
    config.params.logits_soft_cap = 0.0f;
    config.params.window_left = -1;
    config.params.pos_encoding = PosEncoding::kNone;
    config.params.alibi_slopes.reset();
    config.params.relative_bias.reset();
    config.params.use_softmax = true;
    config.params.sigmoid_bias = 0.0f;
  }
  config.query_tile = c.query_tile;
  config.backend = backend_of(c);
  config.fixed_split_size = c.fixed_split_size;
  config.disable_split_kv = c.disable_split_kv;
  config.num_sms_to_use = c.num_sms_to_use;
  config.rope_staging = c.rope_staging;
  return config;
}

// The device side of a problem: inputs uploaded, outputs poisoned.
struct DeviceProblem {
  // Device 0 current before the uploads below, whatever ran before in this process
  // (BatchPrefill restores its caller's context, which may be none).
  struct CurrentDevice {
    CurrentDevice() { cuda::set_device(0); }
  } current_device;
  DeviceCopy q, qo_indptr, pages, v_pages, page_indptr, page_indices, last_page_len, k_rows, v_rows,
      kv_indptr, mask_bits, o, lse;
  HostTensor o_host, lse_host;
  PagedKV paged;
  RaggedKV ragged;
  std::optional<TensorView> mask;

  explicit DeviceProblem(const Problem& p)
      : q(p.q),
        qo_indptr(p.qo_indptr),
        pages(p.cache.pages_storage),
        v_pages(p.cache.v_pages_storage),
        page_indptr(p.cache.page_indptr),
        page_indices(p.cache.page_indices),
        last_page_len(p.cache.last_page_len),
        k_rows(p.cache.k_ragged_storage),
        v_rows(p.cache.v_ragged_storage),
        kv_indptr(p.cache.ragged_indptr) {
    paged = p.cache.paged;
    paged.k = pages.view(p.cache.paged.k);
    paged.v = v_pages.view(p.cache.paged.v);
    paged.table.indptr = page_indptr.view(p.cache.paged.table.indptr);
    paged.table.indices = page_indices.view(p.cache.paged.table.indices);
    paged.table.last_block_len = last_page_len.view(p.cache.paged.table.last_block_len);
    ragged.k = k_rows.view(p.cache.ragged.k);
    ragged.v = v_rows.view(p.cache.ragged.v);
    ragged.indptr = kv_indptr.view(p.cache.ragged.indptr);
    if (p.c.mask == MaskMode::kCustom) {
      mask_bits = DeviceCopy(p.mask_bits);
      mask = mask_bits.view(p.mask_bits.view());
    }
    o_host = HostTensor(p.c.dtype, p.o_ref.shape());
    lse_host = HostTensor(DType::kF32, p.lse_ref.shape());
    o = DeviceCopy(o_host);
    lse = DeviceCopy(lse_host);
    poison();
  }
  void poison() { poison_outputs(o_host, lse_host, o, lse); }
  void run(BatchPrefill& prefill, const Problem& p, cuda::Stream stream,
           const RunOptions& options = {}) {
    const TensorView qv = q.view(p.checked_q_view());
    const TensorView ov = o.view(o_host.view());
    std::optional<TensorView> lv;
    if (p.c.use_softmax) lv = lse.view(lse_host.view());
    if (p.c.kv == PrefillKV::kPaged) {
      prefill.run(qv, PagedKVPages::of(paged), ov, lv, stream, mask, options);
    } else {
      prefill.run(qv, ragged.k, ragged.v, ov, lv, stream, mask, options);
    }
  }
  void download() { download_outputs(o_host, lse_host, o, lse); }
};

inline void plan(BatchPrefill& prefill, const Problem& p, cuda::Stream stream) {
  const std::vector<int32_t> qo = testing::int32_values(p.qo_indptr.view());
  const std::vector<int32_t> mask_indptr = p.c.mask == MaskMode::kCustom
                                               ? testing::int32_values(p.mask_indptr.view())
                                               : std::vector<int32_t>{};
  if (p.c.kv == PrefillKV::kPaged) {
    prefill.plan(qo, testing::int32_values(p.cache.page_indptr.view()),
                 testing::int32_values(p.cache.last_page_len.view()), stream, mask_indptr);
  } else {
    prefill.plan(qo, testing::int32_values(p.cache.ragged_indptr.view()), {}, stream, mask_indptr);
  }
}

inline void expect_matches(const Problem& p, const DeviceProblem& d) {
  const testing::ErrorStats o = testing::error_stats(d.o_host.view(), p.o_ref.view());
  // A weighted sum is not bounded by the values like a softmax average: relative to its size.
  const double scale = p.c.use_softmax ? 1.0 : std::max(1.0, testing::max_abs(p.o_ref.view()));
  EXPECT_LE(o.max_abs, tolerance_abs(p.c.dtype) * scale) << o;
  EXPECT_LE(o.relative_l2, tolerance_l2(p.c.dtype)) << o;
  if (!p.c.use_softmax) return;
  const testing::ErrorStats lse = testing::error_stats(d.lse_host.view(), p.lse_ref.view());
  EXPECT_LE(lse.max_abs, p.c.rope ? gpu_testing::kLseToleranceRotary : kLseTolerance) << lse;
}

inline bool skip_without_gpu() { return !cuda::available(); }

// An sm_90 device 0: where the Hopper family (PrefillBackend::kFA3) runs.
inline bool hopper() {
  if (!cuda::available()) return false;
  const cuda::DeviceProperties props = cuda::device_properties(0);
  return props.cc_major == 9 && props.cc_minor == 0;
}

#define SKIP_WITHOUT_HOPPER() \
  if (!::flare::prefill_testing::hopper()) GTEST_SKIP() << "needs an sm_90 GPU"

// Plans, runs once on the default stream, compares; returns the prefill for further checks.
inline void check(const Case& c, const std::function<void(const BatchPrefill&)>& inspect = {}) {
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  RunOptions options;
  options.variant_scalars = c.variant_scalars;
  options.variant_tensors = c.variant_tensors;
  d.run(prefill, p, nullptr, options);
  d.download();
  expect_matches(p, d);
  if (inspect) inspect(prefill);
}

#define SKIP_WITHOUT_GPU()                          \
  if (::flare::prefill_testing::skip_without_gpu()) \
  GTEST_SKIP() << "no CUDA device: " << ::flare::cuda::unavailable_reason()

}  // namespace flare::prefill_testing
