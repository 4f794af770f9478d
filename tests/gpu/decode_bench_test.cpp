// The decode benchmark of issue 4 (skipped unless FLARE_DECODE_BENCH names an output file):
// bf16, 32 query / 8 KV heads, D = 128, pages in a randomly permuted pool that is filled with
// random values on the device (one case keeps the pages in pool order, to measure what the
// shuffle costs); KV bytes read per second from CUDA events around each run()
// (median of 30), rotating among page tables over >= 1 GiB of distinct pages so no run is
// served from L2. Writes one JSON object per case; asserts every output was written.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "decode_test_support.h"
#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_sync.h"
#include "flare/jit/module.h"

namespace flare {
namespace {

constexpr int kQoHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int kWarmup = 5, kTimed = 30;
constexpr size_t kPoolBytes = size_t{3} << 30;      // per K and V
constexpr size_t kRotationBytes = size_t{1} << 30;  // distinct KV bytes cycled through

// Fills n elements with hash-derived values: 16-bit as bf16/f16 in (-2, 2), 8-bit as e4m3
// with |x| < 2 (bit 6 clear: never NaN) or e5m2 likewise.
jit::KernelSpec fill_spec() {
  jit::KernelSpec spec;
  spec.family_header = "plan_types.cuh";
  spec.entry = "flare_bench_fill";
  spec.label = "bench fill";
  spec.variant_source = R"(
extern "C" __global__ void flare_bench_fill(unsigned char* out, long long n, int bytes,
                                            unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 0x9E3779B1u ^ seed;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    if (bytes == 2) {
      const float x = (h >> 8) * (4.0f / 16777216.0f) - 2.0f;
      ((unsigned short*)out)[i] = (unsigned short)(__float_as_uint(x) >> 16);
    } else {
      out[i] = (unsigned char)(h & 0xbf);
    }
  }
}
)";
  return spec;
}

void fill(void* data, int64_t elements, int bytes, unsigned seed) {
  static const cuda::Function function = jit::get_kernel(fill_spec(), "flare_bench_fill", 0);
  unsigned char* out = static_cast<unsigned char*>(data);
  long long n = elements;
  void* args[] = {&out, &n, &bytes, &seed};
  cuda::launch(function, 1024, 1, 1, 256, 1, 1, 0, nullptr, args);
}

struct BenchCase {
  std::string name;
  std::vector<int32_t> kv_lens;
  int page_size = 16;
  DType kv_dtype = DType::kBF16;
  KVLayout layout = KVLayout::kNHD;
  // Pages of each rotation in pool order instead of shuffled: what random page placement costs
  // against KV laid out contiguously (the SDPA anchors' layout).
  bool pages_in_order = false;
  bool tensor_cores = false;  // BatchDecodeConfig::use_tensor_cores
  int kv_heads_per_item = 1;  // BatchDecodeConfig::kv_heads_per_item (whole-page items)
  int num_qo_heads = kQoHeads;
  int num_kv_heads = kKvHeads;
  int head_dim = kHeadDim;
  DType q_dtype = DType::kBF16;  // and the output's
  bool rope = false;             // PosEncoding::kRopeLlama (fused RoPE)
};

std::vector<int32_t> constant(int batch, int len) { return std::vector<int32_t>(batch, len); }

// Zipf lengths with mean ~= `mean`: the largest length is searched for.
std::vector<int32_t> zipf_lengths(int batch, int mean) {
  int lo = mean, hi = mean * 64;
  std::vector<int32_t> best;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    best = testing::random_lengths(batch, testing::LengthDistribution::kZipf, 1, mid, 2024);
    const double got = std::accumulate(best.begin(), best.end(), 0.0) / batch;
    if (got < mean)
      lo = mid + 1;
    else
      hi = mid;
  }
  return testing::random_lengths(batch, testing::LengthDistribution::kZipf, 1, lo, 2024);
}

