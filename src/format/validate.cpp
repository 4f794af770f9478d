// Validation of index arrays, tensor shapes and KV caches (DESIGN decision 6): every check
// reads only host memory and throws kInvalidArgument naming the argument and the values.
#include "flare/format/validate.h"

#include "flare/core/error.h"

namespace flare {

namespace {

constexpr auto kInvalid = ErrorCode::kInvalidArgument;

// Entry i of a 1-D int32 CPU array that has already passed the checks of check_int32_array.
int64_t entry(const TensorView& array, int64_t i) {
  return array.ptr<const int32_t>()[i * array.strides[0]];
}

// int32, on the CPU, 1-D: the checks shared by every index array.
void check_int32_array(const TensorView& array, const char* name) {
  FLARE_CHECK(array.dtype == DType::kI32, kInvalid, name, " must be int32, got ",
              dtype_name(array.dtype));
  FLARE_CHECK(array.device.is_cpu(), kInvalid, name, " must be on the CPU, got ",
              array.device.str());
  FLARE_CHECK(array.ndim == 1, kInvalid, name, " must be 1-D, got shape ", array.shape_str());
  FLARE_CHECK(array.shape[0] == 0 || array.data != nullptr, kInvalid, name,
              " has no data (null pointer)");
}

void check_floating(const TensorView& t, const char* name) {
  FLARE_CHECK(is_floating(t.dtype), kInvalid, name, " must have a floating dtype, got ",
              dtype_name(t.dtype));
}

// k and v agree in dtype and device; both floating.
void check_kv_pair(const TensorView& k, const char* k_name, const TensorView& v,
                   const char* v_name) {
  check_floating(k, k_name);
  FLARE_CHECK(v.dtype == k.dtype, kInvalid, v_name, " must have the dtype of ", k_name, " (",
              dtype_name(k.dtype), "), got ", dtype_name(v.dtype));
  FLARE_CHECK(v.device == k.device, kInvalid, v_name, " must be on the device of ", k_name, " (",
              k.device.str(), "), got ", v.device.str());
}

// `what` of k and v (e.g. the page count) must agree.
void check_same_extent(int64_t k_extent, int64_t v_extent, const char* what, const char* k_name,
                       const char* v_name) {
  FLARE_CHECK(k_extent == v_extent, kInvalid, v_name, " must have the ", what, " of ", k_name, " (",
              k_extent, "), got ", v_extent);
}

}  // namespace

void validate_indptr(const TensorView& indptr, const char* name, int64_t expected_size,
                     int64_t max_last) {
  check_int32_array(indptr, name);
  const int64_t size = indptr.shape[0];
  if (expected_size >= 0) {
    FLARE_CHECK(size == expected_size, kInvalid, name, " must have ", expected_size,
                " entries (batch + 1), got ", size);
  }
  FLARE_CHECK(size >= 1, kInvalid, name, " must have at least 1 entry (batch + 1), got 0");
  FLARE_CHECK(entry(indptr, 0) == 0, kInvalid, name, "[0] must be 0, got ", entry(indptr, 0));
  for (int64_t i = 1; i < size; ++i) {
    FLARE_CHECK(entry(indptr, i) >= entry(indptr, i - 1), kInvalid, name,
                " must be non-decreasing: ", name, "[", i, "]=", entry(indptr, i), " < ", name, "[",
                i - 1, "]=", entry(indptr, i - 1));
  }
  if (max_last >= 0) {
    FLARE_CHECK(entry(indptr, size - 1) <= max_last, kInvalid, name, "[", size - 1,
                "]=", entry(indptr, size - 1), " must be <= ", max_last);
  }
}

void validate_tensor(const TensorView& t, const char* name, int ndim) {
  FLARE_CHECK(t.ndim == ndim, kInvalid, name, " must have ", ndim, " dimensions, got shape ",
              t.shape_str());
  for (int d = 0; d < ndim; ++d) {
    FLARE_CHECK(t.shape[d] >= 0 && t.strides[d] >= 0, kInvalid, name,
                " must have non-negative sizes and strides, got size ", t.shape[d], " and stride ",
                t.strides[d], " in dimension ", d);
  }
  // Size-1 innermost dimensions never step, so their stride does not matter.
  FLARE_CHECK(ndim == 0 || t.shape[ndim - 1] <= 1 || t.strides[ndim - 1] == 1, kInvalid, name,
              " must be contiguous in its last dimension (stride 1), got stride ",
              t.strides[ndim - 1], " for shape ", t.shape_str());
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) numel *= t.shape[d];
  FLARE_CHECK(numel == 0 || t.data != nullptr, kInvalid, name, " has no data (null pointer)");
}

