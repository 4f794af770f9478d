// Quantizing append to an NVFP4 paged KV cache (FlashInfer's nvfp4_quantize_append_paged_kv_cache
// and nvfp4_quantize_append_paged_kv_cache_with_slot_mapping): each appended 16-bit K / V row
// is quantized block by block (include/flare/format/nvfp4.h) into its page slot.
#pragma once

#include "flare/api/append_paged_kv.h"
#include "flare/api/index_errors.h"
#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"

namespace flare {

// An NVFP4 paged cache: codes and scales in the same layout, any strides.
//   k_codes, v_codes    uint8 (kU8) NHD [pages, page_size, H_kv, D / 2] | HND [pages, H_kv,
//                       page_size, D / 2]: E2M1 pairs, the even element in the low nibble
//   k_scales, v_scales  float8 e4m3 (kE4M3), the same with D / 16: one scale a 16-value block
// D (a multiple of 16) may differ between K and V. On the GPU the code rows' addresses and
// strides must be multiples of 8 bytes (one block's codes are stored as one 8-byte word).
struct Nvfp4Pages {
  TensorView k_codes;
  TensorView v_codes;
  TensorView k_scales;
  TensorView v_scales;
  KVLayout layout = KVLayout::kNHD;
};

// The global decode scales (x = e2m1 * block scale * global): float32, one element each, each
// on the cache's device (read there by the kernel, so a captured append replays with their
// current values; a bad one is recorded) or on the CPU (read and checked on the host, passed
// by value). Each must be positive and finite.
struct Nvfp4GlobalScales {
  TensorView k;
  TensorView v;
};

// Tokens placed through a page table: as append_paged_kv (AppendPagedKVInput: append_key and
// append_value float16 or bfloat16 [nnz, H_kv, D], batch_indices and positions int32 [nnz],
// negative batch indices are padding). `table` is the cache's page table (indptr, indices).
// CPU: everything on the CPU; validates every index and both scales first and throws
// kInvalidArgument naming the argument and value, nothing written then.
// GPU: everything on one CUDA device, no synchronization or allocation (CUDA-graph safe); the
// kernel bounds-checks each token as append_paged_kv_cuda does and records a bad index, or a
// scale that is not positive and finite (then nothing is written), in the device's append
// error record (check_append_paged_kv raises it).
void append_paged_kv_nvfp4(const AppendPagedKVInput& input, const Nvfp4Pages& cache,
                           const BlockSparseIndex& table, const Nvfp4GlobalScales& scales,
                           cuda::Stream stream = nullptr);

// Tokens placed by flat slot: token i goes to page slot_mapping[i] / page_size, slot
// slot_mapping[i] % page_size; slot_mapping int32 or int64 [nnz] (negative: padding, skipped);
// append_key / append_value may hold more rows than nnz (only the first nnz are read). A slot
// past the cache is an error (CPU: thrown; GPU: recorded, the token skipped).
struct SlotAppendInput {
  TensorView append_key;
  TensorView append_value;
  TensorView slot_mapping;
};
void append_paged_kv_nvfp4_by_slot(const SlotAppendInput& input, const Nvfp4Pages& cache,
                                   const Nvfp4GlobalScales& scales, cuda::Stream stream = nullptr);

// The kernel both GPU paths launch: what CI compiles without a GPU.
jit::KernelSpec append_paged_kv_nvfp4_kernel_spec();

}  // namespace flare
