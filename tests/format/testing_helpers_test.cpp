// Tests of the shared test helpers in tests/testing/ (elements, random, compare, index
// arrays): the other suites trust them, so each property they document is checked here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/random.h"

namespace flare::testing {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A [2, 3] float32 view with padded rows (stride 5) over values 0..9.
struct PaddedMatrix {
  HostTensor storage{DType::kF32, {2, 5}};
  TensorView view;
  PaddedMatrix() {
    for (int i = 0; i < 10; ++i) storage.set(i, static_cast<float>(i));
    view = sub_view(storage, {0, 1}, {2, 3});
  }
};

TEST(Elements, ForEachElementVisitsRowMajorWithStridedOffsets) {
  PaddedMatrix m;
  std::vector<int64_t> linears;
  std::vector<int64_t> offsets;
  for_each_element(m.view, [&](int64_t linear, int64_t offset) {
    linears.push_back(linear);
    offsets.push_back(offset);
  });
  EXPECT_EQ(linears, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 1, 2, 5, 6, 7}));
  EXPECT_EQ(to_double_vector(m.view), (std::vector<double>{1, 2, 3, 6, 7, 8}));
}

TEST(Elements, ForEachElementHandlesEmptyAndZeroDimViews) {
  int visits = 0;
  HostTensor empty(DType::kF32, {3, 0, 2});
  for_each_element(empty.view(), [&](int64_t, int64_t) { ++visits; });
  EXPECT_EQ(visits, 0);
  float scalar = 4.0f;
  TensorView zero_dim = TensorView::contiguous(&scalar, DType::kF32, std::vector<int64_t>{});
  for_each_element(zero_dim, [&](int64_t linear, int64_t offset) {
    EXPECT_EQ(linear, 0);
    EXPECT_EQ(offset, 0);
    ++visits;
  });
  EXPECT_EQ(visits, 1);
}

TEST(Elements, ToContiguousCopiesBytesOfAnyDtype) {
  PaddedMatrix m;
  const HostTensor copy = to_contiguous(m.view);
  EXPECT_EQ(copy.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_double_vector(copy.view()), (std::vector<double>{1, 2, 3, 6, 7, 8}));
  HostTensor ints = int32_tensor({4, -1, 9, 2});
  TensorView every_other = ints.view();
  every_other.shape[0] = 2;
  every_other.strides[0] = 2;
  EXPECT_EQ(int32_values(to_contiguous(every_other).view()), (std::vector<int32_t>{4, 9}));
}

TEST(Elements, SubViewRejectsOutOfBoundsRanges) {
  HostTensor storage(DType::kF32, {2, 5});
  EXPECT_FLARE_ERROR(sub_view(storage, {0, 3}, {2, 3}), ErrorCode::kInvalidArgument,
                     "sub_view: dimension 1 range [3, 6) exceeds the storage size 5");
}

TEST(Elements, RebaseViewKeepsLayoutAndOffset) {
  PaddedMatrix m;
  std::vector<float> other(10);
  const TensorView moved = rebase_view(m.view, m.storage.data<void>(), other.data(), Device::cpu());
  EXPECT_EQ(moved.data, other.data() + 1);
  EXPECT_EQ(moved.strides[0], 5);
  const TensorView on_device =
      rebase_view(m.view, m.storage.data<void>(), other.data(), Device::cuda(1));
  EXPECT_EQ(on_device.device, Device::cuda(1));
}

TEST(Random, SameSeedSameValuesOtherSeedOtherValues) {
  const HostTensor a = random_tensor(DType::kF32, {64}, 5);
  const HostTensor b = random_tensor(DType::kF32, {64}, 5);
  const HostTensor c = random_tensor(DType::kF32, {64}, 6);
  EXPECT_EQ(max_abs_error(a.view(), b.view()), 0.0);
  EXPECT_GT(max_abs_error(a.view(), c.view()), 0.1);
}

