// append_paged_kv_cpu: appended tokens land in exactly the page slots the page table names
// (bitwise), nothing else changes, and bad indices are rejected before anything is written.
#include "flare/api/append_paged_kv.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "flare/jit/compiler.h"
#include "testing/append_kv_case.h"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare {
namespace {

using testing::AppendCase;
using testing::make_append_case;

struct AppendParam {
  KVLayout layout;
  int64_t page_size;
  DType dtype;
  bool combined;
  bool strided;
};

std::string param_name(const AppendParam& p) {
  std::string name = std::string(kv_layout_name(p.layout)) + "_page" + std::to_string(p.page_size) +
                     "_" + std::string(dtype_name(p.dtype)) +
                     (p.combined ? "_combined" : "_separate") + (p.strided ? "_strided" : "");
  for (char& c : name) {
    if (c == '-' || c == '.') c = '_';
  }
  return name;
}
void PrintTo(const AppendParam& p, std::ostream* os) { *os << param_name(p); }

class AppendPagedKVCpuTest : public ::testing::TestWithParam<AppendParam> {};

TEST_P(AppendPagedKVCpuTest, WritesExactlyTheAppendedSlots) {
  const AppendParam& p = GetParam();
  testing::KVCacheSpec spec;
  // Old lengths then appended tokens per request: empty requests, a request that starts
  // empty, one that appends nothing, odd lengths.
  const std::vector<int32_t> old_lens = {0, 5, 0, 96, 7, 1};
  const std::vector<int32_t> append_lens = {0, 2, 7, 1, 0, 510};
  spec.num_kv_heads = 4;
  spec.head_dim_qk = 64;
  spec.head_dim_vo = p.combined ? 64 : 128;
  spec.dtype = p.dtype;
  spec.page_size = p.page_size;
  spec.layout = p.layout;
  spec.combined = p.combined;
  spec.strided = p.strided;
  spec.seed = 7;
  AppendCase c = make_append_case(spec, old_lens, append_lens);

  append_paged_kv_cpu(c.input(), c.target);

  EXPECT_TRUE(c.target_matches_complete()) << "first differing byte " << c.first_difference();
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AppendPagedKVCpuTest,
    ::testing::Values(AppendParam{KVLayout::kNHD, 16, DType::kF16, true, false},
                      AppendParam{KVLayout::kHND, 16, DType::kF16, true, false},
                      AppendParam{KVLayout::kNHD, 1, DType::kBF16, false, false},
                      AppendParam{KVLayout::kHND, 3, DType::kF32, false, true},
                      AppendParam{KVLayout::kNHD, 3, DType::kE4M3, true, true},
                      AppendParam{KVLayout::kHND, 1, DType::kE5M2, false, false},
                      AppendParam{KVLayout::kNHD, 16, DType::kBF16, false, true}),
    [](const ::testing::TestParamInfo<AppendParam>& info) { return param_name(info.param); });

testing::KVCacheSpec small_spec() {
  testing::KVCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = 16;
  spec.head_dim_vo = 16;
  spec.page_size = 3;
  spec.combined = true;
  return spec;
}

TEST(AppendPagedKVCpu, ShuffledTokenOrderAndPadding) {
  AppendCase c = make_append_case(small_spec(), {4, 0, 2}, {3, 5, 1}, /*shuffle_seed=*/11);
  append_paged_kv_cpu(c.input(), c.target);
  EXPECT_TRUE(c.target_matches_complete()) << "first differing byte " << c.first_difference();
}

TEST(AppendPagedKVCpu, NothingToAppend) {
  AppendCase c = make_append_case(small_spec(), {4, 0}, {0, 0});
  ASSERT_EQ(c.num_appended(), 0);
  append_paged_kv_cpu(c.input(), c.target);
  EXPECT_TRUE(c.target_matches_complete());
}

// Each bad input throws kInvalidArgument naming the argument and leaves the cache untouched.
class AppendPagedKVCpuErrors : public ::testing::Test {
 protected:
  AppendPagedKVCpuErrors() : c_(make_append_case(small_spec(), {4, 0, 2}, {3, 5, 1})) {}

  void expect_rejected(const AppendPagedKVInput& input, const PagedKV& cache,
                       const std::string& substring) {
    const std::vector<std::byte> before = c_.target_bytes();
    EXPECT_FLARE_ERROR(append_paged_kv_cpu(input, cache), ErrorCode::kInvalidArgument, substring);
    EXPECT_TRUE(before == c_.target_bytes()) << "the cache changed although the call failed";
  }

  AppendCase c_;
};

TEST_F(AppendPagedKVCpuErrors, BatchIndexOutOfRange) {
  const int64_t token = c_.last_appended_token();
  c_.batch_indices.data<int32_t>()[token] = 3;
  expect_rejected(c_.input(), c_.target, "batch_indices[" + std::to_string(token) + "]=3");
}

TEST_F(AppendPagedKVCpuErrors, PositionPastTheRequestsPages) {
  const int64_t token = c_.last_appended_token();
  const int32_t request = c_.batch_indices.data<int32_t>()[token];
  const int64_t capacity = c_.target.table.num_blocks(request) * c_.target.page_size();
  c_.positions.data<int32_t>()[token] = static_cast<int32_t>(capacity);
  expect_rejected(c_.input(), c_.target, "positions[" + std::to_string(token) + "]");
}

TEST_F(AppendPagedKVCpuErrors, NegativePosition) {
  const int64_t token = c_.last_appended_token();
  c_.positions.data<int32_t>()[token] = -2;
  expect_rejected(c_.input(), c_.target, "positions[" + std::to_string(token) + "]=-2");
}

TEST_F(AppendPagedKVCpuErrors, PageIndexOutOfRange) {
  PagedKV cache = c_.target;
  c_.complete.page_indices.data<int32_t>()[0] = static_cast<int32_t>(cache.num_pages());
  expect_rejected(c_.input(), cache, "kv_indices[0]");
}

TEST_F(AppendPagedKVCpuErrors, DtypeMismatch) {
  AppendPagedKVInput input = c_.input();
  input.append_key.dtype = DType::kBF16;
  expect_rejected(input, c_.target, "append_key must be float16");
}

TEST_F(AppendPagedKVCpuErrors, HeadCountMismatch) {
  AppendPagedKVInput input = c_.input();
  input.append_value.shape[1] = 1;
  expect_rejected(input, c_.target, "append_value must have 2 heads");
}

TEST_F(AppendPagedKVCpuErrors, TokenCountMismatch) {
  AppendPagedKVInput input = c_.input();
  input.positions.shape[0] -= 1;
  expect_rejected(input, c_.target, "positions must have");
}

// No GPU needed: every vector width the launcher may pick compiles with NVRTC for the shipped
// architectures without spills or local memory.
class AppendKernelCompiles : public ::testing::TestWithParam<const char*> {};

TEST_P(AppendKernelCompiles, EveryVectorWidthWithoutSpills) {
  EXPECT_FLARE_ERROR(append_paged_kv_kernel_spec(3), ErrorCode::kInvalidArgument, "got 3");
  FLARE_SKIP_WITHOUT_NVRTC();
  for (int bytes : {1, 2, 4, 8, 16}) {
    const jit::KernelSpec spec = append_paged_kv_kernel_spec(bytes);
    const jit::CompiledKernel compiled = jit::compile(spec, GetParam());
    ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
    testing::expect_shipped_usage(compiled, spec.label + " on " + GetParam());
    EXPECT_FALSE(compiled.cubin.empty()) << spec.label;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, AppendKernelCompiles, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare
