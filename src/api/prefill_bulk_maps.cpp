// The Hopper prefill family's bulk-copy maps of K and V (prefill_bulk_maps.h).
#include "src/api/prefill_bulk_maps.h"

#include <algorithm>

#include "kernels/prefill_params.cuh"

namespace flare::api_detail {
namespace {

bool aligned16(const void* base, int64_t stride_elements) {
  return stride_elements > 0 && stride_elements * 2 % 16 == 0 &&
         reinterpret_cast<uintptr_t>(base) % 16 == 0;
}

}  // namespace

bool encode_bulk_maps(const BulkSource& s, cuda::TensorMap& k_map, cuda::TensorMap& v_map) {
  if (!s.paged) {
    if (!aligned16(s.k, s.k_page) || !aligned16(s.k, s.k_head) || !aligned16(s.v, s.v_page) ||
        !aligned16(s.v, s.v_head)) {
      return false;
    }
    const auto encode = [&](cuda::TensorMap& map, const void* base, int head_dim, int64_t rows,
                            int64_t row_stride, int64_t head_stride) {
      cuda::encode_tensor_map_3d(
          map, s.bf16, base,
          {static_cast<uint64_t>(head_dim), static_cast<uint64_t>(s.num_kv_heads),
           static_cast<uint64_t>(std::max<int64_t>(rows, 1))},
          {static_cast<uint64_t>(head_stride) * 2, static_cast<uint64_t>(row_stride) * 2},
          {64, 1, static_cast<uint32_t>(s.kv_tile)});
    };
    encode(k_map, s.k, s.head_dim_qk, s.k_rows, s.k_page, s.k_head);
    encode(v_map, s.v, s.head_dim_vo, s.v_rows, s.v_page, s.v_head);
    return true;
  }
  const int box_rows = prefill_paged_box_rows(s.page_size, s.kv_tile);
  if (box_rows == 0 || s.num_pages < 1) return false;
  if (!aligned16(s.k, s.k_page) || !aligned16(s.k, s.k_slot) || !aligned16(s.k, s.k_head) ||
      !aligned16(s.v, s.v_page) || !aligned16(s.v, s.v_slot) || !aligned16(s.v, s.v_head)) {
    return false;
  }
  // Page ids index dim 3: an id outside [0, num_pages) (or a negative one) is outside the map
  // and its box lands as zeros (the kernel records it in the index-error record).
  const auto encode = [&](cuda::TensorMap& map, const void* base, int head_dim, int64_t page,
                          int64_t slot, int64_t head) {
    cuda::encode_tensor_map_4d(
        map, s.bf16, base,
        {static_cast<uint64_t>(head_dim), static_cast<uint64_t>(s.num_kv_heads),
         static_cast<uint64_t>(s.page_size), static_cast<uint64_t>(s.num_pages)},
        {static_cast<uint64_t>(head) * 2, static_cast<uint64_t>(slot) * 2,
         static_cast<uint64_t>(page) * 2},
        {64, 1, static_cast<uint32_t>(box_rows), 1});
  };
  encode(k_map, s.k, s.head_dim_qk, s.k_page, s.k_slot, s.k_head);
  encode(v_map, s.v, s.head_dim_vo, s.v_page, s.v_slot, s.v_head);
  return true;
}

bool encode_bulk_q_map(const BulkQSource& s, cuda::TensorMap& q_map) {
  if (s.group < 1 || s.query_tile % s.group != 0 || s.group > 256 || s.head_dim % 64 != 0 ||
      !aligned16(s.q, s.token) || !aligned16(s.q, s.head)) {
    return false;
  }
  cuda::encode_tensor_map_3d(
      q_map, s.bf16, s.q,
      {static_cast<uint64_t>(s.head_dim), static_cast<uint64_t>(s.num_heads),
       static_cast<uint64_t>(std::max<int64_t>(s.rows, 1))},
      {static_cast<uint64_t>(s.head) * 2, static_cast<uint64_t>(s.token) * 2},
      {64, static_cast<uint32_t>(s.group), static_cast<uint32_t>(s.query_tile / s.group)});
  return true;
}

}  // namespace flare::api_detail
