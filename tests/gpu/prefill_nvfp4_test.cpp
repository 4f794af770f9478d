// BatchPrefill over NVFP4 KV (kv_dtype uint8: E2M1 codes with e4m3 block scales; converted in
// shared memory by the FA2 family's NVFP4 kernels, staged to 16 bits by run() for the Hopper
// family and head dim 512: src/api/prefill_nvfp4.h) against the CPU float64 reference on the
// dequantized values, under backends auto and fa2: paged NHD / HND and ragged, pages of 1, 3 and
// 16, head dims 64-512 (512: two passes), GQA 1-8, causal / custom mask / soft cap / RoPE, global
// scales as run()'s k_scale / v_scale; outputs NaN-poisoned, reruns bitwise; a captured run
// replayed after a plan with more pages; code rows only 8-byte aligned; an out-of-range page id
// recorded and read as zeros; the scales refused by name. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "gpu/nvfp4_test_support.h"
#include "gpu/prefill_test_support.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using prefill_testing::Case;
using prefill_testing::DeviceCopy;

struct Nvfp4PrefillCase {
  std::string name;
  Case c;
  float k_global = 1.0f;
  float v_global = 1.0f;
};
std::ostream& operator<<(std::ostream& os, const Nvfp4PrefillCase& c) { return os << c.name; }

std::vector<Nvfp4PrefillCase> cases() {
  std::vector<Nvfp4PrefillCase> all;
  {
    Nvfp4PrefillCase n{"paged_nhd_f16_gqa4_page16_causal_scaled"};
    n.c.q_lens = {1, 17, 64, 0};
    n.c.kv_lens = {33, 100, 64, 5};
    n.c.dtype = DType::kF16;
    n.k_global = 0.5f, n.v_global = 2.0f;
    all.push_back(n);
  }
  {
    Nvfp4PrefillCase n{"paged_hnd_bf16_gqa1_page3_custom_mask_soft_cap"};
    n.c.q_lens = {5, 31};
    n.c.kv_lens = {40, 31};
    n.c.num_qo_heads = n.c.num_kv_heads = 4;
    n.c.head_dim_qk = n.c.head_dim_vo = 64;
    n.c.page_size = 3, n.c.layout = KVLayout::kHND;
    n.c.mask = MaskMode::kCustom, n.c.soft_cap = 30.0f;
    all.push_back(n);
  }
  {
    Nvfp4PrefillCase n{"ragged_bf16_d256_gqa8_causal_rope"};
    n.c.q_lens = {7, 128};
    n.c.kv_lens = {70, 300};
    n.c.num_qo_heads = 8, n.c.num_kv_heads = 1;
    n.c.head_dim_qk = n.c.head_dim_vo = 256;
    n.c.kv = PrefillKV::kRagged, n.c.rope = true;
    n.k_global = 0.25f;
    all.push_back(n);
  }
  {
    // Scale rows of 12 bytes (head dim 192: 4-byte copies), pages of 5, a window.
    Nvfp4PrefillCase n{"paged_nhd_bf16_d192_128_gqa4_page5_causal_window"};
    n.c.q_lens = {3, 70, 16};
    n.c.kv_lens = {90, 200, 16};
    n.c.head_dim_qk = 192, n.c.head_dim_vo = 128;
    n.c.page_size = 5, n.c.window_left = 50;
    n.v_global = 0.75f;
    all.push_back(n);
  }
  {
    // Long KV under short queries (the memory-bound shapes): items of many tiles, so the raw
    // stage ring and the page-id slots wrap many times, and one item of a single tile.
    Nvfp4PrefillCase n{"paged_nhd_bf16_gqa4_page7_long_kv"};
    n.c.q_lens = {16, 1, 9, 4};
    n.c.kv_lens = {1500, 777, 2049, 40};
    n.c.page_size = 7, n.c.mask = MaskMode::kNone;
    n.k_global = 0.5f;
    all.push_back(n);
  }
  {
    Nvfp4PrefillCase n{"paged_f16_d512_gqa2_page1_noncausal"};
    n.c.q_lens = {64, 3};
    n.c.kv_lens = {128, 77};
    n.c.num_qo_heads = 4, n.c.num_kv_heads = 2;
    n.c.head_dim_qk = n.c.head_dim_vo = 512;
    n.c.page_size = 1, n.c.mask = MaskMode::kNone, n.c.dtype = DType::kF16;
    all.push_back(n);
  }
  return all;
}

