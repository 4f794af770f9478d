// NVFP4 paged prefill against 16-bit paged prefill on the same shapes, from C++ (the Python side:
// experiments/bench_prefill_nvfp4.py, the same shapes and value ranges): fp16 q, 32 / 8 heads,
// D 128, page 16, shuffled pages; NVFP4 codes uniform over all 256 byte values, block scales
// e4m3 0x30-0x3F, k_scale 0.5, v_scale 2.0; BatchPrefill's default (auto) kernel choice. Prints
// per shape the median GPU time of a run() (CUDA events around kRuns back-to-back eager runs,
// median of kRounds) for 16-bit and NVFP4 KV, their ratio, and the kernel's tiles; outputs are
// poisoned with NaN before the first run and checked finite after the last.
//
// Build (after the library, from the repository root):
//   g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill_nvfp4.cpp -Lbuild-gpu -lflare
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_prefill_nvfp4   (one line)
// Run: build-gpu/bench_prefill_nvfp4   (FLARE_BENCH_KV_TILE=<rows>: the NVFP4 kernels' KV tile;
//   FLARE_BENCH_ONLY=<text>: the shapes whose name contains it; FLARE_BENCH_BACKEND=fa2|fa3: the
//   NVFP4 prefill's backend)
#include <algorithm>
#include <cstdint>
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
#include "scripts/bench_random_16bit.h"

