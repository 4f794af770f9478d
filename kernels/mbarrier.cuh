// mbarriers and named barriers (sm_90): the primitives of warp-specialized kernels, shared by
// the Hopper prefill family (kernels/wgmma.cuh re-exports them) and the decode megakernel
// (kernels/llama_decode_sync.cuh).
#pragma once

namespace flare::sm90 {

__device__ __forceinline__ void barrier_init(unsigned address, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(address), "r"(count) : "memory");
}
// One arrival (release: this thread's earlier writes, and what barriers ordered before them, are
// visible to whoever waits for the phase it completes).
__device__ __forceinline__ void barrier_arrive(unsigned address) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(address) : "memory");
}
// Waits until the phase of parity `parity` completed (acquire).
__device__ __forceinline__ void barrier_wait(unsigned address, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n}\n" ::"r"(address),
      "r"(parity)
      : "memory");
}
// One arrival that also expects `bytes` of bulk copies to complete on the barrier.
__device__ __forceinline__ void barrier_arrive_expect(unsigned address, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(address), "r"(bytes)
               : "memory");
}
// Makes barrier initializations visible to the async proxy (bulk copies completing on them).
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// A barrier among `kThreads` threads of whole warps (ids 1-15; 0 is __syncthreads').
template <int kId, int kThreads>
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
// The same with the barrier id in a register (ping-pong: a warpgroup's own barrier), and the
// arrive half: counts toward the barrier's kThreads without waiting.
template <int kThreads>
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
}  // namespace flare::sm90