// The case's problem with its cache quantized (K and V each with its global scale; the float32
// cache then holds the dequantized values, which the reference reads).
struct Nvfp4Problem {
  prefill_testing::Problem p;
  gpu_testing::Nvfp4Tensors k, v;
};

Nvfp4Problem make_nvfp4_problem(const Nvfp4PrefillCase& n) {
  Case c = n.c;
  const DType dtype = c.dtype;
  c.dtype = DType::kF32;  // the cache in float32, quantized below; q in dtype
  prefill_testing::Problem p = prefill_testing::make_problem(c);
  const bool paged = c.kv == PrefillKV::kPaged;
  Nvfp4Problem out{std::move(p), {}, {}};
  prefill_testing::Problem& q = out.p;
  out.k = gpu_testing::quantize_rows(paged ? q.cache.paged.k : q.cache.ragged.k, n.k_global);
  out.v = gpu_testing::quantize_rows(paged ? q.cache.paged.v : q.cache.ragged.v, n.v_global);
  // q in the kernel's dtype, and the reference again on the dequantized cache.
  q.c.dtype = dtype;
  q.set_q(testing::random_tensor(dtype, {q.total_q, c.num_qo_heads, c.head_dim_qk}, c.seed + 10));
  prefill_testing::compute_reference(q);
  return out;
}

BatchPrefillConfig nvfp4_config(const prefill_testing::Problem& p, int64_t max_total_kv) {
  BatchPrefillConfig config = prefill_testing::config_of(p);
  config.kv_dtype = DType::kU8;
  config.max_total_kv = max_total_kv;
  return config;
}

// The NVFP4 tensors on the device and the run() they feed.
struct DeviceNvfp4 {
  DeviceCopy k_codes, v_codes, k_scales, v_scales;
  explicit DeviceNvfp4(const Nvfp4Problem& n)
      : k_codes(n.k.codes), v_codes(n.v.codes), k_scales(n.k.scales), v_scales(n.v.scales) {}
  TensorView view(const DeviceCopy& d, const HostTensor& h) const { return d.view(h.view()); }

  void run(BatchPrefill& prefill, const Nvfp4Problem& n, prefill_testing::DeviceProblem& d,
           const TensorView& indices, const RunOptions& options, cuda::Stream stream) const {
    const prefill_testing::Problem& p = n.p;
    const TensorView qv = d.q.view(p.q.view());
    const TensorView ov = d.o.view(d.o_host.view());
    const TensorView lv = d.lse.view(d.lse_host.view());
    if (p.c.kv == PrefillKV::kPaged) {
      PagedKVPages pages{view(k_codes, n.k.codes), view(v_codes, n.v.codes), p.c.layout, indices};
      pages.k_scales = view(k_scales, n.k.scales);
      pages.v_scales = view(v_scales, n.v.scales);
      prefill.run(qv, pages, ov, lv, stream, d.mask, options);
    } else {
      const Nvfp4Rows rows{view(k_codes, n.k.codes), view(v_codes, n.v.codes),
                           view(k_scales, n.k.scales), view(v_scales, n.v.scales)};
      prefill.run(qv, rows, ov, lv, stream, d.mask, options);
    }
  }
};

