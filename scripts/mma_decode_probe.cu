// Tensor-core decode loop probe (an experiment behind docs/perf.md's decode section; not part of
// the library): how fast would a decode kernel stream paged KV if its loop issued mma.sync
// instead of CUDA-core FMAs? b64 kv8192-shaped batch (bf16, 32 query / 8 KV heads, D 128,
// NHD pages of 16 tokens randomly placed in a 3 GiB pool); one CTA per (request, KV head).
//
// Per warp and 16-token slice of a 64-token tile:
//   S^T = K Q^T   (M = 16 tokens, N = 8 query rows of which 4 are the head group, K = 128 dims:
//                  8 ldmatrix.x4 of K + 8 mma; Q^T lives in registers as B fragments)
//   online softmax on the accumulator (rows are columns: 3 shuffles per row max)
//   P^T: accumulator layout -> B fragment by movmatrix.trans (2 per slice)
//   O^T += V^T P^T (M = 128 dims in 8 m-tiles, K = 16 tokens: 8 ldmatrix.x4.trans + 8 mma)
// K/V stages are XOR-swizzled by 16-byte chunk so ldmatrix is conflict-free. The four warps'
// states combine through shared memory at the end; a few (request, head) outputs are checked
// against a float64 CPU reference.
// Build and run on the GPU machine: nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/mma
//   scripts/mma_decode_probe.cu && /tmp/mma
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
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

constexpr int kQoHeads = 32, kKvHeads = 8, kGroup = 4, kDim = 128, kPage = 16;
constexpr int kThreads = 128, kWarps = 4, kWarpTokens = 16, kTileTokens = kWarps * kWarpTokens;
constexpr int kRowBytes = kDim * 2, kChunks = kRowBytes / 16;  // 16 chunks of 16 bytes per row
constexpr int kTileBytes = kTileTokens * kRowBytes;             // K or V of a tile: 16 KiB
#ifndef STAGES
#define STAGES 3
#endif
constexpr int kStages = STAGES;
constexpr int kSmemBytes = kStages * 2 * kTileBytes;
constexpr int kCopiesPerThread = kTileTokens * kChunks / kThreads;  // per K and per V

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ unsigned swizzled(int row, int chunk) {
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned transpose8x8(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned (&a)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned (&a)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
}
__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                    unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct Params {
  const __nv_bfloat16* k;  // [pool pages][kPage][kKvHeads][kDim]
  const __nv_bfloat16* v;
  const int* pages;        // [batch][pages_per_request]
  const __nv_bfloat16* q;  // [batch][kQoHeads][kDim]
  float* o;                // [batch][kQoHeads][kDim]
  int pages_per_request, kv_len;
  float scale_log2;        // sm_scale * log2(e)
};

__global__ void __launch_bounds__(kThreads, 2) mma_decode(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int request = blockIdx.x / kKvHeads, head = blockIdx.x % kKvHeads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_tiles = (p.kv_len + kTileTokens - 1) / kTileTokens;
  const int* pages = p.pages + static_cast<long long>(request) * p.pages_per_request;
  const unsigned base = smem_u32(smem);

  // Copies: thread covers chunk `column` of rows first_row + 8 i.
  const int column = threadIdx.x % kChunks, first_row = threadIdx.x / kChunks;
  const auto issue = [&](int tile) {
    if (tile < num_tiles) {
      const unsigned stage = base + (tile % kStages) * 2 * kTileBytes;
#pragma unroll
      for (int i = 0; i < kCopiesPerThread; ++i) {
        const int row = first_row + i * (kThreads / kChunks);
        const int token = tile * kTileTokens + row;
        const int t = token < p.kv_len ? token : 0;
        const long long element =
            ((static_cast<long long>(pages[t / kPage]) * kPage + t % kPage) * kKvHeads + head) *
                kDim + column * 8;
        const unsigned offset = swizzled(row, column);
        cp16(stage + offset, p.k + element);
        cp16(stage + kTileBytes + offset, p.v + element);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  // Q^T as B fragments: b[ks][0] = (dims 16 ks + 2 (lane % 4) + {0, 1}, row lane / 4),
  // b[ks][1] the same 8 dims further. Rows >= kGroup are zero.
  unsigned qb[kDim / 16][2];
  {
    const int row = lane / 4;
    const __nv_bfloat16* q =
        p.q + (static_cast<long long>(request) * kQoHeads + head * kGroup + row) * kDim;
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned bits = 0;
        if (row < kGroup) {
          bits = *reinterpret_cast<const unsigned*>(q + 16 * ks + 8 * h + 2 * (lane % 4));
        }
        qb[ks][h] = bits;
      }
    }
  }
  float o_acc[kDim / 16][4];  // O^T: (dim 16 mt + lane / 4 (+8), row 2 (lane % 4) + {0, 1})
#pragma unroll
  for (int mt = 0; mt < kDim / 16; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[mt][e] = 0.0f;
  }
  float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.0f, 0.0f};

  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int tile = 0; tile < num_tiles; ++tile) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    issue(tile + kStages - 1);
    const unsigned k_stage = base + (tile % kStages) * 2 * kTileBytes;
    const unsigned v_stage = k_stage + kTileBytes;
    const int row0 = warp * kWarpTokens;

    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks) {
      unsigned a[4];
      const int row = row0 + (lane & 7) + (((lane >> 3) & 1) << 3);
      ldmatrix_x4(k_stage + swizzled(row, 2 * ks + (lane >> 4)), a);
      mma(s, a, qb[ks][0], qb[ks][1]);
    }
    // s[0]: (token lane / 4, row 2 (lane % 4)), s[1]: row + 1, s[2], s[3]: token + 8.
    const int token = tile * kTileTokens + row0 + lane / 4;
    float mx[2];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool visible = token + (e >> 1) * 8 < p.kv_len;
      s[e] = visible ? s[e] * p.scale_log2 : -INFINITY;
    }
    mx[0] = fmaxf(s[0], s[2]);
    mx[1] = fmaxf(s[1], s[3]);
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], offset));
      mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], offset));
    }
    float rescale[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float m_new = fmaxf(m[j], mx[j]);
      const float m_base = m_new == -INFINITY ? 0.0f : m_new;
      rescale[j] = exp2_approx(m[j] - m_base);
      m[j] = m_new;
      s[j] = exp2_approx(s[j] - m_base);
      s[j + 2] = exp2_approx(s[j + 2] - m_base);
      d[j] = d[j] * rescale[j] + s[j] + s[j + 2];
    }
