// merge_states_ragged on the GPU (FlashInfer's variable_length_merge_states; kernels/
// merge_state.cuh flare_merge_states with a state indptr) against the CPU operator: f32 / f16 /
// bf16, D 64 / 128 and an odd D (the element path), ranges of 0, 1 and hundreds of states,
// -inf states, base 2 and natural LSEs, padded NaN-poisoned outputs whose padding must stay
// untouched; malformed device indptr (decreasing, negative, past the states) reads nothing
// outside the tensors and gives the clamped ranges' result. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flare/api/merge_state.h"
#include "flare/jit/cuda_driver.h"
#include "flare/reference/merge.h"
#include "testing/elements.h"
#include "testing/print.h"
#include "testing/random.h"

namespace flare {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kHeads = 5;

// A host tensor and its device copy; views on the device keep the host view's layout.
struct Mirror {
  HostTensor host;
  cuda::DeviceBuffer device;

  explicit Mirror(HostTensor t)
      : host(std::move(t)),
        device(static_cast<size_t>(std::max<int64_t>(
            16, host.numel() * static_cast<int64_t>(dtype_bytes(host.dtype()))))) {
    upload();
  }
  size_t bytes() const { return static_cast<size_t>(host.numel()) * dtype_bytes(host.dtype()); }
  void upload() {
    if (bytes() > 0) cuda::memcpy_htod(device.data(), host.data<std::byte>(), bytes());
  }
  void download() {
    if (bytes() > 0) cuda::memcpy_dtoh(host.data<std::byte>(), device.data(), bytes());
  }
  // `view` (into host's storage) moved onto the device copy.
  TensorView on_device(const TensorView& view) const {
    return testing::rebase_view(view, host.data<std::byte>(), device.data(), Device::cuda(0));
  }
};

// Outputs inside a NaN-filled storage one row and 8 elements wider on each side: a write
// outside the view shows as a non-NaN element of the padding.
struct PaddedOut {
  Mirror v, s;
  TensorView v_view, s_view;

  PaddedOut(DType dtype, int64_t seq, int64_t dim)
      : v(HostTensor(dtype, {seq + 2, kHeads, dim + 16})),
        s(HostTensor(DType::kF32, {seq + 2, kHeads})) {
    v.host.fill(std::numeric_limits<float>::quiet_NaN());
    s.host.fill(std::numeric_limits<float>::quiet_NaN());
    v.upload();
    s.upload();
    v_view = testing::sub_view(v.host, {1, 0, 8}, {seq, kHeads, dim});
    s_view = testing::sub_view(s.host, {1, 0}, {seq, kHeads});
  }
  void expect_padding_untouched() const {
    const int64_t seq = v_view.shape[0], dim = v_view.shape[2];
    int64_t written = 0;
    for (int64_t r = 0; r < seq + 2; ++r) {
      for (int64_t h = 0; h < kHeads; ++h) {
        for (int64_t d = 0; d < dim + 16; ++d) {
          const bool inside = r >= 1 && r <= seq && d >= 8 && d < dim + 8;
          if (!inside && !std::isnan(v.host.get((r * kHeads + h) * (dim + 16) + d))) ++written;
        }
        const bool inside = r >= 1 && r <= seq;
        if (!inside && !std::isnan(s.host.get(r * kHeads + h))) ++written;
      }
    }
    EXPECT_EQ(written, 0) << "elements written outside the outputs";
  }
};

// Runs the GPU operator on `indptr` (given to the kernel as is) and compares each row r with
// the CPU operator on the states [ranges[r].first, ranges[r].second), within float32 rounding
// and the output dtype's.
void check(DType dtype, int64_t dim, LseBase base, const std::vector<int32_t>& indptr,
           const std::vector<std::pair<int32_t, int32_t>>& ranges, int64_t total, uint64_t seed) {
  const auto seq = static_cast<int64_t>(indptr.size()) - 1;
  ASSERT_EQ(static_cast<int64_t>(ranges.size()), seq);
  HostTensor v = testing::random_tensor(dtype, {total, kHeads, dim}, seed);
  HostTensor s = testing::random_tensor(DType::kF32, {total, kHeads}, seed + 1, 4.0f);
  for (int64_t i = 0; i < s.numel(); i += 7) s.set(i, -kInf);  // empty states here and there
  const Mirror v_dev(std::move(v)), s_dev(std::move(s));
  HostTensor offsets(DType::kI32, {seq + 1});
  std::copy(indptr.begin(), indptr.end(), offsets.data<int32_t>());
  const Mirror indptr_dev(std::move(offsets));
  PaddedOut out(dtype, seq, dim);

  merge_states_ragged(v_dev.on_device(v_dev.host.view()), s_dev.on_device(s_dev.host.view()),
                      indptr_dev.on_device(indptr_dev.host.view()), out.v.on_device(out.v_view),
                      out.s.on_device(out.s_view), nullptr, base);
  cuda::device_synchronize();
  out.v.download();
  out.s.download();
  out.expect_padding_untouched();

  // The GPU weighs every state against the row's largest LSE at once, the CPU folds them in
  // pairs: float32 rounding apart, then the output dtype's.
  const double v_tolerance = dtype == DType::kF32 ? 1e-5 : dtype == DType::kF16 ? 2e-3 : 1.6e-2;
  for (int64_t r = 0; r < seq; ++r) {
    HostTensor one_row(DType::kI32, {2});
    one_row.data<int32_t>()[0] = ranges[static_cast<size_t>(r)].first;
    one_row.data<int32_t>()[1] = ranges[static_cast<size_t>(r)].second;
    HostTensor v_cpu(dtype, {1, kHeads, dim}), s_cpu(DType::kF32, {1, kHeads});
    merge_states_ragged(v_dev.host.view(), s_dev.host.view(), one_row.view(), v_cpu.view(),
                        s_cpu.view(), base);
    for (int64_t h = 0; h < kHeads; ++h) {
      const float s_gpu = out.s.host.get((r + 1) * kHeads + h);
      const float s_ref = s_cpu.get(h);
      if (std::isinf(s_ref)) {
        EXPECT_EQ(s_gpu, s_ref) << "row " << r << " head " << h;
      } else {
        EXPECT_NEAR(s_gpu, s_ref, 1e-5 * (1.0 + std::fabs(s_ref))) << "row " << r << " head " << h;
      }
      for (int64_t d = 0; d < dim; ++d) {
        const float got = out.v.host.get(((r + 1) * kHeads + h) * (dim + 16) + 8 + d);
        const float want = v_cpu.get(h * dim + d);
        ASSERT_NEAR(got, want, v_tolerance * (1.0 + std::fabs(want)))
            << "row " << r << " head " << h << " d " << d;
      }
    }
  }
}

class MergeStatesRaggedGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t, LseBase>> {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
    cuda::set_device(0);
  }
};

