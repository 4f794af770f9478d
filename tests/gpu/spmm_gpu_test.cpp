// The GPU SpMM and SDDMM (flare/sparse/spmm_gpu.h, sddmm_gpu.h; kernels/spmm_csr.cuh,
// sddmm_csr.cuh) against the float64 CPU references: random CSR matrices with empty rows and one
// row holding 30% of the nonzeros, a single-column matrix, feature sizes 32-512, padded row
// strides (every vector width), and column indices outside [0, cols) (they contribute nothing,
// nothing is read outside the tensors). Outputs are NaN-poisoned first. Skips without a CUDA
// device.
#include "flare/sparse/spmm_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <vector>

#include "flare/jit/cuda_sync.h"
#include "flare/sparse/sddmm_gpu.h"
#include "flare/sparse/spmm_tune.h"
#include "gpu/decode_test_support.h"
#include "gpu/spmm_test_support.h"
#include "jit/jit_test_support.h"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"
#include "testing/random.h"

namespace flare {
namespace {

using gpu_testing::DeviceCopy;
using gpu_testing::to_device;
using namespace spmm_testing;

TEST(SpmmGpu, MatchesTheFloat64ReferenceAtEveryFeatureSizeAndStride) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 11);
  for (const int64_t d : {32, 64, 128, 256, 512}) check_spmm(a, a, d, d, static_cast<uint64_t>(d));
  check_spmm(a, a, 128, 132, 3);  // padded rows: 16-byte vectors still
  check_spmm(a, a, 64, 66, 4);    // 8-byte vectors
  check_spmm(a, a, 32, 33, 5);    // single floats
  const sparse::CsrStorage column = sparse_testing::random_csr(1000, 1, 0.5, 0.0, 12);
  check_spmm(column, column, 64, 64, 6);
  const sparse::CsrStorage wide = sparse_testing::random_csr(40, 5000, 0.2, 0.3, 13);
  check_spmm(wide, wide, 512, 512, 7);
  // Feature sizes below 32: a warp takes 32 / (d / vec) nonzeros a load.
  for (const int64_t d : {1, 2, 4, 8, 16}) check_spmm(a, a, d, d, static_cast<uint64_t>(40 + d));
  check_spmm(a, a, 16, 18, 8);  // 8-byte vectors, 8 lanes a row
}

TEST(SpmmGpu, SixteenBitOperandsMatchTheReferenceWithOneRounding) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 14);
  uint64_t seed = 60;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const int64_t d : {8, 32, 64, 128, 256, 512}) check_spmm(a, a, d, d, seed++, dtype);
    check_spmm(a, a, 128, 132, seed++, dtype);  // 8-byte vectors
    check_spmm(a, a, 64, 66, seed++, dtype);    // 4-byte vectors
    check_spmm(a, a, 32, 33, seed++, dtype);    // single elements
  }
}

// A CSR of the given row lengths (columns 0, 1, ...; random values).
TEST(SpmmGpu, RowsAroundChunkBoundaries) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  std::vector<std::vector<int64_t>> patterns = {
      {0, 0, 128, 0, 128, 0, 0, 256, 1, 127, 0, 0},
      {5, 1000, 0, 3, 2000, 120, 8, 0},
      {0, 3000},
      {3000, 0, 0},
      {7},
      {0, 0, 0},
      {511, 1, 0, 512, 513, 0, 1},
  };
  std::vector<int64_t> sparse_tail(1500, 0);  // 1,500 rows, a few nonzeros among them
  for (size_t r = 0; r < sparse_tail.size(); r += 97)
    sparse_tail[r] = 1 + static_cast<int64_t>(r % 5);
  sparse_tail[700] = 900;
  patterns.push_back(sparse_tail);
  uint64_t seed = 100;
  for (const auto& lengths : patterns) {
    const sparse::CsrStorage a = rows_of_lengths(lengths, 3000, seed++);
    for (const int64_t d : {32, 128, 512}) check_spmm(a, a, d, d, seed++);
    check_spmm(a, a, 32, 32, seed++, DType::kBF16);  // heads and carries of 16-bit rows
    check_spmm(a, a, 512, 512, seed++, DType::kF16);
  }
}

// Every candidate schedule (feature tiles, chunk sizes) gives A X, on padded rows too.
TEST(SpmmGpu, EveryScheduleMatchesTheReference) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 15);
  uint64_t seed = 80;
  for (const auto& [d, stride, dtype] : {std::tuple<int64_t, int64_t, DType>{512, 520, DType::kF32},
                                         {96, 96, DType::kF32},
                                         {256, 256, DType::kBF16}}) {
    for (const sparse::SpmmSchedule& schedule : sparse::spmm_schedules(d)) {
      SCOPED_TRACE(::testing::Message()
                   << "tile " << schedule.feature_tile << " chunk " << schedule.chunk_items);
      check_spmm(a, a, d, stride, seed++, dtype,
                 [&](const sparse::Csr& m, const TensorView& x, const TensorView& y,
                     const TensorView& w) { sparse::spmm(m, x, y, w, nullptr, schedule); });
    }
  }
}

