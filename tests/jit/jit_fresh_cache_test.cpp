// The GPU machine's "ptxas's report has no entry 'flare_merge'": the merge, decode and prefill
// kernels as BatchPrefill and BatchDecode build them, compiled again and again from fresh cache
// directories, one after another, from threads at once and from processes at once. Every compile
// must carry ptxas's report for its entry. The cause was NVRTC's own cubin cache, which skips
// ptxas and is active only where NVRTC can load libcuda: without a driver these runs also pass
// without the fix (--no-cache), and show that no state of ours is shared between compiles.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/jit/compiler.h"
#include "jit/jit_test_support.h"
#include "testing/nvrtc.h"

namespace flare::jit {
namespace {

constexpr const char* kArch = "sm_90a";  // the GPU machine's

// The merge spec first: every BatchPrefill of one head dim and dtype compiles the same unit.
std::vector<KernelSpec> api_specs() {
  const ShippedPrefillConfig prefill = shipped_prefill_configs()[0];
  const BatchPrefillKernels kernels = batch_prefill_kernels(prefill.config, prefill.tiles);
  return {kernels.merge, batch_decode_kernels(shipped_decode_configs()[0]).decode, kernels.prefill};
}

// "" when `kernel` is `spec` compiled with ptxas's report for its entry and clean usage; else
// what is wrong (no gtest assertions: forked children and threads report through this).
std::string report_problem(const KernelSpec& spec, const CompiledKernel& kernel) {
  const std::string where = spec.label + (kernel.from_cache ? " (cache hit)" : " (compiled)");
  if (kernel.usage.size() != 1 || kernel.usage[0].entry != spec.entry) {
    return where + ": usage of " + std::to_string(kernel.usage.size()) + " entries";
  }
  if (kernel.log.find("Compiling entry function '" + spec.entry + "'") == std::string::npos) {
    return where + ": no ptxas report for " + spec.entry + " in the log:\n" + kernel.log;
  }
  const ResourceUsage& usage = kernel.usage[0];
  if (usage.registers <= 0 || usage.spill_bytes != 0 || usage.local_bytes != 0) {
    return where + ": " + std::to_string(usage.registers) + " registers, " +
           std::to_string(usage.spill_bytes) + " spill bytes, " +
           std::to_string(usage.local_bytes) + " local bytes";
  }
  return "";
}

std::string compile_problem(const KernelSpec& spec, bool cached) {
  try {
    return report_problem(spec, cached ? compile_cached(spec, kArch) : compile(spec, kArch));
  } catch (const std::exception& error) {
    return spec.label + ": " + error.what();
  }
}

class FreshCacheTest : public testing::JitTest {
 protected:
  void SetUp() override {
    JitTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
  // A new, empty cache directory, as on a machine that never compiled these kernels. Set only
  // while no other thread runs: getenv and setenv do not synchronize.
  void use_fresh_cache_directory() {
    const std::filesystem::path dir =
        std::filesystem::path(cache_dir()) / ("fresh" + std::to_string(next_directory_++));
    setenv("FLARE_CACHE_DIR", dir.c_str(), 1);
  }

 private:
  int next_directory_ = 0;
};

TEST_F(FreshCacheTest, SameUnitsCompiledAgainOneAfterAnother) {
  for (int round = 0; round < 2; ++round) {
    for (const KernelSpec& spec : api_specs()) {
      use_fresh_cache_directory();
      EXPECT_EQ(compile_problem(spec, /*cached=*/true), "") << "round " << round;
    }
  }
}

TEST_F(FreshCacheTest, SameUnitsCompiledByThreadsAtOnce) {
  const std::vector<KernelSpec> specs = api_specs();
  use_fresh_cache_directory();
  // Each thread asks the cache for the merge kernel (one compiles, the others wait for it) and
  // compiles one spec itself, so NVRTC runs several programs at once.
  constexpr int kThreads = 4;
  std::vector<std::string> problems(2 * kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      problems[2 * t] = compile_problem(specs[0], /*cached=*/true);
      problems[2 * t + 1] = compile_problem(specs[t % specs.size()], /*cached=*/false);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& problem : problems) EXPECT_EQ(problem, "");

  // precompile's workers given the merge spec twice, as a list of decode and prefill configs
  // would give it.
  use_fresh_cache_directory();
  const std::vector<KernelSpec> batch = {specs[0], specs[1], specs[2], specs[0]};
  const std::vector<CompiledKernel> results = precompile(batch, kArch, kThreads);
  ASSERT_EQ(results.size(), batch.size());
  for (size_t i = 0; i < batch.size(); ++i) EXPECT_EQ(report_problem(batch[i], results[i]), "");
}

TEST_F(FreshCacheTest, SameUnitCompiledByProcessesAtOnce) {
  const KernelSpec merge = api_specs()[0];
  use_fresh_cache_directory();
  constexpr int kProcesses = 3;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: the shared cache directory, then an uncached compile of the same unit.
      std::string problem = compile_problem(merge, /*cached=*/true);
      if (problem.empty()) problem = compile_problem(merge, /*cached=*/false);
      if (!problem.empty()) std::fprintf(stderr, "child %d: %s\n", p, problem.c_str());
      _exit(problem.empty() ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  EXPECT_EQ(compile_problem(merge, /*cached=*/true), "") << "the entry the children left";
}

}  // namespace
}  // namespace flare::jit
