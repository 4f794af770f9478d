// The ptxas -v report parser on fixed report text (CUDA 13 sm_90a and sm_80 wording), including
// non-inlined (and recursive) callees whose frames and spills must be charged to the entries.
#include <gtest/gtest.h>

#include "src/jit/ptxas_report.h"

namespace flare::jit {
namespace {

constexpr const char* kSm90aReport = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'shared_k' for 'sm_90a'
ptxas info    : Function properties for shared_k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compile time = 2.915 ms
ptxas info    : Compiling entry function 'localmem' for 'sm_90a'
ptxas info    : Function properties for localmem
ptxas         .     1024 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 42 registers, used 0 barriers, 1024 bytes cumulative stack size
ptxas info    : Compile time = 37.415 ms
)";

TEST(PtxasReport, ReadsEveryEntryInOrder) {
  const std::vector<ResourceUsage> usage = parse_ptxas_report(kSm90aReport);
  ASSERT_EQ(usage.size(), 2u);
  EXPECT_EQ(usage[0].entry, "shared_k");
  EXPECT_EQ(usage[0].registers, 10);
  EXPECT_EQ(usage[0].static_shared_bytes, 4096);
  EXPECT_EQ(usage[0].local_bytes, 0);
  EXPECT_EQ(usage[0].spill_bytes, 0);
  EXPECT_EQ(usage[1].entry, "localmem");
  EXPECT_EQ(usage[1].registers, 42);
  EXPECT_EQ(usage[1].static_shared_bytes, 0);
  EXPECT_EQ(usage[1].local_bytes, 1024);
  EXPECT_EQ(usage[1].spill_bytes, 0);
}

TEST(PtxasReport, Sm80WordingWithConstantBank) {
  const std::vector<ResourceUsage> usage = parse_ptxas_report(
      "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
      "ptxas info    : Function properties for k\n"
      "ptxas         .     16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem, 360 bytes cmem[0]\n");
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].registers, 255);
  EXPECT_EQ(usage[0].static_shared_bytes, 49152);
  EXPECT_EQ(usage[0].local_bytes, 16);
  EXPECT_EQ(usage[0].spill_bytes, 20);
}

TEST(PtxasReport, CalleeFramesAndSpillsCountAgainstEntries) {
  const std::vector<ResourceUsage> usage = parse_ptxas_report(
      "ptxas info    : Function properties for helper\n"
      "ptxas         .     32 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : Function properties for k\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 20 registers, used 0 barriers, 32 bytes cumulative stack size\n");
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].entry, "k");
  EXPECT_EQ(usage[0].local_bytes, 32);
  EXPECT_EQ(usage[0].spill_bytes, 8);
}

TEST(PtxasReport, RecursiveCalleeFrameCountsAgainstEntries) {
  // CUDA 13 sm_90a wording for a recursive callee: the entry prints no cumulative stack size.
  const std::vector<ResourceUsage> usage = parse_ptxas_report(
      "ptxas warning : Registers are spilled to local memory in function '_Z3fibi', 20 bytes "
      "spill stores, 20 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : Function properties for k\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 24 registers, used 0 barriers\n"
      "ptxas info    : Function properties for _Z3fibi\n"
      "ptxas         .     24 bytes stack frame, 20 bytes spill stores, 20 bytes spill loads\n");
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_EQ(usage[0].local_bytes, 24);
  EXPECT_EQ(usage[0].spill_bytes, 40);
}

TEST(PtxasReport, EmptyLogHasNoEntries) { EXPECT_TRUE(parse_ptxas_report("").empty()); }

}  // namespace
}  // namespace flare::jit
