// NVRTC compilation without a GPU: cubins for sm_80 and sm_90a, resource usage from ptxas's
// report checked against the cubin's own attributes, errors carrying NVRTC's log, and logging.
#include <gtest/gtest.h>

#include <algorithm>

#include "flare/jit/compiler.h"
#include "jit/jit_test_support.h"
#include "src/jit/cubin_elf.h"
#include "testing/expect_error.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare::jit {
namespace {

using testing::JitTest;

class CompileForArch : public JitTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    JitTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
};

TEST_P(CompileForArch, SimpleKernelGivesElfCubinWithoutLocalMemory) {
  const CompiledKernel kernel = compile(testing::simple_spec(), GetParam());
  EXPECT_TRUE(is_elf64(kernel.cubin));
  EXPECT_GT(kernel.cubin.size(), 1000u);
  EXPECT_FALSE(kernel.from_cache);
  EXPECT_GT(kernel.compile_seconds, 0.0);
  ASSERT_EQ(kernel.usage.size(), 1u);
  const ResourceUsage& usage = kernel.usage[0];
  EXPECT_EQ(usage.entry, "jit_test_scale");
  EXPECT_GT(usage.registers, 0);
  EXPECT_LE(usage.registers, 255);
  EXPECT_EQ(usage.local_bytes, 0);
  EXPECT_EQ(usage.spill_bytes, 0);
  EXPECT_EQ(usage.static_shared_bytes, 0);
  EXPECT_EQ(usage.max_threads, 0);  // no __launch_bounds__
  EXPECT_NE(kernel.log.find("for '" + GetParam() + "'"), std::string::npos) << kernel.log;

  // ptxas's report and the cubin's EIATTR_REGCOUNT must agree.
  const std::vector<CubinKernel> kernels = read_cubin_kernels(kernel.cubin);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].name, "jit_test_scale");
  EXPECT_EQ(kernels[0].registers, usage.registers);
}

TEST_P(CompileForArch, RuntimeIndexedArrayUsesLocalMemory) {
  const CompiledKernel kernel = compile(testing::local_memory_spec(), GetParam());
  ASSERT_EQ(kernel.usage.size(), 1u);
  EXPECT_GT(kernel.usage[0].registers, 0);
  EXPECT_GE(kernel.usage[0].local_bytes, 256 * 4);  // the whole float[256] table
}

TEST_P(CompileForArch, TwoEntriesReportedInSpecOrder) {
  const CompiledKernel kernel = compile(testing::two_entry_spec(), GetParam());
  ASSERT_EQ(kernel.usage.size(), 2u);
  EXPECT_EQ(kernel.usage[0].entry, "jit_test_bounded");
  EXPECT_EQ(kernel.usage[0].max_threads, 256);
  EXPECT_EQ(kernel.usage[0].static_shared_bytes, 512 * 4);
  EXPECT_EQ(kernel.usage[1].entry, "jit_test_plain");
  EXPECT_EQ(kernel.usage[1].max_threads, 0);
  EXPECT_EQ(kernel.usage[1].static_shared_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, CompileForArch, ::testing::Values("sm_80", "sm_90a"),
                         flare::testing::ArchName());

TEST_F(JitTest, Sm90aAcceptsHopperOnlyInstructions) {
  FLARE_SKIP_WITHOUT_NVRTC();
  // wgmma.fence exists only on sm_90a: proves the architecture-specific target reaches ptxas.
  KernelSpec spec = testing::two_entry_spec();
  spec.entry = "jit_test_fence";
  spec.variant_source = R"(
extern "C" __global__ void jit_test_fence(float* y) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  y[threadIdx.x] = 1.0f;
}
)";
  EXPECT_NO_THROW(compile(spec, "sm_90a"));
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kCompileError, "wgmma");
}

