// The NVFP4 quantizing append (include/flare/api/append_paged_kv_nvfp4.h): one thread per block
// of 16 values of a token's K or V row of one head, quantized as include/flare/format/nvfp4.h
// defines it (bit for bit) into its page slot: 8 bytes of E2M1 pairs and one e4m3 scale.
// Tokens are placed by (batch index, position) through the page table, or by a flat slot.
#pragma once

#include "append_placement.cuh"
#include "index_check.cuh"
#include "nvfp4_codes.cuh"

namespace flare {

// Shared bit for bit with the host (src/api/append_paged_kv_nvfp4.cpp). Strides in bytes (the
// host folds NHD / HND into the slot and head strides).
struct AppendNvfp4Params {
  unsigned char* k_codes;  // [pages][..][D_qk / 2] bytes
  unsigned char* v_codes;
  unsigned char* k_scales;  // [pages][..][D_qk / 16] e4m3
  unsigned char* v_scales;
  const unsigned char* append_k;  // f16 / bf16 [nnz][H][D]
  const unsigned char* append_v;
  const float* k_global;  // one float each, read on the device (CUDA graphs); null: the value
  const float* v_global;  // below, given by the host
  float k_global_value;
  float v_global_value;
  // Placement: slot_mapping != null: token i goes to flat slot slot_mapping[i] (page * page
  // size + slot; negative: padding); else through batch_indices / positions and the table.
  const void* slot_mapping;  // int32 or int64 [nnz] (slot_mapping_64)
  const int32_t* batch_indices;
  const int32_t* positions;
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  IndexErrorRecord* index_error;
  int64_t num_indices;
  int64_t k_code_stride[3];  // page, slot, head
  int64_t v_code_stride[3];
  int64_t k_scale_stride[3];
  int64_t v_scale_stride[3];
  int64_t append_k_stride[2];  // token, head
  int64_t append_v_stride[2];
  int64_t nnz;
  int32_t k_blocks;  // D_qk / 16
  int32_t v_blocks;
  int32_t num_heads;
  int32_t page_size;
  int32_t batch;
  int32_t num_pages;
  int32_t slot_mapping_64;
  int32_t bf16;  // append_k / append_v are bfloat16 (else float16)
};

constexpr int kAppendNvfp4Threads = 256;

}  // namespace flare

#ifdef __CUDACC_RTC__

namespace flare::append_nvfp4 {

__device__ __forceinline__ float load_16bit(const unsigned char* p, bool bf16) {
  const unsigned short bits = *reinterpret_cast<const unsigned short*>(p);
  if (bf16) return __uint_as_float(static_cast<unsigned>(bits) << 16);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}

// The page and slot of token `token`, or -1 (padding, or out of range: recorded).
__device__ __forceinline__ int64_t place(const AppendNvfp4Params& p, int64_t token, int64_t* slot) {
  if (p.slot_mapping != nullptr) {
    const long long flat = p.slot_mapping_64 ? static_cast<const long long*>(p.slot_mapping)[token]
                                             : static_cast<const int32_t*>(p.slot_mapping)[token];
    if (flat < 0) return -1;  // padding
    if (flat >= static_cast<long long>(p.num_pages) * p.page_size) {
      record_index_error(p.index_error, kIndexErrorSlot, -1, token, flat);
      return -1;
    }
    *slot = flat % p.page_size;
    return flat / p.page_size;
  }
  return append_kernel::slot_of(p, token, slot);  // through the page table
}

__device__ __forceinline__ bool positive_finite(float x) { return isfinite(x) && x > 0.0f; }

}  // namespace flare::append_nvfp4

// Grid-stride over (token, head, block) with K's blocks first: the grid depends on nnz alone.
extern "C" __global__ void __launch_bounds__(flare::kAppendNvfp4Threads)
    flare_append_paged_kv_nvfp4(const flare::AppendNvfp4Params p) {
  using namespace flare::append_nvfp4;
  const float k_global = p.k_global != nullptr ? *p.k_global : p.k_global_value;
  const float v_global = p.v_global != nullptr ? *p.v_global : p.v_global_value;
  const bool scales_ok = positive_finite(k_global) && positive_finite(v_global);
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!scales_ok) {  // nothing is written; one thread records it
    if (first == 0) {
      const bool k_bad = !positive_finite(k_global);
      record_index_error(p.index_error, flare::kIndexErrorScale, -1, k_bad ? 0 : 1,
                         __float_as_uint(k_bad ? k_global : v_global));
    }
    return;
  }
  const int row_blocks = p.k_blocks + p.v_blocks;
  const long long total = p.nnz * p.num_heads * row_blocks;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long item = first; item < total; item += step) {
    const int block = static_cast<int>(item % row_blocks);
    const long long token_head = item / row_blocks;
    const long long head = token_head % p.num_heads;
    const long long token = token_head / p.num_heads;
    long long slot = 0;
    const long long page = place(p, token, &slot);
    if (page < 0) continue;
    const bool is_k = block < p.k_blocks;
    const int b = is_k ? block : block - p.k_blocks;
    const long long* as = is_k ? p.append_k_stride : p.append_v_stride;
    const long long* cs = is_k ? p.k_code_stride : p.v_code_stride;
    const long long* ss = is_k ? p.k_scale_stride : p.v_scale_stride;
    const unsigned char* src =
        (is_k ? p.append_k : p.append_v) + token * as[0] + head * as[1] + b * 16 * 2;
    const float global = is_k ? k_global : v_global;
    float x[16];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      x[i] = load_16bit(src + 2 * i, p.bf16 != 0);
      amax = fmaxf(amax, fabsf(x[i]));
    }
    const unsigned scale =
        flare::nvfp4::e4m3_bits(amax > 0.0f ? __fdiv_rn(amax, 6.0f * global) : 0.0f);
    const float rounded = flare::nvfp4::e4m3_value(scale);
    const float inverse = amax > 0.0f && rounded > 0.0f ? __fdiv_rn(1.0f, rounded * global) : 0.0f;
    unsigned words[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; ++i)
      words[i / 8] |= flare::nvfp4::e2m1_code(x[i] * inverse) << (4 * (i % 8));
    unsigned char* codes =
        (is_k ? p.k_codes : p.v_codes) + page * cs[0] + slot * cs[1] + head * cs[2] + b * 8;
    // 8 bytes of codes: the host checks 8-byte alignment of the pointers and strides.
    *reinterpret_cast<uint2*>(codes) = make_uint2(words[0], words[1]);
    (is_k ? p.k_scales : p.v_scales)[page * ss[0] + slot * ss[1] + head * ss[2] + b] =
        static_cast<unsigned char>(scale);
  }
}

#endif  // __CUDACC_RTC__
