// RunOptions::sink at run(): the host checks every run of BatchPrefill makes before launching
// (src/api/variant_support.h check_run_options): a float32 [num_qo_heads] contiguous tensor on
// the config's CUDA device, with softmax only; each refusal names the sink. No GPU needed (the
// checks read the view, never its data).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

#include "flare/api/run_options.h"
#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "src/api/variant_support.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

constexpr int64_t kHeads = 8;
constexpr int kDevice = 0;

// A view at a fake device address: the checks never dereference it.
TensorView sink_view(DType dtype, int64_t heads, Device device = Device::cuda(kDevice)) {
  static float storage[64];
  return TensorView::contiguous(storage, dtype, {heads}, device);
}

void check(const AttentionParams& params, const TensorView& sink) {
  RunOptions options;
  options.sink = sink;
  api_detail::check_run_options(params, std::nullopt, options, /*wants_lse=*/false, {2, kHeads, 2},
                                kDevice, "BatchPrefill");
}

TEST(RunOptionsSink, AFloat32HeadVectorOnTheDevicePasses) {
  EXPECT_NO_THROW(check(AttentionParams{}, sink_view(DType::kF32, kHeads)));
}

TEST(RunOptionsSink, ShapeDtypeDeviceAndLayoutAreNamed) {
  EXPECT_FLARE_ERROR(check(AttentionParams{}, sink_view(DType::kF32, kHeads - 1)),
                     ErrorCode::kInvalidArgument, "sink must be a contiguous float32 [8]");
  EXPECT_FLARE_ERROR(check(AttentionParams{}, sink_view(DType::kF16, kHeads)),
                     ErrorCode::kInvalidArgument, "got float16 [8]");
  EXPECT_FLARE_ERROR(check(AttentionParams{}, sink_view(DType::kF32, kHeads, Device::cpu())),
                     ErrorCode::kInvalidArgument, "sink must be on cuda:0, got cpu");
  EXPECT_FLARE_ERROR(check(AttentionParams{}, sink_view(DType::kF32, kHeads, Device::cuda(1))),
                     ErrorCode::kInvalidArgument, "sink must be on cuda:0, got cuda:1");
  TensorView strided = sink_view(DType::kF32, kHeads);
  strided.strides[0] = 2;
  EXPECT_FLARE_ERROR(check(AttentionParams{}, strided), ErrorCode::kInvalidArgument,
                     "sink must be a contiguous float32");
  TensorView matrix =
      TensorView::contiguous(strided.data, DType::kF32, {1, kHeads}, Device::cuda(kDevice));
  EXPECT_FLARE_ERROR(check(AttentionParams{}, matrix), ErrorCode::kInvalidArgument,
                     "got float32 [1, 8]");
}

TEST(RunOptionsSink, RefusedWithoutSoftmax) {
  AttentionParams sigmoid;
  sigmoid.use_softmax = false;
  EXPECT_FLARE_ERROR(check(sigmoid, sink_view(DType::kF32, kHeads)), ErrorCode::kInvalidArgument,
                     "sink was given, but the variant has no softmax");
}

}  // namespace
}  // namespace flare
