// `flare plan-latency` end to end on a few runs: --json prints one parseable flat object per
// (kind, batch) with the documented keys and sane values, the table has its rows, and bad
// options are usage errors.
#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli_test_support.h"
#include "tools/flat_json.h"

namespace flare {
namespace {

using testing::CliResult;
using testing::JsonObject;
using testing::number;
using testing::ScratchDir;
using testing::text;

CliResult run(std::vector<std::string> args) {
  ScratchDir scratch;
  args.insert(args.begin(), "plan-latency");
  return testing::run_cli(args, scratch);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

TEST(PlanLatencyCli, JsonHasOneObjectPerKindAndBatch) {
  const CliResult result = run({"--runs", "5", "--batches", "1,64", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = lines_of(result.out);
  ASSERT_EQ(lines.size(), 4u) << result.out;
  const std::vector<std::pair<std::string, double>> rows = {
      {"decode", 1}, {"decode", 64}, {"prefill", 1}, {"prefill", 64}};
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::optional<JsonObject> json = testing::parse_flat_json(lines[i]);
    ASSERT_TRUE(json.has_value()) << "not one flat JSON object: " << lines[i];
    EXPECT_EQ(text(*json, "kind"), rows[i].first);
    EXPECT_EQ(number(*json, "batch"), rows[i].second);
    EXPECT_EQ(text(*json, "lengths"), "uniform");
    EXPECT_EQ(number(*json, "runs"), 5);
    // The H100 grids: 4 decode CTAs per SM (2 for at most one tile per SM), 2 prefill CTAs.
    const bool four_per_sm = rows[i].first == "decode" && rows[i].second == 64;
    EXPECT_EQ(number(*json, "num_ctas"), four_per_sm ? 528 : 264);
    const double items = number(*json, "work_items");
    EXPECT_GE(items, 1);
    EXPECT_GE(number(*json, "queue_entries"), items);
    EXPECT_GE(number(*json, "partial_slots"), 0);
    for (const char* part : {"validate_us_median", "planner_us_median", "stage_us_median"}) {
      EXPECT_GE(number(*json, part), 0) << part;
    }
    EXPECT_GT(number(*json, "plan_us_p10"), 0);
    EXPECT_LE(number(*json, "plan_us_p10"), number(*json, "plan_us_median"));
    EXPECT_LE(number(*json, "plan_us_median"), number(*json, "plan_us_p90"));
  }
}

TEST(PlanLatencyCli, TableHasItsRows) {
  const CliResult result =
      run({"--runs", "3", "--batches", "4", "--kinds", "prefill", "--lengths", "zipf"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = lines_of(result.out);
  ASSERT_EQ(lines.size(), 3u) << result.out;  // title, header, one row
  EXPECT_NE(lines[0].find("zipf"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2].rfind("prefill", 0), 0u) << lines[2];
}

// A decode cascade under one 8192-token prefix: the launch's virtual requests (the prefix group
// and one per request) planned with their merge map; every (tile, KV head) shared with the
// prefix writes a partial state.
TEST(PlanLatencyCli, CascadeRowsPlanTheLevelsAsOneBatch) {
  const CliResult result = run({"--runs", "5", "--batches", "16", "--kinds", "cascade", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = lines_of(result.out);
  ASSERT_EQ(lines.size(), 1u) << result.out;
  const std::optional<JsonObject> json = testing::parse_flat_json(lines[0]);
  ASSERT_TRUE(json.has_value()) << lines[0];
  EXPECT_EQ(text(*json, "kind"), "cascade");
  EXPECT_EQ(number(*json, "batch"), 16);
  // 16 requests x 8 KV heads at least, each writing a partial state, plus the prefix's chunks.
  EXPECT_GT(number(*json, "queue_entries"), 16 * 8);
  EXPECT_GE(number(*json, "partial_slots"), 16 * 8);
  EXPECT_GT(number(*json, "plan_us_median"), 0);
}

TEST(PlanLatencyCli, BadOptionsAreUsageErrors) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"--batches", "0"},
                                               {"--kinds", "all"},
                                               {"--decode-loop", "gpu"},
                                               {"--runs", "0"},
                                               {"--json", "yes"}}) {
    const CliResult result = run(args);
    EXPECT_EQ(result.exit_code, 2) << args[0] << " " << args[1] << ": " << result.err;
  }
}

}  // namespace
}  // namespace flare
