// `flare info` and the top-level command line: version, devices and cache are reported,
// unknown commands are usage errors.
#include <gtest/gtest.h>

#include <string>

#include "flare/jit/cuda_driver.h"
#include "tools/cli_test_support.h"

namespace flare {
namespace {

using testing::CliResult;
using testing::ScratchDir;

TEST(InfoCli, ReportsVersionDevicesCacheAndThreads) {
  ScratchDir scratch;
  const CliResult result = testing::run_cli({"info"}, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* line : {"flare ", "cuda devices:", "jit cache:", "cpu threads:"}) {
    EXPECT_NE(result.out.find(line), std::string::npos) << line << " in\n" << result.out;
  }
  if (!cuda::available()) {
    EXPECT_NE(result.out.find(cuda::unavailable_reason()), std::string::npos) << result.out;
  }
}

TEST(Cli, TopLevelUsage) {
  ScratchDir scratch;
  CliResult result = testing::run_cli({}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("usage: flare <command>"), std::string::npos) << result.err;
  result = testing::run_cli({"--help"}, scratch);
  EXPECT_EQ(result.exit_code, 0);
  for (const char* command : {"attention", "bench", "info"}) {
    EXPECT_NE(result.out.find(command), std::string::npos) << command;
  }
  result = testing::run_cli({"frobnicate"}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("unknown command 'frobnicate'"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("Try 'flare --help'"), std::string::npos) << result.err;
  for (const char* command : {"attention", "bench", "info"}) {
    result = testing::run_cli({command, "--help"}, scratch);
    EXPECT_EQ(result.exit_code, 0) << command;
    EXPECT_NE(result.out.find(std::string("usage: flare ") + command), std::string::npos);
  }
}

}  // namespace
}  // namespace flare
