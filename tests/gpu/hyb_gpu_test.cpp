// The GPU SpMM over hyb(c, k) (flare/sparse/hyb_gpu.h; kernels/spmm_hyb.cuh) against the float64
// CPU reference: random matrices with empty rows and one row holding 30% of the nonzeros, rows
// of every length around the bucket widths and the warps' slots, one to three column partitions,
// feature sizes 8-1024 (tiles above 512), padded strides, 16-bit operands, and corrupted column
// and row ids (they contribute nothing; nothing is read or written outside the tensors).
// Outputs and workspace NaN-poisoned first (tests/gpu/spmm_test_support.h). Skips without a
// CUDA device.
#include "flare/sparse/hyb_gpu.h"

#include <gtest/gtest.h>

#include <functional>
#include <tuple>
#include <vector>

#include "flare/jit/cuda_sync.h"
#include "flare/sparse/spmm_tune.h"
#include "gpu/spmm_test_support.h"
#include "jit/jit_test_support.h"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using namespace spmm_testing;

// A layout's arrays on the device, its values in `values`' dtype gathered by source.
struct DeviceHyb {
  sparse::HybGpuLayout layout;
  DeviceCopy ell_rows, ell_columns, ell_values, rest_rows, rest_indptr, rest_columns, rest_values;

  sparse::HybGpu view() const {
    return {&layout,        ell_rows.view,    ell_columns.view,  ell_values.view,
            rest_rows.view, rest_indptr.view, rest_columns.view, rest_values.view};
  }
};

DeviceHyb upload(sparse::HybGpuLayout layout, const HostTensor& values) {
  DeviceHyb d;
  d.ell_rows = to_device(int32_tensor(layout.ell_rows));
  d.ell_columns = to_device(int32_tensor(layout.ell_columns));
  d.ell_values = gathered(layout.ell_source, values);
  d.rest_rows = to_device(int32_tensor(layout.rest_rows));
  d.rest_indptr = to_device(int32_tensor(layout.rest_indptr));
  d.rest_columns = to_device(int32_tensor(layout.rest_columns));
  d.rest_values = gathered(layout.rest_source, values);
  d.layout = std::move(layout);
  return d;
}

// Edits a layout's host arrays before they are copied (corrupting ids).
using LayoutEdit = std::function<void(sparse::HybGpuLayout&)>;

// spmm over hyb(c, k) of `a` (values rounded to dtype) as a check_spmm runner.
// schedule: {0, 0} for spmm's default.
SpmmRunner hyb_runner(const sparse::CsrStorage& a, int c, int k, DType dtype,
                      sparse::HybSchedule schedule = {}, const LayoutEdit& edit = {}) {
  return [&a, c, k, dtype, schedule, edit](const sparse::Csr&, const TensorView& x,
                                           const TensorView& y, const TensorView& w) {
    sparse::HybGpuLayout layout = sparse::hyb_gpu_layout(a.view(), c, k);
    if (edit) edit(layout);
    const DeviceHyb d = upload(std::move(layout), rounded_to(float_tensor(a.values), dtype));
    if (schedule.feature_tile == 0) {
      sparse::spmm(d.view(), x, y, w, nullptr);
    } else {
      sparse::spmm(d.view(), x, y, w, nullptr, schedule);
    }
    cuda::device_synchronize();  // before the arrays are freed
  };
}

