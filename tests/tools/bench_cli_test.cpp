// `flare bench` end to end on tiny workloads: --json prints one parseable object with the
// documented keys and sane values (including the sampled error against float64), the table
// has its rows, and bad workloads are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flare/jit/cuda_driver.h"
#include "tools/cli_test_support.h"
#include "tools/flat_json.h"

namespace flare {
namespace {

using testing::CliResult;
using testing::JsonObject;
using testing::number;
using testing::ScratchDir;
using testing::text;

// A tiny workload (milliseconds on the CPU backend); `options` adds or overrides values, and
// an empty value drops the option.
std::vector<std::string> bench_args(std::map<std::string, std::string> options) {
  const std::map<std::string, std::string> tiny = {
      {"--device", "cpu"}, {"--batch", "5"},     {"--kv-len", "37"},   {"--heads-qo", "8"},
      {"--heads-kv", "2"}, {"--head-dim", "16"}, {"--page-size", "3"}, {"--iters", "2"}};
  options.insert(tiny.begin(), tiny.end());  // keeps the caller's values
  std::vector<std::string> args = {"bench"};
  for (const auto& [name, value] : options) {
    if (value.empty()) continue;
    args.push_back(name);
    args.push_back(value);
  }
  return args;
}

JsonObject run_json(const std::map<std::string, std::string>& options) {
  ScratchDir scratch;
  std::vector<std::string> args = bench_args(options);
  args.push_back("--json");
  const CliResult result = testing::run_cli(args, scratch);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::optional<JsonObject> json = testing::parse_flat_json(result.out);
  EXPECT_TRUE(json.has_value()) << "not one flat JSON object: " << result.out;
  return json.value_or(JsonObject{});
}

TEST(FlatJson, RejectsWhatIsNotOneFlatObject) {
  EXPECT_TRUE(testing::parse_flat_json(R"({"a": 1.5e3, "b": "x\"y", "c": null, "d": true})"));
  for (const char* bad :
       {"", "{", R"({"a": NaN})", R"({"a": 1,})", R"({"a": 1} x)", R"({"a": {"b": 1}})",
        R"({"a": 1, "a": 2})", R"({a: 1})", "[1]", R"({"a": +1})", R"({"a": 1.})"}) {
    EXPECT_FALSE(testing::parse_flat_json(bad)) << bad;
  }
}

TEST(BenchCli, DecodeJsonHasTheDocumentedKeys) {
  const JsonObject json = run_json({{"--dist", "uniform"}, {"--seed", "3"}});
  for (const char* key : {"mode", "device", "dist", "kv", "variant", "dtype", "kv_dtype"}) {
    EXPECT_FALSE(text(json, key).empty()) << key;
  }
  EXPECT_EQ(text(json, "mode"), "decode");
  EXPECT_EQ(text(json, "kv"), "paged");
  EXPECT_EQ(text(json, "device").rfind("cpu", 0), 0u) << text(json, "device");
  EXPECT_EQ(text(json, "dist"), "uniform");
  EXPECT_EQ(text(json, "dtype"), "bfloat16");
  EXPECT_EQ(number(json, "batch"), 5);
  EXPECT_EQ(number(json, "total_q"), 5);
  EXPECT_EQ(number(json, "heads_qo"), 8);
  EXPECT_EQ(number(json, "heads_kv"), 2);
  EXPECT_EQ(number(json, "head_dim"), 16);
  EXPECT_EQ(number(json, "page_size"), 3);
  EXPECT_EQ(number(json, "iters"), 2);
  EXPECT_EQ(number(json, "seed"), 3);
  EXPECT_GE(number(json, "kv_len_min"), 1);
  EXPECT_LE(number(json, "kv_len_max"), 2 * 37 - 1);
  EXPECT_EQ(number(json, "total_kv"), 5 * number(json, "kv_len_mean"));
  for (const char* key :
       {"plan_us", "time_ms_median", "time_ms_min", "requests_per_s", "tokens_per_s",
        "kv_bytes_per_s", "flop_per_s", "num_ctas", "num_work_items"}) {
    EXPECT_GT(number(json, key), 0) << key;
  }
  EXPECT_LE(number(json, "time_ms_min"), number(json, "time_ms_median"));
  EXPECT_DOUBLE_EQ(number(json, "requests_per_s"), number(json, "tokens_per_s"));
  // Outputs are bf16 of magnitude <= 1: rounding alone is up to 2^-9.
  EXPECT_LE(number(json, "max_abs_error"), 4e-3);
  EXPECT_EQ(number(json, "checked_requests"), 4);
  // Every KV byte of a decode batch is read once: total_kv * H_kv * 2 (K, V) * D * 2 bytes.
  const double bytes = number(json, "total_kv") * 2 * 2 * 16 * 2;
  EXPECT_NEAR(number(json, "kv_bytes_per_s") * number(json, "time_ms_median") * 1e-3, bytes,
              bytes * 1e-4);
}

TEST(BenchCli, PrefillZipfWindowFp8) {
  const JsonObject json = run_json({{"--mode", "prefill"},
                                    {"--qo-len", "9"},
                                    {"--dist", "zipf"},
                                    {"--variant", "window"},
                                    {"--dtype", "f16"},
                                    {"--kv-dtype", "e4m3"},
                                    {"--batch", "3"}});
  EXPECT_EQ(text(json, "mode"), "prefill");
  EXPECT_EQ(text(json, "variant"), "window");
  EXPECT_EQ(text(json, "kv_dtype"), "float8_e4m3");
  EXPECT_EQ(number(json, "batch"), 3);
  EXPECT_GE(number(json, "total_q"), 3);
  EXPECT_GT(number(json, "tokens_per_s"), number(json, "requests_per_s"));
  EXPECT_LE(number(json, "max_abs_error"), 2e-3);  // f16 output rounding
  EXPECT_EQ(number(json, "checked_requests"), 3);
}

// Constant lengths make the visible pairs countable: each of 3 requests has 40 queries at
// positions 60..99 of 100 keys, query t seeing 61 + t keys under the causal mask, so
// 3 * (40 * 61 + 39 * 40 / 2) = 9660 pairs and 4 * head_dim * H_qo FLOPs per pair.
void expect_causal_prefill_flops(const JsonObject& json) {
  const double pairs = 3 * (40 * 61 + 39 * 40 / 2);
  const double flops = 4.0 * 64 * 8 * pairs;
  EXPECT_NEAR(number(json, "flop_per_s") * number(json, "time_ms_median") * 1e-3, flops,
              flops * 1e-4);
  EXPECT_EQ(number(json, "total_q"), 3 * 40);
  EXPECT_EQ(number(json, "total_kv"), 3 * 100);
}

const std::map<std::string, std::string> kCountablePrefill = {
    {"--mode", "prefill"}, {"--batch", "3"},    {"--kv-len", "100"}, {"--qo-len", "40"},
    {"--head-dim", "64"},  {"--heads-qo", "8"}, {"--heads-kv", "2"}};

std::map<std::string, std::string> with(std::map<std::string, std::string> options,
                                        const std::map<std::string, std::string>& more) {
  for (const auto& [name, value] : more) options[name] = value;
  return options;
}

TEST(BenchCli, PrefillFlopsCountVisiblePairsOnPagedAndRaggedKV) {
  for (const char* kv : {"paged", "ragged"}) {
    const JsonObject json =
        run_json(with(kCountablePrefill,
                      {{"--kv", kv}, {"--page-size", kv == std::string("ragged") ? "" : "3"}}));
    EXPECT_EQ(text(json, "kv"), kv);
    EXPECT_EQ(number(json, "page_size"), kv == std::string("ragged") ? 1 : 3);
    expect_causal_prefill_flops(json);
    EXPECT_LE(number(json, "max_abs_error"), 4e-3) << kv;  // bf16 output rounding
    EXPECT_EQ(number(json, "checked_requests"), 3);
  }
}

TEST(BenchCli, RaggedKVTableAndUsageErrors) {
  ScratchDir scratch;
  CliResult result = testing::run_cli(
      bench_args(with(kCountablePrefill, {{"--kv", "ragged"}, {"--page-size", ""}})), scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("ragged KV"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("FLOP/s"), std::string::npos) << result.out;
  result = testing::run_cli({"bench", "--kv", "ragged"}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--kv ragged applies to --mode prefill only"), std::string::npos)
      << result.err;
  result = testing::run_cli({"bench", "--mode", "prefill", "--kv", "ragged", "--page-size", "4"},
                            scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--page-size applies to --kv paged only"), std::string::npos)
      << result.err;
  result = testing::run_cli({"bench", "--kv", "blocks"}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("paged|ragged"), std::string::npos) << result.err;
}

// With a GPU, what the GPU prefill does not run is named; without one, the missing GPU is
// named first, before any dtype.
TEST(BenchCli, CudaPrefillNamesWhatItDoesNotRun) {
  ScratchDir scratch;
  for (const auto& [dtypes, message] :
       std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"--kv-dtype", "e4m3"}}, "the GPU prefill does not support fp8 KV"},
           {{{"--dtype", "f32"}}, "float16 or bfloat16"}}) {
    const CliResult result = testing::run_cli(
        bench_args(with(with(kCountablePrefill, dtypes), {{"--device", "cuda"}})), scratch);
    EXPECT_EQ(result.exit_code, 1) << result.err;
    if (cuda::available()) {
      EXPECT_NE(result.err.find(message), std::string::npos) << result.err;
    } else {
      EXPECT_NE(result.err.find("no usable CUDA device"), std::string::npos) << result.err;
      EXPECT_EQ(result.err.find(message), std::string::npos) << result.err;
    }
  }
}

// Without --device, a prefill the GPU does not run is benchmarked on the CPU, with a note
// when a GPU is there.
TEST(BenchCli, DefaultDeviceFallsBackToTheCpuForFp8Prefill) {
  ScratchDir scratch;
  std::vector<std::string> args =
      bench_args(with(kCountablePrefill, {{"--device", ""}, {"--kv-dtype", "e5m2"}}));
  args.push_back("--json");
  const CliResult result = testing::run_cli(args, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\"device\": \"cpu"), std::string::npos) << result.out;
  if (cuda::available()) {
    EXPECT_NE(result.err.find("note: the GPU prefill does not support fp8 KV"), std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("benchmarking the CPU backend instead"), std::string::npos);
  }
}

