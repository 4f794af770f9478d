// Prefill benchmark of BatchPrefill on the GPU: bf16, causal, batch x seq x heads x head_dim,
// ragged KV and paged KV (page 16 or FLARE_BENCH_PAGE, randomly permuted pages), plus
// variable-length (uniform and Zipf) and append batches; prints TFLOP/s (causal FLOPs, as
// shared/bench/torch_baselines.py counts them). Last, the append batch against 128 BatchDecode
// steps on the same paged cache.
//
// Build (after the library, from the repository root):
//   g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_prefill.cpp -Lbuild-gpu -lflare
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_prefill   (one line)
// Run: build-gpu/bench_prefill   (the PyTorch side: scripts/bench_prefill_torch.py)
//   build-gpu/bench_prefill --print-zipf-lengths   prints the Zipf batch and exits (no GPU),
//   to compare with `python3 scripts/bench_prefill_torch.py --print-zipf-lengths`.
//   FLARE_BENCH_BACKEND=fa2|fa3 picks the kernel family (default: the backend's auto choice);
//   FLARE_BENCH_PAGE=<rows> the page size of the paged cases (default 16); FLARE_BENCH_ALIBI=1,
//   FLARE_BENCH_ROPE=1, FLARE_BENCH_WINDOW_LEFT=<n>, FLARE_BENCH_SOFT_CAP=<cap>: that variant
//   (TFLOP/s still count the causal FLOPs); FLARE_BENCH_ROPE_STAGING=fused|staged with RoPE:
//   the ragged cases' BatchPrefillConfig::rope_staging (default auto; a tile column ending in
//   "s" marks a staged plan); FLARE_BENCH_APPEND_QO=<tokens> the append case's new tokens
//   (default 128); FLARE_BENCH_VARIANT=relative_position_bias|distance_bias: T5's bias, by
//   buckets or by a table per distance (scripts/bench_library_variant.h; the append-vs-decode
//   comparison is skipped then).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "scripts/bench_library_variant.h"
#include "scripts/bench_random_16bit.h"

namespace {

using namespace flare;

constexpr int kHeads = 16;
constexpr int kHeadDim = 128;
// FLARE_BENCH_PAGE: the paged cases' page size (default 16; a divisor of 32768).
int bench_page_size() {
  const char* page = std::getenv("FLARE_BENCH_PAGE");
  const int size = page != nullptr ? std::atoi(page) : 16;
  if (size < 1 || 32768 % size != 0) {
    std::fprintf(stderr, "FLARE_BENCH_PAGE must divide 32768, got '%s'\n", page);
    std::exit(2);
  }
  return size;
}
const int kPageSize = bench_page_size();
constexpr int kWarmup = 3;
constexpr int kIterations = 10;

// Device bf16 buffer of n elements with pseudo-random unit-scale values (never zeros).
cuda::DeviceBuffer random_bf16(int64_t n, uint32_t seed) {
  return bench_inputs::random_16bit(n, seed, /*fp16=*/false);
}

using bench_inputs::DeviceInts;
using bench_inputs::view;

std::vector<int32_t> prefix(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> out(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), out.begin() + 1);
  return out;
}

