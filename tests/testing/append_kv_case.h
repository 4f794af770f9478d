// A paged-KV append test case: the complete cache (old + appended tokens, built by kv_builder),
// a copy of its pages with the appended slots poisoned, and the tokens that restore them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "flare/api/append_paged_kv.h"
#include "flare/core/tensor.h"
#include "testing/elements.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"

namespace flare::testing {

// After appending input() into `target`, its bytes must equal the complete cache's bytes.
struct AppendCase {
  TestKVCache complete;             // every token in place: the expected pages
  HostTensor target_k_storage;      // copy of complete.pages_storage, appended slots = NaN
  HostTensor target_v_storage;      // copy of complete.v_pages_storage (empty when combined)
  PagedKV target;                   // complete.paged rebased onto the target storage
  HostTensor append_k_storage;      // [nnz, H, D_qk] (padded when the spec is strided)
  HostTensor append_v_storage;
  TensorView append_k;
  TensorView append_v;
  HostTensor batch_indices;  // int32 [nnz]; -1 for the padding tokens
  HostTensor positions;      // int32 [nnz]

  AppendPagedKVInput input() const {
    return {append_k, append_v, batch_indices.view(), positions.view()};
  }
  int64_t num_tokens() const { return append_k.shape[0]; }
  int64_t num_appended() const {
    int64_t count = 0;
    for (int64_t i = 0; i < num_tokens(); ++i) count += batch_indices.data<int32_t>()[i] >= 0;
    return count;
  }
  int64_t last_appended_token() const {
    for (int64_t i = num_tokens() - 1; i >= 0; --i) {
      if (batch_indices.data<int32_t>()[i] >= 0) return i;
    }
    return -1;
  }
  std::vector<std::byte> target_bytes() const {
    std::vector<std::byte> bytes;
    for (const HostTensor* t : {&target_k_storage, &target_v_storage}) {
      const auto* data = t->data<std::byte>();
      bytes.insert(bytes.end(), data, data + storage_bytes(*t));
    }
    return bytes;
  }
  // Byte index of the first difference between target and complete pages, or -1.
  int64_t first_difference() const {
    std::vector<std::byte> expected;
    for (const HostTensor* t : {&complete.pages_storage, &complete.v_pages_storage}) {
      const auto* data = t->data<std::byte>();
      expected.insert(expected.end(), data, data + storage_bytes(*t));
    }
    const std::vector<std::byte> actual = target_bytes();
    if (actual.size() != expected.size()) return 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      if (actual[i] != expected[i]) return static_cast<int64_t>(i);
    }
    return -1;
  }
  bool target_matches_complete() const { return first_difference() < 0; }

  // A default-constructed HostTensor (no V storage for combined caches) holds nothing.
  static size_t storage_bytes(const HostTensor& t) {
    if (t.shape().empty()) return 0;
    return static_cast<size_t>(t.numel()) * dtype_bytes(t.dtype());
  }
};

namespace detail {

inline HostTensor copy_storage(const HostTensor& source) {
  if (source.shape().empty()) return HostTensor();
  HostTensor copy(source.dtype(), source.shape());
  std::memcpy(copy.data<std::byte>(), source.data<std::byte>(), AppendCase::storage_bytes(source));
  return copy;
}

// Sets every element of the (page, slot) row of all heads to NaN.
inline void poison_slot(const TensorView& pages, KVLayout layout, int64_t page, int64_t slot) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t heads = layout == KVLayout::kNHD ? pages.shape[2] : pages.shape[1];
  for (int64_t head = 0; head < heads; ++head) {
    const int64_t base = page_element_offset(pages, layout, page, slot, head);
    for (int64_t d = 0; d < pages.shape[3]; ++d) set_element_at(pages, base + d, nan);
  }
}

// [tokens, heads, dim] buffer, padded (+1 head, +8 dims, offset start) when `strided`.
inline TensorView token_buffer(HostTensor& storage, DType dtype, int64_t tokens, int64_t heads,
                               int64_t dim, bool strided) {
  const int64_t pad = strided ? 1 : 0;
  storage = HostTensor(dtype, {tokens + pad, heads + pad, dim + (strided ? 8 : 0)});
  storage.fill(std::numeric_limits<float>::quiet_NaN());
  return sub_view(storage, {pad, pad, 0}, {tokens, heads, dim});
}