TEST(BenchCli, EveryVariantChecksOut) {
  for (const char* variant : {"default", "softcap", "alibi", "window"}) {
    const JsonObject json = run_json({{"--variant", variant}, {"--dtype", "f32"}});
    EXPECT_EQ(text(json, "variant"), variant);
    EXPECT_LE(number(json, "max_abs_error"), 1e-5) << variant;
  }
}

TEST(BenchCli, ZipfLengthsKeepTheMeanAndAreSkewed) {
  const JsonObject json = run_json({{"--dist", "zipf"},
                                    {"--batch", "64"},
                                    {"--kv-len", "50"},
                                    {"--heads-qo", "2"},
                                    {"--heads-kv", "1"},
                                    {"--iters", "1"}});
  EXPECT_NEAR(number(json, "kv_len_mean"), 50, 5);
  EXPECT_GT(number(json, "kv_len_max"), 3 * 50);
  EXPECT_LT(number(json, "kv_len_min"), 50 / 2);
}

TEST(BenchCli, TableHasItsRows) {
  ScratchDir scratch;
  const CliResult result = testing::run_cli(bench_args({}), scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* row : {"flare bench: decode on cpu", "requests", "time / call", "throughput",
                          "requests/s", "KV read", "FLOP/s", "max |error|", "4 of 5 requests"}) {
    EXPECT_NE(result.out.find(row), std::string::npos) << row << " in\n" << result.out;
  }
  EXPECT_EQ(result.err, "") << "no progress bar when stderr is not a terminal";
}