void validate_dtype(const TensorView& t, const char* name, DType expected) {
  FLARE_CHECK(t.dtype == expected, kInvalid, name, " must be ", dtype_name(expected), ", got ",
              dtype_name(t.dtype));
}

void validate_paged_kv(const PagedKV& kv) {
  validate_tensor(kv.k, "k_cache", 4);
  validate_tensor(kv.v, "v_cache", 4);
  check_kv_pair(kv.k, "k_cache", kv.v, "v_cache");
  // v's page size and heads read with k's layout (PagedKV accessors read k only).
  const bool nhd = kv.layout == KVLayout::kNHD;
  check_same_extent(kv.k.shape[0], kv.v.shape[0], "page count", "k_cache", "v_cache");
  check_same_extent(kv.page_size(), kv.v.shape[nhd ? 1 : 2], "page size", "k_cache", "v_cache");
  check_same_extent(kv.num_kv_heads(), kv.v.shape[nhd ? 2 : 1], "number of KV heads", "k_cache",
                    "v_cache");
  const int64_t page_size = kv.page_size();
  const int64_t num_pages = kv.num_pages();
  FLARE_CHECK(page_size >= 1, kInvalid, "page size must be >= 1, got ", page_size,
              " (k_cache shape ", kv.k.shape_str(), ", layout ", kv_layout_name(kv.layout), ")");
  validate_page_table(kv.table, num_pages, page_size);
}

void validate_page_table(const BlockSparseIndex& table, int64_t num_pages, int64_t page_size) {
  FLARE_CHECK(table.block_size == page_size, kInvalid, "page table block_size must equal the ",
              "page size ", page_size, ", got ", table.block_size);

  validate_indptr(table.indptr, "kv_indptr");
  const int64_t batch = table.indptr.shape[0] - 1;
  const int64_t used_pages = entry(table.indptr, batch);

  const TensorView& indices = table.indices;
  check_int32_array(indices, "kv_indices");
  FLARE_CHECK(indices.shape[0] >= used_pages, kInvalid, "kv_indices must have at least ",
              used_pages, " entries (kv_indptr[", batch, "]), got ", indices.shape[0]);
  for (int64_t i = 0; i < used_pages; ++i) {
    const int64_t page = entry(indices, i);
    FLARE_CHECK(page >= 0 && page < num_pages, kInvalid, "kv_indices[", i, "]=", page,
                " is out of range [0, ", num_pages, ") (the number of pages)");
  }

  const TensorView& last_page_len = table.last_block_len;
  check_int32_array(last_page_len, "kv_last_page_len");
  FLARE_CHECK(last_page_len.shape[0] == batch, kInvalid, "kv_last_page_len must have ", batch,
              " entries (batch), got ", last_page_len.shape[0]);
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t pages = entry(table.indptr, r + 1) - entry(table.indptr, r);
    if (pages == 0) continue;  // an empty request's last_page_len is ignored
    const int64_t last = entry(last_page_len, r);
    FLARE_CHECK(last >= 1 && last <= page_size, kInvalid, "kv_last_page_len[", r, "]=", last,
                " must be in [1, ", page_size, "] (the page size) for request ", r, ", which has ",
                pages, " pages");
  }
}

void validate_ragged_kv(const RaggedKV& kv) {
  validate_tensor(kv.k, "k", 3);
  validate_tensor(kv.v, "v", 3);
  check_kv_pair(kv.k, "k", kv.v, "v");
  check_same_extent(kv.k.shape[0], kv.v.shape[0], "number of rows", "k", "v");
  check_same_extent(kv.k.shape[1], kv.v.shape[1], "number of KV heads", "k", "v");
  validate_indptr(kv.indptr, "kv_indptr");
  const int64_t batch = kv.indptr.shape[0] - 1;
  FLARE_CHECK(entry(kv.indptr, batch) == kv.k.shape[0], kInvalid, "kv_indptr[", batch,
              "]=", entry(kv.indptr, batch), " must equal the number of rows of k (", kv.k.shape[0],
              ")");
}

}  // namespace flare
