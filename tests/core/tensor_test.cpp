// TensorView offsets, select/slice (with their bounds errors), contiguity; Device names;
// HostTensor allocation and fill.
#include "flare/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "flare/core/error.h"

namespace flare {
namespace {

// Runs `action`, which must throw kInvalidArgument whose message contains every part.
template <class Action>
void expect_invalid_argument(Action action, std::initializer_list<std::string> parts) {
  try {
    action();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
    }
  }
}

TEST(TensorViewTest, ContiguousHasRowMajorStrides) {
  float storage[2 * 3 * 5];
  const TensorView view = TensorView::contiguous(storage, DType::kF32, {2, 3, 5});
  EXPECT_EQ(view.ndim, 3);
  EXPECT_EQ(view.numel(), 30);
  EXPECT_EQ(view.stride(0), 15);
  EXPECT_EQ(view.stride(1), 5);
  EXPECT_EQ(view.stride(2), 1);
  EXPECT_EQ(view.size(-1), 5);
  EXPECT_EQ(view.stride(-3), 15);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_TRUE(view.device.is_cpu());
  EXPECT_EQ(view.shape_str(), "[2, 3, 5]");

  const TensorView from_vector =
      TensorView::contiguous(storage, DType::kF16, std::vector<int64_t>{7}, Device::cuda(2));
  EXPECT_EQ(from_vector.numel(), 7);
  EXPECT_EQ(from_vector.device, Device::cuda(2));
}

TEST(TensorViewTest, ScalarAndEmptyViews) {
  float value = 0;
  const TensorView scalar = TensorView::contiguous(&value, DType::kF32, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.shape_str(), "[]");
  EXPECT_EQ(scalar.offset({}), 0);
  const TensorView empty = TensorView::contiguous(nullptr, DType::kF32, {4, 0, 3});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.is_contiguous());
}

TEST(TensorViewTest, ContiguousRejectsBadShapes) {
  expect_invalid_argument(
      [] {
        TensorView::contiguous(nullptr, DType::kF32, {2, -1});
      },
      {"shape[1]", "-1"});
  expect_invalid_argument(
      [] {
        TensorView::contiguous(nullptr, DType::kF32, {1, 1, 1, 1, 1, 1, 1});
      },
      {"ndim", "7"});
}

TEST(TensorViewTest, OffsetFollowsStrides) {
  TensorView view = TensorView::contiguous(nullptr, DType::kF32, {4, 3, 5});
  EXPECT_EQ(view.offset({2, 1, 4}), 2 * 15 + 5 + 4);
  view.strides = {100, 1, 7};  // any non-negative strides
  EXPECT_EQ(view.offset({3, 2, 4}), 300 + 2 + 28);
  expect_invalid_argument([&] { view.offset({4, 0, 0}); }, {"dim 0", "4", "[0, 4)"});
  expect_invalid_argument([&] { view.offset({0, 0, -1}); }, {"dim 2", "-1"});
  expect_invalid_argument([&] { view.offset({0, 0}); }, {"3", "2"});
}

TEST(TensorViewTest, SelectDropsADimension) {
  std::vector<float> storage(4 * 3 * 5);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<float>(i);
  const TensorView view = TensorView::contiguous(storage.data(), DType::kF32, {4, 3, 5});

  const TensorView middle = view.select(1, 2);  // [4, 5] with strides [15, 1]
  EXPECT_EQ(middle.ndim, 2);
  EXPECT_EQ(middle.shape_str(), "[4, 5]");
  EXPECT_EQ(middle.stride(0), 15);
  EXPECT_EQ(middle.stride(1), 1);
  EXPECT_FALSE(middle.is_contiguous());
  EXPECT_EQ(middle.ptr<float>()[middle.offset({3, 4})], storage[view.offset({3, 2, 4})]);

  const TensorView last = view.select(-1, 4);  // [4, 3] with strides [15, 5]
  EXPECT_EQ(last.shape_str(), "[4, 3]");
  EXPECT_EQ(last.ptr<float>()[last.offset({1, 2})], storage[view.offset({1, 2, 4})]);

  const TensorView row = view.select(0, 3);
  EXPECT_TRUE(row.is_contiguous());
  EXPECT_EQ(row.ptr<float>(), storage.data() + 45);

  expect_invalid_argument([&] { view.select(1, 3); }, {"dim 1", "3", "[0, 3)", "[4, 3, 5]"});
  expect_invalid_argument([&] { view.select(3, 0); }, {"dim 3"});
  expect_invalid_argument([&] { view.select(-4, 0); }, {"dim -4"});
}

