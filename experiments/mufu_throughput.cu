// Special-function-unit throughput on this GPU, in elements per SM per clock, for the operations
// a soft-capped softmax takes per logit: tanh.approx.{f32,f16x2,bf16x2} and ex2.approx.{f32,f16x2}
// (with the packing conversions the packed forms need). Question (docs/perf.md, soft-cap): do the
// packed forms run two elements per MUFU slot, which would halve the soft-cap's tanh cost?
// Build + run (GPU machine): nvcc -O3 -arch=sm_90a experiments/mufu_throughput.cu -o /tmp/mufu &&
//   /tmp/mufu && cuobjdump -sass /tmp/mufu | grep -oE "MUFU\.[A-Z0-9.]+|F2FP[A-Z0-9.]*|HADD2[A-Z0-9.]*" | sort | uniq -c
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                    \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                           \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

constexpr int kChains = 8, kIters = 4096;

__device__ __forceinline__ float tanh_f32(float x) {
  float y;
  asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float ex2_f32(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned tanh_f16x2(unsigned x) {
  unsigned y;
  asm volatile("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ unsigned tanh_bf16x2(unsigned x) {
  unsigned y;
  asm volatile("tanh.approx.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ unsigned ex2_f16x2(unsigned x) {
  unsigned y;
  asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// kind 0 tanh f32, 1 ex2 f32, 2 tanh f16x2, 3 tanh bf16x2, 4 ex2 f16x2,
// 5 tanh f16x2 with f32 in and out (cvt.rn.f16x2.f32 + tanh + two cvt.f32.f16): the soft-cap's use;
// 6 / 7 the softmax's exp2 of two logits to a bf16x2 P fragment and an f32 sum, f16x2 / f32 ex2
template <int kKind>
__global__ void spin(float* out, float seed) {
  float f[2 * kChains];
  unsigned u[kChains];
  for (int c = 0; c < 2 * kChains; ++c) f[c] = seed * (threadIdx.x + c + 1) * 1e-3f;
  for (int c = 0; c < kChains; ++c) {
    __half2 h = __floats2half2_rn(f[2 * c], f[2 * c + 1]);
    u[c] = *reinterpret_cast<unsigned*>(&h);
  }
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if (kKind == 0) { f[2 * c] = tanh_f32(f[2 * c]); f[2 * c + 1] = tanh_f32(f[2 * c + 1]); }
      if (kKind == 1) { f[2 * c] = ex2_f32(-f[2 * c]); f[2 * c + 1] = ex2_f32(-f[2 * c + 1]); }
      if (kKind == 2) u[c] = tanh_f16x2(u[c]);
      if (kKind == 3) u[c] = tanh_bf16x2(u[c]);
      if (kKind == 4) u[c] = ex2_f16x2(u[c] ^ 0x80008000u);
      if (kKind == 5) {
        __half2 h = __floats2half2_rn(f[2 * c], f[2 * c + 1]);
        unsigned t = tanh_f16x2(*reinterpret_cast<unsigned*>(&h));
        float2 r = __half22float2(*reinterpret_cast<__half2*>(&t));
        f[2 * c] = r.x * 1.5f; f[2 * c + 1] = r.y * 1.5f;
      }
      if (kKind == 6) {  // the softmax's use: f32 in, sum in f32, bf16x2 out for the P.V MMA
        __half2 h = __floats2half2_rn(f[2 * c] - 4.0f, f[2 * c + 1] - 4.0f);
        unsigned t = ex2_f16x2(*reinterpret_cast<unsigned*>(&h));
        float2 r = __half22float2(*reinterpret_cast<__half2*>(&t));
        __nv_bfloat162 b = __floats2bfloat162_rn(r.x, r.y);
        u[c] ^= *reinterpret_cast<unsigned*>(&b);
        f[2 * c] = r.x + r.y; f[2 * c + 1] = r.y * 0.5f;
      }
      if (kKind == 7) {  // the same with ex2.approx.f32 twice (today's softmax)
        float x0 = ex2_f32(f[2 * c] - 4.0f), x1 = ex2_f32(f[2 * c + 1] - 4.0f);
        __nv_bfloat162 b = __floats2bfloat162_rn(x0, x1);
        u[c] ^= *reinterpret_cast<unsigned*>(&b);
        f[2 * c] = x0 + x1; f[2 * c + 1] = x1 * 0.5f;
      }
    }
  }
  float acc = 0;
  for (int c = 0; c < 2 * kChains; ++c) acc += f[c];
  for (int c = 0; c < kChains; ++c) acc += __uint_as_float(u[c] & 0x3fff3fffu);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int kKind>
void measure(const char* name, float* out, int blocks, int threads, int sms, int clock_khz) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  spin<kKind><<<blocks, threads>>>(out, 0.5f);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(a));
  for (int r = 0; r < 5; ++r) spin<kKind><<<blocks, threads>>>(out, 0.5f);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double elements = 5.0 * blocks * threads * kIters * 2.0 * kChains;
  const double clocks = ms * 1e-3 * clock_khz * 1e3;
  std::printf("%-28s %8.3f ms  %6.2f elements / SM / clock (at %d MHz)\n", name, ms,
              elements / clocks / sms, clock_khz / 1000);
}

int main() {
  int sms = 0, clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  float* out;
  const int blocks = sms * 8, threads = 256;
  CHECK(cudaMalloc(&out, sizeof(float) * blocks * threads));
  measure<0>("tanh.approx.f32", out, blocks, threads, sms, clock_khz);
  measure<1>("ex2.approx.ftz.f32", out, blocks, threads, sms, clock_khz);
  measure<2>("tanh.approx.f16x2", out, blocks, threads, sms, clock_khz);
  measure<3>("tanh.approx.bf16x2", out, blocks, threads, sms, clock_khz);
  measure<4>("ex2.approx.f16x2", out, blocks, threads, sms, clock_khz);
  measure<5>("tanh f16x2 from/to f32", out, blocks, threads, sms, clock_khz);
  measure<6>("softmax ex2 f16x2 -> bf16x2", out, blocks, threads, sms, clock_khz);
  measure<7>("softmax ex2 f32 -> bf16x2", out, blocks, threads, sms, clock_khz);
  CHECK(cudaFree(out));
  return 0;
}
