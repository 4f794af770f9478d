// Tests of the paged KV view (src/format/paged_kv.cpp): accessors for page sizes 1/3/16 in
// both layouts, combined versus separate K/V, empty requests, and 64-bit offsets.
#include "flare/format/paged_kv.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/print.h"
#include "testing/random.h"

namespace flare {
namespace {

using testing::indptr_values;
using testing::int32_tensor;
constexpr auto kInvalid = ErrorCode::kInvalidArgument;

constexpr int64_t kHeads = 3;
constexpr int64_t kHeadDim = 8;

// A page table for `lengths`: pages handed out from a shuffled pool of `pool` pages.
struct PageTable {
  HostTensor indptr;
  HostTensor indices;
  HostTensor last_page_len;
  std::vector<int32_t> pages_per_request;
  std::vector<int32_t> page_ids;  // indices, as a vector
};

PageTable make_table(const std::vector<int32_t>& lengths, int64_t page_size, int32_t pool,
                     uint64_t seed) {
  PageTable table;
  std::vector<int32_t> last;
  for (int32_t len : lengths) {
    table.pages_per_request.push_back(static_cast<int32_t>((len + page_size - 1) / page_size));
    last.push_back(len == 0 ? 0 : static_cast<int32_t>((len - 1) % page_size + 1));
  }
  const int32_t used = indptr_values(table.pages_per_request).back();
  testing::Rng rng(seed);
  std::vector<int32_t> perm = rng.permutation(pool);
  table.page_ids.assign(perm.begin(), perm.begin() + used);
  table.indptr = int32_tensor(indptr_values(table.pages_per_request));
  table.indices = int32_tensor(table.page_ids);
  table.last_page_len = int32_tensor(last);
  return table;
}

// Page tensor shape of `layout`: NHD [pool, page_size, H, D], HND [pool, H, page_size, D].
std::vector<int64_t> page_shape(KVLayout layout, int64_t pool, int64_t page_size,
                                int64_t head_dim) {
  return layout == KVLayout::kNHD ? std::vector<int64_t>{pool, page_size, kHeads, head_dim}
                                  : std::vector<int64_t>{pool, kHeads, page_size, head_dim};
}

// Offset of (page, slot, head, 0) in a contiguous page tensor, written out independently of
// page_element_offset.
int64_t contiguous_offset(KVLayout layout, int64_t page, int64_t slot, int64_t head,
                          int64_t page_size, int64_t head_dim) {
  return layout == KVLayout::kNHD ? ((page * page_size + slot) * kHeads + head) * head_dim
                                  : ((page * kHeads + head) * page_size + slot) * head_dim;
}

TEST(KVLayoutNames, ParseAndNameRoundTrip) {
  EXPECT_EQ(parse_kv_layout("NHD"), KVLayout::kNHD);
  EXPECT_EQ(parse_kv_layout("HND"), KVLayout::kHND);
  EXPECT_STREQ(kv_layout_name(KVLayout::kNHD), "NHD");
  EXPECT_STREQ(kv_layout_name(KVLayout::kHND), "HND");
  EXPECT_FLARE_ERROR(parse_kv_layout("nhd"), kInvalid,
                     "kv_layout must be \"NHD\" or \"HND\", got \"nhd\"");
  EXPECT_FLARE_ERROR(parse_kv_layout(nullptr), kInvalid, "got \"\"");
}

class PagedAccessors : public ::testing::TestWithParam<std::tuple<int64_t, KVLayout>> {};

TEST_P(PagedAccessors, ShapesLengthsAndOffsetsMatchHandComputedValues) {
  const auto [page_size, layout] = GetParam();
  const std::vector<int32_t> lengths = {1, 7, 0, 97, 16, 3, 0};
  PageTable table = make_table(lengths, page_size, /*pool=*/200, /*seed=*/7);
  HostTensor k(DType::kF16, page_shape(layout, 200, page_size, kHeadDim));
  HostTensor v(DType::kF16, page_shape(layout, 200, page_size, 2 * kHeadDim));
  const PagedKV kv = PagedKV::from_separate(k.view(), v.view(), layout, table.indptr.view(),
                                            table.indices.view(), table.last_page_len.view());
  EXPECT_EQ(kv.batch(), 7);
  EXPECT_EQ(kv.num_pages(), 200);
  EXPECT_EQ(kv.page_size(), page_size);
  EXPECT_EQ(kv.num_kv_heads(), kHeads);
  EXPECT_EQ(kv.head_dim_qk(), kHeadDim);
  EXPECT_EQ(kv.head_dim_vo(), 2 * kHeadDim);
  EXPECT_EQ(kv.table.block_size, page_size);
  EXPECT_EQ(kv.layout, layout);

  const std::vector<int32_t> first_page = indptr_values(table.pages_per_request);
  for (size_t r = 0; r < lengths.size(); ++r) {
    const auto request = static_cast<int64_t>(r);
    EXPECT_EQ(kv.kv_len(request), lengths[r]) << "request " << r;
    EXPECT_EQ(kv.table.num_blocks(request), table.pages_per_request[r]) << "request " << r;
    for (int64_t pos = 0; pos < lengths[r]; ++pos) {
      const int64_t page = table.page_ids[static_cast<size_t>(first_page[r] + pos / page_size)];
      const int64_t slot = pos % page_size;
      EXPECT_EQ(kv.table.block_of(request, pos), page * page_size + slot);
      for (int64_t head = 0; head < kHeads; ++head) {
        ASSERT_EQ(kv.k_offset(request, pos, head),
                  contiguous_offset(layout, page, slot, head, page_size, kHeadDim))
            << "request " << r << " pos " << pos << " head " << head;
        ASSERT_EQ(kv.v_offset(request, pos, head),
                  contiguous_offset(layout, page, slot, head, page_size, 2 * kHeadDim))
            << "request " << r << " pos " << pos << " head " << head;
      }
    }
  }
}

// K and V taken from one [pages, 2, ...] tensor address exactly the elements that separate
// views with the combined tensor's strides address, and those are the K (index 0) and V
// (index 1) halves of each page.
TEST_P(PagedAccessors, CombinedAndSeparateViewsAddressTheSameElements) {
  const auto [page_size, layout] = GetParam();
  const std::vector<int32_t> lengths = {5, 0, 33, 1};
  constexpr int32_t kPool = 20;
  PageTable table = make_table(lengths, page_size, kPool, /*seed=*/3);
  std::vector<int64_t> shape = page_shape(layout, kPool, page_size, kHeadDim);
  shape.insert(shape.begin() + 1, 2);
  HostTensor storage(DType::kBF16, shape);
  const PagedKV combined = PagedKV::from_combined(storage.view(), layout, table.indptr.view(),
                                                  table.indices.view(), table.last_page_len.view());

  // Separate views over the same buffer, built by hand: V starts one K half later.
  const int64_t half = page_size * kHeads * kHeadDim;
  auto* base = storage.data<std::byte>();
  const auto bytes = static_cast<int64_t>(dtype_bytes(DType::kBF16));
  std::vector<int64_t> k_shape = page_shape(layout, kPool, page_size, kHeadDim);
  TensorView k = TensorView::contiguous(base, DType::kBF16, k_shape);
  k.strides[0] = 2 * half;
  TensorView v = k;
  v.data = base + half * bytes;
  const PagedKV separate = PagedKV::from_separate(k, v, layout, table.indptr.view(),
                                                  table.indices.view(), table.last_page_len.view());

  EXPECT_EQ(combined.k.ndim, 4);
  EXPECT_EQ(combined.v.ndim, 4);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(combined.k.shape[d], separate.k.shape[d]) << "dim " << d;
    EXPECT_EQ(combined.k.strides[d], separate.k.strides[d]) << "dim " << d;
    EXPECT_EQ(combined.v.strides[d], separate.v.strides[d]) << "dim " << d;
  }
  EXPECT_EQ(combined.page_size(), page_size);
  EXPECT_EQ(combined.num_kv_heads(), kHeads);