TEST(BenchCli, BadWorkloadsAreErrors) {
  ScratchDir scratch;
  CliResult result = testing::run_cli({"bench", "--qo-len", "4"}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--qo-len applies to --mode prefill only"), std::string::npos);
  result = testing::run_cli({"bench", "--dist", "normal"}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("constant|uniform|zipf"), std::string::npos) << result.err;
  result = testing::run_cli({"bench", "--batch", "0"}, scratch);
  EXPECT_EQ(result.exit_code, 2);
  result =
      testing::run_cli({"bench", "--device", "cpu", "--heads-qo", "6", "--heads-kv", "4"}, scratch);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("flare: error: --heads-qo must be a multiple of --heads-kv"),
            std::string::npos)
      << result.err;
  for (const char* head_dim : {"12", "100", "520"}) {
    result = testing::run_cli({"bench", "--device", "cpu", "--head-dim", head_dim, "--iters", "1"},
                              scratch);
    EXPECT_EQ(result.exit_code, 1) << "head dims are multiples of 8 up to 512";
    EXPECT_NE(result.err.find(std::string("flare: error: --head-dim must be a multiple of 8 in "
                                          "[8, 512], got ") +
                              head_dim),
              std::string::npos)
        << result.err;
  }
}

TEST(BenchCli, CudaWithoutADeviceIsAClearError) {
  if (cuda::available()) GTEST_SKIP() << "a CUDA device is present";
  ScratchDir scratch;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"bench", "--device", "cuda"},
           {"bench", "--device", "cuda:1", "--dtype", "f32", "--head-dim", "100"}}) {
    const CliResult result = testing::run_cli(args, scratch);
    EXPECT_EQ(result.exit_code, 1);
    EXPECT_EQ(result.err.rfind("flare: error: cuda:", 0), 0u) << result.err;
    EXPECT_NE(result.err.find("no usable CUDA device"), std::string::npos) << result.err;
  }
}