inline void copy_row(const TensorView& from, int64_t from_row, const TensorView& to,
                     int64_t to_row) {
  const size_t element = dtype_bytes(from.dtype);
  for (int64_t head = 0; head < from.shape[1]; ++head) {
    std::memcpy(static_cast<std::byte*>(to.data) +
                    (to_row * to.strides[0] + head * to.strides[1]) * element,
                static_cast<const std::byte*>(from.data) +
                    (from_row * from.strides[0] + head * from.strides[1]) * element,
                static_cast<size_t>(from.shape[2]) * element);
  }
}

}  // namespace detail

// Requests hold old_lens[r] tokens and append append_lens[r] more. The append tensors list
// the appended tokens request by request (shuffled when shuffle_seed != 0), followed by two
// padding tokens (batch index -1) holding random values that must not be written anywhere.
inline AppendCase make_append_case(KVCacheSpec spec, const std::vector<int32_t>& old_lens,
                                   const std::vector<int32_t>& append_lens,
                                   uint64_t shuffle_seed = 0) {
  FLARE_CHECK(old_lens.size() == append_lens.size(), ErrorCode::kInvalidArgument,
              "old_lens and append_lens differ in size");
  spec.kv_lens.resize(old_lens.size());
  for (size_t r = 0; r < old_lens.size(); ++r) spec.kv_lens[r] = old_lens[r] + append_lens[r];
  AppendCase c;
  c.complete = build_kv_cache(spec);
  const TestKVCache& full = c.complete;

  c.target_k_storage = detail::copy_storage(full.pages_storage);
  c.target_v_storage = detail::copy_storage(full.v_pages_storage);
  c.target = full.paged;
  c.target.k = rebase_view(full.paged.k, full.pages_storage.data<std::byte>(),
                           c.target_k_storage.data<std::byte>(), Device::cpu());
  const HostTensor& v_source = spec.combined ? full.pages_storage : full.v_pages_storage;
  HostTensor& v_target = spec.combined ? c.target_k_storage : c.target_v_storage;
  c.target.v = rebase_view(full.paged.v, v_source.data<std::byte>(), v_target.data<std::byte>(),
                           Device::cpu());

  struct Token {
    int32_t request;
    int32_t pos;
    int64_t ragged_row;
  };
  std::vector<Token> tokens;
  const std::vector<int32_t> page_indptr = int32_values(full.page_indptr.view());
  const std::vector<int32_t> row_indptr = int32_values(full.ragged_indptr.view());
  for (size_t r = 0; r < old_lens.size(); ++r) {
    for (int32_t pos = old_lens[r]; pos < spec.kv_lens[r]; ++pos) {
      tokens.push_back({static_cast<int32_t>(r), pos, row_indptr[r] + pos});
      const int64_t page = full.page_ids[static_cast<size_t>(page_indptr[r] + pos / spec.page_size)];
      detail::poison_slot(c.target.k, spec.layout, page, pos % spec.page_size);
      detail::poison_slot(c.target.v, spec.layout, page, pos % spec.page_size);
    }
  }
  if (shuffle_seed != 0) Rng(shuffle_seed).shuffle(tokens);
  constexpr int kPaddingTokens = 2;
  const auto nnz = static_cast<int64_t>(tokens.size()) + kPaddingTokens;
  const int64_t heads = spec.num_kv_heads;
  c.append_k = detail::token_buffer(c.append_k_storage, spec.dtype, nnz, heads, spec.head_dim_qk,
                                    spec.strided);
  c.append_v = detail::token_buffer(c.append_v_storage, spec.dtype, nnz, heads, spec.head_dim_vo,
                                    spec.strided);
  fill_random(c.append_k, spec.seed + 100);
  fill_random(c.append_v, spec.seed + 101);
  c.batch_indices = HostTensor(DType::kI32, {nnz});
  c.positions = HostTensor(DType::kI32, {nnz});
  for (int64_t i = 0; i < nnz; ++i) {
    const bool padding = i >= static_cast<int64_t>(tokens.size());
    c.batch_indices.data<int32_t>()[i] = padding ? -1 : tokens[static_cast<size_t>(i)].request;
    c.positions.data<int32_t>()[i] = padding ? 0 : tokens[static_cast<size_t>(i)].pos;
    if (padding) continue;
    const int64_t row = tokens[static_cast<size_t>(i)].ragged_row;
    detail::copy_row(full.ragged.k, row, c.append_k, i);
    detail::copy_row(full.ragged.v, row, c.append_v, i);
  }
  return c;
}

}  // namespace flare::testing