// The backends every NVFP4 case runs under: auto, fa2, and on sm_90 fa3 (the Hopper family's
// producer converts at 64-row tiles; the staged copy at 128 and with RoPE). Head dim 512 runs
// the FA2 family only.
std::vector<PrefillBackend> nvfp4_backends(const prefill_testing::Problem& p) {
  std::vector<PrefillBackend> backends = {PrefillBackend::kAuto, PrefillBackend::kFA2};
  const cuda::DeviceProperties props = cuda::device_properties(0);
  if (props.cc_major == 9 && props.cc_minor == 0 && p.c.head_dim_qk != 512) {
    backends.push_back(PrefillBackend::kFA3);
  }
  return backends;
}
const char* backend_name(PrefillBackend backend) {
  return backend == PrefillBackend::kFA2   ? "backend fa2"
         : backend == PrefillBackend::kFA3 ? "backend fa3"
                                           : "backend auto";
}

int64_t planned_units(const prefill_testing::Problem& p) {
  const HostTensor& indptr =
      p.c.kv == PrefillKV::kPaged ? p.cache.page_indptr : p.cache.ragged_indptr;
  return indptr.data<int32_t>()[p.c.q_lens.size()];
}

void run_and_check(const Nvfp4PrefillCase& n, const Nvfp4Problem& problem,
                   const BatchPrefillConfig& config);

class BatchPrefillNvfp4 : public ::testing::TestWithParam<Nvfp4PrefillCase> {};

// Under kAuto (on sm_90 the Hopper family, reading the staged copy, takes query tiles of 64 rows
// and more) and kFA2 (the FA2 family's NVFP4 kernels read codes and scales, but at head dim
// 512, whose two passes read the staged copy).
TEST_P(BatchPrefillNvfp4, MatchesTheReferenceOnDequantizedValues) {
  SKIP_WITHOUT_GPU();
  const Nvfp4PrefillCase& n = GetParam();
  const Nvfp4Problem problem = make_nvfp4_problem(n);
  const prefill_testing::Problem& p = problem.p;
  for (const PrefillBackend backend : nvfp4_backends(p)) {
    SCOPED_TRACE(backend_name(backend));
    BatchPrefillConfig config = nvfp4_config(p, planned_units(p) + 3);
    config.backend = backend;
    run_and_check(n, problem, config);
  }
}

void run_and_check(const Nvfp4PrefillCase& n, const Nvfp4Problem& problem,
                   const BatchPrefillConfig& config) {
  const prefill_testing::Problem& p = problem.p;
  BatchPrefill prefill(config);
  prefill_testing::DeviceProblem d(p);
  const DeviceNvfp4 nv(problem);
  RunOptions options;
  options.k_scale = n.k_global;
  options.v_scale = n.v_global;
  prefill_testing::plan(prefill, p, nullptr);
  std::optional<HostTensor> first_o;
  for (int attempt = 0; attempt < 2; ++attempt) {
    d.poison();
    nv.run(prefill, problem, d, d.paged.table.indices, options, nullptr);
    d.download();
    if (attempt == 0) {
      prefill_testing::expect_matches(p, d);
      first_o.emplace(HostTensor(d.o_host.dtype(), d.o_host.shape()));
      std::memcpy(first_o->data<std::byte>(), d.o_host.data<std::byte>(),
                  static_cast<size_t>(d.o_host.numel()) * dtype_bytes(d.o_host.dtype()));
    } else {
      EXPECT_TRUE(gpu_testing::bytes_equal(d.o_host, *first_o)) << n.name << ": o differs";
    }
  }
  prefill.check();
}

INSTANTIATE_TEST_SUITE_P(Cases, BatchPrefillNvfp4, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Nvfp4PrefillCase>& info) {
                           return info.param.name;
                         });

