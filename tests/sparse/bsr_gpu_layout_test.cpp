// The tensor-core BSR SpMM's host side without a GPU (flare/sparse/bsr_gpu.h): the device
// layout of bsr_split(a, 16, 16, min_fill) (every nonzero in exactly one slot), the argument
// errors raised before any launch, and the block kernel's compile for sm_80 and sm_90a (0 spills).
#include <gtest/gtest.h>

#include <vector>

#include "flare/sparse/bsr_gpu.h"
#include "jit/jit_test_support.h"
#include "kernels/spmm_bsr.cuh"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"

namespace flare::sparse {
namespace {

// 40 x 40: rows 0-15 fill block (0, 0) completely; row 20 holds one nonzero at column 33.
CsrStorage two_regions() {
  CsrStorage a;
  a.rows = a.cols = 40;
  a.indptr.push_back(0);
  for (int r = 0; r < 40; ++r) {
    if (r < 16) {
      for (int c = 0; c < 16; ++c) a.indices.push_back(c);
    } else if (r == 20) {
      a.indices.push_back(33);
    }
    a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
  }
  a.values.assign(a.indices.size(), 1.0f);
  return a;
}

TEST(BsrGpuLayout, DenseBlocksGoToTheTensorCoresTheRestToTheRemainder) {
  const CsrStorage a = two_regions();
  const BsrGpuLayout split = bsr_gpu_layout(a.view(), 0.5);
  EXPECT_EQ(split.block_rows, 3);
  EXPECT_EQ(split.indptr, (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(split.block_col, (std::vector<int32_t>{0}));
  ASSERT_EQ(split.source.size(), 256u);
  for (int s = 0; s < 256; ++s) EXPECT_EQ(split.source[static_cast<size_t>(s)], s);
  EXPECT_EQ(split.rest_rows, (std::vector<int32_t>{20}));
  EXPECT_EQ(split.rest_indptr, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(split.rest_columns, (std::vector<int32_t>{33}));
  EXPECT_EQ(split.rest_source, (std::vector<int64_t>{256}));
  EXPECT_DOUBLE_EQ(split.padding_ratio(), 1.0);
  const BsrGpuLayout all_blocks = bsr_gpu_layout(a.view(), 0.0);
  EXPECT_EQ(all_blocks.block_col, (std::vector<int32_t>{0, 2}));  // row 20's block (1, 2)
  EXPECT_EQ(all_blocks.indptr, (std::vector<int32_t>{0, 1, 2, 2}));
  EXPECT_TRUE(all_blocks.rest_rows.empty());
  EXPECT_DOUBLE_EQ(all_blocks.padding_ratio(), 512.0 / 257.0);
}

TEST(BsrGpuLayout, EveryNonzeroLiesInOneSlot) {
  const CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 61);
  for (const double min_fill : {0.0, 0.01, 0.2, 1.0}) {
    const BsrGpuLayout layout = bsr_gpu_layout(a.view(), min_fill);
    std::vector<int> seen(a.indices.size(), 0);
    for (const int64_t e : layout.source) {
      if (e >= 0) ++seen[static_cast<size_t>(e)];
    }
    for (const int64_t e : layout.rest_source) ++seen[static_cast<size_t>(e)];
    for (const int count : seen) ASSERT_EQ(count, 1) << "min_fill " << min_fill;
    EXPECT_EQ(layout.indptr.size(), static_cast<size_t>(layout.block_rows + 1));
  }
  EXPECT_FLARE_ERROR(bsr_gpu_layout(a.view(), 1.5), ErrorCode::kInvalidArgument,
                     "min_fill must be in [0, 1], got 1.5");
}

// Views of host memory labelled as on CUDA device 0: the checks read only their metadata and
// throw before anything is launched.
struct FakeDeviceBsr {
  CsrStorage a = two_regions();
  BsrGpuLayout layout = bsr_gpu_layout(a.view(), 0.5);
  alignas(16) std::vector<uint16_t> halves = std::vector<uint16_t>(64 * 1024, 0);
  std::vector<int32_t> ints = std::vector<int32_t>(1024, 0);

  TensorView array(DType dtype, size_t size) {
    void* data = dtype == DType::kI32 ? static_cast<void*>(ints.data()) : halves.data();
    return TensorView::contiguous(data, dtype, {static_cast<int64_t>(size)}, Device::cuda(0));
  }
  BsrGpu view(DType dtype = DType::kBF16) {
    return {&layout,
            array(DType::kI32, layout.indptr.size()),
            array(DType::kI32, layout.block_col.size()),
            array(dtype, layout.source.size()),
            array(DType::kI32, layout.rest_rows.size()),
            array(DType::kI32, layout.rest_indptr.size()),
            array(DType::kI32, layout.rest_columns.size()),
            array(dtype, layout.rest_columns.size())};
  }
  TensorView dense(int64_t rows, int64_t d, DType dtype = DType::kBF16) {
    return TensorView::contiguous(halves.data(), dtype, {rows, d}, Device::cuda(0));
  }
};

TEST(BsrGpuArguments, ErrorsNameTheArgumentBeforeAnyLaunch) {
  FakeDeviceBsr f;
  const TensorView x = f.dense(40, 32), y = f.dense(40, 32);
  const TensorView workspace = f.array(DType::kBF16, 8 * 1024);
  EXPECT_FLARE_ERROR(spmm(BsrGpu{}, x, y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "A.layout is null");
  EXPECT_FLARE_ERROR(spmm(f.view(DType::kF32), f.dense(40, 32, DType::kF32),
                          f.dense(40, 32, DType::kF32), workspace, nullptr),
                     ErrorCode::kUnsupported, "takes float16 or bfloat16 x, got float32");
  EXPECT_FLARE_ERROR(spmm(f.view(), f.dense(40, 16), f.dense(40, 16), workspace, nullptr),
                     ErrorCode::kUnsupported, "positive multiples of 32, got 16");
  TensorView strided = f.dense(40, 32);
  strided.strides[0] = 36;  // 72-byte rows
  EXPECT_FLARE_ERROR(spmm(f.view(), strided, y, workspace, nullptr), ErrorCode::kUnsupported,
                     "x and y must be 16-byte aligned with row strides of multiples of 16 bytes");
  BsrGpu a = f.view();
  a.values = f.array(DType::kF16, f.layout.source.size());
  EXPECT_FLARE_ERROR(spmm(a, x, y, workspace, nullptr), ErrorCode::kInvalidArgument,
                     "A.values must be a contiguous bfloat16 [256] tensor");
  EXPECT_FLARE_ERROR(spmm(f.view(), x, y, f.array(DType::kBF16, 1), nullptr),
                     ErrorCode::kInvalidArgument, "workspace must be a contiguous 1-D tensor");
  EXPECT_FLARE_ERROR(spmm_bsr_kernel_spec(DType::kF32), ErrorCode::kUnsupported,
                     "takes float16 or bfloat16, got float32");
}

class ShippedSpmmBsrKernels : public jit::testing::JitTest,
                              public ::testing::WithParamInterface<const char*> {};

TEST_P(ShippedSpmmBsrKernels, CompileWithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  for (const jit::KernelSpec& spec : shipped_spmm_bsr_kernel_specs()) {
    const jit::CompiledKernel compiled = jit::compile(spec, GetParam());
    ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
    // 16 float32 sums, the next block's loads in flight: 64 registers on both archs.
    testing::expect_shipped_usage(compiled, spec.label + " on " + GetParam(), 80);
    EXPECT_EQ(compiled.usage[0].max_threads, kSpmmBsrThreads) << spec.label;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShippedSpmmBsrKernels, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare::sparse
