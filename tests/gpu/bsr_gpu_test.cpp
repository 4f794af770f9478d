// The GPU SpMM over "BSR + CSR remainder" with tensor cores (flare/sparse/bsr_gpu.h;
// kernels/spmm_bsr.cuh) against the float64 CPU reference: block-structured random matrices
// (dense 16 x 16 regions plus scattered nonzeros; rows and columns not multiples of 16), every
// min_fill split, feature sizes 32-1024, padded strides, float16 and bfloat16, and block
// columns outside the matrix (they contribute nothing; nothing is read outside the tensors).
// Outputs and workspace NaN-poisoned first (tests/gpu/spmm_test_support.h). Skips without a
// CUDA device.
#include "flare/sparse/bsr_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <vector>

#include "flare/jit/cuda_sync.h"
#include "gpu/spmm_test_support.h"
#include "testing/random.h"

namespace flare {
namespace {

using namespace spmm_testing;

// rows x cols with block_share of its 16 x 16 block positions 80% full and about 1% of the
// other entries set.
sparse::CsrStorage block_structured(int64_t rows, int64_t cols, double block_share, uint64_t seed) {
  testing::Rng rng(seed);
  const int64_t block_rows = (rows + 15) / 16, block_cols = (cols + 15) / 16;
  std::vector<bool> dense(static_cast<size_t>(block_rows * block_cols));
  for (size_t b = 0; b < dense.size(); ++b) dense[b] = rng.uniform() < block_share;
  sparse::CsrStorage a;
  a.rows = rows;
  a.cols = cols;
  a.indptr.push_back(0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const bool in_dense = dense[static_cast<size_t>((r / 16) * block_cols + c / 16)];
      if (rng.uniform() < (in_dense ? 0.8 : 0.01)) {
        a.indices.push_back(static_cast<int32_t>(c));
        a.values.push_back(static_cast<float>(rng.normal()));
      }
    }
    a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
  }
  return a;
}

struct DeviceBsr {
  sparse::BsrGpuLayout layout;
  DeviceCopy indptr, block_col, values, rest_rows, rest_indptr, rest_columns, rest_values;

  sparse::BsrGpu view() const {
    return {&layout,        indptr.view,      block_col.view,    values.view,
            rest_rows.view, rest_indptr.view, rest_columns.view, rest_values.view};
  }
};

DeviceBsr upload(sparse::BsrGpuLayout layout, const HostTensor& values) {
  DeviceBsr d;
  d.indptr = to_device(int32_tensor(layout.indptr));
  d.block_col = to_device(int32_tensor(layout.block_col));
  d.values = gathered(layout.source, values);
  d.rest_rows = to_device(int32_tensor(layout.rest_rows));
  d.rest_indptr = to_device(int32_tensor(layout.rest_indptr));
  d.rest_columns = to_device(int32_tensor(layout.rest_columns));
  d.rest_values = gathered(layout.rest_source, values);
  d.layout = std::move(layout);
  return d;
}

using LayoutEdit = std::function<void(sparse::BsrGpuLayout&)>;

SpmmRunner bsr_runner(const sparse::CsrStorage& a, double min_fill, DType dtype,
                      const LayoutEdit& edit = {}) {
  return [&a, min_fill, dtype, edit](const sparse::Csr&, const TensorView& x, const TensorView& y,
                                     const TensorView& w) {
    sparse::BsrGpuLayout layout = sparse::bsr_gpu_layout(a.view(), min_fill);
    if (edit) edit(layout);
    ASSERT_LE(sparse::bsr_spmm_workspace_bytes(layout, x.shape[1]),
              static_cast<size_t>(w.shape[0]));
    const DeviceBsr d = upload(std::move(layout), rounded_to(float_tensor(a.values), dtype));
    sparse::spmm(d.view(), x, y, w, nullptr);
    cuda::device_synchronize();  // before the arrays are freed
  };
}

TEST(BsrGpu, MatchesTheReferenceForEveryFillAndFeatureSize) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = block_structured(300, 257, 0.3, 51);
  uint64_t seed = 800;
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const double min_fill : {0.0, 0.5, 1.0}) {
      SCOPED_TRACE(::testing::Message() << "min_fill " << min_fill);
      // The block kernel rounds Y to 16 bits; the remainder adds to it: one more rounding (and
      // the tensor cores' float32 sums, far below it).
      for (const int64_t d : {32, 64, 128, 512, 1024})
        check_spmm(a, a, d, d, seed++, dtype, bsr_runner(a, min_fill, dtype), 1);
      check_spmm(a, a, 64, 72, seed++, dtype, bsr_runner(a, min_fill, dtype), 1);  // padded rows
    }
  }
  // Every block dense and every row in blocks; no blocks at all.
  const sparse::CsrStorage full = block_structured(64, 48, 1.0, 52);
  check_spmm(full, full, 32, 32, seed++, DType::kBF16, bsr_runner(full, 0.0, DType::kBF16), 1);
  const sparse::CsrStorage scattered = block_structured(100, 100, 0.0, 53);
  check_spmm(scattered, scattered, 32, 32, seed++, DType::kBF16,
             bsr_runner(scattered, 0.9, DType::kBF16), 1);
}

TEST(BsrGpu, BlockColumnsOutsideTheMatrixContributeNothing) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = block_structured(96, 80, 0.5, 54);
  sparse::CsrStorage reference = a;
  const sparse::BsrGpuLayout clean = sparse::bsr_gpu_layout(a.view(), 0.0);
  ASSERT_GE(clean.blocks(), 3);
  const std::vector<int64_t> bad = {0, clean.blocks() / 2, clean.blocks() - 1};
  for (const int64_t b : bad) {
    for (int s = 0; s < 256; ++s) {
      const int64_t e = clean.source[static_cast<size_t>(b * 256 + s)];
      if (e >= 0) reference.values[static_cast<size_t>(e)] = 0.0f;
    }
  }
  const LayoutEdit corrupt = [&bad](sparse::BsrGpuLayout& layout) {
    layout.block_col[static_cast<size_t>(bad[0])] = -1;
    layout.block_col[static_cast<size_t>(bad[1])] = 5;  // columns 80-95: outside 80 columns
    layout.block_col[static_cast<size_t>(bad[2])] = 1 << 30;
  };
  check_spmm(a, reference, 64, 64, 900, DType::kBF16, bsr_runner(a, 0.0, DType::kBF16, corrupt), 1);
}

}  // namespace
}  // namespace flare