int64_t sum_of(const std::vector<int32_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

// The Zipf batch; zipf_lengths() in scripts/bench_prefill_torch.py is the same code line by
// line. Integer arithmetic only (splitmix64, integer division; no pow, no library generator),
// so the two programs get the same list by construction. Raw lengths follow a bounded power
// law of density ~ x^-1.5 on [16, 16384] (Pareto exponent 0.5 by inverse CDF: x = 16384 / s^2,
// s uniform in [1, 32], here s = m / 2^20 with m a uniform integer in [2^20, 32 * 2^20]).
// They are then scaled by the smallest multiple of 1/1024 whose sum, each length clipped to
// [16, 16384], reaches batch * mean; the excess (a few tokens) comes off the first longest
// request, so the mean is exact.
constexpr int64_t kZipfMinLen = 16, kZipfMaxLen = 16384;
constexpr uint64_t kZipfSeed = 2024;

uint64_t splitmix64(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<int32_t> zipf_lengths(int batch, int64_t mean, uint64_t seed) {
  FLARE_CHECK(batch >= 1 && mean >= kZipfMinLen && mean <= kZipfMaxLen, ErrorCode::kInvalidArgument,
              "zipf_lengths: batch ", batch, " (>= 1) and mean ", mean,
              " (in [16, 16384]) expected");
  constexpr uint64_t kSteps = uint64_t{1} << 20;  // 2^20: resolution of s
  constexpr uint64_t kSpan = 32;                  // sqrt(kZipfMaxLen / kZipfMinLen)
  std::vector<int64_t> raw;
  uint64_t state = seed;
  for (int i = 0; i < batch; ++i) {
    const uint64_t m = kSteps + splitmix64(state) % ((kSpan - 1) * kSteps + 1);
    raw.push_back(static_cast<int64_t>(uint64_t{kZipfMaxLen} * kSteps * kSteps / (m * m)));
  }
  const auto scaled = [&raw](int64_t scale) {  // lengths times scale / 1024, clipped
    std::vector<int32_t> lengths;
    for (const int64_t x : raw) {
      lengths.push_back(
          static_cast<int32_t>(std::clamp(x * scale / 1024, kZipfMinLen, kZipfMaxLen)));
    }
    return lengths;
  };
  const int64_t target = int64_t{batch} * mean;
  int64_t lo = 1, hi = int64_t{1} << 20;  // every length clips to 16 at lo, to 16384 at hi
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (sum_of(scaled(mid)) < target) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  std::vector<int32_t> lengths = scaled(lo);
  int32_t& longest = *std::max_element(lengths.begin(), lengths.end());
  longest -= static_cast<int32_t>(sum_of(lengths) - target);
  FLARE_CHECK(longest >= kZipfMinLen, ErrorCode::kInternal,
              "zipf_lengths: longest request trimmed to ", longest, ", below 16");
  return lengths;
}

// One line both programs print identically (compared by eye or with diff).
void print_lengths(const char* label, const std::vector<int32_t>& lengths) {
  std::printf("%s: batch %zu, min %d, max %d, mean %.1f, sum %lld:", label, lengths.size(),
              *std::min_element(lengths.begin(), lengths.end()),
              *std::max_element(lengths.begin(), lengths.end()),
              static_cast<double>(sum_of(lengths)) / static_cast<double>(lengths.size()),
              static_cast<long long>(sum_of(lengths)));
  for (const int32_t len : lengths) std::printf(" %d", len);
  std::printf("\n");
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

// The prefill config of every case: bf16, causal, kHeads / kHeads, kHeadDim.
BatchPrefillConfig prefill_config(int max_batch, int64_t max_total_qo) {
  BatchPrefillConfig config;
  config.max_batch = max_batch;
  config.max_total_qo = static_cast<int>(max_total_qo);
  config.num_qo_heads = config.num_kv_heads = kHeads;
  config.head_dim_qk = config.head_dim_vo = kHeadDim;
  config.dtype = DType::kBF16;
  config.params.mask = MaskMode::kCausal;
  // FLARE_BENCH_QUERY_TILE / FLARE_BENCH_KV_TILE override the heuristic (tile experiments).
  if (const char* tile = std::getenv("FLARE_BENCH_QUERY_TILE")) config.query_tile = std::atoi(tile);
  if (const char* tile = std::getenv("FLARE_BENCH_KV_TILE")) config.kv_tile = std::atoi(tile);
  if (const char* backend = std::getenv("FLARE_BENCH_BACKEND")) {  // fa2 | fa3 (default auto)
    const std::string name = backend;
    if (name != "fa2" && name != "fa3") {
      std::fprintf(stderr, "FLARE_BENCH_BACKEND must be fa2 or fa3, got '%s'\n", backend);
      std::exit(2);
    }
    config.backend = name == "fa2" ? PrefillBackend::kFA2 : PrefillBackend::kFA3;
  }
  // FLARE_BENCH_WINDOW_LEFT: a sliding window (the FLOP counts stay the causal ones).
  if (const char* window = std::getenv("FLARE_BENCH_WINDOW_LEFT")) {
    config.params.window_left = std::atoi(window);
  }
  // FLARE_BENCH_ALIBI=1: ALiBi with the default slopes (the FLOP counts stay the causal ones).
  if (const char* alibi = std::getenv("FLARE_BENCH_ALIBI"); alibi != nullptr && alibi[0] == '1') {
    config.params.pos_encoding = PosEncoding::kAlibi;
  }
  // FLARE_BENCH_ROPE=1: fused RoPE (Llama's defaults; the FLOP counts stay the causal ones).
  if (const char* rope = std::getenv("FLARE_BENCH_ROPE"); rope != nullptr && rope[0] == '1') {
    config.params.pos_encoding = PosEncoding::kRopeLlama;
  }
  // FLARE_BENCH_SOFT_CAP=<cap>: logits soft-cap (the FLOP counts stay the causal ones).
  if (const char* cap = std::getenv("FLARE_BENCH_SOFT_CAP")) {
    config.params.logits_soft_cap = std::strtof(cap, nullptr);
    if (!(config.params.logits_soft_cap > 0.0f)) {
      std::fprintf(stderr, "FLARE_BENCH_SOFT_CAP must be a positive number, got '%s'\n", cap);
      std::exit(2);
    }
  }
  if (const auto* variant = bench_inputs::LibraryVariant::from_environment(kHeads)) {
    config.variant = variant->variant();
  }
  // FLARE_BENCH_FIXED_SPLIT: the batch-invariant plan (fixed_split_size) instead of the default.
  if (const char* split = std::getenv("FLARE_BENCH_FIXED_SPLIT")) {
    config.fixed_split_size = std::atoi(split);
  }
  return config;
}

// Paged KV (NHD, kPageSize) over the pools k and v of num_pages pages and a device page table.
PagedKV paged_kv(const cuda::DeviceBuffer& k, const cuda::DeviceBuffer& v, int64_t num_pages,
                 const TensorView& indptr, const TensorView& indices,
                 const TensorView& last_page_len) {
  PagedKV pkv;
  pkv.k = view(k.data(), DType::kBF16, {num_pages, kPageSize, kHeads, kHeadDim});
  pkv.v = view(v.data(), DType::kBF16, {num_pages, kPageSize, kHeads, kHeadDim});
  pkv.layout = KVLayout::kNHD;
  pkv.table.block_size = kPageSize;
  pkv.table.indptr = indptr;
  pkv.table.indices = indices;
  pkv.table.last_block_len = last_page_len;
  return pkv;
}

// Median host microseconds of `calls` back-to-back calls of `body` (no synchronization
// between them): the C++ API's own cost per call (issue 17).
template <class Body>
double host_median_us(cuda::Stream stream, int calls, Body body) {
  cuda::stream_synchronize(stream);
  std::vector<double> us;
  for (int i = 0; i < calls; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    body();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
                     .count());
  }
  cuda::stream_synchronize(stream);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct BenchResult {
  double ragged_tflops = 0, paged_tflops = 0;
  double ragged_run_host_us = 0, ragged_plan_host_us = 0;
};

// One batch: q_lens / kv_lens per request, ragged and paged.
BenchResult bench(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                  double flops, std::string& tiles) {
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
  DeviceInts d_pages(page_indptr), d_ids(page_ids), d_last(last_page_len);
  cuda::OwnedStream stream;

  BatchPrefillConfig config = prefill_config(static_cast<int>(q_lens.size()), total_q);
  const TensorView qv = view(q.data(), DType::kBF16, {total_q, kHeads, kHeadDim});
  const TensorView ov = view(o.data(), DType::kBF16, {total_q, kHeads, kHeadDim});

  config.kv = PrefillKV::kRagged;
  // FLARE_BENCH_ROPE_STAGING (with FLARE_BENCH_ROPE=1): where the ragged cases rotate q and k
  // (BatchPrefillConfig::rope_staging); paged K/V always rotates in the kernels.
  const std::string staging = std::getenv("FLARE_BENCH_ROPE_STAGING") != nullptr
                                  ? std::getenv("FLARE_BENCH_ROPE_STAGING")
                                  : "auto";
  config.rope_staging = staging == "fused"    ? RopeStaging::kFused
                        : staging == "staged" ? RopeStaging::kStaged
                                              : RopeStaging::kAuto;
  if (staging != "auto" && staging != "fused" && staging != "staged") {
    std::fprintf(stderr, "FLARE_BENCH_ROPE_STAGING must be auto, fused or staged, got '%s'\n",
                 staging.c_str());
    std::exit(2);
  }
  BatchPrefill ragged(config);
  ragged.plan(qo_indptr, kv_indptr, {}, stream.get());
  const TensorView rk = view(k.data(), DType::kBF16, {total_kv, kHeads, kHeadDim});
  const TensorView rv = view(v.data(), DType::kBF16, {total_kv, kHeads, kHeadDim});
  const auto* variant = bench_inputs::LibraryVariant::from_environment(kHeads);
  const RunOptions options = variant != nullptr ? variant->options() : RunOptions{};
  const auto run_ragged = [&] {
    ragged.run(qv, rk, rv, ov, std::nullopt, stream.get(), std::nullopt, options);
  };
  const double ragged_ms = median_ms(stream.get(), run_ragged);
  BenchResult result;
  // Host time where a kernel is short enough that 200 of them take under a second.
  if (ragged_ms < 5.0) {
    result.ragged_run_host_us = host_median_us(stream.get(), 200, run_ragged);
    result.ragged_plan_host_us = host_median_us(
        stream.get(), 100, [&] { ragged.plan(qo_indptr, kv_indptr, {}, stream.get()); });
  }
  tiles = std::to_string(ragged.last_tiles().query_tile) + "x" +
          std::to_string(ragged.last_tiles().kv_tile) + (ragged.last_plan_stages_rope() ? "s" : "");

  config.kv = PrefillKV::kPaged;
  config.page_size = kPageSize;
  config.rope_staging = RopeStaging::kAuto;  // paged K/V: the kernels rotate
  BatchPrefill paged(config);
  paged.plan(qo_indptr, page_indptr, last_page_len, stream.get());
  const PagedKV pkv = paged_kv(k, v, num_pages, d_pages.tensor, d_ids.tensor, d_last.tensor);
  const double paged_ms = median_ms(stream.get(), [&] {
    paged.run(qv, PagedKVPages::of(pkv), ov, std::nullopt, stream.get(), std::nullopt, options);
  });
  result.ragged_tflops = flops / ragged_ms / 1e9;
  result.paged_tflops = flops / paged_ms / 1e9;
  return result;
}

// The append batch (kAppendBatch requests, kAppendNew new tokens each, causal, on a cache of
// kAppendCache tokens, paged as in bench()) against the same tokens decoded one step at a time
// with BatchDecode: step t (0 .. kAppendNew - 1) takes token t of every request, with the same
// query rows (a strided view of the append's q) and the same pages, against the first
// kAppendCache - (kAppendNew - 1) + t tokens (what token t sees under the bottom-right causal
// mask), so its output must equal the append's row t.
constexpr int kAppendBatch = 8, kAppendNew = 128, kAppendCache = 32768;

struct AppendVsDecode {
  double append_ms = 0;       // paged BatchPrefill run(), median
  double loop_ms = 0;         // kAppendNew x (plan() + run()), end to end, median
  double runs_ms = 0;         // the same loop, only the run() intervals summed, median
  double max_difference = 0;  // max |o_append - o_decode| over values both wrote
  double max_output = 0;      // max |o_append| (scale of the difference)
  int64_t nan_values = 0;     // NaN in either output (the poison of an unwritten row)
};

float bf16_to_float(uint16_t bits) {
  const uint32_t widened = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &widened, 4);
  return value;
}

AppendVsDecode append_vs_decode() {
  const int64_t row = int64_t{kHeads} * kHeadDim;
  const int64_t total_q = int64_t{kAppendBatch} * kAppendNew;
  const int pages_per_request = kAppendCache / kPageSize;
  const int64_t num_pages = int64_t{kAppendBatch} * pages_per_request;
  // Request r owns page_ids[r * pages_per_request ...], shuffled as in bench().
  std::vector<int32_t> page_ids(static_cast<size_t>(num_pages));
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937(7));
  cuda::DeviceBuffer q = random_bf16(total_q * row, 1);
  cuda::DeviceBuffer k = random_bf16(num_pages * kPageSize * row, 2);
  cuda::DeviceBuffer v = random_bf16(num_pages * kPageSize * row, 3);
  const size_t o_bytes = static_cast<size_t>(total_q * row) * 2;
  cuda::DeviceBuffer o_append(o_bytes), o_decode(o_bytes);
  cuda::OwnedStream stream;
  // NaN (0xFFFF) everywhere: a row either path fails to write shows in the comparison.
  cuda::memset_d8_async(o_append.data(), 0xFF, o_bytes, stream.get());
  cuda::memset_d8_async(o_decode.data(), 0xFF, o_bytes, stream.get());
  AppendVsDecode result;

  // Append: one paged BatchPrefill over the whole cache.
  const std::vector<int32_t> qo_indptr = prefix(std::vector<int32_t>(kAppendBatch, kAppendNew));
  const std::vector<int32_t> page_indptr =
      prefix(std::vector<int32_t>(kAppendBatch, pages_per_request));
  const std::vector<int32_t> full_last(kAppendBatch, kPageSize);
  DeviceInts d_pages(page_indptr), d_ids(page_ids), d_last(full_last);
  BatchPrefillConfig config = prefill_config(kAppendBatch, total_q);
  config.kv = PrefillKV::kPaged;
  config.page_size = kPageSize;
  BatchPrefill append(config);
  append.plan(qo_indptr, page_indptr, full_last, stream.get());
  const PagedKV append_kv = paged_kv(k, v, num_pages, d_pages.tensor, d_ids.tensor, d_last.tensor);
  const TensorView q_all = view(q.data(), DType::kBF16, {total_q, kHeads, kHeadDim});
  const TensorView o_all = view(o_append.data(), DType::kBF16, {total_q, kHeads, kHeadDim});
  result.append_ms = median_ms(stream.get(), [&] {
    append.run(q_all, PagedKVPages::of(append_kv), o_all, std::nullopt, stream.get());
  });

  // Decode: per step, the host arrays plan() takes and the device page table run() reads,
  // all built and uploaded before timing (a serving engine keeps its page table on the device).
  std::vector<std::vector<int32_t>> step_indptr, step_last;
  std::vector<int32_t> all_indptr, all_indices, all_last;
  for (int t = 0; t < kAppendNew; ++t) {
    const int kv_len = kAppendCache - (kAppendNew - 1) + t;
    const int pages = (kv_len + kPageSize - 1) / kPageSize;
    step_indptr.push_back(prefix(std::vector<int32_t>(kAppendBatch, pages)));
    step_last.emplace_back(kAppendBatch, (kv_len - 1) % kPageSize + 1);
    all_indptr.insert(all_indptr.end(), step_indptr.back().begin(), step_indptr.back().end());
    all_last.insert(all_last.end(), step_last.back().begin(), step_last.back().end());
    // Step t's indices at t * num_pages: each request's first `pages` pages, packed.
    all_indices.resize(static_cast<size_t>(t * num_pages));
    for (int r = 0; r < kAppendBatch; ++r) {
      const auto first = page_ids.begin() + int64_t{r} * pages_per_request;
      all_indices.insert(all_indices.end(), first, first + pages);
    }
  }
  all_indices.resize(static_cast<size_t>(kAppendNew * num_pages));
  DeviceInts d_step_indptr(all_indptr), d_step_indices(all_indices), d_step_last(all_last);
  std::vector<PagedKV> step_kv;
  std::vector<TensorView> step_q, step_o;
  for (int t = 0; t < kAppendNew; ++t) {
    step_kv.push_back(paged_kv(
        k, v, num_pages,
        d_step_indptr.tensor.slice(0, int64_t{t} * (kAppendBatch + 1),
                                   int64_t{t + 1} * (kAppendBatch + 1)),
        d_step_indices.tensor.slice(0, t * num_pages, (t + 1) * num_pages),
        d_step_last.tensor.slice(0, int64_t{t} * kAppendBatch, int64_t{t + 1} * kAppendBatch)));
    // Token t of every request: rows r * kAppendNew + t of the append's q and o.
    const int64_t offset = int64_t{t} * row * 2;
    TensorView q_t = view(static_cast<std::byte*>(q.data()) + offset, DType::kBF16,
                          {kAppendBatch, kHeads, kHeadDim});
    TensorView o_t = view(static_cast<std::byte*>(o_decode.data()) + offset, DType::kBF16,
                          {kAppendBatch, kHeads, kHeadDim});
    q_t.strides[0] = o_t.strides[0] = kAppendNew * row;
    step_q.push_back(q_t);
    step_o.push_back(o_t);
  }
  BatchDecodeConfig decode_config;
  decode_config.max_batch = kAppendBatch;
  decode_config.num_qo_heads = decode_config.num_kv_heads = kHeads;
  decode_config.head_dim = kHeadDim;
  decode_config.page_size = kPageSize;
  decode_config.q_dtype = decode_config.kv_dtype = DType::kBF16;
  decode_config.layout = KVLayout::kNHD;
  decode_config.params = config.params;  // the same variant (FLARE_BENCH_ROPE, _ALIBI, ...)
  BatchDecode decode(decode_config);
  const auto run_step = [&](int t) {
    decode.run(step_q[static_cast<size_t>(t)], step_kv[static_cast<size_t>(t)],
               step_o[static_cast<size_t>(t)], std::nullopt, stream.get());
  };
  // Timing. The plan differs per step (kv_len grows) and one BatchDecode holds one plan, so
  // every step calls plan() (host scheduling + one async copy) right before its run(), as a
  // decode loop without CUDA graphs does. loop_ms: CUDA events around the whole loop (includes
  // any GPU idle time while the host plans). runs_ms: the same loop with an event pair around
  // each run() only (after plan() issued its copy), summed: the decode kernels' own time.
  result.loop_ms = median_ms(stream.get(), [&] {
    for (int t = 0; t < kAppendNew; ++t) {
      decode.plan(step_indptr[static_cast<size_t>(t)], step_last[static_cast<size_t>(t)],
                  stream.get());
      run_step(t);
    }
  });
  std::vector<cuda::Event> starts, stops;
  for (int t = 0; t < kAppendNew; ++t) {
    starts.emplace_back(true);
    stops.emplace_back(true);
  }
  std::vector<double> sums;
  for (int i = 0; i < kWarmup + kIterations; ++i) {
    for (int t = 0; t < kAppendNew; ++t) {
      decode.plan(step_indptr[static_cast<size_t>(t)], step_last[static_cast<size_t>(t)],
                  stream.get());
      starts[static_cast<size_t>(t)].record(stream.get());
      run_step(t);
      stops[static_cast<size_t>(t)].record(stream.get());
    }
    stops.back().synchronize();
    double sum = 0;
    for (int t = 0; t < kAppendNew; ++t) {
      sum += stops[static_cast<size_t>(t)].elapsed_ms_since(starts[static_cast<size_t>(t)]);
    }
    if (i >= kWarmup) sums.push_back(sum);
  }
  std::sort(sums.begin(), sums.end());
  result.runs_ms = sums[sums.size() / 2];

  // Both paths computed the same attention rows.
  cuda::stream_synchronize(stream.get());
  std::vector<uint16_t> host_append(static_cast<size_t>(total_q * row)),
      host_decode(host_append.size());
  cuda::memcpy_dtoh(host_append.data(), o_append.data(), o_bytes);
  cuda::memcpy_dtoh(host_decode.data(), o_decode.data(), o_bytes);
  for (size_t i = 0; i < host_append.size(); ++i) {
    const double a = bf16_to_float(host_append[i]), d = bf16_to_float(host_decode[i]);
    if (std::isnan(a) || std::isnan(d)) {
      ++result.nan_values;
      continue;
    }
    result.max_difference = std::max(result.max_difference, std::fabs(a - d));
    result.max_output = std::max(result.max_output, std::fabs(a));
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int32_t> zipf = zipf_lengths(16, 1024, kZipfSeed);
  if (argc > 1 && std::strcmp(argv[1], "--print-zipf-lengths") == 0) {  // no GPU needed
    print_lengths("zipf lengths", zipf);
    return 0;
  }
  flare::cuda::set_device(0);
  const flare::cuda::DeviceProperties props = flare::cuda::device_properties(0);
  std::printf("device %s, %d SMs\n", props.name.c_str(), props.num_sms);
  std::printf("%-34s %8s %12s %12s %14s %15s\n", "case", "tiles", "ragged TF/s", "paged TF/s",
              "run() host us", "plan() host us");
  // FLARE_BENCH_ONLY=<substring>: run only the cases whose name contains it (profiling).
  const char* only = std::getenv("FLARE_BENCH_ONLY");
  const auto selected = [only](const std::string& name) {
    return only == nullptr || name.find(only) != std::string::npos;
  };
  const auto report = [&selected](const std::string& name, const std::vector<int32_t>& q,
                                  const std::vector<int32_t>& kv, double flops) {
    if (!selected(name)) return;
    std::string tiles;
    const BenchResult r = bench(q, kv, flops, tiles);
    std::printf("%-34s %8s %12.1f %12.1f %14.1f %15.1f\n", name.c_str(), tiles.c_str(),
                r.ragged_tflops, r.paged_tflops, r.ragged_run_host_us, r.ragged_plan_host_us);
    std::fflush(stdout);
  };
  const double per_pair = 4.0 * kHeads * kHeadDim;  // FLOPs per (query, key) pair, all heads
  for (const int seq : {1024, 4096, 16384}) {
    const std::vector<int32_t> lens(16, seq);
    report("causal b16 seq " + std::to_string(seq), lens, lens, 16 * per_pair * seq * seq / 2.0);
  }
  // Uniform 512-1024 from splitmix64 (uniform_lengths in the torch script is the same code, so
  // both rows time the same list).
  std::vector<int32_t> uniform(16);
  double uniform_flops = 0;
  uint64_t uniform_state = 11;
  for (int32_t& len : uniform) {
    len = static_cast<int32_t>(512 + splitmix64(uniform_state) % 513);
    uniform_flops += per_pair * len * len / 2.0;
  }
  report("causal b16 uniform 512-1024", uniform, uniform, uniform_flops);
  // Zipf: power-law lengths with mean 1024 (zipf_lengths; the same list as the torch script's).
  const std::string zipf_name = "causal b16 zipf mean 1024";
  double zipf_flops = 0;
  for (const int32_t len : zipf) zipf_flops += per_pair * len * len / 2.0;
  if (selected(zipf_name)) print_lengths("zipf lengths", zipf);
  report(zipf_name, zipf, zipf, zipf_flops);
  // Append: 128 new tokens (FLARE_BENCH_APPEND_QO) on a 32768-token cache (FLOPs of the full
  // q x 32768 rectangle).
  const char* append_qo = std::getenv("FLARE_BENCH_APPEND_QO");
  const int append = append_qo != nullptr ? std::atoi(append_qo) : 128;
  if (append < 1 || append > 32768) {
    std::fprintf(stderr, "FLARE_BENCH_APPEND_QO must be in [1, 32768], got '%s'\n", append_qo);
    return 2;
  }
  const std::vector<int32_t> q_append(8, append), kv_append(8, 32768);
  report("append b8 " + std::to_string(append) + " on 32768", q_append, kv_append,
         8 * per_pair * append * 32768.0);
  // The same append against 128 decode steps (append_vs_decode); speedup = decode / append.
  int status = 0;
  const std::string versus_name = "append vs decode b8 128 on 32768";
  if (bench_inputs::LibraryVariant::from_environment(kHeads) != nullptr) {
    std::printf("%-34s skipped: FLARE_BENCH_VARIANT is set (the decode steps run none)\n",
                versus_name.c_str());
  } else if (selected(versus_name)) {
    const AppendVsDecode r = append_vs_decode();
    std::printf(
        "%-34s append %.3f ms | 128 decode steps %.3f ms (plan+run loop), %.3f ms "
        "(run() only) | speedup %.1fx (%.1fx) | max |o_append - o_decode| %.2e "
        "(max |o| %.2e)\n",
        versus_name.c_str(), r.append_ms, r.loop_ms, r.runs_ms, r.loop_ms / r.append_ms,
        r.runs_ms / r.append_ms, r.max_difference, r.max_output);
    // bf16 outputs of two kernels: a few units in the last place apart; a wrong row, page or
    // mask would differ by the outputs' own size.
    if (r.nan_values > 0 || r.max_difference > 0.05 * r.max_output) {
      std::printf(
          "FAILED: append and decode outputs differ (%lld NaN values; max difference "
          "%.2e, limit %.2e)\n",
          static_cast<long long>(r.nan_values), r.max_difference, 0.05 * r.max_output);
      status = 1;
    }
    std::fflush(stdout);
  }
  return status;
}
