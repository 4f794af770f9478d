// Where a paged-KV append puts a token through the page table, shared by the 16-bit append
// (kernels/append_paged_kv.cuh) and the NVFP4 one (kernels/append_paged_kv_nvfp4.cuh): their
// parameter records carry the same index fields (batch_indices, positions, kv_indptr,
// kv_indices, index_error, num_indices, page_size, batch, num_pages).
#pragma once

#include "index_check.cuh"

#ifdef __CUDACC_RTC__

namespace flare::append_kernel {

// The page of token `token` (and its slot), or -1 when the token is padding or its indices are
// out of range (recorded: bad input must never write outside the cache, nor vanish silently).
template <class Params>
__device__ __forceinline__ int64_t slot_of(const Params& p, int64_t token, int64_t* slot) {
  const int32_t request = p.batch_indices[token];
  if (request < 0) return -1;  // padding
  if (request >= p.batch) {
    record_index_error(p.index_error, kIndexErrorRequest, request, token, request);
    return -1;
  }
  const int32_t pos = p.positions[token];
  const int64_t first_page = p.kv_indptr[request];
  const int64_t pages = p.kv_indptr[request + 1] - first_page;
  if (first_page < 0 || pages < 0 || first_page + pages > p.num_indices) {
    record_index_error(p.index_error, kIndexErrorPageRange, request, request, first_page);
    return -1;
  }
  if (pos < 0 || pos >= pages * p.page_size) {
    record_index_error(p.index_error, kIndexErrorPosition, request, token, pos);
    return -1;
  }
  const int64_t entry = first_page + pos / p.page_size;
  const int32_t page = p.kv_indices[entry];
  if (page < 0 || page >= p.num_pages) {
    record_index_error(p.index_error, kIndexErrorPageId, request, entry, page);
    return -1;
  }
  *slot = pos % p.page_size;
  return page;
}

}  // namespace flare::append_kernel

#endif  // __CUDACC_RTC__
