// The tensor maps of the Hopper prefill family's bulk copies of K and V (and of Q)
// (kernels/prefill_hopper.cuh; PrefillParams::k_map / v_map / q_map): what run() encodes for
// ragged rows and for pages, and when it cannot (the kernel then gathers with cp.async).
#pragma once

#include <array>
#include <cstdint>

#include "flare/jit/cuda_driver.h"

namespace flare::api_detail {

// What the maps describe; equal sources give equal maps (run() re-encodes only on a change).
struct BulkSource {
  bool paged = false;
  bool bf16 = false;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_rows = 0, v_rows = 0;  // ragged: tokens of k and v
  int64_t num_pages = 0;           // paged: pages of the cache
  // Element strides: ragged k_page / v_page are the token strides (slots unused).
  int64_t k_page = 0, k_slot = 0, k_head = 0;
  int64_t v_page = 0, v_slot = 0, v_head = 0;
  int page_size = 0, kv_tile = 0;
  int head_dim_qk = 0, head_dim_vo = 0, num_kv_heads = 0;
  bool operator==(const BulkSource&) const = default;
};

// Encodes k_map and v_map of `source`: ragged [tokens][H_kv][D] in boxes of 64 dims x 1 head x
// kv_tile tokens; paged [pages][page_size][H_kv][D] in boxes of 64 x 1 x
// prefill_paged_box_rows(page_size, kv_tile) x 1. False (nothing encoded) when a base address
// or a stride is not a multiple of 16 bytes, or pages of this size are gathered.
bool encode_bulk_maps(const BulkSource& source, cuda::TensorMap& k_map, cuda::TensorMap& v_map);

// What the map of q describes ([tokens][H_qo][D_qk], 16-bit): a query tile's packed rows are
// query_tile / group tokens of `group` consecutive heads each, one box per 64-dim panel.
struct BulkQSource {
  bool bf16 = false;
  const void* q = nullptr;
  int64_t rows = 0;             // tokens of q
  int64_t token = 0, head = 0;  // element strides
  int head_dim = 0, num_heads = 0, group = 0, query_tile = 0;
  bool operator==(const BulkQSource&) const = default;
};

// Encodes q_map of `source` in boxes of 64 dims x group heads x query_tile / group tokens. False
// (nothing encoded) when the group does not divide the query tile, or a base address or a
// stride is not a multiple of 16 bytes (the kernel then gathers Q).
bool encode_bulk_q_map(const BulkQSource& source, cuda::TensorMap& q_map);

// Maps kept with the source they describe: run() re-encodes them only when the source changed
// (a serving loop's buffers usually do not). The source is recorded once encoded, so an encoding
// that throws is tried again on the next run.
template <class Source, int kCount>
struct EncodedMaps {
  Source source;
  bool encoded = false;  // source was tried
  bool valid = false;    // it could be encoded (false: the kernel gathers)
  std::array<cuda::TensorMap, kCount> maps;

  // The maps of `next`, encoded by encode(next, maps) -> valid unless next is the source.
  template <class Encode>
  bool update(const Source& next, Encode&& encode) {
    if (encoded && next == source) return valid;
    encoded = false;
    valid = encode(next, maps);
    source = next;
    encoded = true;
    return valid;
  }
};

}  // namespace flare::api_detail
