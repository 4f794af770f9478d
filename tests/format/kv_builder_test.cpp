// Tests of tests/testing/kv_builder.h: for every layout, page size, combined/separate and
// strided option, every element read through PagedKV equals the ragged copy, the page pool is
// permuted with unused pages, and whatever lies outside the valid tokens is NaN.
#include "testing/kv_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flare/format/validate.h"
#include "testing/compare.h"
#include "testing/expect_error.h"
#include "testing/print.h"

namespace flare::testing {
namespace {

// page size, layout, combined, strided, dtype
using BuilderParam = std::tuple<int64_t, KVLayout, bool, bool, DType>;

class KVBuilder : public ::testing::TestWithParam<BuilderParam> {
 protected:
  KVCacheSpec spec() const {
    const auto [page_size, layout, combined, strided, dtype] = GetParam();
    KVCacheSpec spec;
    spec.kv_lens = {1, 7, 0, 97, 16, 0, 33};
    spec.num_kv_heads = 3;
    spec.head_dim_qk = 16;
    spec.head_dim_vo = combined ? 16 : 8;
    spec.dtype = dtype;
    spec.page_size = page_size;
    spec.layout = layout;
    spec.combined = combined;
    spec.strided = strided;
    spec.unused_pages = 5;
    spec.seed = 11;
    return spec;
  }
};

TEST_P(KVBuilder, EveryPagedElementEqualsTheRaggedCopy) {
  const TestKVCache cache = build_kv_cache(spec());
  const PagedKV& paged = cache.paged;
  const RaggedKV& ragged = cache.ragged;
  ASSERT_NO_THROW(validate_paged_kv(paged));
  ASSERT_NO_THROW(validate_ragged_kv(ragged));
  ASSERT_EQ(paged.batch(), 7);
  ASSERT_EQ(ragged.batch(), 7);
  ASSERT_EQ(cache.total_kv(), 154);
  int64_t compared = 0;
  int64_t mismatches = 0;
  for (int64_t r = 0; r < paged.batch(); ++r) {
    ASSERT_EQ(paged.kv_len(r), cache.spec.kv_lens[static_cast<size_t>(r)]);
    ASSERT_EQ(ragged.kv_len(r), paged.kv_len(r));
    for (int64_t pos = 0; pos < paged.kv_len(r); ++pos) {
      const int64_t row = ragged_begin(ragged.indptr, r) + pos;
      for (int64_t head = 0; head < paged.num_kv_heads(); ++head) {
        for (int64_t d = 0; d < paged.head_dim_qk(); ++d) {
          const float from_pages = element_at(paged.k, paged.k_offset(r, pos, head) + d);
          const float from_rows =
              element_at(ragged.k, row * ragged.k.strides[0] + head * ragged.k.strides[1] + d);
          mismatches += !(from_pages == from_rows);  // NaN counts as a mismatch
          ++compared;
        }
        for (int64_t d = 0; d < paged.head_dim_vo(); ++d) {
          const float from_pages = element_at(paged.v, paged.v_offset(r, pos, head) + d);
          const float from_rows =
              element_at(ragged.v, row * ragged.v.strides[0] + head * ragged.v.strides[1] + d);
          mismatches += !(from_pages == from_rows);
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 154 * 3 * (16 + paged.head_dim_vo()));
  EXPECT_EQ(mismatches, 0);
}

TEST_P(KVBuilder, RaggedValuesAreTheDocumentedRandomTensors) {
  const KVCacheSpec s = spec();
  const TestKVCache cache = build_kv_cache(s);
  const HostTensor k = random_tensor(s.dtype, {154, 3, 16}, s.seed, s.scale);
  const HostTensor v = random_tensor(s.dtype, {154, 3, s.head_dim_vo}, s.seed + 1, s.scale);
  EXPECT_EQ(max_abs_error(cache.ragged.k, k.view()), 0.0);
  EXPECT_EQ(max_abs_error(cache.ragged.v, v.view()), 0.0);
  EXPECT_EQ(count_nan(cache.ragged.k), 0);
  EXPECT_EQ(count_nan(cache.ragged.v), 0);
}

TEST_P(KVBuilder, PagesArePermutedWithUnusedPoolPages) {
  const TestKVCache cache = build_kv_cache(spec());
  const int64_t page_size = cache.spec.page_size;
  int64_t used = 0;
  for (int32_t len : cache.spec.kv_lens) used += (len + page_size - 1) / page_size;
  EXPECT_EQ(cache.num_pages(), used + 5);
  const std::vector<int32_t> indices = int32_values(cache.paged.table.indices);
  ASSERT_EQ(static_cast<int64_t>(indices.size()), used);
  EXPECT_EQ(std::set<int32_t>(indices.begin(), indices.end()).size(), indices.size())
      << "every page belongs to one request";
  std::vector<int32_t> in_order(indices.size());
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = static_cast<int32_t>(i);
  EXPECT_NE(indices, in_order) << "page ids must be shuffled";
  std::vector<int32_t> pool = cache.page_ids;
  std::sort(pool.begin(), pool.end());
  for (size_t i = 0; i < pool.size(); ++i) ASSERT_EQ(pool[i], static_cast<int32_t>(i));
}

// Unused pages and slots past each request's length hold NaN; valid slots do not.
TEST_P(KVBuilder, EverythingOutsideValidTokensIsNaN) {
  const TestKVCache cache = build_kv_cache(spec());
  const PagedKV& paged = cache.paged;
  const int64_t page_size = paged.page_size();
  // valid[page][slot]
  std::vector<std::vector<bool>> valid(static_cast<size_t>(paged.num_pages()),
                                       std::vector<bool>(static_cast<size_t>(page_size), false));
  for (int64_t r = 0; r < paged.batch(); ++r) {
    for (int64_t pos = 0; pos < paged.kv_len(r); ++pos) {
      const int64_t pool_slot = paged.table.block_of(r, pos);
      valid[static_cast<size_t>(pool_slot / page_size)]
           [static_cast<size_t>(pool_slot % page_size)] = true;
    }
  }
  int64_t wrong = 0;
  for (int64_t page = 0; page < paged.num_pages(); ++page) {
    for (int64_t slot = 0; slot < page_size; ++slot) {
      const bool is_valid = valid[static_cast<size_t>(page)][static_cast<size_t>(slot)];
      for (int64_t head = 0; head < paged.num_kv_heads(); ++head) {
        const int64_t k_at = page_element_offset(paged.k, paged.layout, page, slot, head);
        const int64_t v_at = page_element_offset(paged.v, paged.layout, page, slot, head);
        wrong += std::isnan(element_at(paged.k, k_at)) == is_valid;
        wrong += std::isnan(element_at(paged.v, v_at + paged.head_dim_vo() - 1)) == is_valid;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_P(KVBuilder, StridedOptionPadsEveryStride) {
  const TestKVCache cache = build_kv_cache(spec());
  const PagedKV& paged = cache.paged;
  for (const TensorView* t : {&paged.k, &paged.v, &cache.ragged.k, &cache.ragged.v}) {
    EXPECT_EQ(t->stride(-1), 1);
  }
  const bool dense = !cache.spec.strided;
  EXPECT_EQ(cache.ragged.k.is_contiguous(), dense);
  EXPECT_EQ(cache.ragged.v.is_contiguous(), dense);
  // Combined K and V pages interleave, so neither is contiguous on its own.
  EXPECT_EQ(paged.k.is_contiguous(), dense && !cache.spec.combined);
  EXPECT_EQ(paged.v.is_contiguous(), dense && !cache.spec.combined);
  if (!cache.spec.strided) return;
  // Padding after D, an extra head/slot per page, and a view that starts inside its buffer.
  EXPECT_GT(paged.k.stride(-2), paged.head_dim_qk());
  EXPECT_GT(paged.k.stride(0), paged.page_size() * paged.num_kv_heads() * paged.k.stride(-2));
  EXPECT_NE(paged.k.data, cache.pages_storage.data<void>());
  EXPECT_GT(cache.ragged.k.stride(1), cache.ragged.head_dim_qk());
  EXPECT_NE(cache.ragged.k.data, cache.k_ragged_storage.data<void>());
}

std::string param_name(const ::testing::TestParamInfo<BuilderParam>& info) {
  const auto [page_size, layout, combined, strided, dtype] = info.param;
  return "page" + std::to_string(page_size) + "_" + kv_layout_name(layout) +
         (combined ? "_combined" : "_separate") + (strided ? "_strided" : "_dense") + "_" +
         std::string(dtype_name(dtype));
}

INSTANTIATE_TEST_SUITE_P(Layouts, KVBuilder,
                         ::testing::Combine(::testing::Values<int64_t>(1, 3, 16),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND),
                                            ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::kF16)),
                         param_name);

// Every floating dtype, on one representative layout.
INSTANTIATE_TEST_SUITE_P(
    DTypes, KVBuilder,
    ::testing::Combine(::testing::Values<int64_t>(3), ::testing::Values(KVLayout::kHND),
                       ::testing::Values(true), ::testing::Values(true),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kE4M3, DType::kE5M2)),
    param_name);

TEST(KVBuilderSpec, CombinedNeedsEqualHeadDims) {
  KVCacheSpec spec;
  spec.kv_lens = {4};
  spec.head_dim_vo = 32;
  spec.combined = true;
  EXPECT_FLARE_ERROR(build_kv_cache(spec), ErrorCode::kInvalidArgument,
                     "the combined layout needs head_dim_qk == head_dim_vo, got 64 and 32");
}

TEST(KVBuilderSpec, EmptyBatchAndAllEmptyRequests) {
  const TestKVCache none = build_kv_cache({}, 2, 8, 4);
  EXPECT_EQ(none.batch(), 0);
  EXPECT_EQ(none.num_pages(), 3);
  EXPECT_NO_THROW(validate_paged_kv(none.paged));
  const TestKVCache empty = build_kv_cache({0, 0}, 2, 8, 4);
  EXPECT_EQ(empty.total_kv(), 0);
  EXPECT_EQ(empty.paged.kv_len(1), 0);
  EXPECT_NO_THROW(validate_paged_kv(empty.paged));
  EXPECT_NO_THROW(validate_ragged_kv(empty.ragged));
}

TEST(KVBuilderSpec, SameSeedSameCacheAndMoveKeepsViews) {
  TestKVCache a = build_kv_cache({5, 9}, 2, 8, 3, /*seed=*/4);
  const TestKVCache b = build_kv_cache({5, 9}, 2, 8, 3, /*seed=*/4);
  EXPECT_EQ(a.page_ids, b.page_ids);
  EXPECT_EQ(max_abs_error(a.ragged.k, b.ragged.k), 0.0);
  const void* data = a.paged.k.data;
  const TestKVCache moved = std::move(a);
  EXPECT_EQ(moved.paged.k.data, data);
  EXPECT_EQ(moved.pages_storage.data<void>(), data);
}

}  // namespace
}  // namespace flare::testing
