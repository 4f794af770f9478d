// KV layouts and views: page sizes 1/3/16, NHD and HND, combined and separate K/V, strided
// views of q/o/lse/KV, paged versus ragged (bitwise equal), and outputs that do not depend on
// the number of threads.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_case.h"

namespace flare {
namespace {

using testing::AttentionCase;
using testing::AttentionCaseSpec;
using testing::bitwise_equal;
using testing::KVSource;

constexpr double kF32Tolerance = 2e-5;

AttentionCaseSpec layout_case(int64_t page_size, KVLayout layout, bool combined, bool strided) {
  AttentionCaseSpec spec;
  spec.q_lens = {1, 7, 0, 12, 1};
  spec.kv_lens = {97, 7, 5, 33, 0};
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.page_size = page_size;
  spec.layout = layout;
  spec.combined = combined;
  spec.strided = strided;
  spec.params.mask = MaskMode::kCausal;
  spec.seed = static_cast<uint64_t>(page_size * 8 + combined * 4 + strided * 2 +
                                    (layout == KVLayout::kHND));
  return spec;
}

TEST(ReferenceAttentionLayouts, EveryPageSizeLayoutAndViewMatchesNaive) {
  for (int64_t page_size : {1, 3, 16}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (bool combined : {false, true}) {
        for (bool strided : {false, true}) {
          SCOPED_TRACE("page_size " + std::to_string(page_size) + " " + kv_layout_name(layout) +
                       (combined ? " combined" : " separate") + (strided ? " strided" : ""));
          AttentionCase test_case(layout_case(page_size, layout, combined, strided));
          test_case.run(KVSource::kPaged);
          test_case.expect_near(test_case.naive(), kF32Tolerance, kF32Tolerance);
        }
      }
    }
  }
}

TEST(ReferenceAttentionLayouts, RaggedKvMatchesNaive) {
  for (bool strided : {false, true}) {
    SCOPED_TRACE(strided ? "strided" : "contiguous");
    AttentionCase test_case(layout_case(16, KVLayout::kNHD, false, strided));
    test_case.run(KVSource::kRagged);
    test_case.expect_near(test_case.naive(), kF32Tolerance, kF32Tolerance);
  }
}

TEST(ReferenceAttentionLayouts, PagedAndRaggedAreBitwiseEqualInFloat32) {
  for (int64_t page_size : {1, 3, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    AttentionCaseSpec spec = layout_case(page_size, KVLayout::kHND, false, true);
    spec.params.pos_encoding = PosEncoding::kRopeLlama;
    AttentionCase test_case(spec);
    test_case.run(KVSource::kRagged);
    const HostTensor ragged_o = testing::to_contiguous(test_case.o());
    const HostTensor ragged_lse = testing::to_contiguous(test_case.lse());
    test_case.run(KVSource::kPaged);
    EXPECT_TRUE(bitwise_equal(test_case.o(), ragged_o.view()));
    EXPECT_TRUE(bitwise_equal(test_case.lse(), ragged_lse.view()));
  }
}

TEST(ReferenceAttentionLayouts, OutputDoesNotDependOnTheThreadCount) {
  // A long prefill request (several row blocks per KV head) next to short ones.
  AttentionCaseSpec spec;
  spec.q_lens = {300, 1, 0, 17};
  spec.kv_lens = {300, 511, 9, 17};
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.params.mask = MaskMode::kCausal;
  for (Accumulation accumulation : {Accumulation::kF32, Accumulation::kF64}) {
    AttentionCase test_case(spec);
    ReferenceOptions options;
    options.accumulation = accumulation;
    options.num_threads = 1;
    test_case.run(KVSource::kPaged, options);
    const HostTensor single_o = testing::to_contiguous(test_case.o());
    const HostTensor single_lse = testing::to_contiguous(test_case.lse());
    for (int threads : {2, 3, 8}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      options.num_threads = threads;
      test_case.run(KVSource::kPaged, options);
      EXPECT_TRUE(bitwise_equal(test_case.o(), single_o.view()));
      EXPECT_TRUE(bitwise_equal(test_case.lse(), single_lse.view()));
    }
  }
}

TEST(ReferenceAttentionLayouts, BatchOfOnlyEmptyRequests) {
  AttentionCaseSpec spec;
  spec.q_lens = {0, 3, 0};
  spec.kv_lens = {0, 0, 4};
  AttentionCase test_case(spec);
  test_case.run();
  test_case.expect_near(test_case.naive(), 0.0, 0.0);  // zeros and -inf exactly
}

TEST(ReferenceAttentionLayouts, ZeroRequests) {
  AttentionCaseSpec spec;  // batch 0: nothing to do, nothing to write
  AttentionCase test_case(spec);
  EXPECT_NO_THROW(test_case.run());
}

}  // namespace
}  // namespace flare