std::vector<BenchCase> bench_cases() {
  std::vector<BenchCase> cases = {
      {"b64_kv8192", constant(64, 8192)},
      {"b16_kv32768", constant(16, 32768)},
      {"b1_kv32768", constant(1, 32768)},
      {"b16_kv4096", constant(16, 4096)},
      {"b1_kv4096", constant(1, 4096)},
      // The b64 kv8192 bytes in more, shorter requests (the grid-waves plans, decode v14).
      {"b128_kv4096", constant(128, 4096)},
      {"b256_kv2048", constant(256, 2048)},
  };
  const std::vector<int32_t> zipf = zipf_lengths(64, 2048);
  const int64_t total = std::accumulate(zipf.begin(), zipf.end(), int64_t{0});
  std::vector<int32_t> uniform(64, static_cast<int32_t>(total / 64));
  for (int64_t i = 0; i < total % 64; ++i) ++uniform[static_cast<size_t>(i)];
  cases.push_back({"b64_zipf_mean2048", zipf});
  cases.push_back({"b64_uniform_same_total", uniform});
  cases.push_back({"b64_kv8192_page1", constant(64, 8192), 1});
  cases.push_back({"b64_kv8192_e4m3", constant(64, 8192), 16, DType::kE4M3});
  // fp8 where few requests must fill the GPU (the two loops, decode v15).
  cases.push_back({"b1_kv32768_e4m3", constant(1, 32768), 16, DType::kE4M3});
  cases.push_back({"b16_kv4096_e4m3", constant(16, 4096), 16, DType::kE4M3});
  cases.push_back({"b64_kv8192_hnd", constant(64, 8192), 16, DType::kBF16, KVLayout::kHND});
  cases.push_back({"b16_kv4096_page1", constant(16, 4096), 1});
  cases.push_back(
      {"b64_kv8192_pages_in_order", constant(64, 8192), 16, DType::kBF16, KVLayout::kNHD, true});
  // Issue 17's eager shape as bench_python.py lays it out (pages in allocation order).
  cases.push_back(
      {"b16_kv4096_pages_in_order", constant(16, 4096), 16, DType::kBF16, KVLayout::kNHD, true});
  // Other shapes of b64 kv8192's bytes (head group 1 and 8, head dims 64 and 256, f16): which
  // loop is faster beyond the issue's shape.
  const auto shape = [](const char* name, int batch, int len, int qo_heads, int kv_heads,
                        int head_dim, DType dtype) {
    BenchCase c{name, constant(batch, len), 16, dtype};
    c.num_qo_heads = qo_heads, c.num_kv_heads = kv_heads, c.head_dim = head_dim;
    c.q_dtype = dtype;
    return c;
  };
  cases.push_back(shape("b64_kv2048_gqa1", 64, 2048, 32, 32, 128, DType::kBF16));
  cases.push_back(shape("b64_kv8192_gqa8", 64, 8192, 64, 8, 128, DType::kBF16));
  cases.push_back(shape("b64_kv16384_d64", 64, 16384, 32, 8, 64, DType::kBF16));
  cases.push_back(shape("b64_kv4096_d256", 64, 4096, 32, 8, 256, DType::kBF16));
  cases.push_back(shape("b64_kv8192_f16", 64, 8192, 32, 8, 128, DType::kF16));
  cases.push_back(shape("b1_kv32768_d256", 1, 32768, 32, 8, 256, DType::kBF16));
  // The tensor-core loop on the issue's shapes, the skewed batch and the shapes above.
  for (const char* name :
       {"b64_kv8192", "b16_kv32768", "b1_kv32768", "b16_kv4096", "b1_kv4096", "b128_kv4096",
        "b256_kv2048", "b64_zipf_mean2048", "b64_uniform_same_total", "b64_kv8192_pages_in_order",
        "b16_kv4096_pages_in_order", "b64_kv2048_gqa1", "b64_kv8192_gqa8", "b64_kv16384_d64", "b64_kv4096_d256",
        "b64_kv8192_f16", "b1_kv32768_d256", "b64_kv8192_e4m3", "b1_kv32768_e4m3",
        "b16_kv4096_e4m3"}) {
    BenchCase c = *std::find_if(cases.begin(), cases.end(),
                                [name](const BenchCase& b) { return b.name == name; });
    c.name += "_tc";
    c.tensor_cores = true;
    cases.push_back(c);
  }
  // Fused RoPE on the tensor-core loop (issue 18: within 5% of the same case without it), the
  // shapes of scripts/bench_rope_decode.py.
  for (const char* name :
       {"b1_kv32768_tc", "b16_kv4096_tc", "b64_kv8192_tc", "b16_kv32768_tc", "b1_kv4096_tc"}) {
    BenchCase c = *std::find_if(cases.begin(), cases.end(),
                                [name](const BenchCase& b) { return b.name == name; });
    c.rope = true;
    c.name += "_rope";
    cases.push_back(c);
  }
  // Whole-page items (decode v16): every KV head of a token in one work item ("_wp": the 8
  // heads, whole NHD pages; "_wp4": half of them).
  for (const char* name :
       {"b64_kv8192", "b16_kv32768", "b1_kv32768", "b16_kv4096", "b128_kv4096", "b64_zipf_mean2048",
        "b64_uniform_same_total", "b64_kv8192_pages_in_order", "b64_kv8192_page1", "b64_kv8192_hnd",
        "b64_kv8192_gqa8", "b64_kv16384_d64", "b64_kv8192_e4m3", "b1_kv32768_e4m3",
        "b16_kv4096_e4m3"}) {
    BenchCase c = *std::find_if(cases.begin(), cases.end(),
                                [name](const BenchCase& b) { return b.name == name; });
    c.tensor_cores = true;
    c.kv_heads_per_item = c.num_kv_heads;
    c.name += "_wp";
    cases.push_back(c);
    if (c.name == "b64_kv8192_wp") {
      c.kv_heads_per_item = 4;
      c.name += "4";
      cases.push_back(c);
    }
  }
  return cases;
}

