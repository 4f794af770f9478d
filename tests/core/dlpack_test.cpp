// DLPack import/export: dtypes, devices, strides (given or NULL), byte_offset, the managed
// tensor's deleter, and the errors for what flare does not handle.
#include "flare/core/dlpack.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "flare/core/error.h"

namespace flare {
namespace {

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

// A DLTensor over `data` with the given metadata; shape/strides point into the caller's arrays.
DLTensor make_dl_tensor(void* data, DLDataType dtype, std::vector<int64_t>& shape, int64_t* strides,
                        uint64_t byte_offset = 0, DLDevice device = {kDLCPU, 0}) {
  DLTensor tensor{};
  tensor.data = data;
  tensor.device = device;
  tensor.ndim = static_cast<int32_t>(shape.size());
  tensor.dtype = dtype;
  tensor.shape = shape.data();
  tensor.strides = strides;
  tensor.byte_offset = byte_offset;
  return tensor;
}

TEST(DlpackTest, ImportsEveryDtype) {
  struct Case {
    DLDataType dl;
    DType expected;
  };
  const Case cases[] = {
      {{kDLFloat, 32, 1}, DType::kF32},       {{kDLFloat, 16, 1}, DType::kF16},
      {{kDLBfloat, 16, 1}, DType::kBF16},     {{kDLFloat8_e4m3fn, 8, 1}, DType::kE4M3},
      {{kDLFloat8_e5m2, 8, 1}, DType::kE5M2}, {{kDLInt, 32, 1}, DType::kI32},
      {{kDLInt, 64, 1}, DType::kI64},         {{kDLUInt, 8, 1}, DType::kU8},
      {{kDLBool, 8, 1}, DType::kU8},
  };
  std::byte storage[64] = {};
  for (const Case& c : cases) {
    std::vector<int64_t> shape = {3};
    const TensorView view = from_dlpack(make_dl_tensor(storage, c.dl, shape, nullptr));
    EXPECT_EQ(view.dtype, c.expected) << dtype_name(c.expected);
  }
}

TEST(DlpackTest, NullStridesMeanRowMajor) {
  std::vector<float> storage(2 * 3 * 5);
  std::vector<int64_t> shape = {2, 3, 5};
  const TensorView view =
      from_dlpack(make_dl_tensor(storage.data(), {kDLFloat, 32, 1}, shape, nullptr));
  EXPECT_EQ(view.shape_str(), "[2, 3, 5]");
  EXPECT_EQ(view.stride(0), 15);
  EXPECT_EQ(view.stride(1), 5);
  EXPECT_EQ(view.stride(2), 1);
  EXPECT_EQ(view.data, storage.data());
  EXPECT_TRUE(view.device.is_cpu());
}

TEST(DlpackTest, StridesAndByteOffsetAreKept) {
  std::vector<uint16_t> storage(64);
  std::vector<int64_t> shape = {4, 3};
  int64_t strides[] = {1, 9};  // a transposed, padded view
  const TensorView view =
      from_dlpack(make_dl_tensor(storage.data(), {kDLBfloat, 16, 1}, shape, strides, 6));
  EXPECT_EQ(view.stride(0), 1);
  EXPECT_EQ(view.stride(1), 9);
  EXPECT_EQ(view.data, storage.data() + 3) << "byte_offset 6 is three bf16 elements";
  EXPECT_FALSE(view.is_contiguous());
}

TEST(DlpackTest, Devices) {
  std::byte storage[8] = {};
  std::vector<int64_t> shape = {2};
  const DLDataType f32 = {kDLFloat, 32, 1};
  EXPECT_EQ(from_dlpack(make_dl_tensor(storage, f32, shape, nullptr, 0, {kDLCUDA, 3})).device,
            Device::cuda(3));
  EXPECT_EQ(from_dlpack(make_dl_tensor(storage, f32, shape, nullptr, 0, {kDLCUDAHost, 0})).device,
            Device::cpu());
  EXPECT_EQ(
      from_dlpack(make_dl_tensor(storage, f32, shape, nullptr, 0, {kDLCUDAManaged, 1})).device,
      Device::cuda(1));
  expect_invalid_argument(
      [&] {
        from_dlpack(
            make_dl_tensor(storage, f32, shape, nullptr, 0, {static_cast<DLDeviceType>(10), 0}));
      },
      {"device_type", "10"});
}

TEST(DlpackTest, RejectsUnsupportedDtypesAndLanes) {
  std::byte storage[16] = {};
  std::vector<int64_t> shape = {2};
  expect_invalid_argument(
      [&] {
        from_dlpack(make_dl_tensor(storage, {kDLFloat, 64, 1}, shape, nullptr));
      },
      {"dtype", "code 2", "bits 64"});
  expect_invalid_argument(
      [&] {
        from_dlpack(make_dl_tensor(storage, {kDLInt, 8, 1}, shape, nullptr));
      },
      {"code 0", "bits 8"});
  expect_invalid_argument(
      [&] {
        from_dlpack(make_dl_tensor(storage, {kDLFloat8_e4m3fn, 16, 1}, shape, nullptr));
      },
      {"code 10", "bits 16"});
  expect_invalid_argument(
      [&] {
        from_dlpack(make_dl_tensor(storage, {kDLFloat, 32, 4}, shape, nullptr));
      },
      {"lanes", "4"});
}

TEST(DlpackTest, RejectsBadRankShapeStridesAndData) {
  std::byte storage[16] = {};
  const DLDataType u8 = {kDLUInt, 8, 1};
  std::vector<int64_t> too_many = {1, 1, 1, 1, 1, 1, 1};
  expect_invalid_argument([&] { from_dlpack(make_dl_tensor(storage, u8, too_many, nullptr)); },
                          {"ndim", "7"});
  std::vector<int64_t> negative = {2, -3};
  expect_invalid_argument([&] { from_dlpack(make_dl_tensor(storage, u8, negative, nullptr)); },
                          {"shape[1]", "-3"});
  std::vector<int64_t> shape = {2, 3};
  int64_t negative_strides[] = {-3, 1};
  expect_invalid_argument(
      [&] { from_dlpack(make_dl_tensor(storage, u8, shape, negative_strides)); },
      {"strides[0]", "-3"});
  expect_invalid_argument([&] { from_dlpack(make_dl_tensor(nullptr, u8, shape, nullptr)); },
                          {"data", "[2, 3]"});
  std::vector<int64_t> empty = {0, 3};
  EXPECT_EQ(from_dlpack(make_dl_tensor(nullptr, u8, empty, nullptr)).numel(), 0);
}

TEST(DlpackTest, ScalarHasNoShape) {
  float value = 4.0f;
  DLTensor tensor{};
  tensor.data = &value;
  tensor.device = {kDLCPU, 0};
  tensor.dtype = {kDLFloat, 32, 1};
  const TensorView view = from_dlpack(tensor);
  EXPECT_EQ(view.ndim, 0);
  EXPECT_EQ(view.numel(), 1);
}

TEST(DlpackTest, ExportThenImportRoundTrips) {
  std::vector<uint8_t> storage(200);
  TensorView view = TensorView::contiguous(storage.data(), DType::kE5M2, {4, 5, 6});
  view = view.slice(1, 1, 4).select(2, 3);  // [4, 3] strides [30, 6], offset 9 elements
  view.device = Device::cuda(2);

  int releases = 0;
  DLManagedTensor* managed = to_dlpack(view, [&] { ++releases; });
  const DLTensor& dl = managed->dl_tensor;
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.shape[0], 4);
  EXPECT_EQ(dl.shape[1], 3);
  ASSERT_NE(dl.strides, nullptr);
  EXPECT_EQ(dl.strides[0], 30);
  EXPECT_EQ(dl.strides[1], 6);
  EXPECT_EQ(dl.dtype.code, kDLFloat8_e5m2);
  EXPECT_EQ(dl.dtype.bits, 8);
  EXPECT_EQ(dl.dtype.lanes, 1);
  EXPECT_EQ(dl.device.device_type, kDLCUDA);
  EXPECT_EQ(dl.device.device_id, 2);
  EXPECT_EQ(static_cast<uint8_t*>(dl.data) + dl.byte_offset, storage.data() + 9);

  const TensorView back = from_dlpack(dl);
  EXPECT_EQ(back.data, view.data);
  EXPECT_EQ(back.dtype, view.dtype);
  EXPECT_EQ(back.device, view.device);
  EXPECT_EQ(back.ndim, view.ndim);
  EXPECT_EQ(back.shape, view.shape);
  EXPECT_EQ(back.strides, view.strides);

  EXPECT_EQ(releases, 0);
  managed->deleter(managed);
  EXPECT_EQ(releases, 1);
}

TEST(DlpackTest, ExportEveryDtypeAndCpu) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2,
                      DType::kI32, DType::kI64, DType::kU8}) {
    int64_t storage[4] = {};
    const TensorView view = TensorView::contiguous(storage, dtype, {4});
    DLManagedTensor* managed = to_dlpack(view);  // no release callback
    EXPECT_EQ(managed->dl_tensor.device.device_type, kDLCPU);
    EXPECT_EQ(managed->dl_tensor.dtype.bits, 8 * dtype_bytes(dtype));
    EXPECT_EQ(from_dlpack(managed->dl_tensor).dtype, dtype) << dtype_name(dtype);
    managed->deleter(managed);
  }
}

}  // namespace
}  // namespace flare
