// The GPU SpMM's host side without a GPU (flare/sparse/spmm_gpu.h): its kernel specs, their
// compile for sm_80 and sm_90a (0 spills, no local memory), and the argument errors raised
// before any launch (CPU tensors in place of device ones are refused first by device).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "flare/jit/compiler.h"
#include "flare/sparse/spmm_gpu.h"
#include "jit/jit_test_support.h"
#include "kernels/spmm_csr.cuh"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare::sparse {
namespace {

TEST(SpmmKernelSpec, FeatureSizesAndVectorWidthsAreChecked) {
  std::set<std::string> units;
  for (const jit::KernelSpec& spec : shipped_spmm_kernel_specs()) {
    EXPECT_EQ(spec.family_header, "spmm_csr.cuh");
    EXPECT_EQ(spec.entry, "flare_spmm_csr;flare_spmm_csr_carries");
    units.insert(spec.translation_unit());
  }
  EXPECT_EQ(units.size(), 15u);  // d 32-512 in float32, float16 and bfloat16
  EXPECT_FLARE_ERROR(spmm_csr_kernel_spec(48, 1), ErrorCode::kUnsupported,
                     "multiples of 32 or powers of two below 32, got 48");
  EXPECT_FLARE_ERROR(spmm_csr_kernel_spec(32, 4, DType::kI32), ErrorCode::kUnsupported,
                     "float32, float16 or bfloat16, got int32");
  EXPECT_FLARE_ERROR(spmm_csr_kernel_spec(32, 8, DType::kF32), ErrorCode::kInvalidArgument,
                     "vector width 8 must be a power of two of at most 16 bytes");
  // Eight lanes of eight float16 a row of 64: four rows a warp.
  EXPECT_EQ(spmm_csr_kernel_spec(64, 8, DType::kF16).label, "spmm csr float16 d=64 vec=8");
  EXPECT_FLARE_ERROR(spmm_csr_kernel_spec(96, 4), ErrorCode::kInvalidArgument,
                     "whose lanes tile d = 96");
}

TEST(SpmmGpuArguments, CpuTensorsAreRefusedNamingTheArgument) {
  std::vector<int32_t> indptr{0, 1, 1};
  std::vector<int32_t> indices{0};
  std::vector<float> values{1.0f}, x(2 * 32), y(2 * 32);
  Csr a;
  a.rows = 2;
  a.cols = 2;
  a.indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3}, Device::cpu());
  a.indices = TensorView::contiguous(indices.data(), DType::kI32, {1}, Device::cpu());
  a.values = TensorView::contiguous(values.data(), DType::kF32, {1}, Device::cpu());
  const TensorView xv = TensorView::contiguous(x.data(), DType::kF32, {2, 32}, Device::cpu());
  const TensorView yv = TensorView::contiguous(y.data(), DType::kF32, {2, 32}, Device::cpu());
  std::vector<uint8_t> scratch(spmm_workspace_bytes(2, 1, 32));
  const TensorView workspace = TensorView::contiguous(
      scratch.data(), DType::kU8, {static_cast<int64_t>(scratch.size())}, Device::cpu());
  EXPECT_FLARE_ERROR(spmm(a, xv, yv, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "x must be a CUDA tensor (the CPU operator is spmm_reference)");
  EXPECT_FLARE_ERROR(check_spmm(a, xv, yv, workspace, default_spmm_schedule(32)),
                     ErrorCode::kInvalidArgument,
                     "x must be a CUDA tensor (the CPU operator is spmm_reference)");
}

TEST(SpmmGpuWorkspace, TwoPartialRowsAndTwoRowIndicesForEachChunkOfTheLargestSchedule) {
  EXPECT_EQ(spmm_chunk_items(32), 128);
  EXPECT_EQ(spmm_chunk_items(128), 128);
  EXPECT_EQ(spmm_chunk_items(512), 512);
  EXPECT_EQ(spmm_workspace_bytes(0, 0, 32), 0u);
  EXPECT_EQ(spmm_workspace_bytes(1, 0, 32), 2 * 128u + 2 * 4u);  // one chunk
  EXPECT_EQ(spmm_workspace_bytes(28, 100, 32), 2 * 128u + 2 * 4u);
  EXPECT_EQ(spmm_workspace_bytes(29, 100, 32), 2 * (2 * 128u + 2 * 4u));
  // The largest over spmm_schedules(512): tiles of 128 in chunks of 128, 8 chunks of 1,032 bytes
  // (d 512 in one pass: 2 chunks of 4,104).
  EXPECT_EQ(spmm_workspace_bytes(24, 1000, 512), 8 * (2 * 512u + 2 * 4u));
  EXPECT_EQ(spmm_workspace_bytes(100, 284, 96), 3 * (2 * 384u + 2 * 4u));
  EXPECT_EQ(spmm_workspace_bytes(3, 5, 8), 2 * 32u + 2 * 4u);
  EXPECT_FLARE_ERROR(spmm_workspace_bytes(1, -1, 32), ErrorCode::kInvalidArgument,
                     "rows and nnz must be >= 0 and d positive, got 1, -1 and 32");
}

class ShippedSpmmKernels : public jit::testing::JitTest,
                           public ::testing::WithParamInterface<const char*> {};

TEST_P(ShippedSpmmKernels, CompileWithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const std::string arch = GetParam();
  // A memory-bound kernel: at most 64 registers keep 32 warps an SM; d 512 holds 16 floats a
  // lane.
  constexpr int kMaxRegisters = 64;
  // And d 96 (three vectors of one float a lane: a batch rounded down to a power of two).
  std::vector<jit::KernelSpec> specs = shipped_spmm_kernel_specs();
  specs.push_back(spmm_csr_kernel_spec(96, 1));
  for (const jit::KernelSpec& spec : specs) {
    const jit::CompiledKernel compiled = jit::compile(spec, arch);
    ASSERT_EQ(compiled.usage.size(), 2u) << spec.label;
    testing::expect_shipped_usage(compiled, spec.label + " on " + arch, kMaxRegisters);
    for (const jit::ResourceUsage& usage : compiled.usage) {
      EXPECT_EQ(usage.max_threads, kSpmmThreads) << spec.label << " " << usage.entry;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShippedSpmmKernels, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare::sparse