namespace {

using namespace flare;

constexpr int kQoHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;
constexpr int kRuns = 20, kRounds = 5;

using bench_inputs::view;

// A device buffer of `bytes` bytes drawn by `draw` (one byte a call).
template <class Draw>
cuda::DeviceBuffer device_bytes(size_t bytes, Draw draw) {
  std::vector<uint8_t> host(bytes);
  for (uint8_t& b : host) b = draw();
  cuda::DeviceBuffer buffer(std::max<size_t>(bytes, 1));
  cuda::memcpy_htod(buffer.data(), host.data(), bytes);
  return buffer;
}

std::vector<int32_t> prefix(int count, int32_t step) {
  std::vector<int32_t> out(static_cast<size_t>(count) + 1);
  for (int i = 0; i <= count; ++i) out[static_cast<size_t>(i)] = i * step;
  return out;
}

// Median over kRounds of the mean GPU milliseconds of one run() in kRuns back-to-back runs.
template <class Body>
double run_ms(cuda::Stream stream, Body body) {
  for (int i = 0; i < 3; ++i) body();
  std::vector<double> ms;
  for (int round = 0; round < kRounds; ++round) {
    cuda::Event start(true), stop(true);
    start.record(stream);
    for (int i = 0; i < kRuns; ++i) body();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start) / kRuns);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

bool all_finite_f16(const cuda::DeviceBuffer& buffer, int64_t n) {
  std::vector<uint16_t> host(static_cast<size_t>(n));
  cuda::memcpy_dtoh(host.data(), buffer.data(), host.size() * 2);
  return std::none_of(host.begin(), host.end(),
                      [](uint16_t h) { return (h & 0x7C00u) == 0x7C00u; });
}

void bench(int batch, int q_len, int kv_len, bool causal) {
  // FLARE_BENCH_ONLY=<text>: only the shapes whose name ("b16 q16 kv4096") contains it.
  const std::string name =
      "b" + std::to_string(batch) + " q" + std::to_string(q_len) + " kv" + std::to_string(kv_len);
  const char* only = std::getenv("FLARE_BENCH_ONLY");
  if (only != nullptr && name.find(only) == std::string::npos) return;
  const int pages_per = (kv_len + kPageSize - 1) / kPageSize;
  const int64_t num_pages = int64_t{batch} * pages_per;
  const int64_t total_q = int64_t{batch} * q_len;
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  cuda::DeviceBuffer d_ids(ids.size() * 4);
  cuda::memcpy_htod(d_ids.data(), ids.data(), ids.size() * 4);
  const std::vector<int32_t> qo_indptr = prefix(batch, q_len);
  const std::vector<int32_t> page_indptr = prefix(batch, pages_per);
  const std::vector<int32_t> last(static_cast<size_t>(batch), (kv_len - 1) % kPageSize + 1);

  std::mt19937 rng(11);
  const int64_t slots = num_pages * kPageSize * kKvHeads;
  cuda::DeviceBuffer q =
      bench_inputs::random_16bit(total_q * kQoHeads * kHeadDim, 1, /*fp16=*/true);
  cuda::DeviceBuffer k16 = bench_inputs::random_16bit(slots * kHeadDim, 2, true),
                     v16 = bench_inputs::random_16bit(slots * kHeadDim, 3, true);
  const auto code = [&rng] { return static_cast<uint8_t>(rng() & 0xFF); };
  const auto scale = [&rng] { return static_cast<uint8_t>(0x30 + rng() % 16); };
  cuda::DeviceBuffer k_codes = device_bytes(static_cast<size_t>(slots * kHeadDim / 2), code);
  cuda::DeviceBuffer v_codes = device_bytes(static_cast<size_t>(slots * kHeadDim / 2), code);
  cuda::DeviceBuffer k_scales = device_bytes(static_cast<size_t>(slots * kHeadDim / 16), scale);
  cuda::DeviceBuffer v_scales = device_bytes(static_cast<size_t>(slots * kHeadDim / 16), scale);
  const int64_t o_elements = total_q * kQoHeads * kHeadDim;
  cuda::DeviceBuffer o(static_cast<size_t>(o_elements) * 2);
  cuda::OwnedStream stream;

  BatchPrefillConfig config;
  config.max_batch = batch;
  config.max_total_qo = static_cast<int>(total_q);
  config.num_qo_heads = kQoHeads;
  config.num_kv_heads = kKvHeads;
  config.head_dim_qk = config.head_dim_vo = kHeadDim;
  config.dtype = DType::kF16;
  config.kv = PrefillKV::kPaged;
  config.page_size = kPageSize;
  config.params.mask = causal ? MaskMode::kCausal : MaskMode::kNone;
  const TensorView qv = view(q.data(), DType::kF16, {total_q, kQoHeads, kHeadDim});
  const TensorView ov = view(o.data(), DType::kF16, {total_q, kQoHeads, kHeadDim});
  const TensorView idv = view(d_ids.data(), DType::kI32, {num_pages});
  const auto page_view = [&](const cuda::DeviceBuffer& b, DType dtype, int64_t row) {
    return view(b.data(), dtype, {num_pages, kPageSize, kKvHeads, row});
  };
  RunOptions options;
  options.k_scale = 0.5f;
  options.v_scale = 2.0f;

  double ms[2];
  std::string tiles[2];
  for (int nvfp4 = 0; nvfp4 < 2; ++nvfp4) {
    BatchPrefillConfig c = config;
    if (nvfp4 != 0) {
      c.kv_dtype = DType::kU8;
      c.max_total_kv = num_pages;
      // FLARE_BENCH_KV_TILE: the NVFP4 kernels' KV tile instead of the heuristic's where the
      // packed rows fill 32 (experiments; 16-row tiles take 64 KV rows at least).
      // FLARE_BENCH_BACKEND=fa2|fa3: the NVFP4 prefill's backend (default auto).
      if (const char* backend = std::getenv("FLARE_BENCH_BACKEND")) {
        const std::string name = backend;
        c.backend = name == "fa3"   ? PrefillBackend::kFA3
                    : name == "fa2" ? PrefillBackend::kFA2
                                    : PrefillBackend::kAuto;
      }
      const char* tile = std::getenv("FLARE_BENCH_KV_TILE");
      if (tile != nullptr && q_len * (kQoHeads / kKvHeads) >= 32) c.kv_tile = std::atoi(tile);
    }
    BatchPrefill prefill(c);
    prefill.plan(qo_indptr, page_indptr, last, stream.get());
    PagedKVPages pages{page_view(k16, DType::kF16, kHeadDim), page_view(v16, DType::kF16, kHeadDim),
                       KVLayout::kNHD, idv};
    if (nvfp4 != 0) {
      pages = {page_view(k_codes, DType::kU8, kHeadDim / 2),
               page_view(v_codes, DType::kU8, kHeadDim / 2), KVLayout::kNHD, idv};
      pages.k_scales = page_view(k_scales, DType::kU8, kHeadDim / 16);
      pages.v_scales = page_view(v_scales, DType::kU8, kHeadDim / 16);
    }
    cuda::memset_d8_async(o.data(), 0xFF, static_cast<size_t>(o_elements) * 2, stream.get());
    std::fflush(stdout);
    ms[nvfp4] = run_ms(stream.get(), [&] {
      prefill.run(qv, pages, ov, std::nullopt, stream.get(), std::nullopt, options);
    });
    cuda::stream_synchronize(stream.get());
    prefill.check();
    if (!all_finite_f16(o, o_elements)) {
      std::fprintf(stderr, "b%d q%d kv%d: non-finite output (%s KV)\n", batch, q_len, kv_len,
                   nvfp4 != 0 ? "NVFP4" : "16-bit");
      std::exit(1);
    }
    const PrefillTiles t = prefill.last_tiles();
    tiles[nvfp4] = std::to_string(t.query_tile) + "x" + std::to_string(t.kv_tile) +
                   (t.warpgroup ? " wgmma" : "") + ", " +
                   std::to_string(prefill.last_plan().num_ctas) + " CTAs";
  }
  std::printf("| b%d q%d kv%d %s | %.1f (%s) | %.1f (%s) | %.2f |\n", batch, q_len, kv_len,
              causal ? "causal" : "full", ms[0] * 1e3, tiles[0].c_str(), ms[1] * 1e3,
              tiles[1].c_str(), ms[1] / ms[0]);
}

}  // namespace

int main() {
  flare::cuda::set_device(0);
  std::printf(
      "| shape | 16-bit KV us (tiles, CTAs) | NVFP4 KV us (tiles, CTAs) | NVFP4 / 16-bit |\n");
  std::printf("|---|---|---|---|\n");
  bench(1, 4096, 4096, true);
  bench(4, 1024, 1024, true);
  bench(16, 16, 4096, false);
  bench(64, 1, 2048, false);
  return 0;
}
