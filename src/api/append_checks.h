// What the paged-KV appends (api/append_paged_kv.h, api/append_paged_kv_nvfp4.h) share: the
// host's checks of the appended tokens' indices (CPU paths: every one, before anything is
// written) and of index arrays the GPU kernels read, and the page a token lands in.
#pragma once

#include <cstdint>

#include "flare/core/tensor.h"
#include "flare/format/block_sparse.h"

namespace flare::api_detail {

// Entry i of a 1-D int32 host array (any stride).
int64_t host_index_entry(const TensorView& array, int64_t i);

// Every token's batch index (negative: padding) in [0, batch) and position inside its
// request's pages (table on the CPU, validated); kInvalidArgument naming the entry otherwise.
void check_append_tokens(const TensorView& batch_indices, const TensorView& positions,
                         const BlockSparseIndex& table, int64_t page_size);

// The page (id) of position `pos` of request `request` (checked by check_append_tokens).
int64_t append_page(const BlockSparseIndex& table, int64_t request, int64_t pos, int64_t page_size);

// An index array a GPU append kernel reads: int32, 1-D, contiguous.
void check_contiguous_index(const TensorView& array, const char* name);

}  // namespace flare::api_detail
