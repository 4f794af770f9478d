// The megakernel's synchronization and memory primitives (sm_90): mbarriers and 1-D bulk async
// copies for the weight pipeline, device counters between CTAs, loads that bypass L1 for data
// other CTAs wrote during the launch, bf16 packing and the warp-level tensor-core product.
#pragma once

#include "llama_decode_params.cuh"

namespace flare::llama::dev {

constexpr int kHeadDim = FLARE_LLAMA_HEAD_DIM;
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// --- mbarriers and bulk copies (the producer warp fills stages; consumers release them)
__device__ __forceinline__ void mbar_init(unsigned bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Weights are read once per step: evict them first so the KV cache and activations stay in L2.
__device__ __forceinline__ unsigned long long evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar, unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// --- the 8 consumer warps' own barrier (the producer warp never joins it)
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumerWarps * 32) : "memory");
}

// --- device counters between CTAs
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void signal_release(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p) : "memory");
}
__device__ __forceinline__ unsigned long long global_time_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;\n" : "=l"(t));
  return t;
}

// Every consumer thread's writes are published, then one thread adds 1 to `counter`.
__device__ __forceinline__ void consumers_signal(unsigned* counter) {
  __threadfence();
  consumers_sync();
  if (threadIdx.x == 0) signal_release(counter);
}

// The consumers wait until `counter` reaches `target`. A wait of more than 10 s means a CTA
// was never scheduled or a counter was never signalled: the step traps (error 3) instead of
// hanging the device.
__device__ __forceinline__ void consumers_wait(const unsigned* counter, unsigned target,
                                               int32_t* error) {
  if (threadIdx.x == 0 && load_acquire(counter) < target) {
    const unsigned long long start = global_time_ns();
    while (load_acquire(counter) < target) {
      __nanosleep(32);
      if (global_time_ns() - start > 10000000000ull) {
        atomicExch(error, 3);
        __threadfence_system();
        __trap();
      }
    }
  }
  consumers_sync();
}

// --- 16-byte loads of data written during the launch (L2, never a stale L1 line)
__device__ __forceinline__ uint4 load_cg(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

// --- bf16
__device__ __forceinline__ float bf16_to_float(unsigned short bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16);
}
__device__ __forceinline__ unsigned short float_to_bf16(float v) {
  unsigned short out;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(out) : "f"(v));
  return out;
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
__device__ __forceinline__ float bf16_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

// d += a (16x16 row) * b (16x8 col), bf16 in, float32 accumulators (mma.m16n8k16).
__device__ __forceinline__ void mma_bf16(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace flare::llama::dev
