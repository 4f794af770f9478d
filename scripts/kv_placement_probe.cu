// KV-placement probe (an experiment behind docs/perf.md's decode section; not part of the library).
// Question: how fast can any kernel stream b64 kv8192's KV (bf16, 8 KV heads, D 128, pages of 16
// tokens, NHD) when the pages are shuffled, against the same bytes laid out contiguously as SDPA
// reads them? And does the per-CTA access pattern change what shuffling costs?
//   contiguous/head : a CTA per (request, KV head) reads its [8192, 128] K and V, contiguous
//                     (the SDPA anchors' layout and order).
//   paged/head      : a CTA per (request, KV head) reads its 256-byte rows out of every page,
//                     a 2 KiB stride (flare's decode kernels' pattern).
//   paged/head HND  : the same with pages laid out [head][token][dim]: 4 KiB of a head per page.
//   paged/page      : a CTA per (request, eighth of its pages) reads whole pages: every KV head
//                     of a token at once, 32 KiB contiguous per page.
// Every pattern streams the same 2 GiB (512 CTAs) through a pipeline of a given geometry and
// checksums what lands in shared memory; each launch's checksum must equal the pool's, so every
// byte was read exactly once. Geometries: flare's tensor-core loop (128 threads, 3 stages of
// 32 KiB of cp.async.cg, two CTAs per SM), others of cp.async, TMA bulk copies of the largest
// contiguous spans (--all), and clusters of the 8 heads of a request kept together (--clusters).
// Pages go in pool order or shuffled (the benchmark's page tables). scripts/gpu_check.sh runs
// `--flare-only --rounds 2 --json FILE` next to the decode benchmark.
// Build and run on the GPU machine (sm_90): nvcc -std=c++20 -O3 -arch=sm_90a -o /tmp/kv_probe
//   scripts/kv_placement_probe.cu && /tmp/kv_probe [--all] [--clusters]
// (-DFLARE_PROBE_ROW_BYTES=128: fp8 K/V, 1 GiB a launch; -DFLARE_PROBE_BATCH=32
// -DFLARE_PROBE_KV_LEN=2048: 256 CTAs of 2048 tokens, the bytes and items of b16 kv4096's
// default plan, split in two per request and KV head. Below 1 GiB a launch, the launches rotate
// over identical copies of the pool, so that no launch reads what the one before left in L2.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CHECK_CUDA(call)                                                                      \
  do {                                                                                        \
    const cudaError_t error = (call);                                                         \
    if (error != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(error), __FILE__, __LINE__); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

#ifndef FLARE_PROBE_BATCH
#define FLARE_PROBE_BATCH 64
#endif
#ifndef FLARE_PROBE_KV_LEN
#define FLARE_PROBE_KV_LEN 8192
#endif
constexpr int kBatch = FLARE_PROBE_BATCH, kKvHeads = 8, kKvLen = FLARE_PROBE_KV_LEN,
              kPageSize = 16;
// One head's row: 128 bf16 (256 bytes), or 128 fp8 with -DFLARE_PROBE_ROW_BYTES=128 (the same
// requests and pages, half the bytes).
#ifndef FLARE_PROBE_ROW_BYTES
#define FLARE_PROBE_ROW_BYTES 256
#endif
constexpr int kRowBytes = FLARE_PROBE_ROW_BYTES;
constexpr int kTokenBytes = kKvHeads * kRowBytes;               // 2 KiB: a token, every head
constexpr int kPageBytes = kPageSize * kTokenBytes;             // 32 KiB
constexpr int kPagesPerRequest = kKvLen / kPageSize;            // 512
constexpr int kPoolPages = kBatch * kPagesPerRequest;           // every pool page used once
constexpr long long kPoolBytes = 1LL * kPoolPages * kPageBytes;  // 1 GiB each for K and V
constexpr int kCtas = kBatch * kKvHeads;                         // 512 in every mode
// Copies of the K and V pools the launches rotate over: at least 1 GiB of K and V in all.
constexpr long long kCopies = ((1LL << 30) + 2 * kPoolBytes - 1) / (2 * kPoolBytes);
static_assert(kPagesPerRequest % kKvHeads == 0, "whole-page CTAs: an eighth of the pages each");

enum class Mode { kContiguousPerHead, kPagedPerHead, kPagedPerHeadHnd, kPagedWholePage };
enum class Copy { kCpAsync, kBulk };  // 16-byte cp.async.cg per thread, or TMA bulk copies

__device__ __forceinline__ void copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(barrier)
      : "memory");
}
__device__ __forceinline__ void wait_parity(uint32_t barrier, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT;\n}" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// Largest run of contiguous bytes in a mode's stream: a head's row, a page, or everything.
template <Mode kMode>
constexpr int kContiguousBytes = kMode == Mode::kPagedPerHead       ? kRowBytes
                                 : kMode == Mode::kPagedPerHeadHnd ? kPageSize * kRowBytes
                                 : kMode == Mode::kPagedWholePage  ? kPageBytes
                                                                   : 1 << 30;