// The staged copy's count is read on the device: a run captured after a small plan, replayed
// after a plan of more pages (within max_total_kv), computes the larger batch.
TEST(BatchPrefillNvfp4Graph, ReplayAfterALargerPlan) {
  SKIP_WITHOUT_GPU();
  Nvfp4PrefillCase big{"graph"};
  big.c.q_lens = {9, 40};
  big.c.kv_lens = {200, 90};
  big.c.dtype = DType::kBF16;
  big.v_global = 1.5f;
  const Nvfp4Problem problem = make_nvfp4_problem(big);
  const prefill_testing::Problem& p = problem.p;
  BatchPrefillConfig config = nvfp4_config(p, planned_units(p));
  config.use_cuda_graph = true;
  BatchPrefill prefill(config);
  prefill_testing::DeviceProblem d(p);
  const DeviceNvfp4 nv(problem);
  RunOptions options;
  options.v_scale = big.v_global;
  const cuda::OwnedStream stream;
  // First plan: the same requests cut to 1 page each (fewer pages, fewer query tokens).
  const std::vector<int32_t> small_qo = {0, 1, 2};
  const std::vector<int32_t> small_kv = {0, 1, 2};
  const std::vector<int32_t> small_last = {16, 16};
  prefill.plan(small_qo, small_kv, small_last, stream.get());
  std::optional<cuda::Graph> graph;
  graph.emplace(stream.get(),
                [&] { nv.run(prefill, problem, d, d.paged.table.indices, options, stream.get()); });
  prefill_testing::plan(prefill, p, stream.get());
  d.poison();
  graph->launch(stream.get());
  d.download();
  prefill_testing::expect_matches(p, d);
  prefill.check();
}