TEST_F(JitTest, SyntaxErrorThrowsCompileErrorWithNvrtcLog) {
  FLARE_SKIP_WITHOUT_NVRTC();
  KernelSpec spec = testing::simple_spec();
  spec.variant_source = "extern \"C\" __global__ void jit_test_scale() {\n  this is not C++;\n}\n";
  // NVRTC's own diagnostic, located in the variant at its own line number.
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kCompileError, "variant_source(2): error");
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kCompileError, "jit test scale");
}

TEST_F(JitTest, EntryThatIsNotAKernelThrowsCompileError) {
  FLARE_SKIP_WITHOUT_NVRTC();
  KernelSpec spec = testing::simple_spec();
  spec.entry = "jit_test_scale;jit_test_missing";
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kCompileError,
                     "entry 'jit_test_missing' is not a kernel");
}

TEST_F(JitTest, InvalidSpecsAndArchsAreRejectedBeforeCompiling) {
  KernelSpec spec = testing::simple_spec();
  EXPECT_FLARE_ERROR(compile(spec, "compute_80"), ErrorCode::kInvalidArgument, "compute_80");
  EXPECT_FLARE_ERROR(compile(spec, "sm_9"), ErrorCode::kInvalidArgument, "sm_9");
  EXPECT_FLARE_ERROR(compile(spec, ""), ErrorCode::kInvalidArgument, "arch");
  spec.family_header = "no_such_family.cuh";
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kInvalidArgument, "no_such_family.cuh");
  spec = testing::simple_spec();
  spec.defines.push_back({"1BAD", "1"});
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kInvalidArgument, "1BAD");
  spec = testing::simple_spec();
  spec.defines.push_back({"MULTI", "1\n#define EVIL 2"});
  EXPECT_FLARE_ERROR(compile(spec, "sm_80"), ErrorCode::kInvalidArgument, "MULTI");
}

TEST(KernelSpec, TranslationUnitIsDefinesThenVariantThenFamilyHeader) {
  KernelSpec spec;
  spec.family_header = "decode.cuh";
  spec.defines = {{"HEAD_DIM", "128"}, {"GROUP", "4"}};
  spec.variant_source = "struct Variant {};";
  EXPECT_EQ(spec.translation_unit(),
            "#define HEAD_DIM 128\n#define GROUP 4\n#line 1 \"variant_source\"\n"
            "struct Variant {};\n#include \"decode.cuh\"\n");
}

TEST(ArchFor, MapsComputeCapabilityToTarget) {
  EXPECT_EQ(arch_for(8, 0), "sm_80");
  EXPECT_EQ(arch_for(8, 6), "sm_86");
  EXPECT_EQ(arch_for(8, 9), "sm_89");
  EXPECT_EQ(arch_for(9, 0), "sm_90a");
  EXPECT_EQ(arch_for(10, 0), "sm_100");
  EXPECT_EQ(arch_for(12, 0), "sm_120");
  EXPECT_FLARE_ERROR(arch_for(0, 0), ErrorCode::kInvalidArgument, "0.0");
  EXPECT_FLARE_ERROR(arch_for(8, -1), ErrorCode::kInvalidArgument, "8.-1");
}

TEST_F(JitTest, CompileLogsLabelArchAndTime) {
  FLARE_SKIP_WITHOUT_NVRTC();
  unsetenv("FLARE_LOG");
  ::testing::internal::CaptureStderr();
  compile(testing::simple_spec(), "sm_80");
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(logged.find("[flare] compiling jit test scale for sm_80...\n"), std::string::npos)
      << logged;
  EXPECT_NE(logged.find("[flare] compiled jit test scale in "), std::string::npos) << logged;
  EXPECT_NE(logged.find(" s ("), std::string::npos) << logged;
  EXPECT_NE(logged.find(" registers, 0 spills)"), std::string::npos) << logged;

  setenv("FLARE_LOG", "quiet", 1);
  ::testing::internal::CaptureStderr();
  compile(testing::simple_spec(), "sm_80");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace flare::jit