TEST(TensorViewTest, SliceNarrowsADimension) {
  std::vector<uint16_t> storage(6 * 7);
  const TensorView view = TensorView::contiguous(storage.data(), DType::kBF16, {6, 7});

  const TensorView rows = view.slice(0, 2, 5);
  EXPECT_EQ(rows.shape_str(), "[3, 7]");
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.ptr<uint16_t>(), storage.data() + 14);

  const TensorView columns = view.slice(-1, 1, 4);
  EXPECT_EQ(columns.shape_str(), "[6, 3]");
  EXPECT_FALSE(columns.is_contiguous());
  EXPECT_EQ(columns.ptr<uint16_t>() + columns.offset({5, 2}), storage.data() + 5 * 7 + 3);

  const TensorView empty = view.slice(1, 7, 7);
  EXPECT_EQ(empty.numel(), 0);

  expect_invalid_argument([&] { view.slice(1, 2, 8); }, {"dim 1", "[2, 8)", "7"});
  expect_invalid_argument([&] { view.slice(0, 4, 3); }, {"dim 0", "[4, 3)"});
  expect_invalid_argument([&] { view.slice(0, -1, 3); }, {"dim 0", "[-1, 3)"});
  expect_invalid_argument([&] { view.slice(2, 0, 1); }, {"dim 2"});
}

TEST(TensorViewTest, ContiguityIgnoresStridesOfSizeOneDims) {
  TensorView view = TensorView::contiguous(nullptr, DType::kF32, {3, 1, 4, 1});
  view.strides[1] = 12345;
  view.strides[3] = 0;
  EXPECT_TRUE(view.is_contiguous());
  view.strides[2] = 2;
  EXPECT_FALSE(view.is_contiguous());

  TensorView transposed = TensorView::contiguous(nullptr, DType::kF32, {3, 4});
  transposed.strides = {1, 3};
  EXPECT_FALSE(transposed.is_contiguous());
  TensorView padded = TensorView::contiguous(nullptr, DType::kF32, {3, 4});
  padded.strides = {5, 1};
  EXPECT_FALSE(padded.is_contiguous());
}

TEST(DeviceTest, NamesRoundTrip) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:0"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:13"), Device::cuda(13));
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda1", "CPU", "cuda: 1"}) {
    expect_invalid_argument([&] { parse_device(bad); }, {std::string("'") + bad + "'"});
  }
}

TEST(HostTensorTest, ZeroInitializedContiguous) {
  HostTensor tensor(DType::kF16, {3, 5});
  EXPECT_EQ(tensor.numel(), 15);
  const TensorView view = tensor.view();
  EXPECT_EQ(view.shape_str(), "[3, 5]");
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_EQ(view.dtype, DType::kF16);
  for (int64_t i = 0; i < tensor.numel(); ++i) EXPECT_EQ(tensor.get(i), 0.0f);
  tensor.set(7, 1.5f);
  EXPECT_EQ(tensor.get(7), 1.5f);
  EXPECT_EQ(load_float(view.data, DType::kF16, view.offset({1, 2})), 1.5f);
}

TEST(HostTensorTest, FillEveryFloatingDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    HostTensor tensor(dtype, {7});
    tensor.fill(-2.0f);
    for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(tensor.get(i), -2.0f) << dtype_name(dtype);
    tensor.fill(std::nanf(""));
    for (int64_t i = 0; i < 7; ++i) EXPECT_TRUE(std::isnan(tensor.get(i))) << dtype_name(dtype);
  }
}

TEST(HostTensorTest, FillRejectsIntegerDtypes) {
  HostTensor tensor(DType::kI32, {2});
  expect_invalid_argument([&] { tensor.fill(1.0f); }, {"int32"});
}

TEST(HostTensorTest, MovesAndRejectsBadShapes) {
  HostTensor source(DType::kF32, {2});
  source.set(1, 3.0f);
  HostTensor moved = std::move(source);
  EXPECT_EQ(moved.get(1), 3.0f);
  HostTensor empty(DType::kF32, {0, 4});
  EXPECT_EQ(empty.numel(), 0);
  empty.fill(1.0f);
  expect_invalid_argument([] { HostTensor(DType::kF32, {-2}); }, {"shape[0]", "-2"});
}

}  // namespace
}  // namespace flare
