// Validation of every index array and shape before any computation (DESIGN decision 6):
// each check throws flare::Error naming the argument and the expected versus actual value,
// and nothing is written before all checks pass. Index arrays must be on the CPU here;
// device-resident index arrays are checked by the callers that copy them.
#pragma once

#include <cstdint>
#include <optional>

#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/format/ragged.h"

namespace flare {

// `name` is int32, 1-D, [expected_size] (when >= 0), on the CPU, starts at 0 and is
// non-decreasing; when max_last >= 0 its last entry is <= max_last. Example message:
// "kv_indptr must be non-decreasing: kv_indptr[3]=12 < kv_indptr[2]=15".
void validate_indptr(const TensorView& indptr, const char* name, int64_t expected_size = -1,
                     int64_t max_last = -1);

// dtype, rank, contiguity of the innermost dimension (stride 1) and shape prefix.
void validate_tensor(const TensorView& t, const char* name, int ndim);
void validate_dtype(const TensorView& t, const char* name, DType expected);

// Shapes agree between k and v, page size >= 1, indptr/indices/last_page_len consistent:
// indices in [0, num_pages), last_page_len in [1, page_size] for requests with pages.
void validate_paged_kv(const PagedKV& kv);
// The page-table half of validate_paged_kv, for caches whose pages are not float tensors (NVFP4
// codes): block_size == page_size, indptr, indices in [0, num_pages), last_page_len.
void validate_page_table(const BlockSparseIndex& table, int64_t num_pages, int64_t page_size);
void validate_ragged_kv(const RaggedKV& kv);

}  // namespace flare