TEST(BatchPrefillNvfp4Errors, BadPageIdRecordedAndScalesRefusedByName) {
  SKIP_WITHOUT_GPU();
  Nvfp4PrefillCase n{"errors"};
  n.c.q_lens = {4, 4};
  n.c.kv_lens = {40, 20};
  const Nvfp4Problem problem = make_nvfp4_problem(n);
  const prefill_testing::Problem& p = problem.p;
  prefill_testing::DeviceProblem d(p);
  const DeviceNvfp4 nv(problem);
  // Entry 1 (request 0) points far outside the cache: recorded, its page read as zeros, by each
  // family's copies (fa3: the Hopper producer's, which converts at 64-row tiles).
  HostTensor bad = HostTensor(DType::kI32, p.cache.page_indices.shape());
  std::memcpy(bad.data<std::byte>(), p.cache.page_indices.data<std::byte>(),
              static_cast<size_t>(bad.numel()) * sizeof(int32_t));
  bad.data<int32_t>()[1] = 1 << 30;
  const DeviceCopy bad_device(bad);
  for (const PrefillBackend backend : nvfp4_backends(p)) {
    SCOPED_TRACE(backend_name(backend));
    BatchPrefillConfig config = nvfp4_config(p, planned_units(p));
    config.backend = backend;
    BatchPrefill with_backend(config);
    prefill_testing::plan(with_backend, p, nullptr);
    d.poison();
    nv.run(with_backend, problem, d, bad_device.view(bad.view()), {}, nullptr);
    d.download();
    EXPECT_EQ(testing::count_nan(d.o_host.view()), 0);
    EXPECT_FLARE_ERROR(with_backend.check(), ErrorCode::kIndexOutOfRange, "1073741824");
  }
  BatchPrefill prefill(nvfp4_config(p, planned_units(p)));
  prefill_testing::plan(prefill, p, nullptr);

  // Missing scales, and 16-bit ragged run() on an NVFP4 prefill: refused by name.
  PagedKVPages without{nv.view(nv.k_codes, problem.k.codes), nv.view(nv.v_codes, problem.v.codes),
                       p.c.layout, d.paged.table.indices};
  EXPECT_FLARE_ERROR(
      prefill.run(d.q.view(p.q.view()), without, d.o.view(d.o_host.view()), std::nullopt, nullptr),
      ErrorCode::kInvalidArgument, "block scales (kv_cache_sf)");
  PagedKVPages strided = without;
  strided.k_scales = nv.view(nv.k_scales, problem.k.scales);
  strided.v_scales = strided.k_scales;
  strided.v_scales.strides[3] = 2;
  EXPECT_FLARE_ERROR(
      prefill.run(d.q.view(p.q.view()), strided, d.o.view(d.o_host.view()), std::nullopt, nullptr),
      ErrorCode::kInvalidArgument, "innermost stride must be 1");
  // Code rows are copied in 8- or 16-byte pieces: a view 4 bytes in is refused before any launch.
  PagedKVPages misaligned = without;
  misaligned.k_scales = nv.view(nv.k_scales, problem.k.scales);
  misaligned.v_scales = nv.view(nv.v_scales, problem.v.scales);
  misaligned.k.data = static_cast<unsigned char*>(misaligned.k.data) + 4;
  EXPECT_FLARE_ERROR(prefill.run(d.q.view(p.q.view()), misaligned, d.o.view(d.o_host.view()),
                                 std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "8-byte aligned");
}

// `codes` with each row followed by 8 spare bytes (rows of D / 2 + 8 bytes: only 8-byte aligned,
// as code rows packed with their scales are in FlashInfer's strided views).
HostTensor with_padded_rows(const HostTensor& codes) {
  std::vector<int64_t> shape = codes.shape();
  const int64_t width = shape.back();
  shape.back() = width + 8;
  HostTensor padded(DType::kU8, shape);
  std::memset(padded.data<std::byte>(), 0xEE, static_cast<size_t>(padded.numel()));
  for (int64_t row = 0; row < codes.numel() / width; ++row) {
    std::memcpy(padded.data<unsigned char>() + row * (width + 8),
                codes.data<unsigned char>() + row * width, static_cast<size_t>(width));
  }
  return padded;
}

// Code rows only 8-byte aligned: the FA2 family's NVFP4 kernels copy them in 8-byte pieces (and
// the bytes between rows are never read as codes).
TEST(BatchPrefillNvfp4Layouts, CodeRowsAlignedTo8Bytes) {
  SKIP_WITHOUT_GPU();
  Nvfp4PrefillCase n{"narrow"};
  n.c.q_lens = {3, 33};
  n.c.kv_lens = {100, 41};
  n.c.dtype = DType::kF16;
  const Nvfp4Problem problem = make_nvfp4_problem(n);
  const prefill_testing::Problem& p = problem.p;
  for (const PrefillBackend backend : nvfp4_backends(p)) {
    SCOPED_TRACE(backend_name(backend));
    BatchPrefillConfig config = nvfp4_config(p, planned_units(p));
    config.backend = backend;
    BatchPrefill prefill(config);
    prefill_testing::DeviceProblem d(p);
    const DeviceNvfp4 nv(problem);
    const HostTensor k_padded = with_padded_rows(problem.k.codes);
    const HostTensor v_padded = with_padded_rows(problem.v.codes);
    const DeviceCopy k_device(k_padded), v_device(v_padded);
    TensorView k = k_device.view(k_padded.view());
    TensorView v = v_device.view(v_padded.view());
    k.shape[k.ndim - 1] = p.c.head_dim_qk / 2;
    v.shape[v.ndim - 1] = p.c.head_dim_vo / 2;
    PagedKVPages pages{k, v, p.c.layout, d.paged.table.indices};
    pages.k_scales = nv.view(nv.k_scales, problem.k.scales);
    pages.v_scales = nv.view(nv.v_scales, problem.v.scales);
    prefill_testing::plan(prefill, p, nullptr);
    d.poison();
    prefill.run(d.q.view(p.q.view()), pages, d.o.view(d.o_host.view()),
                d.lse.view(d.lse_host.view()), nullptr, d.mask, {});
    d.download();
    prefill_testing::expect_matches(p, d);
    prefill.check();
  }
}

}  // namespace
}  // namespace flare