TEST(HybGpu, MatchesTheReferenceForEveryPartitionCountAndWidth) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 31);
  uint64_t seed = 200;
  for (const auto& [c, k] : {std::pair{1, 0}, {1, 3}, {1, 5}, {3, 2}, {2, 8}}) {
    SCOPED_TRACE(::testing::Message() << "hyb(" << c << ", " << k << ")");
    for (const int64_t d : {8, 32, 96, 128, 512})
      check_spmm(a, a, d, d, seed++, DType::kF32, hyb_runner(a, c, k, DType::kF32));
    check_spmm(a, a, 128, 132, seed++, DType::kF32, hyb_runner(a, c, k, DType::kF32));
    check_spmm(a, a, 32, 33, seed++, DType::kF32, hyb_runner(a, c, k, DType::kF32));
  }
  check_spmm(a, a, 1024, 1024, seed++, DType::kF32, hyb_runner(a, 2, 4, DType::kF32));
  const sparse::CsrStorage column = sparse_testing::random_csr(1000, 1, 0.5, 0.0, 32);
  check_spmm(column, column, 64, 64, seed++, DType::kF32, hyb_runner(column, 1, 2, DType::kF32));
}

TEST(HybGpu, SixteenBitOperandsRoundOncePerPartition) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 33);
  uint64_t seed = 300;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const int64_t d : {8, 32, 128, 256, 512})
      check_spmm(a, a, d, d, seed++, dtype, hyb_runner(a, 1, 5, dtype));
    // Partitions 1 and 2 add to a Y rounded to 16 bits: two more roundings of partial sums.
    check_spmm(a, a, 128, 128, seed++, dtype, hyb_runner(a, 3, 4, dtype), 2);
    check_spmm(a, a, 64, 66, seed++, dtype, hyb_runner(a, 1, 5, dtype));
  }
}

TEST(HybGpu, RowsAroundBucketWidthsAndWarpSlots) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const std::vector<std::vector<int64_t>> patterns = {
      {0, 0, 128, 0, 128, 0, 0, 256, 1, 127, 0, 0},
      {5, 1000, 0, 3, 2000, 120, 8, 0},
      {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
      {2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65},
      {0, 0, 0},
      {7},
  };
  uint64_t seed = 400;
  for (const auto& lengths : patterns) {
    const sparse::CsrStorage a = rows_of_lengths(lengths, 3000, seed++);
    for (const auto& [c, k] : {std::pair{1, 4}, {2, 6}}) {
      for (const int64_t slots : {32, 128, 4096}) {
        SCOPED_TRACE(::testing::Message() << "hyb(" << c << ", " << k << ") slots " << slots);
        for (const int64_t d : {32, 128}) {
          check_spmm(a, a, d, d, seed++, DType::kF32, hyb_runner(a, c, k, DType::kF32, {d, slots}));
        }
        check_spmm(a, a, 512, 512, seed++, DType::kBF16,
                   hyb_runner(a, c, k, DType::kBF16, {512, slots}), c - 1);
      }
    }
  }
}

TEST(HybGpu, EveryScheduleMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 35);
  uint64_t seed = 600;
  for (const auto& [d, stride, dtype] : {std::tuple<int64_t, int64_t, DType>{512, 520, DType::kF32},
                                         {96, 96, DType::kF32},
                                         {256, 256, DType::kBF16}}) {
    for (const sparse::HybSchedule& schedule : sparse::hyb_schedules(d)) {
      SCOPED_TRACE(::testing::Message()
                   << "tile " << schedule.feature_tile << " slots " << schedule.slots_per_warp);
      check_spmm(a, a, d, stride, seed++, dtype, hyb_runner(a, 2, 4, dtype, schedule), 1);
    }
  }
}

class HybGpuTune : public jit::testing::JitTest {};

