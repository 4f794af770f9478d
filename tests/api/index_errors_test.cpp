// The messages of out-of-range index records (what check() raises): each kind names the
// caller's argument, the request, the entry and the value. No GPU needed.
#include "flare/api/index_errors.h"

#include <gtest/gtest.h>

#include <string>

#include "flare/api/run_options.h"

namespace flare {
namespace {

IndexError error_of(IndexErrorKind kind, int64_t request, int64_t entry, int64_t value) {
  IndexError e;
  e.kind = kind;
  e.request = request;
  e.entry = entry;
  e.value = value;
  e.count = 3;
  return e;
}

TEST(IndexErrors, MessagesNameTheArgumentRequestEntryAndValue) {
  const IndexNames names{"BatchDecodeWithPagedKVCacheWrapper", "indices", "indptr", "positions",
                         "batch_indices"};
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorPageId, 2, 37, 9999), names, 512),
            "BatchDecodeWithPagedKVCacheWrapper: indices[37] = 9999 (request 2) is not a page "
            "of the KV cache (it has 512 pages)");
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorPageId, 0, 4, -1), names),
            "BatchDecodeWithPagedKVCacheWrapper: indices[4] = -1 (request 0) is not a page of "
            "the KV cache");
  // Decode records the request only; check() finds the entry in the ids, unless they changed.
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorPageId, 3, -1, -1), names, 64),
            "BatchDecodeWithPagedKVCacheWrapper: request 3 read a page id of indices outside "
            "the KV cache (it has 64 pages)");
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorEntry, 5, 100, -1), names),
            "BatchDecodeWithPagedKVCacheWrapper: request 5 reads indices[100], past the end of "
            "indices");
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorPosition, 1, 7, 40), names),
            "BatchDecodeWithPagedKVCacheWrapper: positions[7] = 40 is outside the pages of its "
            "request 1 (indptr)");
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorRequest, 9, 3, 9), names),
            "BatchDecodeWithPagedKVCacheWrapper: batch_indices[3] = 9 is not a request of the "
            "batch (indptr has fewer)");
  EXPECT_EQ(describe_index_error(error_of(kIndexErrorPageRange, 2, 2, -8), names),
            "BatchDecodeWithPagedKVCacheWrapper: indptr[2] = -8 and indptr[3] give a page range "
            "outside indices");
}

TEST(RunOptions, LseScaleConvertsTheNaturalLogToTheAskedBase) {
  EXPECT_EQ(lse_scale(LseBase::kNatural), 1.0f);
  EXPECT_FLOAT_EQ(lse_scale(LseBase::kBase2), 1.4426950408889634f);
  const RunOptions defaults;
  EXPECT_EQ(defaults.lse_base, LseBase::kNatural);
  EXPECT_FALSE(defaults.enable_pdl);
  EXPECT_EQ(defaults.q_scale * defaults.k_scale * defaults.v_scale, 1.0f);
}

}  // namespace
}  // namespace flare