// Byte offset (inside the K or V array) of byte `o` (16-byte aligned) of CTA `cta`'s K or V
// stream of 2 MiB.
template <Mode kMode>
__device__ __forceinline__ long long stream_offset(int cta, long long o, const int* table) {
  if constexpr (kMode == Mode::kContiguousPerHead) {  // [b][h][t][d]
    return 1LL * cta * kKvLen * kRowBytes + o;
  } else if constexpr (kMode == Mode::kPagedPerHead) {  // row h of every token
    const int b = cta / kKvHeads, h = cta % kKvHeads;
    const int token = static_cast<int>(o / kRowBytes);
    const int page = table[b * kPagesPerRequest + token / kPageSize];
    return 1LL * page * kPageBytes + (token % kPageSize) * kTokenBytes + h * kRowBytes +
           o % kRowBytes;
  } else if constexpr (kMode == Mode::kPagedPerHeadHnd) {  // pages [h][t][d]: 4 KiB of head h
    const int b = cta / kKvHeads, h = cta % kKvHeads;
    const int page = table[b * kPagesPerRequest + static_cast<int>(o / (kPageSize * kRowBytes))];
    return 1LL * page * kPageBytes + h * kPageSize * kRowBytes + o % (kPageSize * kRowBytes);
  } else {  // whole pages [64 e, 64 e + 64) of request b
    const int b = cta / kKvHeads, eighth = cta % kKvHeads;
    const int page = table[b * kPagesPerRequest + eighth * (kPagesPerRequest / kKvHeads) +
                           static_cast<int>(o / kPageBytes)];
    return 1LL * page * kPageBytes + o % kPageBytes;
  }
}