#pragma unroll
    for (int mt = 0; mt < kDim / 16; ++mt) {
      o_acc[mt][0] *= rescale[0];
      o_acc[mt][1] *= rescale[1];
      o_acc[mt][2] *= rescale[0];
      o_acc[mt][3] *= rescale[1];
    }
    const unsigned pb0 = transpose8x8(pack_bf16(s[0], s[1]));
    const unsigned pb1 = transpose8x8(pack_bf16(s[2], s[3]));
#pragma unroll
    for (int mt = 0; mt < kDim / 16; ++mt) {
      unsigned a[4];
      const int row = row0 + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4_trans(v_stage + swizzled(row, 2 * mt + ((lane >> 3) & 1)), a);
      mma(o_acc[mt], a, pb0, pb1);
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();

  // Combine the warps: rows 2 (lane % 4) + j, kept by lanes with lane % 4 < 2.
  float* s_o = reinterpret_cast<float*>(smem);     // [warp][row][dim]
  float* s_m = s_o + kWarps * kGroup * kDim;       // [warp][row]
  float* s_d = s_m + kWarps * kGroup;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) d[j] += __shfl_xor_sync(0xffffffffu, d[j], offset);
  }
  if (lane % 4 < 2) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = 2 * (lane % 4) + j;
#pragma unroll
      for (int mt = 0; mt < kDim / 16; ++mt) {
        s_o[(warp * kGroup + row) * kDim + 16 * mt + lane / 4] = o_acc[mt][j];
        s_o[(warp * kGroup + row) * kDim + 16 * mt + lane / 4 + 8] = o_acc[mt][j + 2];
      }
      if (lane / 4 == 0) {
        s_m[warp * kGroup + row] = m[j];
        s_d[warp * kGroup + row] = d[j];
      }
    }
  }
  __syncthreads();
  for (int unit = threadIdx.x; unit < kGroup * kDim; unit += kThreads) {
    const int row = unit / kDim, dim = unit % kDim;
    float m_max = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, s_m[w * kGroup + row]);
    float num = 0.0f, den = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2_approx(s_m[w * kGroup + row] - m_max);
      num += weight * s_o[(w * kGroup + row) * kDim + dim];
      den += weight * s_d[w * kGroup + row];
    }
    p.o[(static_cast<long long>(request) * kQoHeads + head * kGroup + row) * kDim + dim] = num / den;
  }
}

__global__ void fill_random(__nv_bfloat16* out, long long n, unsigned seed) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed * 40503u ^ static_cast<unsigned>(i >> 32);
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    out[i] = __float2bfloat16((static_cast<int>(x & 0xffff) - 32768) / 16384.0f);  // [-2, 2)
  }
}

