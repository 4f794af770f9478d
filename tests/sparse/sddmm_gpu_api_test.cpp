// The GPU SDDMM's host side without a GPU (flare/sparse/sddmm_gpu.h): its kernel specs, their
// compile for sm_80 and sm_90a (0 spills, no local memory), and the argument errors raised
// before any launch (CPU tensors in place of device ones are refused first by device).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "flare/jit/compiler.h"
#include "flare/sparse/sddmm_gpu.h"
#include "jit/jit_test_support.h"
#include "kernels/sddmm_csr.cuh"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare::sparse {
namespace {

TEST(SddmmKernelSpec, FeatureSizesAndVectorWidthsAreChecked) {
  std::set<std::string> units;
  for (const jit::KernelSpec& spec : shipped_sddmm_kernel_specs()) {
    EXPECT_EQ(spec.family_header, "sddmm_csr.cuh");
    EXPECT_EQ(spec.entry, "flare_sddmm_csr");
    units.insert(spec.translation_unit());
  }
  EXPECT_EQ(units.size(), 15u);  // d 32-512 in float32, float16 and bfloat16
  // The checks are SpMM's (gpu_operands::check_kernel_spec, tested with spmm_csr_kernel_spec).
  EXPECT_FLARE_ERROR(sddmm_csr_kernel_spec(32, 3), ErrorCode::kInvalidArgument,
                     "vector width 3 must be a power of two");
  EXPECT_EQ(sddmm_csr_kernel_spec(64, 8, DType::kF16).label, "sddmm csr float16 d=64 vec=8");
}

TEST(SddmmGpuArguments, CpuTensorsAreRefusedNamingTheArgument) {
  std::vector<int32_t> indptr{0, 1, 1};
  std::vector<int32_t> indices{0};
  std::vector<float> q(2 * 32), k(2 * 32), out(1);
  Csr a;
  a.rows = 2;
  a.cols = 2;
  a.indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3}, Device::cpu());
  a.indices = TensorView::contiguous(indices.data(), DType::kI32, {1}, Device::cpu());
  const TensorView qv = TensorView::contiguous(q.data(), DType::kF32, {2, 32}, Device::cpu());
  const TensorView kv = TensorView::contiguous(k.data(), DType::kF32, {2, 32}, Device::cpu());
  const TensorView ov = TensorView::contiguous(out.data(), DType::kF32, {1}, Device::cpu());
  EXPECT_FLARE_ERROR(sddmm(a, qv, kv, ov, nullptr), ErrorCode::kInvalidArgument,
                     "q must be a CUDA tensor (the CPU operator is sddmm_reference)");
}

class ShippedSddmmKernels : public jit::testing::JitTest,
                            public ::testing::WithParamInterface<const char*> {};

TEST_P(ShippedSddmmKernels, CompileWithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const std::string arch = GetParam();
  // A memory-bound kernel: at most 64 registers keep 32 warps an SM; d 512 holds 16 floats of
  // Q and 16 of K a lane.
  constexpr int kMaxRegisters = 64;
  for (const jit::KernelSpec& spec : shipped_sddmm_kernel_specs()) {
    const jit::CompiledKernel compiled = jit::compile(spec, arch);
    ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
    testing::expect_shipped_usage(compiled, spec.label + " on " + arch, kMaxRegisters);
    EXPECT_EQ(compiled.usage[0].max_threads, kSddmmThreads) << spec.label;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShippedSddmmKernels, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare::sparse
