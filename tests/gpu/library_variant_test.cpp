// The shipped library of variants (flare/variant/library.h) on the GPU: prefix-LM and the
// document mask against the reference given the same masks as custom bits, the distance bias
// with T5's table against the reference's T5 buckets (prefill on both families, split and not,
// pages of 1 and 16; decode on both loops and whole-page items), its table checks before any
// launch, and the causal mask the causal ones require.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/variant/library.h"
#include "gpu/decode_test_support.h"
#include "gpu/prefill_test_support.h"
#include "gpu/variant_test_support.h"
#include "jit/variant_configs.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using prefill_testing::Case;
using variant_testing::check_decode_loops;
using variant_testing::DecodeVariantCase;
using variant_testing::PlannedDecode;

// The shipped prefix-LM (flare/variant/library.h) against the reference given the same mask as
// custom bits: each request's prefix seen by all its queries, the rest causally.
TEST(UserVariantPrefill, LibraryPrefixLmMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  const std::vector<int32_t> prefix = {5, 0, 200, 64};
  HostTensor prefix_host(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) prefix_host.data<int32_t>()[i] = prefix[static_cast<size_t>(i)];
  const gpu_testing::DeviceCopy prefix_device = gpu_testing::to_device(prefix_host);
  Case c;
  c.q_lens = {17, 128, 250, 64};
  c.kv_lens = {300, 128, 250, 64};
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.mask = MaskMode::kNone;  // the variant's mask holds the causal part
  c.variant = variants::prefix_lm();
  c.variant_tensors = {prefix_device.view};
  c.mask_rule = [prefix](int64_t request, int64_t q_pos, int64_t kv_pos) {
    return kv_pos < prefix[static_cast<size_t>(request)] || kv_pos <= q_pos;
  };
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  c.query_tile = 16;
  prefill_testing::check(c);
  // KV chunks of 64: the chunks past a tile's visible end (visible_end: max(q_pos + 1, prefix))
  // become items of no tiles, whose empty states merge with the others.
  c.fixed_split_size = 64;
  prefill_testing::check(c);
  c.query_tile = 0;  // the default tiles (the Hopper family on sm_90)
  prefill_testing::check(c);
}

// A causal library variant (its tensors and reference in `c`) on both prefill paths, split and
// not, pages of 16 and 1; a plan without the causal mask is refused. The split case takes the
// FA2 family's 16-row tiles, or the default tiles where the run is pinned to the Hopper family
// (FLARE_TEST_PREFILL_BACKEND=fa3), which refuses 16 rows.
void check_causal_library_prefill(Case c) {
  prefill_testing::check(c);
  c.kv = PrefillKV::kRagged;
  c.query_tile = 128;
  prefill_testing::check(c);
  c.query_tile = prefill_testing::backend_of(c) == PrefillBackend::kFA3 ? 0 : 16;
  c.fixed_split_size = 64;
  c.page_size = 1;
  c.kv = PrefillKV::kPaged;
  prefill_testing::check(c);
  BatchPrefillConfig config = testing::prefill_config(*c.variant, PrefillKV::kRagged);
  config.params.mask = MaskMode::kNone;
  EXPECT_FLARE_ERROR(BatchPrefill prefill(config), ErrorCode::kInvalidArgument,
                     "requires the causal mask");
}

// T5's bucket table [heads, 32] on the host and distance_bias()'s table from it on the device
// (flare::variants::t5_distance_bias): the reference computes T5's buckets itself.
struct T5Tables {
  T5Tables(int heads, double max_distance, uint64_t seed)
      : buckets(testing::random_tensor(DType::kF32, {heads, 32}, seed)) {
    const float* b = buckets.data<float>();
    const std::vector<float> bias =
        variants::t5_distance_bias(std::vector<float>(b, b + buckets.numel()), heads, max_distance);
    HostTensor host(DType::kF32, {heads, static_cast<int64_t>(bias.size()) / heads});
    std::copy(bias.begin(), bias.end(), host.data<float>());
    by_distance = gpu_testing::to_device(host);
  }
  HostTensor buckets;
  gpu_testing::DeviceCopy by_distance;
};

// distance_bias() with T5's table against the reference's T5 buckets: near keys (one load),
// far tiles (the row's last entry: the Hopper family's offset path), both prefill families,
// split and not, pages of 1 and 16; max distances under and over a 128-key tile; GQA 4 and MHA
// (a thread's rows 8 tokens apart under one head share their table loads: kLogitsByDistance).
TEST(UserVariantPrefill, LibraryDistanceBiasIsT5WithItsTable) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  for (const auto& [max_distance, kv_heads] :
       {std::pair{40.0, 2}, std::pair{200.0, 2}, std::pair{40.0, 8}, std::pair{200.0, 8}}) {
    SCOPED_TRACE("max_distance " + std::to_string(max_distance) + ", KV heads " +
                 std::to_string(kv_heads));
    const T5Tables tables(8, max_distance, 31);
    Case c;
    c.num_kv_heads = kv_heads;
    c.q_lens = {17, 600, 250, 1, 64};
    c.kv_lens = {300, 600, 1200, 77, 64};
    c.variant = variants::distance_bias();
    c.variant_tensors = {tables.by_distance.view};
    c.relative_bias = tables.buckets.view();
    c.relative_max_distance = static_cast<float>(max_distance);
    check_causal_library_prefill(c);
  }
}

