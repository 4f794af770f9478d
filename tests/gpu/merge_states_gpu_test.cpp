// merge_states (kernels/merge_state.cuh) on 1, 3 and 17 stacked states and on none, against a
// float64 reference and the CPU operator, in every dtype, D and layout of the pair tests
// (merge_gpu_cases.h), and replayed from a CUDA graph on new inputs. Skips without a CUDA device.
#include "merge_gpu_cases.h"

namespace flare {
namespace {

using namespace merge_gpu;

using StackedParam = std::tuple<DType, int64_t, int64_t, Layout>;

std::string stacked_param_name(const ::testing::TestParamInfo<StackedParam>& info) {
  const auto [dtype, dim, num_states, layout] = info.param;
  return std::string(dtype_name(dtype)) + "_D" + std::to_string(dim) + "_n" +
         std::to_string(num_states) + "_" + layout_name(layout);
}

class MergeStatesGpu : public MergeGpu, public ::testing::WithParamInterface<StackedParam> {};

TEST_P(MergeStatesGpu, MatchesFloat64AndTheCpuOperator) {
  const auto [dtype, dim, num_states, layout] = GetParam();
  StackedCase c = StackedCase::make(dtype, kSeq, num_states, kHeads, dim, layout, 31);
  c.run();
  cuda::device_synchronize();
  c.download_outputs();
  const Expected exact = c.expected();
  expect_matches(c.out_v.host.view, c.out_s.host.view, exact, "merge_states vs float64");
  HostTensor v_cpu(dtype, {kSeq, kHeads, dim}), s_cpu(DType::kF32, {kSeq, kHeads});
  merge_states(c.v.host.view, c.s.host.view, v_cpu.view(), s_cpu.view());
  expect_matches(c.out_v.host.view, c.out_s.host.view,
                 expected_from_cpu(exact, v_cpu.view(), s_cpu.view()), "merge_states vs CPU");
  expect_padding_untouched(c.out_v.host, "merge_states v_out");
  expect_padding_untouched(c.out_s.host, "merge_states s_out");

  const HostTensor first_v = testing::to_contiguous(c.out_v.host.storage.view());
  c.run();
  cuda::device_synchronize();
  c.download_outputs();
  EXPECT_TRUE(same_bytes(c.out_v.host.storage, first_v)) << "second run differs";
}

INSTANTIATE_TEST_SUITE_P(
    DtypesDimsStatesLayouts, MergeStatesGpu,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 128, 256), ::testing::Values(1, 3, 17),
                       ::testing::Values(Layout::kContiguous, Layout::kPadded, Layout::kMisaligned,
                                         Layout::kTransposed)),
    stacked_param_name);

TEST_F(MergeGpu, MergeStatesWithNoStatesGivesEmptyRows) {
  StackedCase c = StackedCase::make(DType::kBF16, 5, 0, 3, 64, Layout::kContiguous, 32);
  c.run();
  cuda::device_synchronize();
  c.download_outputs();
  expect_matches(c.out_v.host.view, c.out_s.host.view, c.expected(), "zero states");
}

TEST_F(MergeGpu, CapturedInACudaGraphAndReplayedOnNewInputs) {
  StackedCase c = StackedCase::make(DType::kF16, kSeq, 3, kHeads, 128, Layout::kContiguous, 41);
  const cuda::OwnedStream stream;
  c.run(stream.get());  // compiles and loads the kernel outside the capture
  cuda::stream_synchronize(stream.get());
  const cuda::Graph graph(stream.get(), [&] { c.run(stream.get()); });

  for (uint64_t seed : {42, 43}) {
    fill_states(c.inputs(), seed);
    c.v.upload();
    c.s.upload();
    c.out_v.host.storage.fill(kNaN);
    c.out_s.host.storage.fill(kNaN);
    c.out_v.upload();
    c.out_s.upload();
    graph.launch(stream.get());
    cuda::stream_synchronize(stream.get());
    c.download_outputs();
    expect_matches(c.out_v.host.view, c.out_s.host.view, c.expected(),
                   "graph replay, seed " + std::to_string(seed));
  }
}

}  // namespace
}  // namespace flare
