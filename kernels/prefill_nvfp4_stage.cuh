// NVFP4 KV for the prefill kernels (src/api/prefill_nvfp4.h): one thread per block of 16 values
// of a K or V row dequantizes code x e4m3 block scale into the 16-bit staged copy the prefill
// kernels read. The product is exact in float16 and bfloat16 (at most 6 significant bits,
// magnitudes in [2^-10, 2688]); the global scales stay the kernels' k_scale / v_scale.
// Paged: staged page j is the caller's page kv_indices[j], for the plan's entries j <
// kv_indptr[batch]; ragged: staged row r is row r. The count is read on the device (the plan's
// request table, padded with the total past the batch), so a captured launch serves later plans.
#pragma once

#include "index_check.cuh"
#include "nvfp4_codes.cuh"

namespace flare {

// Shared bit for bit with the host (src/api/prefill_nvfp4.cpp). Source strides in bytes (unit =
// page or ragged row, slot, head: the host folds NHD / HND); staged strides in elements.
struct Nvfp4StageParams {
  const unsigned char* codes[2];   // k, v: uint8 [..][D / 2], 8-byte aligned rows
  const unsigned char* scales[2];  // e4m3 [..][D / 16]
  unsigned char* staged[2];        // 16-bit, contiguous in the kernels' layout
  int64_t code_stride[2][3];
  int64_t scale_stride[2][3];
  int64_t staged_stride[2][3];
  const int32_t* indices;    // paged: the caller's page ids; null: ragged
  const int32_t* kv_indptr;  // the plan's request table, max_batch + 1 entries
  IndexErrorRecord* index_error;
  int64_t capacity;   // staged units (pages or rows)
  int64_t num_pages;  // paged: pages of the caller's tensors
  int32_t max_batch;
  int32_t page_size;  // 1 for ragged rows
  int32_t num_heads;
  int32_t blocks[2];  // D_qk / 16, D_vo / 16
  int32_t bf16;       // staged dtype: bfloat16, else float16
};

constexpr int kNvfp4StageThreads = 256;

}  // namespace flare

#ifdef __CUDACC_RTC__

#include "decode_utils.cuh"

namespace flare::nvfp4_stage {

// The request of page-table entry `entry` (an error message's), from the plan's table.
__device__ __forceinline__ int request_of(const Nvfp4StageParams& p, long long entry) {
  int lo = 0, hi = p.max_batch;  // kv_indptr[lo] <= entry < kv_indptr[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (p.kv_indptr[mid] <= entry)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace flare::nvfp4_stage

extern "C" __global__ void __launch_bounds__(flare::kNvfp4StageThreads)
    flare_prefill_nvfp4_stage(const flare::Nvfp4StageParams p) {
  using namespace flare;
  const long long count = min(static_cast<long long>(p.kv_indptr[p.max_batch]), p.capacity);
  const int blocks_per_row = p.blocks[0] + p.blocks[1];
  const long long total = count * p.page_size * p.num_heads * blocks_per_row;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    int block = static_cast<int>(i % blocks_per_row);
    long long rest = i / blocks_per_row;
    const int head = static_cast<int>(rest % p.num_heads);
    rest /= p.num_heads;
    const int slot = static_cast<int>(rest % p.page_size);
    const long long unit = rest / p.page_size;
    const int which = block < p.blocks[0] ? 0 : 1;
    if (which == 1) block -= p.blocks[0];
    long long source = unit;
    bool valid = true;
    if (p.indices != nullptr) {
      source = p.indices[unit];
      valid = source >= 0 && source < p.num_pages;
      if (!valid && slot == 0 && head == 0 && block == 0 && which == 0) {
        record_index_error(p.index_error, kIndexErrorPageId, nvfp4_stage::request_of(p, unit), unit,
                           source);
      }
    }
    uint4 out[2] = {};
    if (valid) {
      const long long* cs = p.code_stride[which];
      const long long* ss = p.scale_stride[which];
      const unsigned char* codes =
          p.codes[which] + source * cs[0] + slot * cs[1] + head * cs[2] + block * 8;
      const unsigned char scale_bits =
          p.scales[which][source * ss[0] + slot * ss[1] + head * ss[2] + block];
      // The decode kernel's conversion (exact), 8 values a call.
      float value[2][8];
      load_nvfp4_8(codes, scale_bits, value[0]);
      load_nvfp4_8(codes + 4, scale_bits, value[1]);
      unsigned packed[8];
#pragma unroll
      for (int pair = 0; pair < 8; ++pair) {
        const float lo = value[pair / 4][2 * (pair % 4)], hi = value[pair / 4][2 * (pair % 4) + 1];
        packed[pair] = p.bf16 != 0 ? float2_to_16bit2<kCodeBF16>(lo, hi)
                                   : float2_to_16bit2<kCodeF16>(lo, hi);
      }
      out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    }
    const long long* ds = p.staged_stride[which];
    uint4* dst = reinterpret_cast<uint4*>(
        p.staged[which] + 2 * (unit * ds[0] + slot * ds[1] + head * ds[2] + block * 16));
    dst[0] = out[0];
    dst[1] = out[1];
  }
}

#endif  // __CUDACC_RTC__
