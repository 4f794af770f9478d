// The megakernel's synchronization and memory primitives (sm_90): 1-D bulk async copies for the
// weight pipeline (on kernels/mbarrier.cuh's barriers), the consumer warps' named barrier,
// device counters between CTAs, loads that bypass L1 for data other CTAs wrote during the
// launch, and scalar bf16 conversions. Pair conversions, -inf and the tensor-core product are
// decode_utils.cuh's and mma_utils.cuh's.
#pragma once

#include "llama_decode_params.cuh"
#include "mbarrier.cuh"
#include "mma_utils.cuh"

namespace flare::llama::dev {

constexpr int kHeadDim = FLARE_LLAMA_HEAD_DIM;
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
constexpr int kWeightBits = FLARE_LLAMA_WEIGHT_BITS;  // the layers' projections: 16 or 4
// Steps this launch runs: p.num_steps in the generate() kernel, 1 (a constant: no loop) in
// step()'s.
__device__ __forceinline__ int launch_steps(const DecodeParams& p) {
  return FLARE_LLAMA_MULTI_STEP ? p.num_steps : 1;
}
static_assert(kWeightBits == 16 || kWeightBits == 4, "bf16 or 4-bit weights");

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// --- bulk copies (the producer warp fills stages; consumers release them)
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
__device__ __forceinline__ void consumers_sync() { sm90::named_sync<1, kConsumerWarps * 32>(); }

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

// --- 16-byte shared-memory accesses by address (the weight stages and activation rows)
__device__ __forceinline__ uint4 shared_load_v4(unsigned address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address));
  return v;
}
__device__ __forceinline__ void shared_store_v4(unsigned address, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
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
// Eight bf16 (one 16-byte vector) -> float32.
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&out)[8]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) bf16x2_to_float2(words[i], out[2 * i], out[2 * i + 1]);
}

}  // namespace flare::llama::dev
