// Does compute-sanitizer racecheck see an mbarrier's release by every arriving warp? The Hopper
// prefill's item hand-off (kernels/prefill_hopper.cuh run()): every consumer thread reads a
// shared slot, each warp's lane 0 arrives on a count-8 mbarrier after __syncwarp, the producer
// waits on it and rewrites the slot. Correct by the PTX memory model (bar.warp.sync orders the
// lanes' accesses, arrive releases, try_wait acquires); racecheck reported it as a WAR hazard
// intermittently (docs/perf.md, fortieth session). Mode 0: every lane reads the slot (the
// kernel's pattern); mode 1: lane 0 reads it and shuffles it to the warp; mode 2: mode 0 with a
// CTA barrier (bar.sync) between the consumers' reads and their arrivals. Delays vary the arrival
// order. Build: nvcc -arch=sm_90a -o probe experiments/racecheck_mbarrier_probe.cu Run:
// compute-sanitizer --tool racecheck ./probe <mode>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(unsigned long long* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count));
}
__device__ __forceinline__ void bar_arrive(unsigned long long* b) {
  asm volatile("{ .reg .b64 s; mbarrier.arrive.shared::cta.b64 s, [%0]; }" ::"r"(smem_addr(b))
               : "memory");
}
__device__ __forceinline__ void bar_wait(unsigned long long* b, unsigned parity) {
  asm volatile(
      "{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }" ::"r"(
          smem_addr(b)),
      "r"(parity)
      : "memory");
}
__device__ void spin(unsigned cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

constexpr int kConsumerWarps = 8;
constexpr int kItems = 64;

__global__ void probe(int mode, int* out) {
  __shared__ unsigned long long ready[2], released;
  __shared__ int slot[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    bar_init(&ready[0], 1);
    bar_init(&ready[1], 1);
    bar_init(&released, kConsumerWarps);
    slot[0] = 0;
  }
  __syncthreads();
  int sum = 0;
  if (warp == kConsumerWarps) {  // producer: slot n % 2 holds item n; rewritten for n + 2
    unsigned parity = 0;
    for (int n = 0; n <= kItems; ++n) {
      bar_wait(&released, parity);
      parity ^= 1u;
      if (lane == 0) bar_arrive(&ready[n & 1]);
      if (n == kItems) break;
      if (lane == 0) slot[(n + 1) & 1] = n + 1 < kItems ? n + 1 : -1;  // while item n "loads"
      __syncwarp();
    }
  } else {
    if (lane == 0) bar_arrive(&released);  // the slot starts free
    for (int n = 0;; ++n) {
      bar_wait(&ready[n & 1], (n >> 1) & 1u);
      int entry;
      if (mode == 1) {
        int v = 0;
        if (lane == 0) v = slot[n & 1];
        entry = __shfl_sync(0xffffffffu, v, 0);
      } else {
        entry = slot[n & 1];
      }
      if (entry < 0) break;
      if (mode == 2) asm volatile("bar.sync 1, 256;" ::: "memory");
      spin(((warp * 7 + n * 13) % 11) * 50);  // the item's work: arrival order varies
      sum += entry;
      __syncwarp();
      if (lane == 0) bar_arrive(&released);
    }
  }
  if (threadIdx.x % 32 == 0) atomicAdd(out, sum);
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  int* out;
  cudaMalloc(&out, sizeof(int));
  cudaMemset(out, 0, sizeof(int));
  probe<<<4, (kConsumerWarps + 1) * 32>>>(mode, out);
  int host = 0;
  const cudaError_t err = cudaMemcpy(&host, out, sizeof(int), cudaMemcpyDeviceToHost);
  const int expected = 4 * kConsumerWarps * (kItems * (kItems - 1) / 2);
  std::printf("mode %d: %s, sum %d (expected %d)\n", mode, cudaGetErrorString(err), host, expected);
  return err == cudaSuccess && host == expected ? 0 : 1;
}
