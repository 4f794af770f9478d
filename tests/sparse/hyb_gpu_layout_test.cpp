// The GPU hyb SpMM's host side without a GPU (flare/sparse/hyb_gpu.h): the device layout of a
// decomposition (every nonzero in exactly one slot, padding -1, partition 0 covering every row;
// the same arrays as tests/sparse/hyb_layout_oracle.h's, built from hyb_from_csr's Hyb),
// the argument errors raised before any launch, and the shipped kernels' compile for sm_80 and
// sm_90a (0 spills).
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "flare/sparse/hyb_gpu.h"
#include "jit/jit_test_support.h"
#include "kernels/spmm_hyb.cuh"
#include "sparse/hyb_layout_oracle.h"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare::sparse {
namespace {

// Rows: 0 = {1}, 1 = {}, 2 = {0, 2, 3}, 3 = {0, 1, 2, 3, 4}; values 1..9 in order.
CsrStorage small_matrix() {
  CsrStorage a;
  a.rows = 4;
  a.cols = 5;
  a.indptr = {0, 1, 1, 4, 9};
  a.indices = {1, 0, 2, 3, 0, 1, 2, 3, 4};
  a.values = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  return a;
}

TEST(HybGpuLayout, BucketsPadWithMinusOneAndPartitionZeroTakesEveryRow) {
  const HybGpuLayout layout = hyb_gpu_layout(small_matrix().view(), 1, 2);
  ASSERT_EQ(layout.partitions.size(), 1u);
  const HybGpuLayout::Partition& part = layout.partitions[0];
  // Width 1: row 0 and the empty row 1 (padding); width 2 is empty and left out; width 4: row 2.
  ASSERT_EQ(part.buckets.size(), 2u);
  EXPECT_EQ(part.buckets[0].log2_width, 0);
  EXPECT_EQ(part.buckets[0].rows, 2);
  EXPECT_EQ(part.buckets[1].log2_width, 2);
  EXPECT_EQ(part.buckets[1].rows, 1);
  EXPECT_EQ(part.buckets[1].row_offset, 2);
  EXPECT_EQ(part.buckets[1].slot_offset, 2);
  EXPECT_EQ(layout.ell_rows, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(layout.ell_columns, (std::vector<int32_t>{1, -1, 0, 2, 3, -1}));
  EXPECT_EQ(layout.ell_source, (std::vector<int64_t>{0, -1, 1, 2, 3, -1}));
  // Row 3's five nonzeros exceed width 4: the remainder.
  EXPECT_EQ(part.remainder.rows, 1);
  EXPECT_EQ(part.remainder.nnz, 5);
  EXPECT_EQ(layout.rest_rows, (std::vector<int32_t>{3}));
  EXPECT_EQ(layout.rest_indptr, (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(layout.rest_columns, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(layout.rest_source, (std::vector<int64_t>{4, 5, 6, 7, 8}));
  EXPECT_DOUBLE_EQ(layout.padding_ratio(), 11.0 / 9.0);
}

TEST(HybGpuLayout, EveryNonzeroLiesInOneSlotForAnyPartitionsAndWidths) {
  const CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 41);
  for (const auto& [c, k] : {std::pair{1, 0}, {1, 5}, {3, 2}, {4, 16}}) {
    SCOPED_TRACE(::testing::Message() << "hyb(" << c << ", " << k << ")");
    const HybGpuLayout layout = hyb_gpu_layout(a.view(), c, k);
    std::vector<int> seen(a.indices.size(), 0);
    for (size_t s = 0; s < layout.ell_columns.size(); ++s) {
      const int64_t e = layout.ell_source[s];
      EXPECT_EQ(layout.ell_columns[s], e < 0 ? -1 : a.indices[static_cast<size_t>(e)]);
      if (e >= 0) ++seen[static_cast<size_t>(e)];
    }
    for (size_t s = 0; s < layout.rest_columns.size(); ++s) {
      const int64_t e = layout.rest_source[s];
      ASSERT_GE(e, 0);
      EXPECT_EQ(layout.rest_columns[s], a.indices[static_cast<size_t>(e)]);
      ++seen[static_cast<size_t>(e)];
    }
    for (const int count : seen) ASSERT_EQ(count, 1);
    // Within a partition a row lies in one bucket or the remainder; partition 0 holds all.
    for (size_t p = 0; p < layout.partitions.size(); ++p) {
      std::multiset<int32_t> rows;
      const HybGpuLayout::Partition& part = layout.partitions[p];
      for (const HybGpuLayout::Bucket& b : part.buckets) {
        for (int64_t i = 0; i < b.rows; ++i)
          rows.insert(layout.ell_rows[static_cast<size_t>(b.row_offset + i)]);
      }
      for (int64_t i = 0; i < part.remainder.rows; ++i)
        rows.insert(layout.rest_rows[static_cast<size_t>(part.remainder.row_offset + i)]);
      EXPECT_EQ(std::set<int32_t>(rows.begin(), rows.end()).size(), rows.size());
      if (p == 0) {
        EXPECT_EQ(static_cast<int64_t>(rows.size()), a.rows);
      }
    }
  }
}

void expect_same_layout(const HybGpuLayout& got, const HybGpuLayout& want) {
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.cols, want.cols);
  EXPECT_EQ(got.nnz, want.nnz);
  ASSERT_EQ(got.partitions.size(), want.partitions.size());
  for (size_t p = 0; p < want.partitions.size(); ++p) {
    const HybGpuLayout::Partition &g = got.partitions[p], &w = want.partitions[p];
    ASSERT_EQ(g.buckets.size(), w.buckets.size()) << "partition " << p;
    for (size_t b = 0; b < w.buckets.size(); ++b) {
      EXPECT_EQ(g.buckets[b].row_offset, w.buckets[b].row_offset) << p << " " << b;
      EXPECT_EQ(g.buckets[b].rows, w.buckets[b].rows) << p << " " << b;
      EXPECT_EQ(g.buckets[b].slot_offset, w.buckets[b].slot_offset) << p << " " << b;
      EXPECT_EQ(g.buckets[b].log2_width, w.buckets[b].log2_width) << p << " " << b;
    }
    EXPECT_EQ(g.remainder.row_offset, w.remainder.row_offset) << p;
    EXPECT_EQ(g.remainder.rows, w.remainder.rows) << p;
    EXPECT_EQ(g.remainder.indptr_offset, w.remainder.indptr_offset) << p;
    EXPECT_EQ(g.remainder.nnz_offset, w.remainder.nnz_offset) << p;
    EXPECT_EQ(g.remainder.nnz, w.remainder.nnz) << p;
  }
  EXPECT_EQ(got.ell_rows, want.ell_rows);
  EXPECT_EQ(got.ell_columns, want.ell_columns);
  EXPECT_EQ(got.ell_source, want.ell_source);
  EXPECT_EQ(got.rest_rows, want.rest_rows);
  EXPECT_EQ(got.rest_indptr, want.rest_indptr);
  EXPECT_EQ(got.rest_columns, want.rest_columns);
  EXPECT_EQ(got.rest_source, want.rest_source);
}

TEST(HybGpuLayout, BuiltFromTheCsrMatrixEqualsTheHybPath) {
  std::vector<CsrStorage> matrices = {small_matrix(),
                                      sparse_testing::random_csr(300, 257, 0.05, 0.3, 42),
                                      sparse_testing::random_csr(40, 3, 0.6, 0.0, 43),
                                      sparse_testing::random_csr(0, 7, 0.1, 0.0, 44)};
  for (size_t m = 0; m < matrices.size(); ++m) {
    const CsrStorage& a = matrices[m];
    for (const auto& [c, k] : {std::pair{1, 0}, {1, 2}, {1, 5}, {2, 1}, {3, 4}, {3, 16}}) {
      if (c > a.cols) continue;
      SCOPED_TRACE(::testing::Message() << "matrix " << m << " hyb(" << c << ", " << k << ")");
      expect_same_layout(hyb_gpu_layout(a.view(), c, k),
                         sparse_testing::layout_via_hyb(hyb_from_csr(a.view(), c, k)));
    }
  }
  const CsrStorage kept = small_matrix();
  Csr without_values = kept.view();
  without_values.values.reset();  // the layout holds sources: values are not needed
  expect_same_layout(hyb_gpu_layout(without_values, 1, 2),
                     sparse_testing::layout_via_hyb(hyb_from_csr(kept.view(), 1, 2)));
  EXPECT_FLARE_ERROR(hyb_gpu_layout(kept.view(), 0, 2), ErrorCode::kInvalidArgument,
                     "flare::sparse::hyb_gpu_layout: column_parts must be in [1, cols = 5], got 0");
  EXPECT_FLARE_ERROR(hyb_gpu_layout(kept.view(), 1, 17), ErrorCode::kInvalidArgument,
                     "max_log2_width must be in [0, 16], got 17");
}

TEST(HybGpuLayout, SchedulesAndWorkspace) {
  using Schedules = std::vector<HybSchedule>;
  EXPECT_EQ(default_hyb_schedule(32), (HybSchedule{32, 128}));
  EXPECT_EQ(default_hyb_schedule(96), (HybSchedule{96, 128}));
  EXPECT_EQ(default_hyb_schedule(384), (HybSchedule{384, 512}));
  EXPECT_EQ(default_hyb_schedule(1024), (HybSchedule{512, 512}));  // a lane's sums at 1024 spill
  EXPECT_EQ(default_hyb_schedule(1536), (HybSchedule{512, 512}));
  EXPECT_EQ(hyb_schedules(128),
            (Schedules{{128, 128}, {128, 512}, {64, 128}, {64, 512}, {32, 128}, {32, 512}}));
  EXPECT_EQ(hyb_schedules(96), (Schedules{{96, 128}, {96, 512}, {32, 128}, {32, 512}}));
  EXPECT_EQ(hyb_schedules(8), (Schedules{{8, 128}, {8, 512}}));
  EXPECT_EQ(hyb_schedules(1024).front(), (HybSchedule{512, 512}));
  EXPECT_EQ(hyb_schedules(1024).size(), 10u);  // tiles 512 .. 32, two slot counts each
  const HybGpuLayout without_rest = hyb_gpu_layout(small_matrix().view(), 1, 3);
  EXPECT_EQ(hyb_spmm_workspace_bytes(without_rest, 128), 0u);
  const HybGpuLayout with_rest = hyb_gpu_layout(small_matrix().view(), 1, 1);
  EXPECT_GT(hyb_spmm_workspace_bytes(with_rest, 128), 0u);
  EXPECT_FLARE_ERROR(hyb_spmm_workspace_bytes(with_rest, 0), ErrorCode::kInvalidArgument,
                     "d must be positive, got 0");
}

// Views of host memory labelled as on CUDA device 0: the checks read only their metadata and
// throw before anything is launched.
struct FakeDeviceHyb {
  HybGpuLayout layout = hyb_gpu_layout(small_matrix().view(), 1, 1);
  std::vector<int32_t> ints = std::vector<int32_t>(64, 0);
  std::vector<float> floats = std::vector<float>(4 * 1024, 0.0f);

  TensorView array(DType dtype, size_t size) {
    void* data = dtype == DType::kI32 ? static_cast<void*>(ints.data()) : floats.data();
    return TensorView::contiguous(data, dtype, {static_cast<int64_t>(size)}, Device::cuda(0));
  }
  HybGpu view() {
    return {&layout,
            array(DType::kI32, layout.ell_rows.size()),
            array(DType::kI32, layout.ell_columns.size()),
            array(DType::kF32, layout.ell_columns.size()),
            array(DType::kI32, layout.rest_rows.size()),
            array(DType::kI32, layout.rest_indptr.size()),
            array(DType::kI32, layout.rest_columns.size()),
            array(DType::kF32, layout.rest_columns.size())};
  }
  TensorView dense(int64_t rows, int64_t d, DType dtype = DType::kF32) {
    return TensorView::contiguous(floats.data(), dtype, {rows, d}, Device::cuda(0));
  }
};

TEST(HybGpuArguments, ErrorsNameTheArgumentBeforeAnyLaunch) {
  FakeDeviceHyb f;
  const TensorView x = f.dense(5, 32), y = f.dense(4, 32);
  const TensorView workspace = f.array(DType::kF32, 1024);
  HybGpu a = f.view();
  EXPECT_FLARE_ERROR(spmm(HybGpu{}, x, y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "A.layout is null");
  std::vector<float> host(5 * 32);
  EXPECT_FLARE_ERROR(
      spmm(a, TensorView::contiguous(host.data(), DType::kF32, {5, 32}, Device::cpu()), y,
           workspace, nullptr),
      ErrorCode::kInvalidArgument, "x must be a CUDA tensor");
  EXPECT_FLARE_ERROR(spmm(a, f.dense(4, 32), y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "x must be a float32, float16 or bfloat16 [5, 32] tensor");
  a.ell_values = f.array(DType::kI32, f.layout.ell_columns.size());
  EXPECT_FLARE_ERROR(spmm(a, x, y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "A.ell_values must be a contiguous float32 [2] tensor");
  a = f.view();
  a.rest_indptr = f.array(DType::kI32, 1);
  EXPECT_FLARE_ERROR(spmm(a, x, y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "A.rest_indptr must be a contiguous int32 [3] tensor");
  a = f.view();
  EXPECT_FLARE_ERROR(spmm(a, f.dense(5, 48), f.dense(4, 48), workspace, nullptr),
                     ErrorCode::kUnsupported, "multiples of 32 or powers of two below 32, got 48");
  EXPECT_FLARE_ERROR(spmm(a, x, y, workspace, nullptr, {32, 48}), ErrorCode::kInvalidArgument,
                     "slots_per_warp a power of two in [32, 65536], got feature_tile 32 and "
                     "slots_per_warp 48");
  EXPECT_FLARE_ERROR(spmm(a, f.dense(5, 1024), f.dense(4, 1024), workspace, nullptr, {1024, 512}),
                     ErrorCode::kInvalidArgument,
                     "schedule must have a feature_tile of at most 512 dividing d = 1024");
  EXPECT_FLARE_ERROR(spmm(a, x, y, f.array(DType::kF32, 1), nullptr), ErrorCode::kInvalidArgument,
                     "workspace must be a contiguous 1-D tensor on cuda:0 of at least");
  f.layout.partitions[0].buckets[0].rows = 1000;
  EXPECT_FLARE_ERROR(spmm(a, x, y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "partition 0's bucket of width 2^0 (1000 rows at row 0, slot 0) lies outside");
}

TEST(SpmmHybKernelSpec, TheCsrSpecsChecksWithMappedRows) {
  std::set<std::string> units;
  for (const jit::KernelSpec& spec : shipped_spmm_hyb_kernel_specs()) {
    EXPECT_EQ(spec.family_header, "spmm_hyb.cuh");
    EXPECT_EQ(spec.entry, "flare_spmm_ell;flare_spmm_csr;flare_spmm_csr_carries");
    units.insert(spec.translation_unit());
  }
  EXPECT_EQ(units.size(), 9u);
  EXPECT_FLARE_ERROR(spmm_hyb_kernel_spec(48, 1), ErrorCode::kUnsupported, "got 48");
  EXPECT_EQ(spmm_hyb_kernel_spec(64, 8, DType::kBF16).label, "spmm hyb bfloat16 d=64 vec=8");
}

class ShippedSpmmHybKernels : public jit::testing::JitTest,
                              public ::testing::WithParamInterface<const char*> {};

TEST_P(ShippedSpmmHybKernels, CompileWithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const std::string arch = GetParam();
  for (const jit::KernelSpec& spec : shipped_spmm_hyb_kernel_specs()) {
    const jit::CompiledKernel compiled = jit::compile(spec, arch);
    ASSERT_EQ(compiled.usage.size(), 3u) << spec.label;
    // 64 registers (4 CTAs an SM) but the ELL kernel of 16-bit rows of 512 (3 CTAs an SM).
    const bool wide = spec.label.find("float16 d=512") != std::string::npos;
    testing::expect_shipped_usage(compiled, spec.label + " on " + arch, wide ? 85 : 64);
    for (const jit::ResourceUsage& usage : compiled.usage)
      EXPECT_EQ(usage.max_threads, kSpmmThreads) << spec.label << " " << usage.entry;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShippedSpmmHybKernels, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare::sparse