class SpmmGpuTune : public jit::testing::JitTest {};

// The search times every candidate, leaves A X in y and caches its choice; the second call reads
// the cache. Schedules outside the ranges and tuning under capture are refused.
TEST_F(SpmmGpuTune, TimesEveryCandidateThenReadsTheCache) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(3000, 2000, 0.02, 0.3, 16);
  const int64_t d = 128;
  sparse::SpmmTuning first, second;
  check_spmm(a, a, d, d, 90, DType::kF32,
             [&](const sparse::Csr& m, const TensorView& x, const TensorView& y,
                 const TensorView& w) { first = sparse::tune_spmm(m, x, y, w, nullptr); });
  EXPECT_FALSE(first.from_cache);
  const std::vector<sparse::SpmmSchedule> candidates = sparse::spmm_schedules(d);
  ASSERT_EQ(first.timings.size(), candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    EXPECT_EQ(first.timings[i].first, candidates[i]);
    EXPECT_GT(first.timings[i].second, 0.0);
  }
  EXPECT_NE(std::find(candidates.begin(), candidates.end(), first.schedule), candidates.end());
  check_spmm(
      a, a, d, d, 91, DType::kF32,
      [&](const sparse::Csr& m, const TensorView& x, const TensorView& y, const TensorView& w) {
        second = sparse::tune_spmm(m, x, y, w, nullptr);
        EXPECT_FLARE_ERROR(sparse::spmm(m, x, y, w, nullptr, {48, 128}),
                           ErrorCode::kInvalidArgument,
                           "schedule must have a feature_tile dividing d = 128");
        EXPECT_FLARE_ERROR(sparse::spmm(m, x, y, w, nullptr, {128, 16}),
                           ErrorCode::kInvalidArgument, "chunk_items in [32, 2^20]");
        const cuda::OwnedStream owned;
        EXPECT_FLARE_ERROR(
            cuda::Graph(owned.get(), [&] { sparse::tune_spmm(m, x, y, w, owned.get()); }),
            ErrorCode::kInvalidArgument, "cannot run while `stream` is captured");
      });
  EXPECT_TRUE(second.from_cache);
  EXPECT_TRUE(second.timings.empty());
  EXPECT_EQ(second.schedule, first.schedule);
}

TEST(SpmmGpu, ColumnsOutsideTheMatrixContributeNothing) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  sparse::CsrStorage a = sparse_testing::random_csr(64, 100, 0.2, 0.0, 21);
  ASSERT_GE(a.indices.size(), 3u);
  sparse::CsrStorage reference = a;
  for (const size_t e : {size_t{0}, a.indices.size() / 2, a.indices.size() - 1}) {
    a.indices[e] = e == 0 ? -5 : static_cast<int32_t>(a.cols + 1000 * e);
    reference.values[e] = 0.0f;  // the reference keeps a valid column, with no weight
  }
  check_spmm(a, reference, 128, 128, 22);
}

