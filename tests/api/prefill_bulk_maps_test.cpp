// The Hopper prefill family's bulk-copy maps (src/api/prefill_bulk_maps.h): which page sizes
// are copied in boxes, and the sources (K/V and Q) run() must leave to the gather (nothing
// encoded, so no GPU or driver needed: those return before encoding), and that run() encodes a
// source once.
#include "src/api/prefill_bulk_maps.h"

#include <gtest/gtest.h>

#include <array>
#include <stdexcept>

#include "kernels/prefill_params.cuh"

namespace flare::api_detail {
namespace {

TEST(PrefillBulkMaps, BoxRowsKeepATileWholeBoxesOfOnePage) {
  EXPECT_EQ(prefill_paged_box_rows(64, 128), 64);    // two pages a tile
  EXPECT_EQ(prefill_paged_box_rows(128, 128), 128);  // one
  EXPECT_EQ(prefill_paged_box_rows(256, 128), 128);  // half a page
  EXPECT_EQ(prefill_paged_box_rows(128, 64), 64);
  EXPECT_EQ(prefill_paged_box_rows(16, 128), 16);  // eight pages a tile, a box each
  EXPECT_EQ(prefill_paged_box_rows(32, 64), 32);
  EXPECT_EQ(prefill_paged_box_rows(8, 128), 0);  // under 16 rows: gathered
  EXPECT_EQ(prefill_paged_box_rows(1, 64), 0);
  EXPECT_EQ(prefill_paged_box_rows(24, 128), 0);  // a tile would straddle a page's end
  EXPECT_EQ(prefill_paged_box_rows(20, 80), 0);   // not a multiple of 8
  EXPECT_EQ(prefill_paged_box_rows(96, 128), 0);  // a tile would straddle a page's end
  EXPECT_EQ(prefill_paged_box_rows(192, 128), 0);
}

BulkSource paged_source() {
  BulkSource s;
  s.paged = true;
  s.bf16 = true;
  alignas(16) static unsigned char storage[64];
  s.k = storage;
  s.v = storage;
  s.num_pages = 10;
  s.k_page = s.v_page = 64 * 2 * 128;
  s.k_slot = s.v_slot = 2 * 128;
  s.k_head = s.v_head = 128;
  s.page_size = 64;
  s.kv_tile = 128;
  s.head_dim_qk = s.head_dim_vo = 128;
  s.num_kv_heads = 2;
  return s;
}

TEST(PrefillBulkMaps, SourcesTheKernelMustGatherEncodeNothing) {
  cuda::TensorMap k, v;
  BulkSource small = paged_source();
  small.page_size = 8;
  EXPECT_FALSE(encode_bulk_maps(small, k, v));
  BulkSource odd_stride = paged_source();
  odd_stride.v_slot = 2 * 128 + 1;  // a row stride of 514 bytes
  EXPECT_FALSE(encode_bulk_maps(odd_stride, k, v));
  BulkSource misaligned = paged_source();
  misaligned.k = static_cast<const unsigned char*>(misaligned.k) + 2;
  EXPECT_FALSE(encode_bulk_maps(misaligned, k, v));
  BulkSource empty = paged_source();
  empty.num_pages = 0;
  EXPECT_FALSE(encode_bulk_maps(empty, k, v));
  BulkSource ragged = paged_source();
  ragged.paged = false;
  ragged.k_head = 7;  // 14 bytes
  EXPECT_FALSE(encode_bulk_maps(ragged, k, v));
}

BulkQSource q_source() {
  BulkQSource s;
  s.bf16 = true;
  alignas(16) static unsigned char storage[64];
  s.q = storage;
  s.rows = 1000;
  s.num_heads = 32;
  s.head_dim = 128;
  s.token = 32 * 128;
  s.head = 128;
  s.group = 4;
  s.query_tile = 128;
  return s;
}

// Q in boxes of `group` heads x query_tile / group tokens needs a group that divides the tile
// (the packed rows of a tile are then whole tokens) and 16-byte strides; else the gather.
TEST(PrefillBulkMaps, QueriesTheKernelMustGatherEncodeNothing) {
  cuda::TensorMap q;
  BulkQSource seven = q_source();
  seven.num_heads = 28;
  seven.group = 7;  // 128 rows are no whole tokens of 7 heads
  EXPECT_FALSE(encode_bulk_q_map(seven, q));
  BulkQSource wide = q_source();
  wide.group = 512;  // more heads than a box holds (and than the tile's rows)
  EXPECT_FALSE(encode_bulk_q_map(wide, q));
  BulkQSource odd_head = q_source();
  odd_head.head = 132;  // 264 bytes
  EXPECT_FALSE(encode_bulk_q_map(odd_head, q));
  BulkQSource odd_token = q_source();
  odd_token.token = 32 * 128 + 4;
  EXPECT_FALSE(encode_bulk_q_map(odd_token, q));
  BulkQSource misaligned = q_source();
  misaligned.q = static_cast<const unsigned char*>(misaligned.q) + 2;
  EXPECT_FALSE(encode_bulk_q_map(misaligned, q));
  BulkQSource odd_dim = q_source();
  odd_dim.head_dim = 96;  // not whole 64-dim panels
  EXPECT_FALSE(encode_bulk_q_map(odd_dim, q));
}

// run() re-encodes a map only when its source changed, and tries again after an encoding that
// threw (the source is recorded only once encoded).
TEST(PrefillBulkMaps, MapsAreEncodedOncePerSource) {
  EncodedMaps<BulkQSource, 1> cache;
  int calls = 0;
  bool fail = false;
  const auto encode = [&](const BulkQSource& source, std::array<cuda::TensorMap, 1>&) {
    ++calls;
    if (fail) throw std::runtime_error("encode failed");
    return source.group == 4;
  };
  BulkQSource a = q_source();
  a.group = 4;
  EXPECT_TRUE(cache.update(a, encode));
  EXPECT_TRUE(cache.update(a, encode));
  EXPECT_EQ(calls, 1);
  BulkQSource b = a;
  b.group = 7;
  EXPECT_FALSE(cache.update(b, encode));
  EXPECT_FALSE(cache.update(b, encode));
  EXPECT_EQ(calls, 2);
  fail = true;
  EXPECT_THROW(cache.update(a, encode), std::runtime_error);
  fail = false;
  EXPECT_TRUE(cache.update(a, encode));
  EXPECT_EQ(calls, 4);
}

}  // namespace
}  // namespace flare::api_detail