TEST_P(MergeStatesRaggedGpu, MatchesTheCpuOperator) {
  const auto [dtype, dim, base] = GetParam();
  // Empty rows, single states, a long range (the loads in flight wrap several times).
  const std::vector<int32_t> lengths = {3, 0, 1, 300, 0, 17, 2, 64, 1};
  std::vector<int32_t> indptr = {0};
  std::vector<std::pair<int32_t, int32_t>> ranges;
  for (const int32_t length : lengths) {
    ranges.emplace_back(indptr.back(), indptr.back() + length);
    indptr.push_back(indptr.back() + length);
  }
  check(dtype, dim, base, indptr, ranges, indptr.back(), 11);
}

using RaggedParam = std::tuple<DType, int64_t, LseBase>;

std::string ragged_param_name(const ::testing::TestParamInfo<RaggedParam>& info) {
  const DType dtype = std::get<0>(info.param);
  const int64_t dim = std::get<1>(info.param);
  const LseBase base = std::get<2>(info.param);
  return std::string(dtype_name(dtype)) + "_D" + std::to_string(dim) +
         (base == LseBase::kBase2 ? "_base2" : "_natural");
}

INSTANTIATE_TEST_SUITE_P(
    DtypesDims, MergeStatesRaggedGpu,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(int64_t{64}, int64_t{128}, int64_t{100}),
                       ::testing::Values(LseBase::kBase2, LseBase::kNatural)),
    ragged_param_name);

// Whatever the device indptr holds, the kernel clamps each range into [0, total] and its end to
// at least its begin: each row is the CPU operator's on its clamped range, and nothing outside
// v, s or the outputs is read or written (compute-sanitizer memcheck runs this test).
TEST(MergeStatesRaggedGpuIndptr, MalformedRangesAreClampedInsideTheTensors) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  cuda::set_device(0);
  const int32_t total = 40;
  const std::vector<int32_t> indptr = {-5,
                                       10,
                                       4,
                                       1000,
                                       30,
                                       45,
                                       std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max()};
  std::vector<std::pair<int32_t, int32_t>> ranges;
  for (size_t r = 0; r + 1 < indptr.size(); ++r) {
    const int32_t begin = std::clamp(indptr[r], 0, total);
    ranges.emplace_back(begin, std::clamp(indptr[r + 1], begin, total));
  }
  check(DType::kF16, 64, LseBase::kBase2, indptr, ranges, total, 21);
}

}  // namespace
}  // namespace flare