// out = (Q K^T) at A's pattern on the GPU (Q and K with rows of `stride` floats, d used)
// against the float64 reference; nonzeros listed in `outside` hold a column outside the matrix
// and must give 0.
void check_sddmm(const sparse::CsrStorage& a, const sparse::CsrStorage& reference, int64_t d,
                 int64_t stride, uint64_t seed, const std::vector<size_t>& outside = {},
                 DType dtype = DType::kF32) {
  SCOPED_TRACE(::testing::Message()
               << a.rows << " x " << a.cols << " nnz " << a.indices.size() << " d " << d
               << " stride " << stride << " " << dtype_name(dtype));
  const auto nnz = static_cast<int64_t>(a.indices.size());
  HostTensor q_random(DType::kF32, {std::max<int64_t>(a.rows, 1), stride});
  HostTensor k_random(DType::kF32, {std::max<int64_t>(a.cols, 1), stride});
  testing::fill_random(q_random.view(), seed);
  testing::fill_random(k_random.view(), seed + 1);
  // The operands rounded to dtype (what the GPU reads) and, as float32, the reference's.
  const HostTensor q_stored = rounded_to(q_random, dtype), k_stored = rounded_to(k_random, dtype);
  const HostTensor q_storage = widened(q_stored), k_storage = widened(k_stored);
  // The reference runs on `reference`: A's pattern before its `outside` columns were moved out
  // of the matrix (their results are checked to be 0 instead).
  const sparse::CsrStorage& valid = reference;
  HostTensor expected(DType::kF32, {nnz}), l1(DType::kF32, {nnz});
  sparse::sddmm_reference(
      valid.view(), rows_view(q_storage.data<float>(), a.rows, d, stride, Device::cpu()),
      rows_view(k_storage.data<float>(), a.cols, d, stride, Device::cpu()), expected.view());
  const auto absolute = [](const HostTensor& t) {
    HostTensor out(DType::kF32, {t.view().shape[0], t.view().shape[1]});
    for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = std::abs(t.data<float>()[i]);
    return out;
  };
  const HostTensor q_abs = absolute(q_storage), k_abs = absolute(k_storage);
  sparse::sddmm_reference(
      valid.view(), rows_view(q_abs.data<float>(), a.rows, d, stride, Device::cpu()),
      rows_view(k_abs.data<float>(), a.cols, d, stride, Device::cpu()), l1.view());

  const HostTensor indptr = int32_tensor(a.indptr), indices = int32_tensor(a.indices);
  HostTensor out(dtype, {std::max<int64_t>(nnz, 1)});
  out.fill(std::nanf(""));
  const DeviceCopy indptr_d = to_device(indptr), indices_d = to_device(indices);
  const DeviceCopy q_d = to_device(q_stored), k_d = to_device(k_stored), out_d = to_device(out);
  sparse::Csr a_d;
  a_d.rows = a.rows;
  a_d.cols = a.cols;
  a_d.indptr = indptr_d.view;
  a_d.indices = indices_d.view;
  TensorView out_view = out_d.view;
  out_view.shape[0] = nnz;
  TensorView q_view = rows_view(q_d.buffer.data(), a.rows, d, stride, Device::cuda(0));
  TensorView k_view = rows_view(k_d.buffer.data(), a.cols, d, stride, Device::cuda(0));
  q_view.dtype = k_view.dtype = dtype;
  sparse::sddmm(a_d, q_view, k_view, out_view, nullptr);
  cuda::device_synchronize();
  HostTensor back(dtype, {std::max<int64_t>(nnz, 1)});
  cuda::memcpy_dtoh(back.data<std::byte>(), out_d.buffer.data(),
                    static_cast<size_t>(back.numel()) * dtype_bytes(dtype));
  double worst = 0.0;
  for (int64_t e = 0; e < nnz; ++e) {
    const float got = back.get(e);
    ASSERT_FALSE(std::isnan(got)) << "nonzero " << e << " unwritten";
    if (std::find(outside.begin(), outside.end(), static_cast<size_t>(e)) != outside.end()) {
      EXPECT_EQ(got, 0.0f) << "nonzero " << e << " has a column outside the matrix";
      continue;
    }
    // float32 dot products of d terms (fma chains, then a shuffle tree): (d + 8) roundoffs,
    // then the output's rounding.
    const double want = expected.data<float>()[e];
    const double bound = (static_cast<double>(d) + 8.0) * 0x1p-24 * l1.data<float>()[e] +
                         output_roundoff(dtype) * std::abs(want) + 1e-30;
    worst = std::max(worst, std::abs(got - want) / bound);
  }
  EXPECT_LE(worst, 1.0);
}

TEST(SddmmGpu, MatchesTheFloat64ReferenceAtEveryFeatureSizeAndStride) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 31);
  for (const int64_t d : {32, 64, 128, 256, 512}) check_sddmm(a, a, d, d, static_cast<uint64_t>(d));
  check_sddmm(a, a, 128, 132, 3);  // padded rows: 16-byte vectors still
  check_sddmm(a, a, 64, 66, 4);    // 8-byte vectors
  check_sddmm(a, a, 32, 33, 5);    // single floats
  const sparse::CsrStorage column = sparse_testing::random_csr(1000, 1, 0.5, 0.0, 32);
  check_sddmm(column, column, 64, 64, 6);
  const sparse::CsrStorage wide = sparse_testing::random_csr(40, 5000, 0.2, 0.3, 33);
  check_sddmm(wide, wide, 512, 512, 7);
  for (const int64_t d : {1, 2, 4, 8, 16}) check_sddmm(a, a, d, d, static_cast<uint64_t>(40 + d));
}

TEST(SddmmGpu, SixteenBitOperandsMatchTheReferenceWithOneRounding) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage a = sparse_testing::random_csr(300, 257, 0.05, 0.3, 34);
  uint64_t seed = 70;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const int64_t d : {8, 32, 64, 128, 256, 512}) check_sddmm(a, a, d, d, seed++, {}, dtype);
    check_sddmm(a, a, 128, 132, seed++, {}, dtype);  // 8-byte vectors
    check_sddmm(a, a, 32, 33, seed++, {}, dtype);    // single elements
  }
}

TEST(SddmmGpu, ColumnsOutsideTheMatrixGiveZeroAndReadNothing) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const sparse::CsrStorage reference = sparse_testing::random_csr(64, 100, 0.2, 0.0, 41);
  sparse::CsrStorage a = reference;
  ASSERT_GE(a.indices.size(), 3u);
  const std::vector<size_t> outside = {0, a.indices.size() / 2, a.indices.size() - 1};
  for (const size_t e : outside) {
    a.indices[e] = e == 0 ? -5 : static_cast<int32_t>(a.cols + 1000 * e);
  }
  check_sddmm(a, reference, 128, 128, 42, outside);
}

}  // namespace
}  // namespace flare