// `--help` promises a note when the default device falls back to the CPU.
TEST(BenchCli, DefaultDeviceWithoutAGpuNotesTheCpuFallback) {
  if (cuda::available()) GTEST_SKIP() << "a CUDA device is present";
  ScratchDir scratch;
  const CliResult result = testing::run_cli(bench_args({{"--device", ""}}), scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("flare bench: decode on cpu"), std::string::npos) << result.out;
  EXPECT_EQ(result.err.rfind("flare: note: no usable CUDA device (", 0), 0u) << result.err;
  EXPECT_NE(result.err.find("); benchmarking the CPU backend\n"), std::string::npos) << result.err;
}

TEST(BenchCli, BadDeviceIsAUsageError) {
  ScratchDir scratch;
  for (const char* device : {"gpu", "cuda:", "cuda:-1", "CPU"}) {
    const CliResult result = testing::run_cli({"bench", "--device", device}, scratch);
    EXPECT_EQ(result.exit_code, 2) << device << ": " << result.err;
    EXPECT_NE(result.err.find("usage error: --device must be cpu, cuda or cuda:N, got '" +
                              std::string(device) + "'"),
              std::string::npos)
        << result.err;
    EXPECT_NE(result.err.find("Try 'flare bench --help'"), std::string::npos) << result.err;
  }
}

