// Test KV caches built from per-request lengths: random K/V in a page pool with randomly
// permuted page ids (plus unused pages), viewed both as PagedKV and as the same data RaggedKV.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/format/ragged.h"
#include "testing/elements.h"
#include "testing/index_arrays.h"
#include "testing/random.h"

namespace flare::testing {

struct KVCacheSpec {
  std::vector<int32_t> kv_lens;  // tokens per request; 0 is an empty request (no pages)
  int64_t num_kv_heads = 1;
  int64_t head_dim_qk = 64;
  int64_t head_dim_vo = 64;
  DType dtype = DType::kF16;  // any floating dtype (fp8 included)
  int64_t page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  // One [pages, 2, ...] tensor (FlashInfer's combined layout, needs head_dim_qk == head_dim_vo)
  // instead of separate K and V page tensors.
  bool combined = false;
  // Views carved out of larger buffers: padding after the last head dim element (head stride
  // > D), one extra head and one extra slot per page (page stride > slots * heads * D), and a
  // data pointer that does not start the buffer. Applies to the ragged copy too.
  bool strided = false;
  int64_t unused_pages = 3;  // pool pages no request references
  // Unused pages, slots past last_page_len and stride padding hold NaN, so a kernel that
  // reads outside the valid region produces NaN; false leaves them 0.
  bool poison_unused = true;
  uint64_t seed = 1;
  float scale = 1.0f;  // K and V values are normal(0, 1) * scale rounded to dtype
};

// The cache, owning every buffer its views point into. Moving it keeps the views valid
// (HostTensor moves its buffer); it cannot be copied.
//   ragged.k: [total_kv, H_kv, D_qk], values == random_tensor(dtype, that shape, seed, scale)
//   ragged.v: [total_kv, H_kv, D_vo], values == random_tensor(dtype, that shape, seed + 1, scale)
//   paged: the same values; token p of request r sits in page
//          page_indices[page_indptr[r] + p / page_size], slot p % page_size.
struct TestKVCache {
  KVCacheSpec spec;
  std::vector<int32_t> page_ids;  // the permuted pool: first used pages in order, then unused
  HostTensor pages_storage;       // K pages, or the combined K/V pages (padded when strided)
  HostTensor v_pages_storage;     // V pages when separate; empty when combined
  HostTensor page_indptr;         // int32 [batch + 1], counts pages
  HostTensor page_indices;        // int32 [page_indptr[batch]]
  HostTensor last_page_len;       // int32 [batch]; 0 for empty requests
  HostTensor k_ragged_storage;    // ragged K (padded when strided)
  HostTensor v_ragged_storage;    // ragged V (padded when strided)
  HostTensor ragged_indptr;       // int32 [batch + 1], counts tokens
  TensorView combined_pages;      // [pages, 2, ...] view when spec.combined, else empty
  PagedKV paged;
  RaggedKV ragged;

