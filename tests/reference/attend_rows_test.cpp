// reference_attend_rows, the plan executor's building block: KV split into random chunks and
// merged with merge_into equals the whole; row subsets equal rows of reference_attention;
// sigmoid partial sums add up; ranges outside the request are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_case.h"
#include "flare/reference/merge.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using testing::AttentionCase;
using testing::AttentionCaseSpec;
using testing::KVSource;
using testing::Rng;

AttentionCaseSpec chunked_case(MaskMode mask) {
  AttentionCaseSpec spec;
  spec.q_lens = {1, 7, 20, 0, 2};
  spec.kv_lens = {511, 97, 20, 3, 0};
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.page_size = 3;
  spec.params.mask = mask;
  return spec;
}

// Random chunk boundaries 0 = b_0 <= b_1 <= ... <= b_n = kv_len (empty chunks included).
std::vector<int64_t> random_boundaries(Rng& rng, int64_t kv_len) {
  std::vector<int64_t> boundaries = {0, kv_len};
  const int64_t cuts = rng.uniform_int(0, 6);
  for (int64_t i = 0; i < cuts; ++i) boundaries.push_back(rng.uniform_int(0, kv_len));
  std::sort(boundaries.begin(), boundaries.end());
  return boundaries;
}

struct RowsResult {
  std::vector<float> o;
  std::vector<float> lse;
};

RowsResult attend(const AttentionProblem& problem, int64_t request, int64_t kv_head, int64_t rows,
                  int64_t kv_begin, int64_t kv_end,
                  Accumulation accumulation = Accumulation::kF32) {
  const int64_t head_dim = head_dim_vo(problem.kv);
  RowsResult result{std::vector<float>(static_cast<size_t>(rows * head_dim), NAN),
                    std::vector<float>(static_cast<size_t>(rows), NAN)};
  reference_attend_rows(problem, request, kv_head, 0, rows, kv_begin, kv_end, result.o.data(),
                        result.lse.data(), accumulation);
  return result;
}

double relative_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] == expected[i]) continue;  // includes equal infinities
    diff += (double{actual[i]} - expected[i]) * (double{actual[i]} - expected[i]);
    norm += double{expected[i]} * expected[i];
  }
  if (diff == 0.0) return 0.0;
  return std::isnan(diff) ? NAN : std::sqrt(diff / std::max(norm, 1e-30));
}

TEST(ReferenceAttendRows, MergedChunksEqualTheWholeKv) {
  for (MaskMode mask : {MaskMode::kNone, MaskMode::kCausal, MaskMode::kCustom}) {
    AttentionCase test_case(chunked_case(mask));
    const AttentionProblem problem = test_case.problem();
    const int64_t group = 4, head_dim = 64;
    Rng rng(7);
    for (int64_t request = 0; request < 5; ++request) {
      const int64_t rows = test_case.naive_inputs().q_lens[request] * group;
      const int64_t kv_len = kv_length(problem.kv, request);
      for (int64_t kv_head = 0; kv_head < 2; ++kv_head) {
        SCOPED_TRACE(::testing::Message() << "mask " << static_cast<int>(mask) << " request "
                                          << request << " kv_head " << kv_head);
        const RowsResult whole = attend(problem, request, kv_head, rows, 0, kv_len);
        const std::vector<int64_t> cuts = random_boundaries(rng, kv_len);
        RowsResult merged{std::vector<float>(whole.o.size(), 0.0f),
                          std::vector<float>(whole.lse.size(), -INFINITY)};
        for (size_t chunk = 0; chunk + 1 < cuts.size(); ++chunk) {
          const RowsResult part =
              attend(problem, request, kv_head, rows, cuts[chunk], cuts[chunk + 1]);
          for (int64_t row = 0; row < rows; ++row) {
            merge_into(&merged.o[row * head_dim], &merged.lse[row], &part.o[row * head_dim],
                       part.lse[row], head_dim);
          }
        }
        EXPECT_LE(relative_error(merged.o, whole.o), 1e-5);
        EXPECT_LE(relative_error(merged.lse, whole.lse), 1e-5);
      }
    }
  }
}

