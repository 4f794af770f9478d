// `flare generate` (tools/flare/generate_command.cpp): its help, usage errors (exit 2), an
// unknown model and a machine without a GPU (exit 1, named); on an sm_90 GPU, four greedy
// tokens of the 1B preset with random weights, three with random 4-bit weights, and sampled ones.
#include <gtest/gtest.h>

#include <string>

#include "flare/jit/cuda_driver.h"
#include "tools/cli_test_support.h"

namespace flare::cli {
namespace {

using testing::run_cli;
using testing::ScratchDir;

bool sm90() { return cuda::available() && cuda::device_properties(0).cc_major >= 9; }

TEST(GenerateCli, HelpAndUsageErrors) {
  const ScratchDir scratch;
  const auto help = run_cli({"generate", "--help"}, scratch);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--random-weights"), std::string::npos);
  EXPECT_NE(help.out.find("llama-3.1-8b"), std::string::npos);

  const auto no_source = run_cli({"generate", "--model", "llama-3.2-1b"}, scratch);
  EXPECT_EQ(no_source.exit_code, 2);
  EXPECT_NE(no_source.err.find("--random-weights is required"), std::string::npos) << no_source.err;

  const auto batch =
      run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights", "--batch", "9"}, scratch);
  EXPECT_EQ(batch.exit_code, 2);
  EXPECT_NE(batch.err.find("--batch must be at most 8, got 9"), std::string::npos) << batch.err;

  const auto format = run_cli(
      {"generate", "--model", "llama-3.2-1b", "--random-weights", "--weights", "int8"}, scratch);
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_NE(format.err.find("int8"), std::string::npos) << format.err;

  const auto temperature = run_cli(
      {"generate", "--model", "llama-3.2-1b", "--random-weights", "--temperature", "-1"}, scratch);
  EXPECT_EQ(temperature.exit_code, 2);
  EXPECT_NE(temperature.err.find("--temperature must be 0 (greedy) or finite and >= 1e-05, got -1"),
            std::string::npos)
      << temperature.err;
  const auto top_p = run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights",
                              "--temperature", "1", "--top-p", "0"},
                             scratch);
  EXPECT_EQ(top_p.exit_code, 2);
  EXPECT_NE(top_p.err.find("--top-p must be in (0, 1], got 0"), std::string::npos) << top_p.err;
  const auto greedy_filter =
      run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights", "--top-k", "5"}, scratch);
  EXPECT_EQ(greedy_filter.exit_code, 2);
  EXPECT_NE(greedy_filter.err.find("need --temperature > 0"), std::string::npos)
      << greedy_filter.err;

  const auto unknown = run_cli({"generate", "--model", "llama-2-7b", "--random-weights"}, scratch);
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("unknown model 'llama-2-7b'; the presets are"), std::string::npos)
      << unknown.err;
}

TEST(GenerateCli, WithoutAGpuSaysWhy) {
  if (cuda::available()) GTEST_SKIP() << "a CUDA device is present";
  const ScratchDir scratch;
  const auto r = run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights"}, scratch);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no usable CUDA device"), std::string::npos) << r.err;
}

TEST(GenerateCliCuda, FourTokensOfTheOneBModel) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const ScratchDir scratch;
  const auto r = run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights", "--prompt-len",
                          "16", "--new-tokens", "4", "--batch", "2"},
                         scratch);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("last generated tokens:"), std::string::npos) << r.out;
}

TEST(GenerateCliCuda, FourBitWeights) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const ScratchDir scratch;
  const auto r = run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights", "--weights",
                          "int4", "--prompt-len", "40", "--new-tokens", "3"},
                         scratch);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("random int4 weights"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
}

TEST(GenerateCliCuda, SampledTokens) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  const ScratchDir scratch;
  const auto r = run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights", "--prompt-len",
                          "16", "--new-tokens", "4", "--batch", "2", "--temperature", "0.8",
                          "--top-k", "40", "--top-p", "0.9", "--seed", "5"},
                         scratch);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("sampled: temperature 0.8, top-k 40, top-p 0.9, seed 5"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("last generated tokens:"), std::string::npos) << r.out;
  // The GPU loop draws the same tokens.
  const auto looped =
      run_cli({"generate", "--model", "llama-3.2-1b", "--random-weights", "--prompt-len", "16",
               "--new-tokens", "4", "--batch", "2", "--temperature", "0.8", "--top-k", "40",
               "--top-p", "0.9", "--seed", "5", "--gpu-loop"},
              scratch);
  EXPECT_EQ(looped.exit_code, 0) << looped.err;
  EXPECT_NE(looped.out.find("GPU loop, one launch"), std::string::npos) << looped.out;
  const auto tail = [](const std::string& out) { return out.substr(out.find("last generated")); };
  EXPECT_EQ(tail(looped.out), tail(r.out));
}

}  // namespace
}  // namespace flare::cli