float bf16_to_float(__nv_bfloat16 h) {
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  const uint32_t w = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 64;
  const int kv_len = argc > 2 ? std::atoi(argv[2]) : 8192;
  const size_t pool_bytes = size_t{3} << 30;
  const long long page_bytes = static_cast<long long>(kPage) * kKvHeads * kDim * 2;
  const long long pool_pages = static_cast<long long>(pool_bytes / page_bytes);
  const int pages_per_request = (kv_len + kPage - 1) / kPage;
  if (static_cast<long long>(batch) * pages_per_request > pool_pages) return 1;
  __nv_bfloat16 *k, *v, *q;
  float* o;
  int* pages_device;
  CHECK_CUDA(cudaMalloc(&k, pool_bytes));
  CHECK_CUDA(cudaMalloc(&v, pool_bytes));
  CHECK_CUDA(cudaMalloc(&q, size_t{2} * batch * kQoHeads * kDim));
  CHECK_CUDA(cudaMalloc(&o, size_t{4} * batch * kQoHeads * kDim));
  fill_random<<<1024, 256>>>(k, pool_bytes / 2, 1);
  fill_random<<<1024, 256>>>(v, pool_bytes / 2, 2);
  fill_random<<<64, 256>>>(q, static_cast<long long>(batch) * kQoHeads * kDim, 3);
  CHECK_CUDA(cudaGetLastError());
  std::vector<int> ids(static_cast<size_t>(pool_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  ids.resize(static_cast<size_t>(batch) * pages_per_request);
  CHECK_CUDA(cudaMalloc(&pages_device, ids.size() * 4));
  CHECK_CUDA(cudaMemcpy(pages_device, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(o, 0xff, size_t{4} * batch * kQoHeads * kDim));  // NaN poison

  Params p{k, v, pages_device, q, o, pages_per_request, kv_len,
           static_cast<float>(1.0 / std::sqrt(double(kDim)) * 1.4426950408889634)};
  CHECK_CUDA(cudaFuncSetAttribute(mma_decode, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  int per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mma_decode, kThreads, kSmemBytes));
  cudaFuncAttributes attributes;
  CHECK_CUDA(cudaFuncGetAttributes(&attributes, mma_decode));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> us;
  for (int rep = 0; rep < 35; ++rep) {
    CHECK_CUDA(cudaEventRecord(a));
    mma_decode<<<batch * kKvHeads, kThreads, kSmemBytes>>>(p);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (rep >= 5) us.push_back(ms * 1000);
  }
  std::sort(us.begin(), us.end());
  const double kv_bytes = 2.0 * batch * kv_len * kKvHeads * kDim * 2;
  std::printf("mma decode probe b%d kv%d stages %d: %d regs, %d CTAs/SM, median %.1f us, %.3f TB/s\n",
              batch, kv_len, kStages, attributes.numRegs, per_sm, us[us.size() / 2],
              kv_bytes / (us[us.size() / 2] * 1e-6) / 1e12);

  // Check some (request, KV head) outputs against float64.
  std::vector<float> o_host(static_cast<size_t>(batch) * kQoHeads * kDim);
  CHECK_CUDA(cudaMemcpy(o_host.data(), o, o_host.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<__nv_bfloat16> q_host(static_cast<size_t>(batch) * kQoHeads * kDim);
  CHECK_CUDA(cudaMemcpy(q_host.data(), q, q_host.size() * 2, cudaMemcpyDeviceToHost));
  double max_error = 0.0;
  long long nans = 0;
  for (float x : o_host) nans += std::isnan(x);
  std::vector<__nv_bfloat16> kpage(kPage * kKvHeads * kDim), vpage(kPage * kKvHeads * kDim);
  for (int request : {0, batch / 2, batch - 1}) {
    std::vector<double> kk(static_cast<size_t>(kv_len) * kKvHeads * kDim), vv(kk.size());
    for (int pg = 0; pg < pages_per_request; ++pg) {
      const long long id = ids[static_cast<size_t>(request) * pages_per_request + pg];
      CHECK_CUDA(cudaMemcpy(kpage.data(), k + id * kPage * kKvHeads * kDim, page_bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(vpage.data(), v + id * kPage * kKvHeads * kDim, page_bytes, cudaMemcpyDeviceToHost));
      for (int slot = 0; slot < kPage && pg * kPage + slot < kv_len; ++slot) {
        for (int e = 0; e < kKvHeads * kDim; ++e) {
          kk[(static_cast<size_t>(pg) * kPage + slot) * kKvHeads * kDim + e] = bf16_to_float(kpage[slot * kKvHeads * kDim + e]);
          vv[(static_cast<size_t>(pg) * kPage + slot) * kKvHeads * kDim + e] = bf16_to_float(vpage[slot * kKvHeads * kDim + e]);
        }
      }
    }
    for (int qh = 0; qh < kQoHeads; ++qh) {
      const int kh = qh / kGroup;
      std::vector<double> logits(static_cast<size_t>(kv_len));
      double mx = -1e300;
      for (int t = 0; t < kv_len; ++t) {
        double dot = 0;
        for (int e = 0; e < kDim; ++e) {
          dot += bf16_to_float(q_host[(static_cast<size_t>(request) * kQoHeads + qh) * kDim + e]) *
                 kk[(static_cast<size_t>(t) * kKvHeads + kh) * kDim + e];
        }
        logits[t] = dot / std::sqrt(double(kDim));
        mx = std::max(mx, logits[t]);
      }
      double den = 0;
      for (double& l : logits) den += (l = std::exp(l - mx));
      for (int e = 0; e < kDim; ++e) {
        double num = 0;
        for (int t = 0; t < kv_len; ++t) num += logits[t] * vv[(static_cast<size_t>(t) * kKvHeads + kh) * kDim + e];
        const double got = o_host[(static_cast<size_t>(request) * kQoHeads + qh) * kDim + e];
        max_error = std::max(max_error, std::abs(got - num / den));
      }
    }
  }
  std::printf("check: 3 requests x 32 heads vs float64: max |error| %.3g, NaN outputs %lld\n",
              max_error, nans);
  return (max_error < 2e-2 && nans == 0) ? 0 : 1;
}