// kSyncEvery > 0: the CTAs of a thread-block cluster (the KV heads of one request, launched as
// one cluster) wait for each other every kSyncEvery stages, so that they read a page's rows
// together; a CTA may run at most kSyncEvery stages ahead of the slowest of its cluster.
template <Mode kMode, Copy kCopy, int kThreads, int kStages, int kStageBytes, int kMinBlocks,
          int kSyncEvery = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    stream_kv(const char* k, const char* v, const int* table, unsigned* checksum) {
  constexpr int kHalf = kStageBytes / 2;  // K's share of a stage; V's is the same
  constexpr int kStagesPerCta = kKvLen * kRowBytes / kHalf;
  constexpr int kChunksPerThread = kStageBytes / 16 / kThreads;
  static_assert(kStageBytes % (16 * kThreads) == 0, "whole chunks per thread");
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long full[kStages];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int cta = blockIdx.x, tid = threadIdx.x;
  if constexpr (kCopy == Copy::kBulk) {
    if (tid == 0) {
      for (int i = 0; i < kStages; ++i)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
            static_cast<uint32_t>(__cvta_generic_to_shared(&full[i]))));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  auto issue = [&](int s) {
    const uint32_t stage = base + (s % kStages) * kStageBytes;
    const long long first = 1LL * s * kHalf;
    if constexpr (kCopy == Copy::kCpAsync) {
#pragma unroll
      for (int i = 0; i < kChunksPerThread; ++i) {
        const int c = i * kThreads + tid;  // K's chunks, then V's
        const int half = c / (kHalf / 16), cc = c % (kHalf / 16);
        const long long off = stream_offset<kMode>(cta, first + cc * 16, table);
        copy16(stage + c * 16, (half ? v : k) + off);
      }
    } else if (tid < 32) {  // warp 0 issues the stage's spans
      constexpr int kSpan = kContiguousBytes<kMode> < kHalf ? kContiguousBytes<kMode> : kHalf;
      constexpr int kSpans = 2 * kHalf / kSpan;
      const uint32_t barrier =
          static_cast<uint32_t>(__cvta_generic_to_shared(&full[s % kStages]));
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // after the reads
      if (tid == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier),
                     "r"(kStageBytes)
                     : "memory");
      __syncwarp();
      for (int i = tid; i < kSpans; i += 32) {
        const int half = i / (kSpans / 2), ii = i % (kSpans / 2);
        const long long off = stream_offset<kMode>(cta, first + 1LL * ii * kSpan, table);
        bulk_copy(stage + half * kHalf + ii * kSpan, (half ? v : k) + off, kSpan, barrier);
      }
    }
  };
  unsigned sum = 0;
  for (int s = 0; s < kStages - 1; ++s) {
    issue(s);
    if constexpr (kCopy == Copy::kCpAsync) asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int s = 0; s < kStagesPerCta; ++s) {
    if constexpr (kSyncEvery > 0) {
      if (s % kSyncEvery == 0) {
        if (s > 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
      }
    }
    if (s + kStages - 1 < kStagesPerCta) issue(s + kStages - 1);
    if constexpr (kCopy == Copy::kCpAsync) {
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
      __syncthreads();
    } else {
      wait_parity(static_cast<uint32_t>(__cvta_generic_to_shared(&full[s % kStages])),
                  (s / kStages) & 1);
    }
    const uint4* stage = reinterpret_cast<const uint4*>(smem + (s % kStages) * kStageBytes);
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {  // another thread's chunks: the barrier matters
      const uint4 x = stage[(i * kThreads + (tid ^ 1))];
      sum += x.x + x.y + x.z + x.w;
    }
    __syncthreads();  // the stage is free before it is refilled
  }
  if constexpr (kSyncEvery > 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  atomicAdd(checksum, sum);
}

__global__ void fill(unsigned* words, long long n, unsigned seed) {
  for (long long i = blockIdx.x * 1LL * blockDim.x + threadIdx.x; i < n;
       i += 1LL * gridDim.x * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    words[i] = x ^ (x >> 13);
  }
}

__global__ void reduce(const unsigned* words, long long n, unsigned* total) {
  unsigned sum = 0;
  for (long long i = blockIdx.x * 1LL * blockDim.x + threadIdx.x; i < n;
       i += 1LL * gridDim.x * blockDim.x)
    sum += words[i];
  atomicAdd(total, sum);
}

struct Run {
  std::string geometry, pattern;
  void (*kernel)(const char*, const char*, const int*, unsigned*);
  int threads, smem;
  int cluster;  // CTAs per thread-block cluster; 1: no cluster
  const char *k, *v;
  const int* table;
};

struct Buffers {
  const char *k_pool, *v_pool, *k_contig, *v_contig;
  const int *in_order, *shuffled;
};

template <Copy kCopy, int kThreads, int kStages, int kStageBytes, int kMinBlocks>
void add_geometry(std::vector<Run>& runs, const Buffers& b) {
  char geometry[96];
  std::snprintf(geometry, sizeof(geometry), "%s %d thr %dx%d KiB %d/SM",
                kCopy == Copy::kBulk ? "bulk" : "cp.async", kThreads, kStages,
                kStageBytes / 1024, kMinBlocks);
  const int smem = kStages * kStageBytes;
  auto add = [&](auto kernel, const char* what, const char* k, const char* v, const int* table) {
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    runs.push_back({geometry, what, kernel, kThreads, smem, 1, k, v, table});
  };
  using enum Mode;
  add(stream_kv<kContiguousPerHead, kCopy, kThreads, kStages, kStageBytes, kMinBlocks>,
      "contiguous/head", b.k_contig, b.v_contig, nullptr);
  add(stream_kv<kPagedPerHead, kCopy, kThreads, kStages, kStageBytes, kMinBlocks>,
      "paged/head, pool order", b.k_pool, b.v_pool, b.in_order);
  add(stream_kv<kPagedPerHead, kCopy, kThreads, kStages, kStageBytes, kMinBlocks>,
      "paged/head, shuffled", b.k_pool, b.v_pool, b.shuffled);
  add(stream_kv<kPagedPerHeadHnd, kCopy, kThreads, kStages, kStageBytes, kMinBlocks>,
      "paged/head HND, shuffled", b.k_pool, b.v_pool, b.shuffled);
  add(stream_kv<kPagedWholePage, kCopy, kThreads, kStages, kStageBytes, kMinBlocks>,
      "paged/page, shuffled", b.k_pool, b.v_pool, b.shuffled);
}

// flare's tensor-core geometry, a CTA per (request, KV head), the 8 heads of a request launched
// as one cluster (co-scheduled in one GPC), with their reads kept together every N stages.
template <int kSyncEvery>
void add_clustered(std::vector<Run>& runs, const Buffers& b, const int* table, const char* what) {
  auto kernel = stream_kv<Mode::kPagedPerHead, Copy::kCpAsync, 128, 3, 32768, 2, kSyncEvery>;
  const int smem = 3 * 32768;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  char geometry[96];
  std::snprintf(geometry, sizeof(geometry), "cp.async 128 thr 3x32 KiB 2/SM, clusters of 8, sync %d",
                kSyncEvery);
  runs.push_back({geometry, what, kernel, 128, smem, kKvHeads, b.k_pool, b.v_pool, table});
}

void launch(const Run& run, long long copy, unsigned* checksum) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kCtas);
  config.blockDim = dim3(run.threads);
  config.dynamicSmemBytes = run.smem;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = run.cluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = run.cluster > 1 ? 1 : 0;
  CHECK_CUDA(cudaLaunchKernelEx(&config, run.kernel, run.k + copy * kPoolBytes,
                                run.v + copy * kPoolBytes, run.table, checksum));
}

}  // namespace