// Random page placement. Locality experiments (what the shuffle costs, and at which scale):
// FLARE_DECODE_BENCH_SHUFFLE_BLOCK=N keeps runs of N consecutive pool pages together and
// shuffles the runs; FLARE_DECODE_BENCH_SHUFFLE_WITHIN=N shuffles only inside aligned runs of N
// pages, which stay in pool order. Neither set: every page shuffled.
void shuffle_pool(std::vector<int32_t>& pool_ids, testing::Rng& rng) {
  const auto knob = [](const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr ? size_t{1} : static_cast<size_t>(std::max(1, std::atoi(v)));
  };
  const size_t block = knob("FLARE_DECODE_BENCH_SHUFFLE_BLOCK");
  const size_t within = knob("FLARE_DECODE_BENCH_SHUFFLE_WITHIN");
  const size_t n = pool_ids.size();
  if (within > 1) {
    for (size_t lo = 0; lo + within <= n; lo += within) {
      std::vector<int32_t> run(pool_ids.begin() + lo, pool_ids.begin() + lo + within);
      rng.shuffle(run);
      std::copy(run.begin(), run.end(), pool_ids.begin() + lo);
    }
    return;
  }
  std::vector<int32_t> runs(n / block);
  std::iota(runs.begin(), runs.end(), 0);
  rng.shuffle(runs);
  std::vector<int32_t> shuffled;
  shuffled.reserve(n);
  for (int32_t r : runs) {
    for (size_t i = 0; i < block; ++i) shuffled.push_back(static_cast<int32_t>(r * block + i));
  }
  pool_ids = shuffled;  // a remainder of fewer than `block` pages is left out
}