  const std::vector<int32_t> first_page = indptr_values(table.pages_per_request);
  auto address = [&](const TensorView& t, int64_t offset) {
    return static_cast<const std::byte*>(t.data) + offset * bytes;
  };
  for (size_t r = 0; r < lengths.size(); ++r) {
    const auto request = static_cast<int64_t>(r);
    for (int64_t pos = 0; pos < lengths[r]; ++pos) {
      const int64_t page = table.page_ids[static_cast<size_t>(first_page[r] + pos / page_size)];
      const int64_t in_half = contiguous_offset(layout, 0, pos % page_size, 0, page_size,
                                                kHeadDim);  // slot's place inside one half
      for (int64_t head = 0; head < kHeads; ++head) {
        const int64_t head_step = layout == KVLayout::kNHD ? kHeadDim : page_size * kHeadDim;
        const std::byte* k_expected = base + (page * 2 * half + in_half + head * head_step) * bytes;
        const std::byte* k_combined = address(combined.k, combined.k_offset(request, pos, head));
        const std::byte* v_combined = address(combined.v, combined.v_offset(request, pos, head));
        ASSERT_EQ(k_combined, k_expected) << "request " << r << " pos " << pos << " head " << head;
        ASSERT_EQ(v_combined, k_expected + half * bytes);
        ASSERT_EQ(address(separate.k, separate.k_offset(request, pos, head)), k_combined);
        ASSERT_EQ(address(separate.v, separate.v_offset(request, pos, head)), v_combined);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndLayouts, PagedAccessors,
                         ::testing::Combine(::testing::Values<int64_t>(1, 3, 16),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND)),
                         [](const auto& info) {
                           return "page" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kv_layout_name(std::get<1>(info.param));
                         });

TEST(PagedKV, FromCombinedKeepsPaddedStrides) {
  // [pages, 2, page_size + 1, H, D + 4] storage, viewed as [pages, 2, page_size, H, D].
  HostTensor storage(DType::kF32, {6, 2, 5, kHeads, kHeadDim + 4});
  TensorView kv = storage.view();
  kv.shape[2] = 4;
  kv.shape[4] = kHeadDim;
  HostTensor indptr = int32_tensor({0, 1});
  HostTensor indices = int32_tensor({5});
  HostTensor last = int32_tensor({4});
  const PagedKV paged =
      PagedKV::from_combined(kv, KVLayout::kNHD, indptr.view(), indices.view(), last.view());
  EXPECT_EQ(paged.k.data, kv.data);
  EXPECT_EQ(static_cast<std::byte*>(paged.v.data) - static_cast<std::byte*>(paged.k.data),
            kv.strides[1] * 4);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(paged.k.strides[d], kv.strides[d == 0 ? 0 : d + 1]) << "dim " << d;
    EXPECT_EQ(paged.v.strides[d], kv.strides[d == 0 ? 0 : d + 1]) << "dim " << d;
  }
  EXPECT_EQ(paged.page_size(), 4);
  EXPECT_EQ(paged.k_offset(0, 3, 2), 5 * kv.strides[0] + 3 * kv.strides[2] + 2 * kv.strides[3]);
}

TEST(PagedKV, FromCombinedRejectsWrongShape) {
  HostTensor four_d(DType::kF32, {6, 2, 4, 8});
  HostTensor three_halves(DType::kF32, {6, 3, 4, 2, 8});
  HostTensor indptr = int32_tensor({0});
  HostTensor empty = int32_tensor({});
  EXPECT_FLARE_ERROR(PagedKV::from_combined(four_d.view(), KVLayout::kNHD, indptr.view(),
                                            empty.view(), empty.view()),
                     kInvalid, "got shape [6, 2, 4, 8]");
  EXPECT_FLARE_ERROR(PagedKV::from_combined(three_halves.view(), KVLayout::kHND, indptr.view(),
                                            empty.view(), empty.view()),
                     kInvalid, "paged_kv_cache must be [pages, 2, H_kv, page_size, D]");
}

TEST(PagedKV, KvLenOfEmptyRequestsIsZeroWhateverTheirLastPageLen) {
  HostTensor k(DType::kF32, {8, 4, 1, 8});
  HostTensor indptr = int32_tensor({0, 0, 2, 2, 2, 3, 3});
  HostTensor indices = int32_tensor({6, 1, 4});
  HostTensor last = int32_tensor({77, 3, 0, -5, 4, 1});
  const PagedKV kv = PagedKV::from_separate(k.view(), k.view(), KVLayout::kNHD, indptr.view(),
                                            indices.view(), last.view());
  const std::vector<int64_t> expected = {0, 7, 0, 0, 4, 0};
  ASSERT_EQ(kv.batch(), 6);
  for (int64_t r = 0; r < kv.batch(); ++r) {
    EXPECT_EQ(kv.kv_len(r), expected[static_cast<size_t>(r)]) << "request " << r;
  }
  EXPECT_FLARE_ERROR(kv.k_offset(0, 0, 0), kInvalid, "column 0 of row 0 is out of range [0, 0)");
}

TEST(PagedKV, OffsetsRejectOutOfRangeArguments) {
  HostTensor k(DType::kF32, {4, 4, 2, 8});
  HostTensor indptr = int32_tensor({0, 2});
  HostTensor indices = int32_tensor({3, 1});
  HostTensor last = int32_tensor({2});
  const PagedKV kv = PagedKV::from_separate(k.view(), k.view(), KVLayout::kNHD, indptr.view(),
                                            indices.view(), last.view());
  EXPECT_EQ(kv.kv_len(0), 6);
  EXPECT_FLARE_ERROR(kv.k_offset(0, 6, 0), kInvalid, "column 6 of row 0 is out of range [0, 6)");
  EXPECT_FLARE_ERROR(kv.k_offset(0, -1, 0), kInvalid, "column -1 of row 0");
  EXPECT_FLARE_ERROR(kv.v_offset(1, 0, 0), kInvalid, "row 1 is out of range [0, 1)");
  EXPECT_FLARE_ERROR(kv.k_offset(0, 0, 2), kInvalid, "KV head 2 is out of range [0, 2)");
}

// Offsets past 2^31 elements: views of a huge pool that is never allocated (data stays
// null; offsets never dereference it), with the page table on the host.
TEST(PagedKV, OffsetsBeyondTwoToThe31AreExact) {
  constexpr int64_t kPool = std::numeric_limits<int32_t>::max();  // page ids up to 2^31 - 2
  constexpr int64_t kPageSize = 16;
  constexpr int64_t kHugeHeads = 8;
  constexpr int64_t kHugeDim = 128;
  const int32_t last_page = static_cast<int32_t>(kPool - 1);
  HostTensor indptr = int32_tensor({0, 1, 3});
  HostTensor indices = int32_tensor({300000, 7, last_page});
  HostTensor last = int32_tensor({16, 5});
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    const std::vector<int64_t> shape =
        layout == KVLayout::kNHD ? std::vector<int64_t>{kPool, kPageSize, kHugeHeads, kHugeDim}
                                 : std::vector<int64_t>{kPool, kHugeHeads, kPageSize, kHugeDim};
    const TensorView k = TensorView::contiguous(nullptr, DType::kF16, shape);
    // V pages padded: a page stride of one extra head dim row.
    TensorView v = k;
    v.strides[0] = k.strides[0] + kHugeDim;
    const PagedKV kv =
        PagedKV::from_separate(k, v, layout, indptr.view(), indices.view(), last.view());
    const int64_t page_elems = kPageSize * kHugeHeads * kHugeDim;  // 2^14
    const int64_t slot_step = layout == KVLayout::kNHD ? kHugeHeads * kHugeDim : kHugeDim;
    const int64_t head_step = layout == KVLayout::kNHD ? kHugeDim : kPageSize * kHugeDim;
    // Request 0, token 15, head 7: page 300000 -> 4'915'200'000 + ... (> 2^32).
    EXPECT_EQ(kv.k_offset(0, 15, 7), 300000 * page_elems + 15 * slot_step + 7 * head_step);
    EXPECT_GT(kv.k_offset(0, 15, 7), int64_t{1} << 32);
    // Request 1, token 20 (second page, slot 4), head 3: the largest int32 page id.
    const int64_t k_expected = (kPool - 1) * page_elems + 4 * slot_step + 3 * head_step;
    EXPECT_EQ(kv.k_offset(1, 20, 3), k_expected);
    EXPECT_EQ(kv.v_offset(1, 20, 3),
              (kPool - 1) * (page_elems + kHugeDim) + 4 * slot_step + 3 * head_step);
    EXPECT_GT(k_expected, int64_t{1} << 44);
  }
}

TEST(BlockSparseIndex, LargeBlockSizeAndIdsUse64BitArithmetic) {
  HostTensor indptr = int32_tensor({0, 2});
  HostTensor indices = int32_tensor({std::numeric_limits<int32_t>::max(), 3});
  HostTensor last = int32_tensor({1});
  BlockSparseIndex index{int64_t{1} << 20, indptr.view(), indices.view(), last.view()};
  EXPECT_EQ(index.num_rows(), 1);
  EXPECT_EQ(index.row_length(0), (int64_t{1} << 20) + 1);
  EXPECT_EQ(index.block_of(0, 12345),
            int64_t{std::numeric_limits<int32_t>::max()} * (int64_t{1} << 20) + 12345);
  EXPECT_EQ(index.block_of(0, int64_t{1} << 20), 3 * (int64_t{1} << 20));
}

TEST(BlockSparseIndex, NumRowsIsZeroWithoutIndptr) {
  BlockSparseIndex index;
  EXPECT_EQ(index.num_rows(), 0);
}

TEST(BlockSparseIndex, HostAccessorsRejectDeviceArrays) {
  HostTensor indptr = int32_tensor({0, 1});
  HostTensor indices = int32_tensor({0});
  HostTensor last = int32_tensor({1});
  BlockSparseIndex index{4, indptr.view(), indices.view(), last.view()};
  index.indptr.device = Device::cuda(0);
  EXPECT_FLARE_ERROR(index.num_blocks(0), kInvalid,
                     "indptr must be on the CPU for host access, got cuda:0");
}

}  // namespace
}  // namespace flare
