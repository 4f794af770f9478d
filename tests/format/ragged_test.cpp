// Tests of the ragged accessors (src/format/ragged.cpp): batch, begin and length of an
// int32 indptr, including empty requests, strided indptrs and out-of-range requests.
#include "flare/format/ragged.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/expect_error.h"
#include "testing/index_arrays.h"

namespace flare {
namespace {

using testing::int32_tensor;
constexpr auto kInvalid = ErrorCode::kInvalidArgument;

TEST(Ragged, BatchBeginAndLengthWithEmptyRequests) {
  HostTensor indptr = int32_tensor({0, 0, 7, 7, 104, 105});
  const TensorView view = indptr.view();
  ASSERT_EQ(ragged_batch(view), 5);
  const std::vector<int64_t> lengths = {0, 7, 0, 97, 1};
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ragged_begin(view, i), indptr.data<int32_t>()[i]) << "request " << i;
    EXPECT_EQ(ragged_length(view, i), lengths[static_cast<size_t>(i)]) << "request " << i;
  }
  EXPECT_EQ(ragged_begin(view, 5), 105);  // the end of the last request
}

TEST(Ragged, ReadsStridedIndptr) {
  HostTensor storage = int32_tensor({0, -1, 3, -1, 10});
  TensorView indptr = storage.view();
  indptr.shape[0] = 3;
  indptr.strides[0] = 2;
  EXPECT_EQ(ragged_batch(indptr), 2);
  EXPECT_EQ(ragged_length(indptr, 0), 3);
  EXPECT_EQ(ragged_length(indptr, 1), 7);
}

TEST(Ragged, EmptyBatch) {
  HostTensor indptr = int32_tensor({0});
  EXPECT_EQ(ragged_batch(indptr.view()), 0);
}

TEST(Ragged, RejectsOutOfRangeRequestsAndBadIndptr) {
  HostTensor indptr = int32_tensor({0, 4, 9});
  EXPECT_FLARE_ERROR(ragged_length(indptr.view(), 2), kInvalid, "request 2 is out of range [0, 2)");
  EXPECT_FLARE_ERROR(ragged_begin(indptr.view(), 3), kInvalid,
                     "indptr index 3 is out of range [0, 3)");
  HostTensor empty = int32_tensor({});
  EXPECT_FLARE_ERROR(ragged_batch(empty.view()), kInvalid,
                     "indptr must be 1-D with at least one entry (batch + 1), got shape [0]");
  HostTensor wide(DType::kI64, {3});
  EXPECT_FLARE_ERROR(ragged_begin(wide.view(), 0), kInvalid,
                     "indptr must be a 1-D int32 array, got int64 [3]");
}

TEST(RaggedKV, AccessorsReadShapesAndIndptr) {
  HostTensor k(DType::kF16, {9, 4, 64});
  HostTensor v(DType::kF16, {9, 4, 32});
  HostTensor indptr = int32_tensor({0, 4, 4, 9});
  const RaggedKV kv{k.view(), v.view(), indptr.view()};
  EXPECT_EQ(kv.batch(), 3);
  EXPECT_EQ(kv.num_kv_heads(), 4);
  EXPECT_EQ(kv.head_dim_qk(), 64);
  EXPECT_EQ(kv.head_dim_vo(), 32);
  EXPECT_EQ(kv.kv_len(0), 4);
  EXPECT_EQ(kv.kv_len(1), 0);
  EXPECT_EQ(kv.kv_len(2), 5);
}

}  // namespace
}  // namespace flare
