// Prefill benchmark of BatchPrefill on the GPU: bf16, causal, batch x seq x heads x head_dim,
// ragged KV and paged KV (page 16, randomly permuted pages), plus variable-length and append
// batches; prints TFLOP/s (causal FLOPs, as shared/bench/torch_baselines.py counts them).
//
// Build (after the library, from the repository root):
//   g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -Lbuild-gpu -lflare
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_prefill   (one line)
// Run: build-gpu/bench_prefill   (the PyTorch side: scripts/bench_prefill_torch.py)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"

namespace {

using namespace flare;

constexpr int kHeads = 16;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr int kWarmup = 3;
constexpr int kIterations = 10;

// Device bf16 buffer of n elements with pseudo-random unit-scale values (never zeros).
cuda::DeviceBuffer random_bf16(int64_t n, uint32_t seed) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<uint16_t> host(static_cast<size_t>(std::min(n, kChunk)));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (uint16_t& x : host) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  cuda::DeviceBuffer buffer(static_cast<size_t>(n) * 2);
  for (int64_t offset = 0; offset < n; offset += kChunk) {
    const int64_t count = std::min(kChunk, n - offset);
    cuda::memcpy_htod(static_cast<uint16_t*>(buffer.data()) + offset, host.data(),
                      static_cast<size_t>(count) * 2);
  }
  return buffer;
}

TensorView view(void* data, DType dtype, std::vector<int64_t> shape) {
  return TensorView::contiguous(data, dtype, shape, Device::cuda(0));
}

struct DeviceInts {
  cuda::DeviceBuffer buffer;
  TensorView tensor;
  explicit DeviceInts(const std::vector<int32_t>& values)
      : buffer(std::max<size_t>(values.size(), 1) * 4) {
    cuda::memcpy_htod(buffer.data(), values.data(), values.size() * 4);
    tensor = view(buffer.data(), DType::kI32, {static_cast<int64_t>(values.size())});
  }
};

std::vector<int32_t> prefix(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> out(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), out.begin() + 1);
  return out;
}