// On a terminal, stderr shows each phase in turn (workload, warm-up, timed samples, reference
// check) on one line that is erased before the result is printed.
TEST(BenchCli, ProgressCoversEveryPhaseOnATerminal) {
  ScratchDir scratch;
  const CliResult result = testing::run_cli_on_terminal(bench_args({{"--iters", "3"}}), scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("time / call"), std::string::npos) << result.out;
  size_t at = 0;
  for (const char* phase :
       {"flare bench: generating the workload...", "flare bench: warm-up (plan, first call)...",
        "flare bench: timing [", "] 0/3", "] 2/3",
        "flare bench: checking 4 requests against the float64 reference..."}) {
    const size_t found = result.err.find(phase, at);
    EXPECT_NE(found, std::string::npos) << phase << " after offset " << at << " in\n" << result.err;
    if (found != std::string::npos) at = found;
  }
  const std::string erase = "\r\033[K";
  ASSERT_GE(result.err.size(), erase.size());
  EXPECT_EQ(result.err.substr(result.err.size() - erase.size()), erase) << "the line is erased";
}

TEST(BenchCli, CudaDecodeJson) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const JsonObject json = run_json({{"--device", "cuda"},
                                    {"--head-dim", "64"},
                                    {"--dist", "zipf"},
                                    {"--kv-len", "300"},
                                    {"--iters", "3"}});
  EXPECT_EQ(text(json, "device").rfind("cuda:0", 0), 0u) << text(json, "device");
  EXPECT_GT(number(json, "time_ms_median"), 0);
  EXPECT_GE(number(json, "num_ctas"), 1);
  EXPECT_LE(number(json, "max_abs_error"), 4e-3);  // bf16 output rounding
  EXPECT_EQ(number(json, "checked_requests"), 4);
}

TEST(BenchCli, CudaPrefillJsonOnPagedAndRaggedKV) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  for (const char* kv : {"paged", "ragged"}) {
    const bool ragged = kv == std::string("ragged");
    const JsonObject json = run_json(with(kCountablePrefill, {{"--device", "cuda"},
                                                              {"--kv", kv},
                                                              {"--page-size", ragged ? "" : "16"},
                                                              {"--iters", "3"}}));
    EXPECT_EQ(text(json, "mode"), "prefill");
    EXPECT_EQ(text(json, "kv"), kv);
    EXPECT_EQ(text(json, "device").rfind("cuda:0", 0), 0u) << text(json, "device");
    EXPECT_EQ(number(json, "iters"), 3);
    for (const char* key : {"plan_us", "time_ms_median", "time_ms_min", "tokens_per_s",
                            "kv_bytes_per_s", "flop_per_s", "num_ctas", "num_work_items"}) {
      EXPECT_GT(number(json, key), 0) << kv << " " << key;
    }
    EXPECT_LE(number(json, "time_ms_min"), number(json, "time_ms_median"));
    expect_causal_prefill_flops(json);
    EXPECT_LE(number(json, "max_abs_error"), 2e-2) << kv;  // bf16 (P rounded before P.V)
    EXPECT_EQ(number(json, "checked_requests"), 3);
  }
}

// A long prefill: the check compares the last 256 query tokens of each sampled request, on a
// ragged cache with Zipf lengths and a sliding window.
TEST(BenchCli, CudaPrefillLongZipfWindow) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const JsonObject json = run_json({{"--device", "cuda"},
                                    {"--mode", "prefill"},
                                    {"--kv", "ragged"},
                                    {"--page-size", ""},
                                    {"--dist", "zipf"},
                                    {"--batch", "6"},
                                    {"--kv-len", "700"},
                                    {"--qo-len", "500"},
                                    {"--head-dim", "128"},
                                    {"--variant", "window"},
                                    {"--dtype", "f16"},
                                    {"--iters", "2"}});
  EXPECT_EQ(text(json, "variant"), "window");
  EXPECT_LE(number(json, "max_abs_error"), 4e-3);  // f16 output rounding
  EXPECT_EQ(number(json, "checked_requests"), 4);
}

}  // namespace
}  // namespace flare
