// The CUDA driver layer. On a machine without a driver (CI): the library still loads, reports
// why CUDA is unavailable, and every device operation throws kNoCudaDevice. With a GPU: a JIT
// kernel is loaded through the module table and launched end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "flare/jit/cuda_driver.h"
#include "flare/jit/module.h"
#include "jit/jit_test_support.h"
#include "testing/expect_error.h"

namespace flare::jit {
namespace {

using testing::JitTest;

TEST(CudaDriver, WithoutDriverEverythingReportsNoCudaDevice) {
  if (cuda::available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  EXPECT_FLARE_ERROR(cuda::device_properties(0), ErrorCode::kNoCudaDevice,
                     cuda::unavailable_reason());
  EXPECT_FLARE_ERROR(cuda::set_device(0), ErrorCode::kNoCudaDevice, "no CUDA device");
  EXPECT_FLARE_ERROR(cuda::current_device(), ErrorCode::kNoCudaDevice, "no CUDA device");
  EXPECT_FLARE_ERROR(cuda::DeviceBuffer(256), ErrorCode::kNoCudaDevice, "no CUDA device");
  EXPECT_FLARE_ERROR(cuda::PinnedBuffer(256), ErrorCode::kNoCudaDevice, "no CUDA device");
  EXPECT_FLARE_ERROR(cuda::device_synchronize(), ErrorCode::kNoCudaDevice, "no CUDA device");
  EXPECT_FLARE_ERROR(cuda::is_capturing(nullptr), ErrorCode::kNoCudaDevice, "no CUDA device");
  EXPECT_FLARE_ERROR(get_kernel(testing::simple_spec(), "jit_test_scale", 0),
                     ErrorCode::kNoCudaDevice, "no CUDA device");
}

TEST(CudaDriver, AvailabilityIsConsistent) {
  EXPECT_EQ(cuda::available(), cuda::device_count() > 0);
  EXPECT_EQ(cuda::available(), cuda::unavailable_reason().empty());
}

TEST(CudaDriver, EmptyBuffersNeedNoDevice) {
  const cuda::DeviceBuffer device(0);
  const cuda::PinnedBuffer pinned(0);
  EXPECT_EQ(device.data(), nullptr);
  EXPECT_EQ(device.bytes(), 0u);
  EXPECT_EQ(pinned.data(), nullptr);
}

TEST(CudaDriver, CheckNamesTheCallAndTheError) {
  EXPECT_NO_THROW(cuda::check(0, "cuMemAlloc"));
  EXPECT_FLARE_ERROR(cuda::check(2, "cuMemAlloc"), ErrorCode::kCudaError, "cuMemAlloc failed: ");
  EXPECT_FLARE_ERROR(cuda::check(2, "cuMemAlloc"), ErrorCode::kCudaError, "(error 2)");
  if (cuda::available()) {
    EXPECT_FLARE_ERROR(cuda::check(2, "cuMemAlloc"), ErrorCode::kCudaError,
                       "cuMemAlloc failed: out of memory (error 2)");
  }
}

// Runs only where a GPU is present (scripts/gpu_check.sh); skipped in CI.
TEST_F(JitTest, LoadsAndLaunchesAJitKernelOnTheDevice) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  const int device = 0;
  const cuda::DeviceProperties props = cuda::device_properties(device);
  EXPECT_FALSE(props.name.empty());
  EXPECT_GT(props.num_sms, 0);
  EXPECT_GE(props.cc_major, 7);
  EXPECT_GT(props.global_bytes, 0);
  EXPECT_GT(props.l2_bytes, 0);
  // Every GPU flare runs on has at least 100 GB/s of DRAM (an H100: 3.35 TB/s).
  EXPECT_GT(props.memory_peak_bytes_per_us, 100e3) << props.memory_peak_bytes_per_us;
  EXPECT_GT(props.registers_per_sm, 0);
  EXPECT_GE(props.max_shared_bytes_per_block_optin, 48 * 1024);

  const KernelSpec spec = testing::simple_spec("3.0f");
  const cuda::Function function = get_kernel(spec, "jit_test_scale", device);
  EXPECT_EQ(get_kernel(spec, "jit_test_scale", device), function) << "loaded once per device";
  EXPECT_EQ(cuda::current_device(), device);
  EXPECT_FLARE_ERROR(get_kernel(spec, "jit_test_missing", device), ErrorCode::kCudaError,
                     "jit_test_missing");

  constexpr int n = 97;
  std::vector<uint16_t> x_bf16(n);          // bf16 bit patterns of i - 48
  std::vector<uint8_t> bias_e4m3(n, 0x38);  // e4m3 1.0
  for (int i = 0; i < n; ++i) {
    const float value = static_cast<float>(i - 48);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    x_bf16[i] = static_cast<uint16_t>(bits >> 16);  // exact: small integers
  }
  int32_t item[8] = {0, 0, 0, 0, 0, 10, -1, 0};  // kv_end = 10
  cuda::DeviceBuffer x(n * 2), bias(n), items(sizeof(item)), y(n * sizeof(float));
  cuda::memcpy_htod(x.data(), x_bf16.data(), n * 2);
  cuda::memcpy_htod(bias.data(), bias_e4m3.data(), n);
  cuda::PinnedBuffer staging(sizeof(item));
  std::memcpy(staging.data(), item, sizeof(item));
  cuda::memcpy_htod_async(items.data(), staging.data(), sizeof(item), nullptr);
  cuda::memset_d8_async(y.data(), 0xff, n * sizeof(float), nullptr);  // NaN poison
  EXPECT_FALSE(cuda::is_capturing(nullptr));

  void* x_ptr = x.data();
  void* bias_ptr = bias.data();
  void* items_ptr = items.data();
  void* y_ptr = y.data();
  int count = n;
  void* args[] = {&x_ptr, &bias_ptr, &items_ptr, &y_ptr, &count};
  EXPECT_GT(cuda::max_active_blocks_per_sm(function, 64, 0), 0);
  cuda::set_max_dynamic_shared(function, 0);
  cuda::launch(function, 2, 1, 1, 64, 1, 1, 0, nullptr, args);
  cuda::stream_synchronize(nullptr);
  std::vector<float> out(n);
  cuda::memcpy_dtoh(out.data(), y.data(), n * sizeof(float));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], (i - 48) * 3.0f + 1.0f + 10.0f) << "element " << i;
  }
  cuda::device_synchronize();
}

}  // namespace
}  // namespace flare::jit
