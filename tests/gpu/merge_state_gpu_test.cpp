// The merge kernels (kernels/merge_state.cuh) on pairs of states, merge_state and
// merge_state_in_place, against a float64 reference and the CPU operator: f32/f16/bf16, D
// 64/128/256 and odd sizes, odd seq and H, -inf states whose v holds NaN, contiguous, padded,
// misaligned and transposed views, NaN-poisoned outputs whose padding must stay untouched,
// strided masks; bitwise determinism and commutativity, a grid-stride pass, a second device,
// errors before launch (stacked states: merge_states_gpu_test.cpp). Skips without a CUDA device.
#include "merge_gpu_cases.h"

namespace flare {
namespace {

using namespace merge_gpu;

using PairParam = std::tuple<DType, int64_t, Layout>;

std::string pair_param_name(const ::testing::TestParamInfo<PairParam>& info) {
  const auto [dtype, dim, layout] = info.param;
  return std::string(dtype_name(dtype)) + "_D" + std::to_string(dim) + "_" + layout_name(layout);
}

class MergeStatePairGpu : public MergeGpu, public ::testing::WithParamInterface<PairParam> {};

TEST_P(MergeStatePairGpu, MatchesFloat64AndTheCpuOperatorBitwiseStable) {
  const auto [dtype, dim, layout] = GetParam();
  PairCase c = PairCase::make(dtype, kSeq, kHeads, dim, layout, layout, layout, 11);
  c.run();
  cuda::device_synchronize();
  c.expect_correct("merge_state");

  // Deterministic, and a ⊕ b == b ⊕ a bit for bit.
  const HostTensor first_v = testing::to_contiguous(c.out_v.host.storage.view());
  const HostTensor first_s = testing::to_contiguous(c.out_s.host.storage.view());
  c.run();
  cuda::device_synchronize();
  c.download_outputs();
  EXPECT_TRUE(same_bytes(c.out_v.host.storage, first_v)) << "second run differs";
  EXPECT_TRUE(same_bytes(c.out_s.host.storage, first_s)) << "second run differs";
  c.run_swapped();
  cuda::device_synchronize();
  c.download_outputs();
  EXPECT_TRUE(same_bytes(c.out_v.host.storage, first_v)) << "b ⊕ a differs from a ⊕ b";
  EXPECT_TRUE(same_bytes(c.out_s.host.storage, first_s)) << "b ⊕ a differs from a ⊕ b";
}

INSTANTIATE_TEST_SUITE_P(
    DtypesDimsLayouts, MergeStatePairGpu,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 128, 256),
                       ::testing::Values(Layout::kContiguous, Layout::kPadded, Layout::kMisaligned,
                                         Layout::kTransposed)),
    pair_param_name);

TEST_F(MergeGpu, PairWithMixedLayouts) {
  for (DType dtype : {DType::kF16, DType::kF32}) {
    PairCase c = PairCase::make(dtype, kSeq, kHeads, 128, Layout::kContiguous, Layout::kMisaligned,
                                Layout::kPadded, 12);
    c.run();
    cuda::device_synchronize();
    c.expect_correct(std::string("mixed layouts ") + std::string(dtype_name(dtype)));
  }
}

TEST_F(MergeGpu, PairOddShapes) {
  struct Shape {
    int64_t seq, heads, dim;
  };
  // D 96 (16-byte path, 12 lanes rounded up to 16), 7 and 1 (element path), 0 (s only); one
  // row; odd counts of both.
  for (const Shape shape : {Shape{1, 1, 64}, Shape{3, 5, 96}, Shape{7, 3, 7}, Shape{5, 2, 1},
                            Shape{3, 2, 0}, Shape{511, 1, 64}, Shape{0, 4, 64}}) {
    for (DType dtype : {DType::kF16, DType::kF32}) {
      PairCase c = PairCase::make(dtype, shape.seq, shape.heads, shape.dim, Layout::kContiguous,
                                  Layout::kContiguous, Layout::kContiguous, 13);
      c.run();
      cuda::device_synchronize();
      c.expect_correct("seq " + std::to_string(shape.seq) + " H " + std::to_string(shape.heads) +
                       " D " + std::to_string(shape.dim) + " " + std::string(dtype_name(dtype)));
    }
  }
}

TEST_F(MergeGpu, PairRowsBeyondOneGridPass) {
  // f32 D 4 is one 16-byte vector per row, 32 rows per warp: 8192 blocks of 8 warps cover
  // 2,097,152 rows per pass, so 2,100,000 rows need the grid-stride loop.
  PairCase c = PairCase::make(DType::kF32, 300000, 7, 4, Layout::kContiguous, Layout::kContiguous,
                              Layout::kContiguous, 14);
  c.run();
  cuda::device_synchronize();
  c.download_outputs();
  expect_matches(c.out_v.host.view, c.out_s.host.view,
                 expected_merge(c.inputs(), c.out_v.host.view), "grid-stride");
}

using InPlaceParam = std::tuple<DType, int64_t, Layout, bool>;

std::string in_place_param_name(const ::testing::TestParamInfo<InPlaceParam>& info) {
  const auto [dtype, dim, layout, masked] = info.param;
  return std::string(dtype_name(dtype)) + "_D" + std::to_string(dim) + "_" + layout_name(layout) +
         (masked ? "_masked" : "_all_rows");
}

