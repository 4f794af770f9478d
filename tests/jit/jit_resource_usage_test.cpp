// Resource usage from the cubin plus ptxas's report: the no-spill / no-local-memory checks of the
// CI config tests fail on a kernel that spills, with or without the report; a compile whose log
// lacks the report keeps its kernel (a warning, usage from the cubin); NVRTC's own cache, which
// drops the report, is off.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "flare/jit/compiler.h"
#include "jit/jit_test_support.h"
#include "src/jit/compile_steps.h"
#include "src/jit/cubin_elf.h"
#include "src/jit/nvrtc_api.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare::jit {
namespace {

using testing::JitTest;

// What the CI config tests (tests/jit/*_configs_test.cpp, tests/api) assert of a shipped kernel.
bool passes_config_checks(const ResourceUsage& usage) {
  return usage.spill_bytes == 0 && usage.local_bytes == 0 && usage.registers > 0;
}

// The usage a compile would report had NVRTC's log no ptxas report (as when NVRTC serves the
// cubin from its cache), and the warning it logs.
std::vector<ResourceUsage> usage_without_report(const KernelSpec& spec,
                                                const CompiledKernel& kernel, std::string& logged) {
  unsetenv("FLARE_LOG");
  ::testing::internal::CaptureStderr();
  std::vector<ResourceUsage> usage =
      resource_usage("", kernel.cubin, entry_names(spec), spec.label);
  logged = ::testing::internal::GetCapturedStderr();
  setenv("FLARE_LOG", "quiet", 1);
  return usage;
}

class UsageForArch : public JitTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    JitTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
};

TEST_P(UsageForArch, SpillingKernelFailsTheConfigChecksWithOrWithoutTheReport) {
  const KernelSpec spec = testing::spilling_spec();
  const CompiledKernel kernel = compile(spec, GetParam());
  ASSERT_EQ(kernel.usage.size(), 1u);
  const ResourceUsage& reported = kernel.usage[0];
  EXPECT_LE(reported.registers, 32) << kernel.log;
  EXPECT_GT(reported.spill_bytes, 0) << kernel.log;
  EXPECT_GT(reported.local_bytes, 0) << kernel.log;  // spills live in the stack frame
  EXPECT_FALSE(passes_config_checks(reported));
  EXPECT_NE(kernel.log.find("Registers are spilled"), std::string::npos) << kernel.log;

  std::string logged;
  const std::vector<ResourceUsage> from_cubin = usage_without_report(spec, kernel, logged);
  ASSERT_EQ(from_cubin.size(), 1u);
  EXPECT_EQ(from_cubin[0].registers, reported.registers);
  EXPECT_EQ(from_cubin[0].local_bytes, reported.local_bytes);
  EXPECT_EQ(from_cubin[0].spill_bytes, ResourceUsage::kUnknownSpills);
  EXPECT_FALSE(passes_config_checks(from_cubin[0]));
  EXPECT_NE(logged.find("warning: jit test spills: ptxas's report in NVRTC's log has no entry "
                        "'jit_test_spill'"),
            std::string::npos)
      << logged;
}

TEST_P(UsageForArch, MissingReportKeepsTheCubinsNumbersAndOnlyWarns) {
  for (const KernelSpec& spec :
       {testing::simple_spec(), testing::local_memory_spec(), testing::two_entry_spec()}) {
    const CompiledKernel kernel = compile(spec, GetParam());
    std::string logged;
    const std::vector<ResourceUsage> from_cubin = usage_without_report(spec, kernel, logged);
    ASSERT_EQ(from_cubin.size(), kernel.usage.size()) << spec.label;
    for (size_t i = 0; i < from_cubin.size(); ++i) {
      const ResourceUsage& full = kernel.usage[i];
      const ResourceUsage& partial = from_cubin[i];
      EXPECT_EQ(partial.entry, full.entry);
      EXPECT_EQ(partial.registers, full.registers) << full.entry;
      EXPECT_EQ(partial.local_bytes, full.local_bytes) << full.entry;
      EXPECT_EQ(partial.max_threads, full.max_threads) << full.entry;
      EXPECT_EQ(partial.static_shared_bytes, 0) << full.entry << ": known from the report only";
      EXPECT_EQ(partial.spill_bytes, ResourceUsage::kUnknownSpills) << full.entry;
      EXPECT_NE(logged.find("'" + full.entry + "'"), std::string::npos) << logged;
    }
  }
}

TEST_P(UsageForArch, RecursiveCalleeIsChargedToTheEntry) {
  const KernelSpec spec = testing::recursive_callee_spec();
  const CompiledKernel kernel = compile(spec, GetParam());
  // The recursion's frame is in no stack attribute of the kernel...
  const std::vector<CubinKernel> kernels = read_cubin_kernels(kernel.cubin);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0].stack_bytes, 0);
  // ...only in ptxas's report, which charges it to the entry.
  ASSERT_EQ(kernel.usage.size(), 1u);
  EXPECT_GT(kernel.usage[0].local_bytes, 0) << kernel.log;
  EXPECT_FALSE(passes_config_checks(kernel.usage[0]));

  std::string logged;
  const std::vector<ResourceUsage> from_cubin = usage_without_report(spec, kernel, logged);
  ASSERT_EQ(from_cubin.size(), 1u);
  EXPECT_EQ(from_cubin[0].spill_bytes, ResourceUsage::kUnknownSpills);
  EXPECT_FALSE(passes_config_checks(from_cubin[0])) << "unknown must not pass for zero";
}

TEST_P(UsageForArch, CubinStackMatchesPtxasStackFrame) {
  const CompiledKernel local = compile(testing::local_memory_spec(), GetParam());
  const std::vector<CubinKernel> kernels = read_cubin_kernels(local.cubin);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_GE(kernels[0].stack_bytes, 256 * 4);
  EXPECT_NE(local.log.find(std::to_string(kernels[0].stack_bytes) + " bytes stack frame"),
            std::string::npos)
      << local.log;
}

INSTANTIATE_TEST_SUITE_P(Archs, UsageForArch, ::testing::Values("sm_80", "sm_90a"),
                         flare::testing::ArchName());

TEST(NvrtcOptions, TurnOffNvrtcsOwnCacheWhichWouldDropTheReport) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const nvrtc::Toolkit& toolkit = nvrtc::toolkit();
  const std::vector<std::string> options = nvrtc_options("sm_90a");
  const bool has_cache =
      toolkit.version_major > 12 || (toolkit.version_major == 12 && toolkit.version_minor >= 9);
  EXPECT_EQ(std::count(options.begin(), options.end(), "--no-cache"), has_cache ? 1 : 0)
      << "NVRTC " << toolkit.version_major << "." << toolkit.version_minor;
  EXPECT_EQ(std::count(options.begin(), options.end(), "--ptxas-options=-v"), 1);
}

}  // namespace
}  // namespace flare::jit