TEST(DecodeBenchmark, Issue4Table) {
  FLARE_REQUIRE_GPU();
  const char* out_path = std::getenv("FLARE_DECODE_BENCH");
  if (out_path == nullptr) GTEST_SKIP() << "set FLARE_DECODE_BENCH=<file> to run";
  cuda::set_device(0);
  std::ofstream out(out_path);
  ASSERT_TRUE(out) << out_path;

  cuda::DeviceBuffer k_pool(kPoolBytes), v_pool(kPoolBytes);
  int64_t pool_element_bytes = 0;  // what the pools hold now
  const cuda::OwnedStream stream;
  testing::Rng rng(5);

  // FLARE_DECODE_BENCH_CASES=a,b limits the run to those cases (profiling one case).
  const char* only = std::getenv("FLARE_DECODE_BENCH_CASES");
  for (const BenchCase& bc : bench_cases()) {
    if (only != nullptr &&
        ("," + std::string(only) + ",").find("," + bc.name + ",") == std::string::npos) {
      continue;
    }
    const int batch = static_cast<int>(bc.kv_lens.size());
    const int64_t elem = static_cast<int64_t>(dtype_bytes(bc.kv_dtype));
    const int64_t page_bytes = int64_t{bc.page_size} * bc.num_kv_heads * bc.head_dim * elem;
    const int64_t pool_pages = static_cast<int64_t>(kPoolBytes) / page_bytes;
    if (elem != pool_element_bytes) {  // 16-bit or fp8 random patterns over the whole pools
      const int64_t elements = static_cast<int64_t>(kPoolBytes) / elem;
      fill(k_pool.data(), elements, static_cast<int>(elem), 1);
      fill(v_pool.data(), elements, static_cast<int>(elem), 2);
      pool_element_bytes = elem;
    }

    std::vector<int32_t> indptr(1, 0), last;
    int64_t kv_tokens = 0;
    for (int32_t len : bc.kv_lens) {
      indptr.push_back(indptr.back() + (len + bc.page_size - 1) / bc.page_size);
      last.push_back((len - 1) % bc.page_size + 1);
      kv_tokens += len;
    }
    const int64_t pages = indptr.back();
    const int64_t kv_bytes = kv_tokens * bc.num_kv_heads * bc.head_dim * elem * 2;
    const int rotations = static_cast<int>(std::clamp<int64_t>(
        (static_cast<int64_t>(kRotationBytes) + kv_bytes - 1) / kv_bytes, 1, pool_pages / pages));
    // Each rotation: its own pages of the pool, in random order.
    std::vector<int32_t> pool_ids(static_cast<size_t>(pool_pages));
    std::iota(pool_ids.begin(), pool_ids.end(), 0);
    if (!bc.pages_in_order) shuffle_pool(pool_ids, rng);
    ASSERT_GE(static_cast<int64_t>(pool_ids.size()), rotations * pages);
    std::vector<int32_t> all_indices(pool_ids.begin(), pool_ids.begin() + rotations * pages);
    // FLARE_DECODE_BENCH_SORT_WINDOW=N: each request's page list sorted by pool position inside
    // consecutive windows of N pages (does a kernel that reads a window's pages in address order
    // get back what the shuffle costs?).
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_SORT_WINDOW"); v && std::atoi(v) > 1) {
      const int64_t window = std::atoi(v);
      for (int64_t r = 0; r < rotations; ++r) {
        for (int i = 0; i < batch; ++i) {
          for (int64_t lo = indptr[i]; lo < indptr[i + 1]; lo += window) {
            const auto first = all_indices.begin() + r * pages + lo;
            std::sort(first, first + std::min<int64_t>(window, indptr[i + 1] - lo));
          }
        }
      }
    }
    cuda::DeviceBuffer indices(all_indices.size() * 4), indptr_d(indptr.size() * 4),
        last_d(last.size() * 4);
    cuda::memcpy_htod(indices.data(), all_indices.data(), all_indices.size() * 4);
    cuda::memcpy_htod(indptr_d.data(), indptr.data(), indptr.size() * 4);
    cuda::memcpy_htod(last_d.data(), last.data(), last.size() * 4);

    BatchDecodeConfig config;
    config.max_batch = batch;
    config.num_qo_heads = bc.num_qo_heads;
    config.num_kv_heads = bc.num_kv_heads;
    config.head_dim = bc.head_dim;
    config.page_size = bc.page_size;
    config.q_dtype = bc.q_dtype;
    config.kv_dtype = bc.kv_dtype;
    config.layout = bc.layout;
    // Scheduler experiments: FLARE_DECODE_BENCH_CTAS_PER_SM / _SPLIT / _WAVES override
    // ctas_per_sm / fixed_split_size / waves (0 = the defaults).
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_CTAS_PER_SM")) {
      config.ctas_per_sm = std::atoi(v);
    }
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_SPLIT")) {
      config.fixed_split_size = std::atoi(v);
    }
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_WAVES")) config.waves = std::atoi(v);
    config.use_tensor_cores = bc.tensor_cores;
    // FLARE_DECODE_BENCH_TENSOR_CORES=1: the tensor-core loop for every case (all of them have
    // a q and KV pair it takes).
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_TENSOR_CORES")) {
      config.use_tensor_cores = v[0] == '1' || bc.tensor_cores;
    }
    config.kv_heads_per_item = bc.kv_heads_per_item;
    if (bc.rope) config.params.pos_encoding = PosEncoding::kRopeLlama;
    // FLARE_DECODE_BENCH_KV_HEADS_PER_ITEM=N: whole-page items of N heads for every
    // tensor-core case whose KV heads N divides.
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_KV_HEADS_PER_ITEM")) {
      const int heads = std::atoi(v);
      if (config.use_tensor_cores && heads >= 1 && bc.num_kv_heads % heads == 0) {
        config.kv_heads_per_item = heads;
      }
    }
    BatchDecode decode(config);
    cuda::DeviceBuffer q(static_cast<size_t>(batch) * bc.num_qo_heads * bc.head_dim * 2);
    fill(q.data(), int64_t{batch} * bc.num_qo_heads * bc.head_dim, 2, 7);
    gpu_testing::DeviceOutputs outputs(batch, bc.num_qo_heads, bc.head_dim, bc.q_dtype);
    const TensorView q_view = TensorView::contiguous(
        q.data(), bc.q_dtype, {batch, bc.num_qo_heads, bc.head_dim}, Device::cuda(0));
    const bool nhd = bc.layout == KVLayout::kNHD;
    const std::vector<int64_t> page_shape =
        nhd ? std::vector<int64_t>{pool_pages, bc.page_size, bc.num_kv_heads, bc.head_dim}
            : std::vector<int64_t>{pool_pages, bc.num_kv_heads, bc.page_size, bc.head_dim};
    std::vector<PagedKV> tables(static_cast<size_t>(rotations));
    for (int r = 0; r < rotations; ++r) {
      PagedKV& kv = tables[static_cast<size_t>(r)];
      kv.layout = bc.layout;
      kv.k = TensorView::contiguous(k_pool.data(), bc.kv_dtype, page_shape, Device::cuda(0));
      kv.v = TensorView::contiguous(v_pool.data(), bc.kv_dtype, page_shape, Device::cuda(0));
      kv.table.block_size = bc.page_size;
      kv.table.indptr =
          TensorView::contiguous(indptr_d.data(), DType::kI32, {batch + 1}, Device::cuda(0));
      kv.table.indices = TensorView::contiguous(static_cast<int32_t*>(indices.data()) + r * pages,
                                                DType::kI32, {pages}, Device::cuda(0));
      kv.table.last_block_len =
          TensorView::contiguous(last_d.data(), DType::kI32, {batch}, Device::cuda(0));
    }
    cuda::device_synchronize();
    decode.plan(indptr, last, stream.get());
    outputs.poison(stream.get());

    // FLARE_DECODE_BENCH_PREFILL=1: the same batch through BatchPrefill (tensor cores, one
    // query per request, the head group packed into the rows) instead of BatchDecode: what a
    // tensor-core decode path would give. 16-bit KV only (the prefill has no fp8 KV).
    std::optional<BatchPrefill> prefill;
    if (const char* v = std::getenv("FLARE_DECODE_BENCH_PREFILL"); v != nullptr && v[0] == '1') {
      if (elem != 2) continue;
      BatchPrefillConfig pc;
      pc.max_batch = batch;
      pc.max_total_qo = batch;
      pc.num_qo_heads = bc.num_qo_heads;
      pc.num_kv_heads = bc.num_kv_heads;
      pc.head_dim_qk = pc.head_dim_vo = bc.head_dim;
      pc.page_size = bc.page_size;
      pc.layout = bc.layout;
      pc.dtype = bc.q_dtype;
      prefill.emplace(pc);
      std::vector<int32_t> qo_indptr(static_cast<size_t>(batch) + 1);
      std::iota(qo_indptr.begin(), qo_indptr.end(), 0);
      prefill->plan(qo_indptr, indptr, last, stream.get());
    }
    const auto run_once = [&](const PagedKV& kv) {
      if (prefill) {
        prefill->run(q_view, PagedKVPages::of(kv), outputs.o_view, std::nullopt, stream.get());
      } else {
        decode.run(q_view, kv, outputs.o_view, std::nullopt, stream.get());
      }
    };

    std::vector<cuda::Event> starts, stops;
    for (int i = 0; i < kTimed; ++i) {
      starts.emplace_back(true);
      stops.emplace_back(true);
    }
    for (int i = 0; i < kWarmup; ++i) {
      run_once(tables[static_cast<size_t>(i % rotations)]);
    }
    const auto host_begin = std::chrono::steady_clock::now();
    for (int i = 0; i < kTimed; ++i) {
      starts[static_cast<size_t>(i)].record(stream.get());
      run_once(tables[static_cast<size_t>((i + kWarmup) % rotations)]);
      stops[static_cast<size_t>(i)].record(stream.get());
    }
    // Host time to enqueue one run (with its two events): above the GPU time, the GPU waits.
    const double host_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_begin)
            .count() /
        kTimed;
    cuda::stream_synchronize(stream.get());
    std::vector<double> ms;
    for (int i = 0; i < kTimed; ++i) {
      ms.push_back(stops[static_cast<size_t>(i)].elapsed_ms_since(starts[static_cast<size_t>(i)]));
    }
    std::sort(ms.begin(), ms.end());
    const double median_ms = ms[ms.size() / 2];
    EXPECT_EQ(testing::count_nan(outputs.o_host().view()), 0) << bc.name;
    // The C++ API's own host cost (issue 17): each of kHostCalls back-to-back run() calls, and
    // plan() calls, timed alone on the wall clock; medians.
    const auto host_median_us = [&stream](int calls, const std::function<void()>& call) {
      std::vector<double> us;
      cuda::stream_synchronize(stream.get());
      for (int i = 0; i < calls; ++i) {
        const auto begin = std::chrono::steady_clock::now();
        call();
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                .count());
      }
      cuda::stream_synchronize(stream.get());
      std::sort(us.begin(), us.end());
      return us[us.size() / 2];
    };
    constexpr int kHostCalls = 500;
    const double run_host_us = host_median_us(kHostCalls, [&] { run_once(tables[0]); });
    const double plan_host_us =
        prefill ? 0.0
                : host_median_us(kHostCalls / 5, [&] { decode.plan(indptr, last, stream.get()); });

    const Plan& plan = prefill ? prefill->last_plan() : decode.last_plan();
    out << "{\"case\": \"" << bc.name << "\", \"batch\": " << batch
        << ", \"kv_tokens\": " << kv_tokens << ", \"page_size\": " << bc.page_size
        << ", \"num_qo_heads\": " << bc.num_qo_heads << ", \"num_kv_heads\": " << bc.num_kv_heads
        << ", \"head_dim\": " << bc.head_dim << ", \"q_dtype\": \"" << dtype_name(bc.q_dtype)
        << "\", \"kv_dtype\": \"" << dtype_name(bc.kv_dtype)
        << "\", \"pages_in_order\": " << (bc.pages_in_order ? "true" : "false")
        << ", \"layout\": \"" << kv_layout_name(bc.layout) << "\", \"kv_bytes\": " << kv_bytes
        << ", \"tensor_cores\": " << (config.use_tensor_cores ? "true" : "false")
        << ", \"kv_heads_per_item\": " << config.kv_heads_per_item
        << ", \"median_us\": " << median_ms * 1e3 << ", \"min_us\": " << ms.front() * 1e3
        << ", \"host_us_per_run\": " << host_us << ", \"run_host_us\": " << run_host_us
        << ", \"plan_host_us\": " << plan_host_us
        << ", \"tbps\": " << kv_bytes / (median_ms * 1e-3) / 1e12
        << ", \"requests_per_s\": " << batch / (median_ms * 1e-3)
        << ", \"rotations\": " << rotations << ", \"num_ctas\": " << plan.num_ctas
        << ", \"work_items\": " << plan.work_items.size()
        << ", \"merge_items\": " << plan.merge_items.size() << ", \"kv_chunk\": " << plan.kv_chunk
        << "}\n";
    out.flush();
  }
}

}  // namespace
}  // namespace flare