// Options: --all (every geometry; default: flare's tensor-core loop's and one of 6 x 16 KiB),
// --flare-only (only the tensor-core loop's, one-head and whole-page items), --clusters (the cluster runs), --rounds N
// (default 3), --json PATH (one line per run: geometry, pattern, median over every round).
int main(int argc, char** argv) {
  bool all = false, flare_only = false, clusters = false;
  int rounds = 3;
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--all") all = true;
    else if (arg == "--flare-only") flare_only = true;
    else if (arg == "--clusters") clusters = true;
    else if (arg == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
    else {
      std::printf("unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  char *k_pool, *v_pool, *k_contig, *v_contig;
  int *table_in_order, *table_shuffled;
  unsigned* checksum;
  CHECK_CUDA(cudaMalloc(&k_pool, kCopies * kPoolBytes));
  CHECK_CUDA(cudaMalloc(&v_pool, kCopies * kPoolBytes));
  CHECK_CUDA(cudaMalloc(&k_contig, kCopies * kPoolBytes));
  CHECK_CUDA(cudaMalloc(&v_contig, kCopies * kPoolBytes));
  CHECK_CUDA(cudaMalloc(&table_in_order, kPoolPages * sizeof(int)));
  CHECK_CUDA(cudaMalloc(&table_shuffled, kPoolPages * sizeof(int)));
  CHECK_CUDA(cudaMalloc(&checksum, sizeof(unsigned)));
  const long long words = kPoolBytes / 4;
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(k_pool), words, 1u);
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(v_pool), words, 2u);
  CHECK_CUDA(cudaGetLastError());
  for (long long c = 0; c < kCopies; ++c) {
    if (c > 0) {
      CHECK_CUDA(cudaMemcpy(k_pool + c * kPoolBytes, k_pool, kPoolBytes, cudaMemcpyDeviceToDevice));
      CHECK_CUDA(cudaMemcpy(v_pool + c * kPoolBytes, v_pool, kPoolBytes, cudaMemcpyDeviceToDevice));
    }
    CHECK_CUDA(cudaMemcpy(k_contig + c * kPoolBytes, k_pool, kPoolBytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaMemcpy(v_contig + c * kPoolBytes, v_pool, kPoolBytes, cudaMemcpyDeviceToDevice));
  }
  CHECK_CUDA(cudaMemset(checksum, 0, sizeof(unsigned)));
  reduce<<<1024, 256>>>(reinterpret_cast<const unsigned*>(k_pool), words, checksum);
  reduce<<<1024, 256>>>(reinterpret_cast<const unsigned*>(v_pool), words, checksum);
  CHECK_CUDA(cudaGetLastError());
  unsigned expected = 0;
  CHECK_CUDA(cudaMemcpy(&expected, checksum, sizeof(unsigned), cudaMemcpyDeviceToHost));

  std::vector<int> pages(kPoolPages);
  std::iota(pages.begin(), pages.end(), 0);
  CHECK_CUDA(cudaMemcpy(table_in_order, pages.data(), kPoolPages * sizeof(int),
                        cudaMemcpyHostToDevice));
  std::mt19937 rng(12345);
  std::shuffle(pages.begin(), pages.end(), rng);
  CHECK_CUDA(cudaMemcpy(table_shuffled, pages.data(), kPoolPages * sizeof(int),
                        cudaMemcpyHostToDevice));

  const Buffers buffers{k_pool, v_pool, k_contig, v_contig, table_in_order, table_shuffled};
  std::vector<Run> runs;
  add_geometry<Copy::kCpAsync, 128, 3, 32768, 2>(runs, buffers);  // flare's tensor-core loop
  add_geometry<Copy::kCpAsync, 256, 3, 65536, 1>(runs, buffers);  // its whole-page items of 8
  if (!flare_only) add_geometry<Copy::kCpAsync, 128, 6, 16384, 2>(runs, buffers);
  if (clusters) {
    add_clustered<0>(runs, buffers, table_shuffled, "paged/head, shuffled");
    add_clustered<1>(runs, buffers, table_shuffled, "paged/head, shuffled");
    add_clustered<4>(runs, buffers, table_shuffled, "paged/head, shuffled");
    add_clustered<16>(runs, buffers, table_shuffled, "paged/head, shuffled");
    add_clustered<4>(runs, buffers, table_in_order, "paged/head, pool order");
  }
  if (all) {
    add_geometry<Copy::kCpAsync, 128, 3, 16384, 4>(runs, buffers);  // its CUDA-core loop
    add_geometry<Copy::kBulk, 128, 3, 32768, 2>(runs, buffers);
    add_geometry<Copy::kBulk, 128, 4, 16384, 3>(runs, buffers);
    add_geometry<Copy::kBulk, 128, 6, 32768, 1>(runs, buffers);
  }

  constexpr int kReps = 15;
  std::vector<std::vector<float>> samples(runs.size());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  const double bytes = 2.0 * kPoolBytes;
  std::printf("%d CTAs of %d tokens, %.0f MiB read per launch, %lld copies\n", kCtas, kKvLen,
              bytes / (1 << 20), kCopies);
  for (int round = 0; round < rounds; ++round) {
    for (size_t r = 0; r < runs.size(); ++r) {
      const Run& run = runs[r];
      std::vector<float> ms(kReps);
      for (int rep = 0; rep < kReps; ++rep) {
        CHECK_CUDA(cudaMemset(checksum, 0, sizeof(unsigned)));
        CHECK_CUDA(cudaEventRecord(start));
        launch(run, rep % kCopies, checksum);
        CHECK_CUDA(cudaEventRecord(stop));
        CHECK_CUDA(cudaEventSynchronize(stop));
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaEventElapsedTime(&ms[rep], start, stop));
        unsigned got = 0;
        CHECK_CUDA(cudaMemcpy(&got, checksum, sizeof(unsigned), cudaMemcpyDeviceToHost));
        if (got != expected) {
          std::printf("%s | %s: checksum %08x, expected %08x\n", run.geometry.c_str(),
                      run.pattern.c_str(), got, expected);
          return 1;
        }
      }
      samples[r].insert(samples[r].end(), ms.begin(), ms.end());
      std::sort(ms.begin(), ms.end());
      const double median_us = ms[kReps / 2] * 1e3;
      std::printf("round %d  %-34s | %-26s %8.1f us  %.3f TB/s\n", round, run.geometry.c_str(),
                  run.pattern.c_str(), median_us, bytes / (median_us * 1e-6) / 1e12);
    }
  }
  if (json_path != nullptr) {
    FILE* json = std::fopen(json_path, "w");
    if (json == nullptr) {
      std::printf("cannot write %s\n", json_path);
      return 1;
    }
    for (size_t r = 0; r < runs.size(); ++r) {
      std::sort(samples[r].begin(), samples[r].end());
      const double median_us = samples[r][samples[r].size() / 2] * 1e3;
      std::fprintf(json,
                   "{\"geometry\": \"%s\", \"pattern\": \"%s\", \"median_us\": %.2f, "
                   "\"tbps\": %.4f}\n",
                   runs[r].geometry.c_str(), runs[r].pattern.c_str(), median_us,
                   bytes / (median_us * 1e-6) / 1e12);
    }
    std::fclose(json);
  }
  return 0;
}