  int64_t batch() const { return static_cast<int64_t>(spec.kv_lens.size()); }
  int64_t total_kv() const { return ragged.k.shape[0]; }
  int64_t num_pages() const { return paged.num_pages(); }
};

namespace detail {

inline int64_t pages_for(int64_t len, int64_t page_size) {
  return (len + page_size - 1) / page_size;
}

// Buffer of `shape` (plus padding when strided) and the view of `shape` inside it. Padding:
// +8 in the last dimension, +1 in the `padded_dims` (the slot and head dims of a page).
inline TensorView padded_buffer(HostTensor& storage, DType dtype, const std::vector<int64_t>& shape,
                                const std::vector<int>& padded_dims, const KVCacheSpec& spec) {
  std::vector<int64_t> full = shape;
  std::vector<int64_t> begin(shape.size(), 0);
  if (spec.strided) {
    full.back() += 8;
    for (int d : padded_dims) {
      full[static_cast<size_t>(d)] += 1;
      begin[static_cast<size_t>(d)] = 1;  // so the view's data pointer is inside the buffer
    }
  }
  storage = HostTensor(dtype, full);
  storage.fill(spec.poison_unused ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
  return sub_view(storage, begin, shape);
}

// Copies token `pos` of every head from the ragged rows into its page slot (bytes, exact).
inline void copy_token(const TensorView& ragged, int64_t row, const TensorView& pages,
                       KVLayout layout, int64_t page, int64_t slot) {
  const auto bytes = static_cast<int64_t>(dtype_bytes(ragged.dtype));
  const auto* src = static_cast<const std::byte*>(ragged.data);
  auto* dst = static_cast<std::byte*>(pages.data);
  for (int64_t head = 0; head < ragged.shape[1]; ++head) {
    const int64_t src_offset = row * ragged.strides[0] + head * ragged.strides[1];
    const int64_t dst_offset = page_element_offset(pages, layout, page, slot, head);
    std::memcpy(dst + dst_offset * bytes, src + src_offset * bytes,
                static_cast<size_t>(ragged.shape[2] * bytes));
  }
}

}  // namespace detail

// Builds the cache described by `spec`; throws kInvalidArgument for a bad spec.
inline TestKVCache build_kv_cache(const KVCacheSpec& spec) {
  FLARE_CHECK(spec.page_size >= 1 && spec.num_kv_heads >= 1 && spec.head_dim_qk >= 1 &&
                  spec.head_dim_vo >= 1 && spec.unused_pages >= 0,
              ErrorCode::kInvalidArgument,
              "KVCacheSpec needs page_size, num_kv_heads, head dims >= 1 and unused_pages >= 0");
  FLARE_CHECK(!spec.combined || spec.head_dim_qk == spec.head_dim_vo, ErrorCode::kInvalidArgument,
              "the combined layout needs head_dim_qk == head_dim_vo, got ", spec.head_dim_qk,
              " and ", spec.head_dim_vo);
  FLARE_CHECK(is_floating(spec.dtype), ErrorCode::kInvalidArgument,
              "KV dtype must be floating, got ", dtype_name(spec.dtype));
  TestKVCache cache;
  cache.spec = spec;
  const int64_t batch = cache.batch();
  const int64_t heads = spec.num_kv_heads;
  const int64_t page_size = spec.page_size;

  // Ragged copy: the reference data.
  std::vector<int32_t> token_indptr = indptr_values(spec.kv_lens);
  const int64_t total_kv = token_indptr.back();
  cache.ragged_indptr = int32_tensor(token_indptr);
  const TensorView k_rows = detail::padded_buffer(cache.k_ragged_storage, spec.dtype,
                                                  {total_kv, heads, spec.head_dim_qk}, {1}, spec);
  const TensorView v_rows = detail::padded_buffer(cache.v_ragged_storage, spec.dtype,
                                                  {total_kv, heads, spec.head_dim_vo}, {1}, spec);
  fill_random(k_rows, spec.seed, spec.scale);
  fill_random(v_rows, spec.seed + 1, spec.scale);
  cache.ragged = RaggedKV{k_rows, v_rows, cache.ragged_indptr.view()};

  // Page table: requests take pages from a randomly permuted pool, in order.
  std::vector<int32_t> page_counts(static_cast<size_t>(batch));
  std::vector<int32_t> last_lens(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t len = spec.kv_lens[static_cast<size_t>(r)];
    FLARE_CHECK(len >= 0, ErrorCode::kInvalidArgument, "kv_lens[", r, "] is negative: ", len);
    page_counts[static_cast<size_t>(r)] = static_cast<int32_t>(detail::pages_for(len, page_size));
    last_lens[static_cast<size_t>(r)] =
        len == 0 ? 0 : static_cast<int32_t>((len - 1) % page_size + 1);
  }
  const std::vector<int32_t> page_indptr = indptr_values(page_counts);
  const int64_t used_pages = page_indptr.back();
  const int64_t pool = used_pages + spec.unused_pages;
  Rng rng(spec.seed + 2);
  cache.page_ids = rng.permutation(static_cast<int32_t>(pool));
  cache.page_indptr = int32_tensor(page_indptr);
  cache.page_indices = int32_tensor(std::vector<int32_t>(
      cache.page_ids.begin(), cache.page_ids.begin() + static_cast<ptrdiff_t>(used_pages)));
  cache.last_page_len = int32_tensor(last_lens);

  // Page tensors: NHD [pool, page_size, H, D], HND [pool, H, page_size, D].
  const bool nhd = spec.layout == KVLayout::kNHD;
  const int64_t dim1 = nhd ? page_size : heads;
  const int64_t dim2 = nhd ? heads : page_size;
  if (spec.combined) {
    cache.combined_pages = detail::padded_buffer(
        cache.pages_storage, spec.dtype, {pool, 2, dim1, dim2, spec.head_dim_qk}, {2, 3}, spec);
    cache.paged =
        PagedKV::from_combined(cache.combined_pages, spec.layout, cache.page_indptr.view(),
                               cache.page_indices.view(), cache.last_page_len.view());
  } else {
    const TensorView k_pages = detail::padded_buffer(
        cache.pages_storage, spec.dtype, {pool, dim1, dim2, spec.head_dim_qk}, {1, 2}, spec);
    const TensorView v_pages = detail::padded_buffer(
        cache.v_pages_storage, spec.dtype, {pool, dim1, dim2, spec.head_dim_vo}, {1, 2}, spec);
    cache.paged = PagedKV::from_separate(k_pages, v_pages, spec.layout, cache.page_indptr.view(),
                                         cache.page_indices.view(), cache.last_page_len.view());
  }

  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t pos = 0; pos < spec.kv_lens[static_cast<size_t>(r)]; ++pos) {
      const int64_t page = cache.page_ids[static_cast<size_t>(page_indptr[r] + pos / page_size)];
      const int64_t row = token_indptr[static_cast<size_t>(r)] + pos;
      detail::copy_token(k_rows, row, cache.paged.k, spec.layout, page, pos % page_size);
      detail::copy_token(v_rows, row, cache.paged.v, spec.layout, page, pos % page_size);
    }
  }
  return cache;
}

// Shorthand: a separate, contiguous NHD cache of f16 values.
inline TestKVCache build_kv_cache(const std::vector<int32_t>& kv_lens, int64_t num_kv_heads,
                                  int64_t head_dim, int64_t page_size, uint64_t seed = 1) {
  KVCacheSpec spec;
  spec.kv_lens = kv_lens;
  spec.num_kv_heads = num_kv_heads;
  spec.head_dim_qk = head_dim;
  spec.head_dim_vo = head_dim;
  spec.page_size = page_size;
  spec.seed = seed;
  return build_kv_cache(spec);
}

}  // namespace flare::testing
