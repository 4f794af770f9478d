// The paged KV cache: K and V pages addressed through a BlockSparseIndex (page table),
// NHD [pages, page_size, H_kv, D] or HND [pages, H_kv, page_size, D], any strides.
#pragma once

#include <cstdint>

#include "flare/core/tensor.h"
#include "flare/format/block_sparse.h"

namespace flare {

enum class KVLayout : uint8_t { kNHD, kHND };
KVLayout parse_kv_layout(const char* name);  // "NHD" | "HND"; kInvalidArgument otherwise
const char* kv_layout_name(KVLayout layout);

struct PagedKV {
  TensorView k;  // NHD [pages, page_size, H_kv, D_qk] | HND [pages, H_kv, page_size, D_qk]
  TensorView v;  // same, with D_vo
  KVLayout layout = KVLayout::kNHD;
  BlockSparseIndex table;  // block_size == page_size; one row per request

  // K and V sliced from one [pages, 2, ...] tensor (FlashInfer's combined layout).
  static PagedKV from_combined(const TensorView& kv, KVLayout layout, const TensorView& indptr,
                               const TensorView& indices, const TensorView& last_page_len);
  static PagedKV from_separate(const TensorView& k, const TensorView& v, KVLayout layout,
                               const TensorView& indptr, const TensorView& indices,
                               const TensorView& last_page_len);

  int64_t batch() const { return table.num_rows(); }
  int64_t num_pages() const { return k.shape[0]; }
  int64_t page_size() const { return layout == KVLayout::kNHD ? k.shape[1] : k.shape[2]; }
  int64_t num_kv_heads() const { return layout == KVLayout::kNHD ? k.shape[2] : k.shape[1]; }
  int64_t head_dim_qk() const { return k.shape[3]; }
  int64_t head_dim_vo() const { return v.shape[3]; }
  int64_t kv_len(int64_t request) const { return table.row_length(request); }  // host only

  // Element offsets (in elements, 64-bit) of token `pos` of `request`, head `head`, dim 0.
  int64_t k_offset(int64_t request, int64_t pos, int64_t head) const;
  int64_t v_offset(int64_t request, int64_t pos, int64_t head) const;
};

// What a GPU run() reads of a paged KV cache: the K and V pages and the page ids. The rest of
// the table (pages per request, last_page_len) is given to plan() on the host, and the kernels
// take page ranges and lengths from the plan; the ids themselves are range-checked on the
// device (include/flare/api/index_errors.h).
struct PagedKVPages {
  TensorView k;  // as PagedKV::k
  TensorView v;  // as PagedKV::v
  KVLayout layout = KVLayout::kNHD;
  TensorView indices;  // int32 [>= the plan's page count] on the device
  // NVFP4 KV only (k and v uint8 codes, D / 2 a row: include/flare/format/nvfp4.h): the e4m3
  // block scales, pages like k / v with D / 16 a row; empty (ndim 0) otherwise.
  TensorView k_scales;
  TensorView v_scales;

  static PagedKVPages of(const PagedKV& kv) { return {kv.k, kv.v, kv.layout, kv.table.indices}; }
};

// Strided offset of (page, slot, head) in a 4-D page tensor of the given layout.
inline int64_t page_element_offset(const TensorView& pages, KVLayout layout, int64_t page,
                                   int64_t slot, int64_t head) {
  return layout == KVLayout::kNHD
             ? page * pages.strides[0] + slot * pages.strides[1] + head * pages.strides[2]
             : page * pages.strides[0] + head * pages.strides[1] + slot * pages.strides[2];
}

}  // namespace flare
