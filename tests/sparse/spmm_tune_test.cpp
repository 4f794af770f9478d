// The SpMM schedules and the tuner's host side without a GPU (flare/sparse/spmm_gpu.h,
// spmm_tune.h): the candidates per feature size, the structure hash, the cache key, the disk cache
// (round trip, malformed and stale entries), and the tuner's argument errors. The timed search
// itself runs in tests/gpu/spmm_gpu_test.cpp.
#include "flare/sparse/spmm_tune.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "jit/jit_test_support.h"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"

namespace flare::sparse {
namespace {

using Schedules = std::vector<SpmmSchedule>;

TEST(SpmmSchedules, TilesOfPowersOfTwoTimes32ThatDivideDEachWithThreeChunkSizes) {
  EXPECT_EQ(default_spmm_schedule(512), (SpmmSchedule{512, 512}));
  EXPECT_EQ(default_spmm_schedule(32), (SpmmSchedule{32, 128}));
  EXPECT_EQ(spmm_schedules(512),
            (Schedules{{512, 512}, {512, 1024}, {512, 2048}, {256, 256}, {256, 512}, {256, 1024},
                       {128, 128}, {128, 256}, {128, 512}, {64, 128}, {64, 256}, {64, 512},
                       {32, 128}, {32, 256}, {32, 512}}));
  EXPECT_EQ(spmm_schedules(96),
            (Schedules{{96, 128}, {96, 256}, {96, 512}, {32, 128}, {32, 256}, {32, 512}}));
  EXPECT_EQ(spmm_schedules(32), (Schedules{{32, 128}, {32, 256}, {32, 512}}));
  EXPECT_EQ(spmm_schedules(8), (Schedules{{8, 128}, {8, 256}, {8, 512}}));
  EXPECT_FLARE_ERROR(spmm_schedules(0), ErrorCode::kInvalidArgument, "d must be positive, got 0");
}

TEST(CsrStructureHash, DependsOnTheStructureOnly) {
  sparse::CsrStorage a = sparse_testing::random_csr(200, 150, 0.05, 0.2, 3);
  sparse::CsrStorage same = a;
  for (float& v : same.values) v *= 2.0f;  // values do not count
  const uint64_t hash = csr_structure_hash(a.view());
  EXPECT_EQ(csr_structure_hash(same.view()), hash);
  sparse::CsrStorage moved = a;
  moved.indices[moved.indices.size() / 2] ^= 1;  // one column
  EXPECT_NE(csr_structure_hash(moved.view()), hash);
  sparse::CsrStorage wider = a;
  wider.cols += 1;  // the shape
  EXPECT_NE(csr_structure_hash(wider.view()), hash);
  sparse::CsrStorage shifted = a;  // a nonzero moved between rows: indptr alone differs
  ASSERT_GT(shifted.indptr[1], shifted.indptr[0]);
  shifted.indptr[1] -= 1;
  EXPECT_NE(csr_structure_hash(shifted.view()), hash);
  Csr bad = a.view();
  bad.indices.dtype = DType::kI64;
  EXPECT_FLARE_ERROR(csr_structure_hash(bad), ErrorCode::kInvalidArgument,
                     "A.indices must be a contiguous int32 1-D tensor");
}

TEST(SpmmTuningKey, NamesTheStructureTheFeatureSizeTheDtypeAndTheGpu) {
  const std::string key = spmm_tuning_key(0x1234, 128, DType::kBF16, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(key.rfind("0000000000001234-d128-bfloat16-", 0), 0u) << key;
  EXPECT_NE(spmm_tuning_key(0x1234, 128, DType::kBF16, "NVIDIA H200"), key);
  EXPECT_NE(spmm_tuning_key(0x1234, 64, DType::kBF16, "NVIDIA H100 80GB HBM3"), key);
  EXPECT_NE(spmm_tuning_key(0x1235, 128, DType::kBF16, "NVIDIA H100 80GB HBM3"), key);
}

class SpmmTuningCache : public jit::testing::JitTest {};

TEST_F(SpmmTuningCache, RoundTripsAndRejectsMalformedOrStaleEntries) {
  const std::string key = spmm_tuning_key(42, 512, DType::kF32, "test gpu");
  EXPECT_FALSE(read_spmm_tuning(key).has_value());
  write_spmm_tuning(key, {128, 256});
  ASSERT_TRUE(read_spmm_tuning(key).has_value());
  EXPECT_EQ(*read_spmm_tuning(key), (SpmmSchedule{128, 256}));
  const std::filesystem::path path = std::filesystem::path(cache_dir()) / "spmm-tuning" / key;
  ASSERT_TRUE(std::filesystem::exists(path));
  for (const char* contents :
       {"garbage", "spmm-tuning v0 128 256\n", "spmm-tuning v1 0 256\n", "spmm-tuning v1 128\n"}) {
    std::ofstream(path) << contents;
    EXPECT_FALSE(read_spmm_tuning(key).has_value()) << contents;
  }
}

TEST_F(SpmmTuningCache, FormatChoicesRoundTripApartFromSchedules) {
  const std::string key = spmm_tuning_key(42, 512, DType::kF32, "test gpu");
  EXPECT_FALSE(read_spmm_format(key).has_value());
  write_spmm_tuning(key, {128, 256});  // a schedule under the same key: another file
  EXPECT_FALSE(read_spmm_format(key).has_value());
  write_spmm_format(key, "hyb:4:6");
  EXPECT_EQ(read_spmm_format(key).value_or(""), "hyb:4:6");
  EXPECT_EQ(*read_spmm_tuning(key), (SpmmSchedule{128, 256}));
  EXPECT_FLARE_ERROR(write_spmm_format(key, "hyb(4, 6)"), ErrorCode::kInvalidArgument,
                     "the format name must be 1-64 letters, digits, ':' or '_', got 'hyb(4, 6)'");
  const std::filesystem::path path =
      std::filesystem::path(cache_dir()) / "spmm-tuning" / ("format-" + key);
  for (const char* contents : {"garbage", "spmm-format v0 csr\n", "spmm-format v1\n",
                               "spmm-format v1 ../x\n"}) {
    std::ofstream(path) << contents;
    EXPECT_FALSE(read_spmm_format(key).has_value()) << contents;
  }
}

TEST_F(SpmmTuningCache, TuningNeedsCudaTensors) {
  const sparse::CsrStorage a = sparse_testing::random_csr(4, 4, 0.5, 0.0, 1);
  std::vector<float> x(4 * 32), y(4 * 32);
  std::vector<uint8_t> scratch(spmm_workspace_bytes(4, static_cast<int64_t>(a.indices.size()), 32));
  const TensorView xv = TensorView::contiguous(x.data(), DType::kF32, {4, 32}, Device::cpu());
  const TensorView yv = TensorView::contiguous(y.data(), DType::kF32, {4, 32}, Device::cpu());
  const TensorView wv = TensorView::contiguous(
      scratch.data(), DType::kU8, {static_cast<int64_t>(scratch.size())}, Device::cpu());
  EXPECT_FLARE_ERROR(tune_spmm(a.view(), xv, yv, wv, nullptr), ErrorCode::kInvalidArgument,
                     "x must be a CUDA tensor");
}

}  // namespace
}  // namespace flare::sparse
