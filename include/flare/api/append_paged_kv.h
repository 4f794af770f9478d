// Appending new tokens' keys and values to a paged KV cache (FlashInfer's append_paged_kv_cache):
// token i goes to request batch_indices[i] at position positions[i] of that request's pages.
#pragma once

#include "flare/api/index_errors.h"
#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"

namespace flare {

// The tokens to append and where they go.
//   append_key    [nnz, H_kv, D_qk]  the dtype of the cache's K pages, any strides (last dim 1)
//   append_value  [nnz, H_kv, D_vo]  the dtype of the cache's V pages, likewise
//   batch_indices int32 [nnz]: the request of each token; a negative entry marks a padding token
//                 that is skipped (get_batch_indices_positions gives -1 past append_indptr[-1])
//   positions     int32 [nnz]: the token's position in its request, so it lands in page
//                 cache.table.indices[indptr[b] + pos / page_size], slot pos % page_size
// Only the page table's indptr and indices are read; kv_last_page_len is not needed to find a
// slot (the caller updates it for the appended lengths).
struct AppendPagedKVInput {
  TensorView append_key;
  TensorView append_value;
  TensorView batch_indices;
  TensorView positions;
};

// CPU: every array (cache pages, page table, tokens, indices) on the CPU. Validates everything
// first (shapes, dtypes, the page table as in validate_paged_kv, each batch index in
// [0, batch) or negative, each position in [0, pages of its request * page_size)) and throws
// kInvalidArgument naming the argument and value; nothing is written then.
void append_paged_kv_cpu(const AppendPagedKVInput& input, const PagedKV& cache);

// GPU: every array on the same CUDA device (cache pages, page table, tokens, indices); runs
// on `stream` without synchronizing or allocating, so it can be captured in a CUDA graph.
// Host-side checks: shapes, dtypes, devices, strides. The index arrays live on the device and
// are not read on the host; the kernel bounds-checks each token (batch index below batch, the
// request's page range inside kv_indices, position inside its request's pages, page id in
// [0, pages)) and skips a token that fails, recording it in the device's append error record
// (check_append_paged_kv raises it): bad indices never write outside the cache, and never
// vanish silently. Negative batch indices are padding, skipped without a record. Copies
// 16-byte vectors when the pointers, strides and head dims allow it, narrower ones otherwise.
// Throws kNoCudaDevice, kCompileError, kCudaError, kInvalidArgument.
void append_paged_kv_cuda(const AppendPagedKVInput& input, const PagedKV& cache,
                          cuda::Stream stream);

// Synchronizes `device` and throws kIndexOutOfRange describing the first out-of-range index
// append_paged_kv_cuda met on it since the last check (clearing the record).
void check_append_paged_kv(int device, const IndexNames& names = {"append_paged_kv"});
// The device's record (created on first use).
const IndexErrorRecordBuffer& append_index_errors(int device);

// The kernel append_paged_kv_cuda launches for a vector width of 1, 2, 4, 8 or 16 bytes (the
// widest dividing every address, stride and row size): what CI compiles without a GPU to
// check for spills. Throws kInvalidArgument for other widths.
jit::KernelSpec append_paged_kv_kernel_spec(int vector_bytes);

// Dispatch on the cache's device.
void append_paged_kv(const AppendPagedKVInput& input, const PagedKV& cache,
                     cuda::Stream stream = nullptr);

}  // namespace flare