TEST(UserVariantDecode, LibraryDistanceBiasIsT5WithItsTable) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const T5Tables tables(16, 100.0, 37);
  DecodeVariantCase c;
  c.variant = variants::distance_bias();
  c.tensors = {tables.by_distance.view};
  c.reference.relative_bias = tables.buckets.view();
  c.reference.relative_max_distance = 100.0f;
  check_decode_loops(c);
}

// A table (kTableExtent) holds at least one column and fewer than 2^31 entries: run() refuses
// others by name before any launch (the view's shape alone: nothing is read).
TEST(UserVariantDecode, DistanceTablesAreCheckedBeforeAnyLaunch) {
  FLARE_REQUIRE_GPU();
  PlannedDecode d(variants::distance_bias());
  cuda::DeviceBuffer buffer(64);
  RunOptions options;
  const TensorView empty =
      TensorView::contiguous(buffer.data(), DType::kF32, {8, 0}, Device::cuda(0));
  options.variant_tensors = {&empty, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor bias must have shape [num_qo_heads=8, at least 1], got [8, 0]");
  const TensorView huge =
      TensorView::contiguous(buffer.data(), DType::kF32, {8, int64_t{1} << 28}, Device::cuda(0));
  options.variant_tensors = {&huge, 1};
  EXPECT_FLARE_ERROR(d.run(options), ErrorCode::kInvalidArgument,
                     "tensor bias holds 2147483648 elements; a table (kTableExtent) holds at "
                     "most 2^31 - 1");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(d.out.o_host().view()), d.out.o_host().numel()) << "o was written";
}

// Packed documents for document_mask(): per request, runs of 1-300 positions with one id
// each, in rows of `columns` (a request longer than that has positions past the row: documents
// of their own), the reference's ids and the starts the variant reads, on the device.
struct Documents {
  Documents(const std::vector<int32_t>& kv_lens, int64_t columns_in, uint64_t seed)
      : columns(columns_in), ids(DType::kI32, {static_cast<int64_t>(kv_lens.size()), columns_in}) {
    std::vector<int32_t> all(static_cast<size_t>(ids.numel()));
    uint64_t state = seed;
    for (size_t r = 0; r < kv_lens.size(); ++r) {
      int32_t id = 0;
      int64_t left = 0;
      for (int64_t j = 0; j < columns; ++j) {
        if (left == 0) {
          state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          left = 1 + static_cast<int64_t>((state >> 33) % 300);
          ++id;
        }
        --left;
        all[r * columns + j] = id;
      }
    }
    std::copy(all.begin(), all.end(), ids.data<int32_t>());
    const std::vector<int32_t> starts =
        variants::document_starts(all, static_cast<int64_t>(kv_lens.size()), columns);
    HostTensor starts_host(DType::kI32, ids.shape());
    std::copy(starts.begin(), starts.end(), starts_host.data<int32_t>());
    starts_device = gpu_testing::to_device(starts_host);
  }
  // Causal and inside one document (positions past the row: alone).
  bool visible(int64_t request, int64_t q_pos, int64_t kv_pos) const {
    if (kv_pos > q_pos) return false;
    if (kv_pos == q_pos) return true;
    if (q_pos >= columns) return false;
    const int32_t* row = ids.data<int32_t>() + request * columns;
    return row[q_pos] == row[kv_pos];
  }

  int64_t columns;
  HostTensor ids;
  gpu_testing::DeviceCopy starts_device;
};

TEST(UserVariantDecode, LibraryDocumentMaskMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);  // Documents copies to the device (alone in a shard, no test set it)
  // check_decode's lengths; 4099 runs past the rows (its last 99 positions alone).
  const Documents docs({1, 17, 255, 4099, 33, 1000}, 4000, 5);
  DecodeVariantCase c;
  c.variant = variants::document_mask();
  c.tensors = {docs.starts_device.view};
  c.reference.document_id = docs.ids.view();
  check_decode_loops(c);
}

// Tiles that skip earlier documents, straddle a start or lie inside one document, on both
// prefill paths, split and not; a non-causal plan is refused.
TEST(UserVariantPrefill, LibraryDocumentMaskMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  Case c;
  c.q_lens = {17, 600, 250, 1, 64};
  c.kv_lens = {300, 600, 1200, 77, 64};
  const Documents docs(c.kv_lens, 1100, 9);
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.variant = variants::document_mask();
  c.variant_tensors = {docs.starts_device.view};
  c.mask_rule = [&docs](int64_t request, int64_t q_pos, int64_t kv_pos) {
    return docs.visible(request, q_pos, kv_pos);
  };
  check_causal_library_prefill(c);
}

}  // namespace
}  // namespace flare
