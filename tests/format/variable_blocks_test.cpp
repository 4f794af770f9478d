// Tests of FlashInfer's variable block-sparse layout as one paged batch
// (src/format/variable_blocks.cpp): random masks and sizes (zeros included) against a
// token-by-token reference, int32 / int64 sizes, a strided mask, and each refused argument.
#include "flare/format/variable_blocks.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "testing/expect_error.h"

namespace flare {
namespace {

constexpr auto kInvalid = ErrorCode::kInvalidArgument;

struct Layout {
  int64_t heads, row_blocks, col_blocks;
  std::vector<uint8_t> mask;  // [H, MB, NB]
  std::vector<int64_t> rows;  // [H, MB]
  std::vector<int64_t> cols;  // [H, NB]
};

// Sizes in [0, 9] whose per-head sums agree: each head's sizes are a random split of `total`.
std::vector<int64_t> split_sizes(std::mt19937& rng, int64_t heads, int64_t blocks, int64_t total) {
  std::vector<int64_t> sizes(static_cast<size_t>(heads * blocks), 0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t unit = 0; unit < total; ++unit) {
      sizes[static_cast<size_t>(h * blocks +
                                static_cast<int64_t>(rng() % static_cast<uint32_t>(blocks)))] += 1;
    }
  }
  return sizes;
}

Layout random_layout(std::mt19937& rng) {
  const auto pick = [&rng](int64_t n) {
    return static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
  };
  Layout l{1 + pick(4), 1 + pick(5), 1 + pick(6), {}, {}, {}};
  l.mask.resize(static_cast<size_t>(l.heads * l.row_blocks * l.col_blocks));
  for (uint8_t& m : l.mask) m = rng() % 3 == 0 ? 0 : static_cast<uint8_t>(1 + rng() % 5);
  l.rows = split_sizes(rng, l.heads, l.row_blocks, pick(40));
  l.cols = split_sizes(rng, l.heads, l.col_blocks, pick(50));
  return l;
}

TensorView view_of(const void* data, DType dtype, std::vector<int64_t> shape) {
  return TensorView::contiguous(const_cast<void*>(data), dtype, shape);
}

// Token by token: request (h, i) lists head h's token t (page h * kv_len + t) when t's column
// block is visible from row block i.
VariableBlockBatch reference(const Layout& l) {
  VariableBlockBatch b;
  for (int64_t b0 = 0; b0 < l.row_blocks; ++b0) b.qo_len += l.rows[static_cast<size_t>(b0)];
  for (int64_t b0 = 0; b0 < l.col_blocks; ++b0) b.kv_len += l.cols[static_cast<size_t>(b0)];
  b.qo_indptr = {0};
  b.kv_indptr = {0};
  for (int64_t h = 0; h < l.heads; ++h) {
    for (int64_t i = 0; i < l.row_blocks; ++i) {
      b.qo_indptr.push_back(
          b.qo_indptr.back() +
          static_cast<int32_t>(l.rows[static_cast<size_t>(h * l.row_blocks + i)]));
      int64_t token = 0;
      for (int64_t j = 0; j < l.col_blocks; ++j) {
        const int64_t size = l.cols[static_cast<size_t>(h * l.col_blocks + j)];
        const bool seen =
            l.mask[static_cast<size_t>((h * l.row_blocks + i) * l.col_blocks + j)] != 0;
        for (int64_t t = 0; t < size; ++t, ++token) {
          if (seen) b.indices.push_back(static_cast<int32_t>(h * b.kv_len + token));
        }
      }
      b.kv_indptr.push_back(static_cast<int32_t>(b.indices.size()));
      b.last_page_len.push_back(b.kv_indptr.back() > b.kv_indptr[b.kv_indptr.size() - 2] ? 1 : 0);
    }
  }
  return b;
}

void expect_same(const VariableBlockBatch& got, const VariableBlockBatch& want, int seed) {
  EXPECT_EQ(got.qo_len, want.qo_len) << "seed " << seed;
  EXPECT_EQ(got.kv_len, want.kv_len) << "seed " << seed;
  EXPECT_EQ(got.qo_indptr, want.qo_indptr) << "seed " << seed;
  EXPECT_EQ(got.kv_indptr, want.kv_indptr) << "seed " << seed;
  EXPECT_EQ(got.indices, want.indices) << "seed " << seed;
  EXPECT_EQ(got.last_page_len, want.last_page_len) << "seed " << seed;
}

TEST(VariableBlocks, RandomLayoutsMatchTheTokenReference) {
  for (int seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const Layout l = random_layout(rng);
    VariableBlockBatch got;
    if (seed % 2 == 0) {  // int64 sizes
      variable_block_batch(
          view_of(l.mask.data(), DType::kU8, {l.heads, l.row_blocks, l.col_blocks}),
          view_of(l.rows.data(), DType::kI64, {l.heads, l.row_blocks}),
          view_of(l.cols.data(), DType::kI64, {l.heads, l.col_blocks}), got);
    } else {  // int32 sizes
      const std::vector<int32_t> rows(l.rows.begin(), l.rows.end());
      const std::vector<int32_t> cols(l.cols.begin(), l.cols.end());
      variable_block_batch(
          view_of(l.mask.data(), DType::kU8, {l.heads, l.row_blocks, l.col_blocks}),
          view_of(rows.data(), DType::kI32, {l.heads, l.row_blocks}),
          view_of(cols.data(), DType::kI32, {l.heads, l.col_blocks}), got);
    }
    expect_same(got, reference(l), seed);
  }
}

TEST(VariableBlocks, ReadsAStridedMask) {
  // The mask is every other entry of a [2, 2, 4] array: [2, 2, 2] with a last stride of 2.
  const std::vector<uint8_t> storage = {1, 9, 0, 9, 0, 9, 1, 9, 1, 9, 1, 9, 0, 9, 0, 9};
  TensorView mask = view_of(storage.data(), DType::kU8, {2, 2, 4});
  mask.shape[2] = 2;
  mask.strides[2] = 2;
  const std::vector<int32_t> rows = {1, 2, 3, 0};
  const std::vector<int32_t> cols = {2, 1, 0, 3};
  VariableBlockBatch got;
  variable_block_batch(mask, view_of(rows.data(), DType::kI32, {2, 2}),
                       view_of(cols.data(), DType::kI32, {2, 2}), got);
  // Head 0: row block 0 sees column block 0 (tokens 0, 1), row block 1 column block 1 (2).
  // Head 1 (kv_len 3, ids from 3): row block 0 sees both (column block 0 is empty: 3, 4, 5),
  // row block 1 nothing.
  EXPECT_EQ(got.qo_indptr, (std::vector<int32_t>{0, 1, 3, 6, 6}));
  EXPECT_EQ(got.kv_indptr, (std::vector<int32_t>{0, 2, 3, 6, 6}));
  EXPECT_EQ(got.indices, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(got.last_page_len, (std::vector<int32_t>{1, 1, 1, 0}));
}

TEST(VariableBlocks, RefusesWhatItCannotRead) {
  const std::vector<uint8_t> mask(8, 1);
  const std::vector<int32_t> rows = {3, 5, 4, 4};
  const std::vector<int32_t> cols = {2, 6, 4, 4};
  const TensorView m = view_of(mask.data(), DType::kU8, {2, 2, 2});
  const TensorView r = view_of(rows.data(), DType::kI32, {2, 2});
  const TensorView c = view_of(cols.data(), DType::kI32, {2, 2});
  VariableBlockBatch out;
  EXPECT_FLARE_ERROR(variable_block_batch(view_of(mask.data(), DType::kU8, {2, 4}), r, c, out),
                     kInvalid, "block_mask_map must have rank 3");
  EXPECT_FLARE_ERROR(variable_block_batch(view_of(rows.data(), DType::kI32, {2, 2, 1}), r, c, out),
                     kInvalid, "block_mask_map must be bool (or uint8), got int32");
  EXPECT_FLARE_ERROR(variable_block_batch(m, view_of(rows.data(), DType::kI32, {1, 4}), c, out),
                     kInvalid, "block_row_sz must have shape [num_kv_heads, MB] = [2, 2]");
  EXPECT_FLARE_ERROR(variable_block_batch(m, r, view_of(mask.data(), DType::kU8, {2, 2}), out),
                     kInvalid, "block_col_sz must hold int32 or int64, got uint8");
  const std::vector<int32_t> uneven = {3, 5, 4, 5};
  EXPECT_FLARE_ERROR(variable_block_batch(m, view_of(uneven.data(), DType::kI32, {2, 2}), c, out),
                     kInvalid,
                     "every KV head's block_row_sz must sum to one qo_len: head 0 "
                     "sums to 8, head 1 to 9");
  const std::vector<int32_t> negative = {3, 5, 9, -1};
  EXPECT_FLARE_ERROR(variable_block_batch(m, r, view_of(negative.data(), DType::kI32, {2, 2}), out),
                     kInvalid, "block_col_sz[1, 1] is -1");
}

}  // namespace
}  // namespace flare