TEST_F(HybGpuTune, TimesEveryCandidateThenReadsTheCache) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(3000, 2000, 0.02, 0.3, 36);
  const int64_t d = 128;
  sparse::HybTuning first, second;
  const auto tuner = [&](sparse::HybTuning& out) {
    return [&a, &out](const sparse::Csr&, const TensorView& x, const TensorView& y,
                      const TensorView& w) {
      const DeviceHyb h = upload(sparse::hyb_gpu_layout(a.view(), 1, 4), float_tensor(a.values));
      out = sparse::tune_spmm(h.view(), x, y, w, nullptr);
      const cuda::OwnedStream owned;
      EXPECT_FLARE_ERROR(
          cuda::Graph(owned.get(), [&] { sparse::tune_spmm(h.view(), x, y, w, owned.get()); }),
          ErrorCode::kInvalidArgument, "cannot run while `stream` is captured");
      cuda::device_synchronize();
    };
  };
  check_spmm(a, a, d, d, 700, DType::kF32, tuner(first));
  EXPECT_FALSE(first.from_cache);
  const std::vector<sparse::HybSchedule> candidates = sparse::hyb_schedules(d);
  ASSERT_EQ(first.timings.size(), candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    EXPECT_EQ(first.timings[i].first, candidates[i]);
    EXPECT_GT(first.timings[i].second, 0.0);
  }
  check_spmm(a, a, d, d, 701, DType::kF32, tuner(second));
  EXPECT_TRUE(second.from_cache);
  EXPECT_TRUE(second.timings.empty());
  EXPECT_EQ(second.schedule, first.schedule);
}

TEST(HybGpu, CorruptedIdsContributeNothingAndStayInsideTheTensors) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(64, 100, 0.3, 0.3, 34);
  sparse::CsrStorage reference = a;
  // hyb(2, 2): rows of more than 4 nonzeros in a partition go to its remainder.
  const sparse::HybGpuLayout clean = sparse::hyb_gpu_layout(a.view(), 2, 2);
  ASSERT_EQ(clean.partitions.size(), 2u);
  ASSERT_FALSE(clean.partitions[1].buckets.empty());
  ASSERT_GT(clean.partitions[0].remainder.rows, 0);
  ASSERT_GT(clean.partitions[1].remainder.rows, 0);
  const auto drop = [&](int64_t source) {
    if (source >= 0) reference.values[static_cast<size_t>(source)] = 0.0f;
  };
  // Columns outside [0, cols) in both partitions' buckets and remainders.
  const std::vector<size_t> bad_slots = {0, clean.ell_columns.size() / 2,
                                         clean.ell_columns.size() - 1};
  const std::vector<size_t> bad_nonzeros = {0, clean.rest_columns.size() - 1};
  for (const size_t s : bad_slots) drop(clean.ell_source[s]);
  for (const size_t e : bad_nonzeros) drop(clean.rest_source[e]);
  // Row ids outside Y in partition 1 (partition 0 wrote those rows: partition 1's part is
  // lost): its first bucket's first row and its remainder's first row.
  const sparse::HybGpuLayout::Bucket& bucket = clean.partitions[1].buckets[0];
  const auto bucket_row = static_cast<size_t>(bucket.row_offset);
  for (int64_t s = 0; s < (int64_t{1} << bucket.log2_width); ++s)
    drop(clean.ell_source[static_cast<size_t>(bucket.slot_offset + s)]);
  const sparse::HybGpuLayout::Remainder& rest = clean.partitions[1].remainder;
  const auto rest_row = static_cast<size_t>(rest.row_offset);
  for (int64_t e = 0; e < clean.rest_indptr[static_cast<size_t>(rest.indptr_offset) + 1]; ++e)
    drop(clean.rest_source[static_cast<size_t>(rest.nnz_offset + e)]);
  const LayoutEdit corrupt = [&](sparse::HybGpuLayout& layout) {
    for (const size_t s : bad_slots) layout.ell_columns[s] = s == 0 ? -5 : 100 + 7 * int32_t(s);
    for (const size_t e : bad_nonzeros) layout.rest_columns[e] = e == 0 ? -1 : 1 << 30;
    layout.ell_rows[bucket_row] = 64 + 3;
    layout.rest_rows[rest_row] = -2;
  };
  for (const int64_t d : {32, 128})
    check_spmm(a, reference, d, d, 500 + d, DType::kF32,
               hyb_runner(a, 2, 2, DType::kF32, {}, corrupt));
}

}  // namespace
}  // namespace flare