TEST(ReferenceAttendRows, FullRangeEqualsReferenceAttentionRowsBitwise) {
  AttentionCaseSpec spec = chunked_case(MaskMode::kCausal);
  spec.params.pos_encoding = PosEncoding::kRopeLlama;
  AttentionCase test_case(spec);
  test_case.run();
  const AttentionProblem problem = test_case.problem();
  const int64_t group = 4, head_dim = 64;
  int64_t q_begin = 0;
  for (int64_t request = 0; request < 5; ++request) {
    const int64_t q_len = test_case.naive_inputs().q_lens[request];
    for (int64_t kv_head = 0; kv_head < 2; ++kv_head) {
      // Row subsets [1, rows - 1) as a plan's tile would cut them.
      const int64_t rows = q_len * group;
      if (rows < 2) continue;
      std::vector<float> o(static_cast<size_t>((rows - 2) * head_dim), NAN);
      std::vector<float> lse(static_cast<size_t>(rows - 2), NAN);
      reference_attend_rows(problem, request, kv_head, 1, rows - 1, 0,
                            kv_length(problem.kv, request), o.data(), lse.data(),
                            Accumulation::kF32);
      for (int64_t row = 1; row < rows - 1; ++row) {
        const int64_t token = q_begin + row / group;
        const int64_t head = kv_head * group + row % group;
        EXPECT_EQ(lse[row - 1], test_case.lse().ptr<float>()[token * 8 + head]);
        for (int64_t d = 0; d < head_dim; ++d) {
          ASSERT_EQ(o[(row - 1) * head_dim + d],
                    test_case.o().ptr<float>()[(token * 8 + head) * head_dim + d]);
        }
      }
    }
    q_begin += q_len;
  }
}

TEST(ReferenceAttendRows, Float64ModeAgreesWithFloat32Mode) {
  AttentionCase test_case(chunked_case(MaskMode::kCausal));
  const AttentionProblem problem = test_case.problem();
  const RowsResult f32 = attend(problem, 0, 1, 4, 10, 400, Accumulation::kF32);
  const RowsResult f64 = attend(problem, 0, 1, 4, 10, 400, Accumulation::kF64);
  EXPECT_LE(relative_error(f32.o, f64.o), 1e-5);
  EXPECT_LE(relative_error(f32.lse, f64.lse), 1e-6);
}

TEST(ReferenceAttendRows, SigmoidChunksAddUpAndLeaveLseUntouched) {
  AttentionCaseSpec spec = chunked_case(MaskMode::kCausal);
  spec.params.use_softmax = false;
  spec.params.sigmoid_bias = 0.5f;
  spec.with_lse = false;
  AttentionCase test_case(spec);
  const AttentionProblem problem = test_case.problem();
  const RowsResult whole = attend(problem, 0, 0, 4, 0, 511);
  const RowsResult first = attend(problem, 0, 0, 4, 0, 200);
  const RowsResult second = attend(problem, 0, 0, 4, 200, 511);
  std::vector<float> sum(whole.o.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = first.o[i] + second.o[i];
  EXPECT_LE(relative_error(sum, whole.o), 1e-5);
  for (float lse : whole.lse) EXPECT_TRUE(std::isnan(lse)) << "lse must stay untouched";
}

TEST(ReferenceAttendRows, EmptyKvRangeGivesTheIdentityState) {
  AttentionCase test_case(chunked_case(MaskMode::kNone));
  const RowsResult empty = attend(test_case.problem(), 1, 0, 28, 50, 50);
  for (float x : empty.o) EXPECT_EQ(x, 0.0f);
  for (float lse : empty.lse) EXPECT_EQ(lse, -std::numeric_limits<float>::infinity());
}

TEST(ReferenceAttendRows, RangesOutsideTheRequestAreRejected) {
  AttentionCase test_case(chunked_case(MaskMode::kNone));
  const AttentionProblem problem = test_case.problem();
  std::vector<float> o(64 * 64, NAN), lse(64, NAN);
  const auto call = [&](int64_t request, int64_t kv_head, int64_t row_begin, int64_t row_end,
                        int64_t kv_begin, int64_t kv_end) {
    reference_attend_rows(problem, request, kv_head, row_begin, row_end, kv_begin, kv_end, o.data(),
                          lse.data(), Accumulation::kF32);
  };
  EXPECT_FLARE_ERROR(call(5, 0, 0, 1, 0, 1), ErrorCode::kInvalidArgument, "request");
  EXPECT_FLARE_ERROR(call(0, 2, 0, 1, 0, 1), ErrorCode::kInvalidArgument, "kv_head");
  EXPECT_FLARE_ERROR(call(0, 0, 0, 5, 0, 1), ErrorCode::kInvalidArgument, "rows [0, 5)");
  EXPECT_FLARE_ERROR(call(0, 0, 0, 4, 0, 512), ErrorCode::kInvalidArgument, "KV range [0, 512)");
  EXPECT_FLARE_ERROR(call(0, 0, 0, 4, 9, 8), ErrorCode::kInvalidArgument, "KV range [9, 8)");
  for (float x : o) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace flare
