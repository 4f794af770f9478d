// Tests of src/format/validate.cpp: every validation error, its code and its message, and
// the inputs that must pass (empty requests, strided index arrays, ignored entries).
#include "flare/format/validate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "testing/expect_error.h"
#include "testing/index_arrays.h"

namespace flare {
namespace {

using testing::int32_tensor;
constexpr auto kInvalid = ErrorCode::kInvalidArgument;

// ---------------------------------------------------------------- validate_indptr

TEST(ValidateIndptr, AcceptsValidIndptrWithEmptyRequests) {
  HostTensor indptr = int32_tensor({0, 0, 3, 3, 7});
  EXPECT_NO_THROW(validate_indptr(indptr.view(), "kv_indptr"));
  EXPECT_NO_THROW(validate_indptr(indptr.view(), "kv_indptr", 5, 7));
}

TEST(ValidateIndptr, AcceptsSingleEntry) {
  HostTensor indptr = int32_tensor({0});
  EXPECT_NO_THROW(validate_indptr(indptr.view(), "qo_indptr", 1));
}

TEST(ValidateIndptr, ReadsStridedEntries) {
  // Every other entry of {0, 99, 2, -7, 5}: {0, 2, 5} is valid; a dense read would fail.
  HostTensor storage = int32_tensor({0, 99, 2, -7, 5});
  TensorView indptr = storage.view();
  indptr.shape[0] = 3;
  indptr.strides[0] = 2;
  EXPECT_NO_THROW(validate_indptr(indptr, "kv_indptr", 3, 5));
}

TEST(ValidateIndptr, RejectsDecreasingEntryWithExactMessage) {
  HostTensor indptr = int32_tensor({0, 4, 15, 12, 20});
  try {
    validate_indptr(indptr.view(), "kv_indptr");
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), kInvalid);
    EXPECT_STREQ(error.what(),
                 "kv_indptr must be non-decreasing: kv_indptr[3]=12 < kv_indptr[2]=15");
  }
}

TEST(ValidateIndptr, RejectsNonZeroFirstEntry) {
  HostTensor indptr = int32_tensor({5, 6, 7});
  EXPECT_FLARE_ERROR(validate_indptr(indptr.view(), "kv_indptr"), kInvalid,
                     "kv_indptr[0] must be 0, got 5");
}

TEST(ValidateIndptr, RejectsWrongSize) {
  HostTensor indptr = int32_tensor({0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_FLARE_ERROR(validate_indptr(indptr.view(), "kv_indptr", 9), kInvalid,
                     "kv_indptr must have 9 entries (batch + 1), got 8");
}

TEST(ValidateIndptr, RejectsEmptyArray) {
  HostTensor indptr = int32_tensor({});
  EXPECT_FLARE_ERROR(validate_indptr(indptr.view(), "qo_indptr"), kInvalid,
                     "qo_indptr must have at least 1 entry (batch + 1), got 0");
}

TEST(ValidateIndptr, RejectsWrongDtype) {
  HostTensor indptr(DType::kI64, {3});
  EXPECT_FLARE_ERROR(validate_indptr(indptr.view(), "kv_indptr"), kInvalid,
                     "kv_indptr must be int32, got int64");
}

TEST(ValidateIndptr, RejectsDeviceArray) {
  HostTensor storage = int32_tensor({0, 1});
  TensorView indptr = storage.view();
  indptr.device = Device::cuda(0);  // never dereferenced: the device check comes first
  EXPECT_FLARE_ERROR(validate_indptr(indptr, "kv_indptr"), kInvalid,
                     "kv_indptr must be on the CPU, got cuda:0");
}

TEST(ValidateIndptr, RejectsTwoDimensionalArray) {
  HostTensor indptr(DType::kI32, {2, 3});
  EXPECT_FLARE_ERROR(validate_indptr(indptr.view(), "kv_indptr"), kInvalid,
                     "kv_indptr must be 1-D, got shape [2, 3]");
}

TEST(ValidateIndptr, RejectsLastEntryAboveMaximum) {
  HostTensor indptr = int32_tensor({0, 4, 10});
  EXPECT_NO_THROW(validate_indptr(indptr.view(), "qo_indptr", 3, 10));
  EXPECT_FLARE_ERROR(validate_indptr(indptr.view(), "qo_indptr", 3, 9), kInvalid,
                     "qo_indptr[2]=10 must be <= 9");
}

// ---------------------------------------------------------------- validate_tensor / dtype

TEST(ValidateTensor, AcceptsPaddedStridesWithUnitInnerStride) {
  HostTensor storage(DType::kF32, {4, 3, 10});
  TensorView t = storage.view();
  t.shape[2] = 8;  // padded rows: stride 10 for 8 elements
  EXPECT_NO_THROW(validate_tensor(t, "q", 3));
}

TEST(ValidateTensor, RejectsWrongRank) {
  HostTensor t(DType::kF32, {4, 8});
  EXPECT_FLARE_ERROR(validate_tensor(t.view(), "q", 3), kInvalid,
                     "q must have 3 dimensions, got shape [4, 8]");
}

TEST(ValidateTensor, RejectsInnerStrideOtherThanOne) {
  HostTensor storage(DType::kF32, {4, 16});
  TensorView t = storage.view();
  t.shape[1] = 8;
  t.strides[1] = 2;
  EXPECT_FLARE_ERROR(validate_tensor(t, "q", 2), kInvalid,
                     "q must be contiguous in its last dimension (stride 1), got stride 2");
}

TEST(ValidateTensor, IgnoresInnerStrideOfSizeOneDimension) {
  HostTensor storage(DType::kF32, {4, 1});
  TensorView t = storage.view();
  t.strides[1] = 7;
  EXPECT_NO_THROW(validate_tensor(t, "lse", 2));
}

TEST(ValidateTensor, RejectsNegativeStride) {
  HostTensor storage(DType::kF32, {4, 8});
  TensorView t = storage.view();
  t.strides[0] = -8;
  EXPECT_FLARE_ERROR(validate_tensor(t, "o", 2), kInvalid,
                     "o must have non-negative sizes and strides, got size 4 and stride -8 in "
                     "dimension 0");
}

TEST(ValidateTensor, RejectsNullDataUnlessEmpty) {
  TensorView t = TensorView::contiguous(nullptr, DType::kF16, {2, 8});
  EXPECT_FLARE_ERROR(validate_tensor(t, "q", 2), kInvalid, "q has no data (null pointer)");
  TensorView empty = TensorView::contiguous(nullptr, DType::kF16, {0, 8});
  EXPECT_NO_THROW(validate_tensor(empty, "q", 2));
}

TEST(ValidateDtype, NamesExpectedAndActual) {
  HostTensor t(DType::kBF16, {2});
  EXPECT_NO_THROW(validate_dtype(t.view(), "q", DType::kBF16));
  EXPECT_FLARE_ERROR(validate_dtype(t.view(), "q", DType::kF16), kInvalid,
                     "q must be float16, got bfloat16");
}

// ---------------------------------------------------------------- validate_paged_kv

// A valid NHD cache: 4 pages of 4 slots, 2 heads, D = 8; three requests, the middle empty.
class ValidatePagedKV : public ::testing::Test {
 protected:
  HostTensor k_{DType::kF32, {4, 4, 2, 8}};
  HostTensor v_{DType::kF32, {4, 4, 2, 8}};
  HostTensor indptr_ = int32_tensor({0, 2, 2, 3});
  HostTensor indices_ = int32_tensor({3, 0, 1});
  HostTensor last_ = int32_tensor({4, 0, 2});

  PagedKV cache(KVLayout layout = KVLayout::kNHD) const {
    return PagedKV::from_separate(k_.view(), v_.view(), layout, indptr_.view(), indices_.view(),
                                  last_.view());
  }
};

TEST_F(ValidatePagedKV, AcceptsValidCacheInBothLayouts) {
  EXPECT_NO_THROW(validate_paged_kv(cache(KVLayout::kNHD)));
  last_ = int32_tensor({2, 0, 1});  // HND reads [4, 4, 2, 8] as 4 heads of 2-slot pages
  EXPECT_NO_THROW(validate_paged_kv(cache(KVLayout::kHND)));
}

TEST_F(ValidatePagedKV, AcceptsDifferentValueHeadDim) {
  v_ = HostTensor(DType::kF32, {4, 4, 2, 16});
  EXPECT_NO_THROW(validate_paged_kv(cache()));
}

TEST_F(ValidatePagedKV, RejectsWrongRank) {
  PagedKV kv = cache();
  HostTensor k3(DType::kF32, {4, 4, 16});
  kv.k = k3.view();
  EXPECT_FLARE_ERROR(validate_paged_kv(kv), kInvalid,
                     "k_cache must have 4 dimensions, got shape [4, 4, 16]");
  HostTensor v5(DType::kF32, {4, 1, 4, 2, 8});
  kv = cache();
  kv.v = v5.view();
  EXPECT_FLARE_ERROR(validate_paged_kv(kv), kInvalid,
                     "v_cache must have 4 dimensions, got shape [4, 1, 4, 2, 8]");
}

TEST_F(ValidatePagedKV, RejectsNonFloatingCache) {
  k_ = HostTensor(DType::kI32, {4, 4, 2, 8});
  v_ = HostTensor(DType::kI32, {4, 4, 2, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "k_cache must have a floating dtype, got int32");
}

TEST_F(ValidatePagedKV, RejectsDtypeMismatch) {
  v_ = HostTensor(DType::kF16, {4, 4, 2, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "v_cache must have the dtype of k_cache (float32), got float16");
}

TEST_F(ValidatePagedKV, RejectsDeviceMismatch) {
  PagedKV kv = cache();
  kv.v.device = Device::cuda(0);
  EXPECT_FLARE_ERROR(validate_paged_kv(kv), kInvalid,
                     "v_cache must be on the device of k_cache (cpu), got cuda:0");
}

TEST_F(ValidatePagedKV, RejectsPageCountMismatch) {
  v_ = HostTensor(DType::kF32, {3, 4, 2, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "v_cache must have the page count of k_cache (4), got 3");
}

TEST_F(ValidatePagedKV, RejectsPageSizeMismatchInEitherLayout) {
  v_ = HostTensor(DType::kF32, {4, 3, 2, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache(KVLayout::kNHD)), kInvalid,
                     "v_cache must have the page size of k_cache (4), got 3");
  v_ = HostTensor(DType::kF32, {4, 4, 3, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache(KVLayout::kHND)), kInvalid,
                     "v_cache must have the page size of k_cache (2), got 3");
}

TEST_F(ValidatePagedKV, RejectsHeadCountMismatch) {
  v_ = HostTensor(DType::kF32, {4, 4, 1, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "v_cache must have the number of KV heads of k_cache (2), got 1");
}

TEST_F(ValidatePagedKV, RejectsZeroPageSize) {
  k_ = HostTensor(DType::kF32, {4, 0, 2, 8});
  v_ = HostTensor(DType::kF32, {4, 0, 2, 8});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "page size must be >= 1, got 0 (k_cache shape [4, 0, 2, 8], layout NHD)");
}

TEST_F(ValidatePagedKV, RejectsTableBlockSizeOtherThanPageSize) {
  PagedKV kv = cache();
  kv.table.block_size = 3;
  EXPECT_FLARE_ERROR(validate_paged_kv(kv), kInvalid,
                     "page table block_size must equal the page size 4, got 3");
}

TEST_F(ValidatePagedKV, RejectsInnerStrideOtherThanOne) {
  HostTensor wide(DType::kF32, {4, 4, 2, 16});
  PagedKV kv = cache();
  kv.k = wide.view();
  kv.k.shape[3] = 8;
  kv.k.strides[3] = 2;
  EXPECT_FLARE_ERROR(validate_paged_kv(kv), kInvalid,
                     "k_cache must be contiguous in its last dimension (stride 1), got stride 2");
}

TEST_F(ValidatePagedKV, RejectsBadIndptr) {
  indptr_ = int32_tensor({0, 2, 1, 3});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_indptr must be non-decreasing: kv_indptr[2]=1 < kv_indptr[1]=2");
  indptr_ = int32_tensor({1, 2, 2, 3});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid, "kv_indptr[0] must be 0, got 1");
}

TEST_F(ValidatePagedKV, RejectsIndicesOfWrongDtypeOrRank) {
  indices_ = HostTensor(DType::kI64, {3});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid, "kv_indices must be int32, got int64");
  indices_ = HostTensor(DType::kI32, {3, 1});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_indices must be 1-D, got shape [3, 1]");
}

TEST_F(ValidatePagedKV, RejectsTooFewIndices) {
  indices_ = int32_tensor({3, 0});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_indices must have at least 3 entries (kv_indptr[3]), got 2");
}

TEST_F(ValidatePagedKV, RejectsIndexOutOfRangeNamingPositionAndValue) {
  indices_ = int32_tensor({3, 4, 1});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_indices[1]=4 is out of range [0, 4) (the number of pages)");
  indices_ = int32_tensor({3, 0, -1});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_indices[2]=-1 is out of range [0, 4)");
}

TEST_F(ValidatePagedKV, IgnoresIndicesPastLastIndptrEntry) {
  indices_ = int32_tensor({3, 0, 1, 99, -5});
  EXPECT_NO_THROW(validate_paged_kv(cache()));
}

TEST_F(ValidatePagedKV, RejectsLastPageLenOfWrongDtypeOrSize) {
  last_ = HostTensor(DType::kF32, {3});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_last_page_len must be int32, got float32");
  last_ = int32_tensor({4, 2});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_last_page_len must have 3 entries (batch), got 2");
}

TEST_F(ValidatePagedKV, RejectsLastPageLenOutsideOneToPageSize) {
  last_ = int32_tensor({0, 0, 2});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_last_page_len[0]=0 must be in [1, 4] (the page size) for request 0, "
                     "which has 2 pages");
  last_ = int32_tensor({4, 0, 5});
  EXPECT_FLARE_ERROR(validate_paged_kv(cache()), kInvalid,
                     "kv_last_page_len[2]=5 must be in [1, 4]");
}

TEST_F(ValidatePagedKV, IgnoresLastPageLenOfEmptyRequests) {
  last_ = int32_tensor({4, 77, 2});
  EXPECT_NO_THROW(validate_paged_kv(cache()));
  last_ = int32_tensor({4, -3, 2});
  EXPECT_NO_THROW(validate_paged_kv(cache()));
}

TEST_F(ValidatePagedKV, AcceptsEmptyBatchAndEmptyPool) {
  k_ = HostTensor(DType::kF32, {0, 4, 2, 8});
  v_ = HostTensor(DType::kF32, {0, 4, 2, 8});
  indptr_ = int32_tensor({0, 0});
  indices_ = int32_tensor({});
  last_ = int32_tensor({0});
  EXPECT_NO_THROW(validate_paged_kv(cache()));
  indptr_ = int32_tensor({0});
  last_ = int32_tensor({});
  EXPECT_NO_THROW(validate_paged_kv(cache()));
}

// ---------------------------------------------------------------- validate_ragged_kv

class ValidateRaggedKV : public ::testing::Test {
 protected:
  HostTensor k_{DType::kF16, {10, 2, 8}};
  HostTensor v_{DType::kF16, {10, 2, 16}};
  HostTensor indptr_ = int32_tensor({0, 3, 3, 10});

  RaggedKV cache() const { return RaggedKV{k_.view(), v_.view(), indptr_.view()}; }
};

TEST_F(ValidateRaggedKV, AcceptsValidCache) { EXPECT_NO_THROW(validate_ragged_kv(cache())); }

TEST_F(ValidateRaggedKV, RejectsWrongRank) {
  k_ = HostTensor(DType::kF16, {10, 16});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "k must have 3 dimensions, got shape [10, 16]");
}

TEST_F(ValidateRaggedKV, RejectsRowCountMismatch) {
  v_ = HostTensor(DType::kF16, {9, 2, 16});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "v must have the number of rows of k (10), got 9");
}

TEST_F(ValidateRaggedKV, RejectsHeadCountMismatch) {
  v_ = HostTensor(DType::kF16, {10, 1, 16});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "v must have the number of KV heads of k (2), got 1");
}

TEST_F(ValidateRaggedKV, RejectsDtypeMismatchAndNonFloating) {
  v_ = HostTensor(DType::kBF16, {10, 2, 16});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "v must have the dtype of k (float16), got bfloat16");
  k_ = HostTensor(DType::kU8, {10, 2, 8});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "k must have a floating dtype, got uint8");
}

TEST_F(ValidateRaggedKV, RejectsIndptrNotCoveringAllRows) {
  indptr_ = int32_tensor({0, 3, 3, 9});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "kv_indptr[3]=9 must equal the number of rows of k (10)");
}

TEST_F(ValidateRaggedKV, RejectsBadIndptr) {
  indptr_ = int32_tensor({0, 5, 3, 10});
  EXPECT_FLARE_ERROR(validate_ragged_kv(cache()), kInvalid,
                     "kv_indptr must be non-decreasing: kv_indptr[2]=3 < kv_indptr[1]=5");
}

}  // namespace
}  // namespace flare