class MergeStateInPlaceGpu : public MergeGpu, public ::testing::WithParamInterface<InPlaceParam> {};

TEST_P(MergeStateInPlaceGpu, MergesMaskedRowsAndLeavesTheOthersBitwise) {
  const auto [dtype, dim, layout, masked] = GetParam();
  PairCase c = PairCase::make(dtype, kSeq, kHeads, dim, layout, layout, layout, 21);
  const Expected merged = expected_merge(c.inputs(), c.a_v.host.view);
  const HostTensor original_v = testing::to_contiguous(c.a_v.host.storage.view());
  const HostTensor original_s = testing::to_contiguous(c.a_s.host.storage.view());
  // A strided mask (every second byte of a [seq, 2] buffer), on the device.
  HostTensor mask_storage(DType::kU8, {kSeq, 2});
  Rng rng(22);
  for (int64_t i = 0; i < 2 * kSeq; ++i) {
    mask_storage.data<uint8_t>()[i] = static_cast<uint8_t>(rng.uniform_int(0, 3));
  }
  const TensorView mask_view = mask_storage.view().select(1, 1);
  cuda::DeviceBuffer mask_device(static_cast<size_t>(storage_bytes(mask_storage)));
  cuda::memcpy_htod(mask_device.data(), mask_storage.data<std::byte>(),
                    static_cast<size_t>(storage_bytes(mask_storage)));
  std::optional<TensorView> mask;
  if (masked) {
    mask = testing::rebase_view(mask_view, mask_storage.data<std::byte>(), mask_device.data(),
                                Device::cuda(0));
  }

  merge_state_in_place(c.a_v.device_view(), c.a_s.device_view(), c.b_v.device_view(),
                       c.b_s.device_view(), mask, nullptr);
  cuda::device_synchronize();
  c.a_v.download();
  c.a_s.download();

  Expected expected = merged;
  int64_t kept_rows = 0, changed_elements = 0;
  const TensorView& v = c.a_v.host.view;
  const TensorView& s = c.a_s.host.view;
  for (int64_t row = 0; row < kSeq * kHeads; ++row) {
    const int64_t sq = row / kHeads, head = row % kHeads;
    if (!masked || mask_view.ptr<uint8_t>()[sq * mask_view.strides[0]] != 0) continue;
    expected.checked[static_cast<size_t>(row)] = false;
    ++kept_rows;
    changed_elements += !element_unchanged(c.a_s.host, original_s, s_offset(s, sq, head));
    for (int64_t d = 0; d < dim; ++d) {
      changed_elements += !element_unchanged(c.a_v.host, original_v, v_offset(v, sq, head, d));
    }
  }
  EXPECT_EQ(changed_elements, 0) << "rows outside the mask were written";
  if (masked) {
    EXPECT_GT(kept_rows, 0);
  }
  expect_matches(v, s, expected, "merge_state_in_place");
  expect_padding_untouched(c.a_v.host, "in-place v");
  expect_padding_untouched(c.a_s.host, "in-place s");
}

INSTANTIATE_TEST_SUITE_P(
    DtypesDimsLayoutsMasks, MergeStateInPlaceGpu,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 128, 256),
                       ::testing::Values(Layout::kPadded, Layout::kTransposed), ::testing::Bool()),
    in_place_param_name);

TEST_F(MergeGpu, RunsOnTheDeviceOfItsTensors) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  cuda::set_device(1);
  PairCase c = PairCase::make(DType::kBF16, kSeq, kHeads, 128, Layout::kPadded, Layout::kPadded,
                              Layout::kPadded, 51, /*device=*/1);
  cuda::set_device(0);  // the current device is not the tensors' one
  c.run();
  cuda::set_device(1);
  cuda::device_synchronize();
  c.expect_correct("on cuda:1");
  cuda::set_device(0);
}

TEST_F(MergeGpu, BadArgumentsAreRejectedBeforeAnythingIsWritten) {
  PairCase c = PairCase::make(DType::kF16, kSeq, kHeads, 64, Layout::kContiguous,
                              Layout::kContiguous, Layout::kContiguous, 61);
  // s_b on the host while everything else is on the GPU.
  EXPECT_FLARE_ERROR(
      merge_state(c.a_v.device_view(), c.a_s.device_view(), c.b_v.device_view(), c.b_s.host.view,
                  c.out_v.device_view(), c.out_s.device_view(), nullptr),
      ErrorCode::kInvalidArgument, "s_b must be on cuda:0 (the device of v_a)");
  TensorView wrong_dtype = c.out_v.device_view();
  wrong_dtype.dtype = DType::kBF16;
  EXPECT_FLARE_ERROR(merge_state(c.a_v.device_view(), c.a_s.device_view(), c.b_v.device_view(),
                                 c.b_s.device_view(), wrong_dtype, c.out_s.device_view(), nullptr),
                     ErrorCode::kInvalidArgument, "v_out dtype must be v_a's float16");
  cuda::device_synchronize();
  c.download_outputs();
  EXPECT_EQ(testing::count_nan(c.out_v.host.storage.view()), c.out_v.host.storage.numel());
  EXPECT_EQ(testing::count_nan(c.out_s.host.storage.view()), c.out_s.host.storage.numel());
}

}  // namespace
}  // namespace flare