// Median milliseconds of `body` over kIterations, timed with events.
template <class Body>
double median_ms(cuda::Stream stream, Body body) {
  for (int i = 0; i < kWarmup; ++i) body();
  std::vector<double> times;
  for (int i = 0; i < kIterations; ++i) {
    cuda::Event start(true), stop(true);
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    times.push_back(stop.elapsed_ms_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One batch: q_lens / kv_lens per request; returns {ragged TFLOP/s, paged TFLOP/s}.
std::pair<double, double> bench(const std::vector<int32_t>& q_lens,
                                const std::vector<int32_t>& kv_lens, double flops,
                                std::string& tiles) {
  const std::vector<int32_t> qo_indptr = prefix(q_lens);
  const std::vector<int32_t> kv_indptr = prefix(kv_lens);
  const int64_t total_q = qo_indptr.back();
  const int64_t total_kv = kv_indptr.back();
  const int64_t row = int64_t{kHeads} * kHeadDim;
  cuda::DeviceBuffer q = random_bf16(total_q * row, 1);
  cuda::DeviceBuffer o(static_cast<size_t>(total_q * row) * 2);
  // Pages: each request's KV padded to whole pages inside one pool, pages permuted.
  std::vector<int32_t> pages_per_request, last_page_len;
  for (const int32_t len : kv_lens) {
    pages_per_request.push_back((len + kPageSize - 1) / kPageSize);
    last_page_len.push_back(len == 0 ? 0 : (len - 1) % kPageSize + 1);
  }
  const std::vector<int32_t> page_indptr = prefix(pages_per_request);
  const int64_t num_pages = page_indptr.back();
  std::vector<int32_t> page_ids(static_cast<size_t>(num_pages));
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(7));
  const int64_t kv_rows = std::max(total_kv, num_pages * kPageSize);
  cuda::DeviceBuffer k = random_bf16(kv_rows * row, 2);
  cuda::DeviceBuffer v = random_bf16(kv_rows * row, 3);
  DeviceInts d_qo(qo_indptr), d_kv(kv_indptr), d_pages(page_indptr), d_ids(page_ids),
      d_last(last_page_len);
  cuda::OwnedStream stream;

  BatchPrefillConfig config;
  config.max_batch = static_cast<int>(q_lens.size());
  config.max_total_qo = static_cast<int>(total_q);
  config.num_qo_heads = config.num_kv_heads = kHeads;
  config.head_dim_qk = config.head_dim_vo = kHeadDim;
  config.dtype = DType::kBF16;
  config.params.mask = MaskMode::kCausal;
  // FLARE_BENCH_QUERY_TILE / FLARE_BENCH_KV_TILE override the heuristic (tile experiments).
  if (const char* tile = std::getenv("FLARE_BENCH_QUERY_TILE")) config.query_tile = std::atoi(tile);
  if (const char* tile = std::getenv("FLARE_BENCH_KV_TILE")) config.kv_tile = std::atoi(tile);
  const TensorView qv = view(q.data(), DType::kBF16, {total_q, kHeads, kHeadDim});
  const TensorView ov = view(o.data(), DType::kBF16, {total_q, kHeads, kHeadDim});

  config.kv = PrefillKV::kRagged;
  BatchPrefill ragged(config);
  ragged.plan(qo_indptr, kv_indptr, {}, stream.get());
  RaggedKV rkv{view(k.data(), DType::kBF16, {total_kv, kHeads, kHeadDim}),
               view(v.data(), DType::kBF16, {total_kv, kHeads, kHeadDim}), d_kv.tensor};
  const double ragged_ms = median_ms(
      stream.get(), [&] { ragged.run(qv, d_qo.tensor, rkv, ov, std::nullopt, stream.get()); });
  tiles = std::to_string(ragged.last_tiles().query_tile) + "x" +
          std::to_string(ragged.last_tiles().kv_tile);

  config.kv = PrefillKV::kPaged;
  config.page_size = kPageSize;
  BatchPrefill paged(config);
  paged.plan(qo_indptr, page_indptr, last_page_len, stream.get());
  PagedKV pkv;
  pkv.k = view(k.data(), DType::kBF16, {num_pages, kPageSize, kHeads, kHeadDim});
  pkv.v = view(v.data(), DType::kBF16, {num_pages, kPageSize, kHeads, kHeadDim});
  pkv.layout = KVLayout::kNHD;
  pkv.table.block_size = kPageSize;
  pkv.table.indptr = d_pages.tensor;
  pkv.table.indices = d_ids.tensor;
  pkv.table.last_block_len = d_last.tensor;
  const double paged_ms = median_ms(
      stream.get(), [&] { paged.run(qv, d_qo.tensor, pkv, ov, std::nullopt, stream.get()); });
  return {flops / ragged_ms / 1e9, flops / paged_ms / 1e9};
}

}  // namespace

int main() {
  flare::cuda::set_device(0);
  const flare::cuda::DeviceProperties props = flare::cuda::device_properties(0);
  std::printf("device %s, %d SMs\n", props.name.c_str(), props.num_sms);
  std::printf("%-34s %8s %12s %12s\n", "case", "tiles", "ragged TF/s", "paged TF/s");
  // FLARE_BENCH_ONLY=<substring>: run only the cases whose name contains it (profiling).
  const char* only = std::getenv("FLARE_BENCH_ONLY");
  const auto report = [only](const std::string& name, const std::vector<int32_t>& q,
                             const std::vector<int32_t>& kv, double flops) {
    if (only != nullptr && name.find(only) == std::string::npos) return;
    std::string tiles;
    const auto [ragged, paged] = bench(q, kv, flops, tiles);
    std::printf("%-34s %8s %12.1f %12.1f\n", name.c_str(), tiles.c_str(), ragged, paged);
    std::fflush(stdout);
  };
  const double per_pair = 4.0 * kHeads * kHeadDim;  // FLOPs per (query, key) pair, all heads
  for (const int seq : {1024, 4096, 16384}) {
    const std::vector<int32_t> lens(16, seq);
    report("causal b16 seq " + std::to_string(seq), lens, lens, 16 * per_pair * seq * seq / 2.0);
  }
  std::mt19937 rng(11);
  std::vector<int32_t> uniform(16);
  double uniform_flops = 0;
  for (int32_t& len : uniform) {
    len = std::uniform_int_distribution<int32_t>(512, 1024)(rng);
    uniform_flops += per_pair * len * len / 2.0;
  }
  report("causal b16 uniform 512-1024", uniform, uniform, uniform_flops);
  // Append: 128 new tokens on a 32768-token cache (FLOPs of the full 128 x 32768 rectangle).
  const std::vector<int32_t> q_append(8, 128), kv_append(8, 32768);
  report("append b8 128 on 32768", q_append, kv_append, 8 * per_pair * 128.0 * 32768.0);
  return 0;
}
