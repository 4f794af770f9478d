// The paged-KV append kernel: copies each appended token's K and V rows into its page slot with
// FLARE_APPEND_VEC_BYTES-wide loads and stores (16 when pointers and strides allow it).
#pragma once

#include "append_placement.cuh"
#include "index_check.cuh"

namespace flare {

// Kernel arguments, shared bit for bit with the host (src/api/append_paged_kv.cpp). Strides
// are in bytes; the host folds the NHD/HND layout into the slot and head strides.
struct AppendPagedKVParams {
  char* k_pages;
  char* v_pages;
  const char* append_k;
  const char* append_v;
  // Index data is the caller's and never trusted: a token whose indices fall outside these
  // arrays or the cache is skipped and recorded in index_error.
  const int32_t* batch_indices;  // [nnz]; negative: padding, skipped
  const int32_t* positions;      // [nnz]
  const int32_t* kv_indptr;      // [batch + 1], pages
  const int32_t* kv_indices;     // [num_indices]
  IndexErrorRecord* index_error;
  int64_t num_indices;
  int64_t k_page_stride;
  int64_t k_slot_stride;
  int64_t k_head_stride;
  int64_t v_page_stride;
  int64_t v_slot_stride;
  int64_t v_head_stride;
  int64_t append_k_token_stride;
  int64_t append_k_head_stride;
  int64_t append_v_token_stride;
  int64_t append_v_head_stride;
  int64_t k_row_bytes;  // D_qk * element bytes, a multiple of the vector width
  int64_t v_row_bytes;  // D_vo * element bytes, likewise
  int64_t nnz;
  int32_t num_heads;
  int32_t page_size;
  int32_t batch;
  int32_t num_pages;
};

// Threads per block of the kernel; the host launches with this block size.
constexpr int kAppendThreads = 256;

}  // namespace flare

#ifdef __CUDACC_RTC__

#ifndef FLARE_APPEND_VEC_BYTES
#error "FLARE_APPEND_VEC_BYTES (1, 2, 4, 8 or 16) must be defined"
#endif

namespace flare::append_kernel {

constexpr int kVecBytes = FLARE_APPEND_VEC_BYTES;
static_assert(kVecBytes == 1 || kVecBytes == 2 || kVecBytes == 4 || kVecBytes == 8 ||
                  kVecBytes == 16,
              "vector width must be a power of two up to 16 bytes");

// The unit of one load/store; its alignment lets the compiler emit one LDG/STG.128 at 16.
struct alignas(kVecBytes) Vec {
  unsigned char bytes[kVecBytes];
};

}  // namespace flare::append_kernel

// One thread per vector of a (token, head) row; K vectors first, then V vectors. Grid-stride so
// the grid is fixed by nnz alone (CUDA graphs replay it for any indices).
extern "C" __global__ void __launch_bounds__(flare::kAppendThreads)
    flare_append_paged_kv(const flare::AppendPagedKVParams p) {
  using flare::append_kernel::kVecBytes;
  using flare::append_kernel::Vec;
  const int64_t k_vecs = p.k_row_bytes / kVecBytes;
  const int64_t row_vecs = k_vecs + p.v_row_bytes / kVecBytes;
  const int64_t total = p.nnz * p.num_heads * row_vecs;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < total;
       item += step) {
    const int64_t vec = item % row_vecs;
    const int64_t token_head = item / row_vecs;
    const int64_t head = token_head % p.num_heads;
    const int64_t token = token_head / p.num_heads;
    int64_t slot = 0;
    const int64_t page = flare::append_kernel::slot_of(p, token, &slot);
    if (page < 0) continue;
    const char* src;
    char* dst;
    if (vec < k_vecs) {
      src = p.append_k + token * p.append_k_token_stride + head * p.append_k_head_stride +
            vec * kVecBytes;
      dst = p.k_pages + page * p.k_page_stride + slot * p.k_slot_stride + head * p.k_head_stride +
            vec * kVecBytes;
    } else {
      const int64_t v_vec = vec - k_vecs;
      src = p.append_v + token * p.append_v_token_stride + head * p.append_v_head_stride +
            v_vec * kVecBytes;
      dst = p.v_pages + page * p.v_page_stride + slot * p.v_slot_stride + head * p.v_head_stride +
            v_vec * kVecBytes;
    }
    *reinterpret_cast<Vec*>(dst) = *reinterpret_cast<const Vec*>(src);
  }
}

#endif  // __CUDACC_RTC__
