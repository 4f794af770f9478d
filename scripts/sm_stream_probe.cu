// SM-topology probe (an experiment behind docs/perf.md's decode section; not part of the library).
// Question: do SMs stream KV at different rates because of where they sit (GPC / CPC), and would
// a plan that gives faster SMs more bytes finish sooner?
//  1. SM groups sharing a GPC, from thread-block clusters (a cluster's CTAs share a GPC): one
//     CTA per SM, clusters of 16 / 9 / 8 / 6 / 4 / 3 / 2, union of the SMs of each cluster.
//  2. A decode-like stream: 4 CTAs of 128 threads per SM, a 3-stage cp.async pipeline of 16 KiB
//     stages (flare's bf16 decode geometry), each CTA reading 4 MiB from randomly placed 32 KiB
//     pages of a 3 GiB pool; per-SM end times printed by group.
//  3. The same total bytes with each SM's share proportional to its measured rate (1 / its end
//     time in 2), CTAs mapped to SMs at run time through %smid: the balanced plan's gain.
// Build and run on the GPU machine: nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/probe
//   scripts/sm_stream_probe.cu && /tmp/probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    const cudaError_t error = (call);                                                       \
    if (error != cudaSuccess) {                                                             \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(error), __FILE__, __LINE__); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace {

constexpr int kThreads = 128, kStages = 3, kStageBytes = 16384, kCtasPerSm = 4;
constexpr int kChunksPerThread = kStageBytes / 16 / kThreads;
constexpr long long kPageBytes = 32768, kRegionPages = 160;  // a CTA's pages: 5 MiB at most
constexpr int kUniformTiles = 256;                            // 4 MiB: one b64 kv8192 item

__device__ unsigned sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void cluster_probe(int* sm_of_block, unsigned spin_ns) {
  if (threadIdx.x == 0) {
    sm_of_block[blockIdx.x] = static_cast<int>(sm_id());
    const unsigned long long start = global_ns();
    while (global_ns() - start < spin_ns) {
    }
  }
}

// tiles_per_sm == nullptr: every CTA streams kUniformTiles from region blockIdx.x. Otherwise a
// CTA takes slot (its SM, arrival order on it) and that SM's tile count.
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    stream(const unsigned char* pool, const int* page_of, const int* tiles_per_sm,
           int* arrivals, float* sink, unsigned long long* trace) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int slot_shared, tiles_shared;
  const unsigned sm = sm_id();
  if (threadIdx.x == 0) {
    slot_shared = static_cast<int>(blockIdx.x);
    tiles_shared = kUniformTiles;
    if (tiles_per_sm != nullptr) {
      slot_shared = static_cast<int>(sm) * kCtasPerSm + atomicAdd(&arrivals[sm], 1) % kCtasPerSm;
      tiles_shared = tiles_per_sm[sm];
    }
  }
  __syncthreads();
  const unsigned long long start = global_ns();
  const int slot = slot_shared, tiles = tiles_shared;
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const auto issue = [&](int tile) {
    if (tile < tiles) {
      const long long page = page_of[slot * kRegionPages + tile / 2];
      const unsigned char* src = pool + page * kPageBytes + (tile & 1) * kStageBytes;
      const unsigned dst = base + (tile % kStages) * kStageBytes;
      for (int i = 0; i < kChunksPerThread; ++i) {
        const int offset = (i * kThreads + threadIdx.x) * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + offset),
                     "l"(src + offset)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  float acc = 0.0f;
  for (int t = 0; t < kStages - 1; ++t) issue(t);
  for (int t = 0; t < tiles; ++t) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    acc += reinterpret_cast<const float*>(smem + (t % kStages) * kStageBytes)[threadIdx.x * 4];
    __syncthreads();
    issue(t + kStages - 1);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (acc == 12345.0f) sink[0] = acc;  // keeps the reads
  if (threadIdx.x == 0) {
    trace[3 * blockIdx.x] = sm;
    trace[3 * blockIdx.x + 1] = start;
    trace[3 * blockIdx.x + 2] = global_ns();
  }
}

int find_root(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

std::vector<int> gpc_groups(int num_sms) {
  std::vector<int> parent(num_sms);
  std::iota(parent.begin(), parent.end(), 0);
  int* sm_of_block;
  CHECK_CUDA(cudaMalloc(&sm_of_block, 4096 * sizeof(int)));
  constexpr int kOneCtaPerSm = 200 * 1024;  // dynamic shared memory
  CHECK_CUDA(cudaFuncSetAttribute(cluster_probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CHECK_CUDA(cudaFuncSetAttribute(cluster_probe, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kOneCtaPerSm));
  for (int size : {16, 9, 8, 6, 4, 3, 2}) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = size;
    attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(32);
    config.gridDim = dim3(size);
    config.dynamicSmemBytes = kOneCtaPerSm;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveClusters(&clusters, cluster_probe, &config));
    std::printf("clusters of %2d: %3d resident (%d SMs)\n", size, clusters, clusters * size);
    if (clusters == 0) continue;
    config.gridDim = dim3(clusters * size);
    for (int rep = 0; rep < 4; ++rep) {
      CHECK_CUDA(cudaLaunchKernelEx(&config, cluster_probe, sm_of_block, 200000u));
      CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<int> sms(static_cast<size_t>(clusters) * size);
      CHECK_CUDA(cudaMemcpy(sms.data(), sm_of_block, sms.size() * 4, cudaMemcpyDeviceToHost));
      for (int c = 0; c < clusters; ++c) {
        for (int i = 1; i < size; ++i) {
          parent[find_root(parent, sms[c * size + i])] = find_root(parent, sms[c * size]);
        }
      }
    }
  }
  CHECK_CUDA(cudaFree(sm_of_block));
  std::vector<int> group(num_sms);
  std::map<int, int> number;
  for (int s = 0; s < num_sms; ++s) {
    const int root = find_root(parent, s);
    group[s] = number.emplace(root, static_cast<int>(number.size())).first->second;
  }
  return group;
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int num_sms = prop.multiProcessorCount, slots = num_sms * kCtasPerSm;
  std::printf("%s, %d SMs\n", prop.name, num_sms);
  const std::vector<int> group = gpc_groups(num_sms);

  const size_t pool_bytes = size_t{3} << 30;
  const long long pool_pages = static_cast<long long>(pool_bytes / kPageBytes);
  if (slots * kRegionPages > pool_pages) {
    std::printf("pool too small for %d CTAs\n", slots);
    return 1;
  }
  unsigned char* pool;
  CHECK_CUDA(cudaMalloc(&pool, pool_bytes));
  CHECK_CUDA(cudaMemset(pool, 0x3c, pool_bytes));
  std::vector<int> page_of(static_cast<size_t>(pool_pages));
  std::iota(page_of.begin(), page_of.end(), 0);
  std::shuffle(page_of.begin(), page_of.end(), std::mt19937(7));
  int *page_of_device, *tiles_device, *arrivals;
  float* sink;
  unsigned long long* trace_device;
  CHECK_CUDA(cudaMalloc(&page_of_device, page_of.size() * 4));
  CHECK_CUDA(cudaMemcpy(page_of_device, page_of.data(), page_of.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&tiles_device, num_sms * 4));
  CHECK_CUDA(cudaMalloc(&arrivals, num_sms * 4));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  CHECK_CUDA(cudaMalloc(&trace_device, slots * 3 * 8));
  CHECK_CUDA(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kStages * kStageBytes));
  cudaEvent_t begin, end;
  CHECK_CUDA(cudaEventCreate(&begin));
  CHECK_CUDA(cudaEventCreate(&end));

  // Median time of 15 launches; per-SM mean CTA end (us after the first CTA's start).
  const auto measure = [&](const int* tiles_per_sm, std::vector<double>& sm_end) {
    std::vector<float> us;
    for (int rep = 0; rep < 15; ++rep) {
      CHECK_CUDA(cudaMemset(arrivals, 0, num_sms * 4));
      CHECK_CUDA(cudaEventRecord(begin));
      stream<<<slots, kThreads, kStages * kStageBytes>>>(pool, page_of_device, tiles_per_sm,
                                                         arrivals, sink, trace_device);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaEventRecord(end));
      CHECK_CUDA(cudaEventSynchronize(end));
      float ms;
      CHECK_CUDA(cudaEventElapsedTime(&ms, begin, end));
      us.push_back(ms * 1000);
    }
    std::vector<unsigned long long> trace(static_cast<size_t>(slots) * 3);
    CHECK_CUDA(cudaMemcpy(trace.data(), trace_device, trace.size() * 8, cudaMemcpyDeviceToHost));
    unsigned long long first = ~0ull;
    for (int c = 0; c < slots; ++c) first = std::min(first, trace[3 * c + 1]);
    sm_end.assign(num_sms, 0.0);
    std::vector<int> ctas(num_sms, 0);
    for (int c = 0; c < slots; ++c) {
      sm_end[trace[3 * c]] += (trace[3 * c + 2] - first) / 1000.0;
      ++ctas[trace[3 * c]];
    }
    for (int s = 0; s < num_sms; ++s) sm_end[s] /= std::max(ctas[s], 1);
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };

  std::vector<double> uniform_end, weighted_end;
  const double uniform_us = measure(nullptr, uniform_end);
  std::printf("uniform: %.1f us, %.2f TB/s; mean CTA end per SM (us), by cluster group:\n",
              uniform_us, double(slots) * kUniformTiles * kStageBytes / (uniform_us * 1e6));
  for (int g = 0; g <= *std::max_element(group.begin(), group.end()); ++g) {
    std::printf("  group %d:", g);
    for (int s = 0; s < num_sms; ++s) {
      if (group[s] == g) std::printf(" %d:%.0f", s, uniform_end[s]);
    }
    std::printf("\n");
  }
  double rate_sum = 0;
  for (double e : uniform_end) rate_sum += 1.0 / e;
  std::vector<int> tiles(num_sms);
  long long total = 0;
  for (int s = 0; s < num_sms; ++s) {
    tiles[s] = std::min<int>(2 * kRegionPages,
                             static_cast<int>(kUniformTiles * num_sms / rate_sum / uniform_end[s]));
    total += tiles[s];
  }
  CHECK_CUDA(cudaMemcpy(tiles_device, tiles.data(), num_sms * 4, cudaMemcpyHostToDevice));
  for (int round = 0; round < 2; ++round) {
    const double u = measure(nullptr, uniform_end);
    const double w = measure(tiles_device, weighted_end);
    std::printf("round %d: uniform %.1f us (SM ends %.0f..%.0f); weighted by measured rate %.1f us"
                " (SM ends %.0f..%.0f; %.4f of the uniform bytes)\n",
                round, u, *std::min_element(uniform_end.begin(), uniform_end.end()),
                *std::max_element(uniform_end.begin(), uniform_end.end()), w,
                *std::min_element(weighted_end.begin(), weighted_end.end()),
                *std::max_element(weighted_end.begin(), weighted_end.end()),
                double(total) / (double(num_sms) * kUniformTiles));
  }
  return 0;
}
