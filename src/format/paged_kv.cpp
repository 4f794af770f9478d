// PagedKV construction from combined ([pages, 2, ...]) or separate K/V page tensors, the
// layout names, and 64-bit element offsets of a request's token through the page table.
#include "flare/format/paged_kv.h"

#include <string_view>

#include "flare/core/error.h"

namespace flare {

KVLayout parse_kv_layout(const char* name) {
  const std::string_view text = name == nullptr ? std::string_view() : std::string_view(name);
  if (text == "NHD") return KVLayout::kNHD;
  if (text == "HND") return KVLayout::kHND;
  fail(ErrorCode::kInvalidArgument, "kv_layout must be \"NHD\" or \"HND\", got \"", text, "\"");
}

const char* kv_layout_name(KVLayout layout) { return layout == KVLayout::kNHD ? "NHD" : "HND"; }

PagedKV PagedKV::from_combined(const TensorView& kv, KVLayout layout, const TensorView& indptr,
                               const TensorView& indices, const TensorView& last_page_len) {
  FLARE_CHECK(kv.ndim == 5 && kv.shape[1] == 2, ErrorCode::kInvalidArgument,
              "paged_kv_cache must be [pages, 2, ",
              layout == KVLayout::kNHD ? "page_size, H_kv" : "H_kv, page_size",
              ", D] with K at index 0 and V at 1 of dimension 1, got shape ", kv.shape_str());
  // select keeps the remaining strides, so K and V interleave per page exactly as stored.
  return from_separate(kv.select(1, 0), kv.select(1, 1), layout, indptr, indices, last_page_len);
}

PagedKV PagedKV::from_separate(const TensorView& k, const TensorView& v, KVLayout layout,
                               const TensorView& indptr, const TensorView& indices,
                               const TensorView& last_page_len) {
  FLARE_CHECK(k.ndim == 4, ErrorCode::kInvalidArgument,
              "k_cache must have 4 dimensions (pages, page_size, H_kv, D or pages, H_kv, "
              "page_size, D), got shape ",
              k.shape_str());
  PagedKV paged;
  paged.k = k;
  paged.v = v;
  paged.layout = layout;
  paged.table.block_size = paged.page_size();
  paged.table.indptr = indptr;
  paged.table.indices = indices;
  paged.table.last_block_len = last_page_len;
  return paged;
}

namespace {

int64_t token_offset(const PagedKV& kv, const TensorView& pages, int64_t request, int64_t pos,
                     int64_t head) {
  FLARE_CHECK(head >= 0 && head < kv.num_kv_heads(), ErrorCode::kInvalidArgument, "KV head ", head,
              " is out of range [0, ", kv.num_kv_heads(), ")");
  const int64_t slot_in_pool = kv.table.block_of(request, pos);
  const int64_t page_size = kv.page_size();
  return page_element_offset(pages, kv.layout, slot_in_pool / page_size, slot_in_pool % page_size,
                             head);
}

}  // namespace

int64_t PagedKV::k_offset(int64_t request, int64_t pos, int64_t head) const {
  return token_offset(*this, k, request, pos, head);
}

int64_t PagedKV::v_offset(int64_t request, int64_t pos, int64_t head) const {
  return token_offset(*this, v, request, pos, head);
}

}  // namespace flare