TEST(Random, ValuesAreNormalTimesScale) {
  const HostTensor t = random_tensor(DType::kF32, {20000}, 1, 3.0f);
  const std::vector<double> values = to_double_vector(t.view());
  double sum = 0.0;
  double sum_sq = 0.0;
  for (double x : values) {
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / values.size();
  const double stddev = std::sqrt(sum_sq / values.size() - mean * mean);
  // Standard error of the mean is 3 / sqrt(20000) ~ 0.02; of the std ~ 0.015.
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(stddev, 3.0, 0.1);
}

TEST(Random, ValuesAreRoundedToTheDtype) {
  const HostTensor bf16 = random_tensor(DType::kBF16, {256}, 2);
  const HostTensor f32 = random_tensor(DType::kF32, {256}, 2);
  // Same draws: bf16 values are the float32 ones rounded (relative error <= 2^-8).
  for (int64_t i = 0; i < 256; ++i) {
    EXPECT_EQ(bf16.get(i), bf16_bits_to_float(float_to_bf16_bits(f32.get(i))));
    EXPECT_LE(std::fabs(bf16.get(i) - f32.get(i)), std::fabs(f32.get(i)) * 0x1p-8);
  }
}

TEST(Random, FillRandomOnAStridedViewMatchesTheContiguousTensor) {
  HostTensor storage(DType::kF16, {4, 3, 10});
  storage.fill(kNaN);
  const TensorView view = sub_view(storage, {0, 0, 1}, {4, 3, 8});
  fill_random(view, 9, 0.5f);
  const HostTensor expected = random_tensor(DType::kF16, {4, 3, 8}, 9, 0.5f);
  EXPECT_EQ(max_abs_error(view, expected.view()), 0.0);
  EXPECT_EQ(count_nan(storage.view()), 4 * 3 * 2) << "padding must be left alone";
}

TEST(Random, IntegerDtypesAreRejected) {
  EXPECT_FLARE_ERROR(random_tensor(DType::kI32, {3}, 1), ErrorCode::kInvalidArgument,
                     "fill_random needs a floating dtype, got int32");
}

TEST(RandomLengths, ConstantAndUniform) {
  EXPECT_EQ(random_lengths(4, LengthDistribution::kConstant, 0, 97, 1),
            (std::vector<int32_t>{97, 97, 97, 97}));
  const std::vector<int32_t> uniform = random_lengths(2000, LengthDistribution::kUniform, 0, 7, 3);
  EXPECT_EQ(uniform, random_lengths(2000, LengthDistribution::kUniform, 0, 7, 3));
  EXPECT_EQ(*std::min_element(uniform.begin(), uniform.end()), 0);
  EXPECT_EQ(*std::max_element(uniform.begin(), uniform.end()), 7);
  EXPECT_EQ(std::count(uniform.begin(), uniform.end(), 0) > 150, true) << "empty requests occur";
}

TEST(RandomLengths, ZipfIsSkewed) {
  const std::vector<int32_t> lengths = random_lengths(1000, LengthDistribution::kZipf, 1, 1024, 4);
  EXPECT_EQ(*std::min_element(lengths.begin(), lengths.end()) >= 1, true);
  EXPECT_EQ(*std::max_element(lengths.begin(), lengths.end()), 1024);
  std::vector<int32_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const int32_t median = sorted[sorted.size() / 2];
  // Exponent 1.2 over 1024 ranks: P(rank 1) ~ 0.23 (length 1024), P(rank <= 3) ~ 0.40, so
  // the median length is at most 1024 / 4.
  EXPECT_LE(median, 256);
  EXPECT_GT(std::count(lengths.begin(), lengths.end(), 1024), 150);
}

TEST(RandomLengths, RejectsBadRanges) {
  EXPECT_FLARE_ERROR(random_lengths(3, LengthDistribution::kUniform, 5, 4, 1),
                     ErrorCode::kInvalidArgument, "min_len=5 max_len=4");
}

TEST(Compare, MaxAbsAndRelativeL2) {
  HostTensor a(DType::kF32, {2, 2});
  HostTensor b(DType::kF16, {2, 2});  // dtypes may differ
  const std::vector<float> av = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> bv = {1.0f, 2.5f, 3.0f, 3.0f};
  for (int i = 0; i < 4; ++i) {
    a.set(i, av[static_cast<size_t>(i)]);
    b.set(i, bv[static_cast<size_t>(i)]);
  }
  const ErrorStats stats = error_stats(a.view(), b.view());
  EXPECT_EQ(stats.max_abs, 1.0);
  EXPECT_EQ(stats.worst_index, 3);
  EXPECT_EQ(stats.count, 4);
  EXPECT_DOUBLE_EQ(stats.relative_l2, std::sqrt(1.25) / std::sqrt(1 + 6.25 + 9 + 9));
  EXPECT_EQ(max_abs_error(a.view(), std::vector<double>{1, 2, 3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(relative_l2_error(a.view(), std::vector<float>{1, 2, 3, 2}),
                   2.0 / std::sqrt(18.0));
}

TEST(Compare, NaNMakesErrorsNaNAndInfinitiesCountOnlyWhenUnequal) {
  HostTensor a(DType::kF32, {3});
  a.set(0, 1.0f);
  a.set(1, static_cast<float>(-kInf));
  a.set(2, 2.0f);
  EXPECT_EQ(max_abs_error(a.view(), std::vector<double>{1.0, -kInf, 2.0}), 0.0);
  EXPECT_EQ(relative_l2_error(a.view(), std::vector<double>{1.0, -kInf, 2.0}), 0.0);
  EXPECT_EQ(max_abs_error(a.view(), std::vector<double>{1.0, kInf, 2.0}), kInf);
  EXPECT_EQ(relative_l2_error(a.view(), std::vector<double>{1.0, kInf, 2.0}), kInf);
  EXPECT_EQ(max_abs_error(a.view(), std::vector<double>{1.0, -1.0, 2.0}), kInf);
  a.set(2, static_cast<float>(kNaN));
  const ErrorStats stats = error_stats(a.view(), std::vector<double>{1.5, -kInf, 2.0});
  EXPECT_TRUE(std::isnan(stats.max_abs));
  EXPECT_TRUE(std::isnan(stats.relative_l2));
  EXPECT_EQ(stats.worst_index, 2);
  EXPECT_FALSE(stats.max_abs <= 1e9) << "a NaN error must fail any tolerance check";
}

TEST(Compare, ZeroReference) {
  HostTensor zeros(DType::kF32, {4});
  zeros.fill(0.0f);
  EXPECT_EQ(relative_l2_error(zeros.view(), std::vector<double>(4, 0.0)), 0.0);
  zeros.set(1, 1e-6f);
  EXPECT_EQ(relative_l2_error(zeros.view(), std::vector<double>(4, 0.0)), kInf);
}

TEST(Compare, RejectsSizeMismatchAndIntegerTensors) {
  HostTensor a(DType::kF32, {4});
  EXPECT_FLARE_ERROR(max_abs_error(a.view(), std::vector<double>(3, 0.0)),
                     ErrorCode::kInvalidArgument,
                     "compared tensors differ in size: actual has 4 elements, expected has 3");
  HostTensor ints = int32_tensor({1, 2});
  EXPECT_FLARE_ERROR(count_nan(ints.view()), ErrorCode::kInvalidArgument,
                     "count_nan needs a floating dtype, got int32");
}

TEST(Compare, PoisonFillsEveryElementButNotPadding) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    HostTensor storage(dtype, {3, 6});
    storage.fill(1.0f);
    const TensorView view = sub_view(storage, {0, 2}, {3, 4});
    EXPECT_EQ(count_nan(view), 0);
    poison(view);
    EXPECT_EQ(count_nan(view), 12) << dtype_name(dtype);
    EXPECT_EQ(count_nan(storage.view()), 12) << dtype_name(dtype);
  }
}

TEST(IndexArrays, IndptrFromLengths) {
  const HostTensor indptr = indptr_tensor({3, 0, 5});
  EXPECT_EQ(indptr.dtype(), DType::kI32);
  EXPECT_EQ(int32_values(indptr.view()), (std::vector<int32_t>{0, 3, 3, 8}));
  EXPECT_EQ(int32_values(indptr_tensor({}).view()), (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace flare::testing
