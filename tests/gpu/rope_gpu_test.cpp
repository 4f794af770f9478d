// apply_rope's kernel (kernels/rope_apply.cuh) against the CPU reference (apply_rope on CPU
// tensors): f16 / bf16, both pair layouts, indptr and offsets or pos_ids of int32 and int64,
// rotary_dim of the whole head or part of it, head dims 64 / 128 / 256, GQA, positions up to
// 10^6, empty requests, padded views inside NaN-filled storage (the padding must stay NaN), in
// place against out of place bit for bit, vLLM's cos_sin_cache table (rows clamped), index
// arrays of any values (nothing read or written outside the tensors: gpu_check.sh runs both under
// memcheck), and the GPU-only limits refused before launch. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flare/api/rope.h"
#include "gpu/prefill_test_support.h"
#include "testing/elements.h"
#include "testing/expect_error.h"
#include "testing/random.h"

namespace flare {
namespace {

using prefill_testing::DeviceCopy;
using testing::element_at;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum class Form { kIndptr, kIds32, kIds64 };

// A [nnz, heads, dim] view padded inside NaN storage [nnz, heads + 1, dim + 8], on the host and
// its device copy.
struct Rows {
  HostTensor storage;
  TensorView host;
  DeviceCopy device;
  Rows(DType dtype, int64_t nnz, int64_t heads, int64_t dim, uint64_t seed, bool random)
      : storage(dtype, {nnz, heads + 1, dim + 8}) {
    storage.fill(kNaN);
    host = testing::sub_view(storage, {0, 1, 0}, {nnz, heads, dim});
    if (random) testing::fill_random(host, seed, 2.0f);
    device = DeviceCopy(storage);
  }
  TensorView view() const { return device.view(host); }
  void download() {
    cuda::memcpy_dtoh(storage.data<std::byte>(), device.buffer.data(),
                      static_cast<size_t>(storage.numel()) * dtype_bytes(storage.dtype()));
  }
};

// Requests of these lengths (0 included) at random offsets, as indptr / offsets and as ids.
struct Positions {
  HostTensor indptr, offsets, ids32, ids64;
  DeviceCopy d_indptr, d_offsets, d_ids32, d_ids64;
  explicit Positions(const std::vector<int32_t>& lengths, uint64_t seed)
      : indptr(DType::kI32, {static_cast<int64_t>(lengths.size()) + 1}),
        offsets(DType::kI32, {static_cast<int64_t>(lengths.size())}),
        ids32(DType::kI32, {0}),
        ids64(DType::kI64, {0}) {
    testing::Rng rng(seed);
    int32_t total = 0;
    indptr.data<int32_t>()[0] = 0;
    std::vector<int64_t> ids;
    for (size_t b = 0; b < lengths.size(); ++b) {
      const auto offset = static_cast<int32_t>(rng.uniform_int(0, 1000000));
      offsets.data<int32_t>()[b] = offset;
      for (int32_t t = 0; t < lengths[b]; ++t) ids.push_back(offset + t);
      total += lengths[b];
      indptr.data<int32_t>()[b + 1] = total;
    }
    ids32 = HostTensor(DType::kI32, {total});
    ids64 = HostTensor(DType::kI64, {total});
    for (int32_t t = 0; t < total; ++t) {
      ids32.data<int32_t>()[t] = static_cast<int32_t>(ids[static_cast<size_t>(t)]);
      ids64.data<int64_t>()[t] = ids[static_cast<size_t>(t)];
    }
    d_indptr = DeviceCopy(indptr), d_offsets = DeviceCopy(offsets);
    d_ids32 = DeviceCopy(ids32), d_ids64 = DeviceCopy(ids64);
  }
  RopePositions host(Form form) const {
    if (form == Form::kIndptr) return {indptr.view(), offsets.view(), std::nullopt};
    return {std::nullopt, std::nullopt, form == Form::kIds32 ? ids32.view() : ids64.view()};
  }
  RopePositions device(Form form) const {
    if (form == Form::kIndptr) {
      return {d_indptr.view(indptr.view()), d_offsets.view(offsets.view()), std::nullopt};
    }
    return {std::nullopt, std::nullopt,
            form == Form::kIds32 ? d_ids32.view(ids32.view()) : d_ids64.view(ids64.view())};
  }
};

// Every element of `got` within a few units in the last place of the reference (the GPU's
// float32 angles and rotation against the CPU's float64, each rounded once), padding NaN.
void expect_close(const Rows& got, const Rows& want, const std::string& what) {
  const double ulp = got.storage.dtype() == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.storage.numel(); ++i) {
    const float g = element_at(got.storage.view(), i), w = element_at(want.storage.view(), i);
    const bool ok =
        std::isnan(w) ? std::isnan(g) : std::abs(g - w) <= 2 * ulp * std::max(1.0f, std::abs(w));
    if (!ok && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << w;
  }
  EXPECT_EQ(bad, 0) << what;
}

using Param = std::tuple<DType, bool, Form, int64_t, bool>;  // dtype, interleave, form, D, half

class RopeGpu : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cuda::set_device(0);
    cuda::set_device(0);  // uploads need a current context, whatever ran before
  }
};

TEST_P(RopeGpu, MatchesTheCpuReferenceAndInPlaceEqualsOutOfPlace) {
  const auto [dtype, interleave, form, dim, half] = GetParam();
  const int64_t nnz = 37, q_heads = 8, k_heads = 2;
  const Positions pos({5, 0, 17, 1, 14}, 3);
  Rows q(dtype, nnz, q_heads, dim, 1, true), k(dtype, nnz, k_heads, dim, 2, true);
  Rows q_out(dtype, nnz, q_heads, dim, 0, false), k_out(dtype, nnz, k_heads, dim, 0, false);
  Rows q_ref(dtype, nnz, q_heads, dim, 0, false), k_ref(dtype, nnz, k_heads, dim, 0, false);
  RopeOptions options;
  options.interleave = interleave;
  options.rotary_dim = half ? static_cast<int>(dim / 2) : 0;
  options.rope_theta = 5e5f;
  apply_rope(q.host, k.host, q_ref.host, k_ref.host, pos.host(form), options, nullptr);
  apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), pos.device(form), options, nullptr);
  cuda::device_synchronize();
  q_out.download();
  k_out.download();
  expect_close(q_out, q_ref, "q");
  expect_close(k_out, k_ref, "k");
  // In place: the inputs rotated where they are, bit for bit the out-of-place rows.
  apply_rope(q.view(), k.view(), q.view(), k.view(), pos.device(form), options, nullptr);
  cuda::device_synchronize();
  q.download();
  k.download();
  EXPECT_EQ(std::memcmp(q.storage.data<std::byte>(), q_out.storage.data<std::byte>(),
                        static_cast<size_t>(q.storage.numel()) * dtype_bytes(dtype)),
            0)
      << "q in place";
  EXPECT_EQ(std::memcmp(k.storage.data<std::byte>(), k_out.storage.data<std::byte>(),
                        static_cast<size_t>(k.storage.numel()) * dtype_bytes(dtype)),
            0)
      << "k in place";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, interleave, form, dim, half] = info.param;
  const char* forms[] = {"indptr", "ids32", "ids64"};
  return std::string(dtype_name(dtype)) + (interleave ? "_interleaved_" : "_halves_") +
         forms[static_cast<int>(form)] + "_D" + std::to_string(dim) + (half ? "_half" : "_whole");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RopeGpu,
    ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16), ::testing::Bool(),
                       ::testing::Values(Form::kIndptr, Form::kIds32, Form::kIds64),
                       ::testing::Values(int64_t{64}, int64_t{128}, int64_t{256}),
                       ::testing::Bool()),
    param_name);

// vLLM's table of (cos, sin) rows, both pair layouts, int32 and int64 ids: the GPU against the
// CPU; then positions past the table read its last row (nothing outside it).
TEST(RopeGpuCosSinCache, MatchesTheCpuAndClampsPositionsIntoTheTable) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  constexpr int64_t kRows = 300, kRotary = 64, kNnz = 29;
  HostTensor table = testing::random_tensor(DType::kF32, {kRows, kRotary}, 21);
  const DeviceCopy d_table(table);
  HostTensor ids(DType::kI64, {kNnz});
  testing::Rng rng(22);
  for (int64_t t = 0; t < kNnz; ++t) ids.data<int64_t>()[t] = rng.uniform_int(0, kRows - 1);
  const DeviceCopy d_ids(ids);
  for (const bool interleave : {false, true}) {
    for (const DType dtype : {DType::kF16, DType::kBF16}) {
      Rows q(dtype, kNnz, 6, 128, 23, true), k(dtype, kNnz, 2, 128, 24, true);
      Rows q_out(dtype, kNnz, 6, 128, 0, false), k_out(dtype, kNnz, 2, 128, 0, false);
      Rows q_ref(dtype, kNnz, 6, 128, 0, false), k_ref(dtype, kNnz, 2, 128, 0, false);
      RopeOptions options;
      options.interleave = interleave;
      options.cos_sin_cache = table.view();
      apply_rope(q.host, k.host, q_ref.host, k_ref.host, {std::nullopt, std::nullopt, ids.view()},
                 options, nullptr);
      options.cos_sin_cache = d_table.view(table.view());
      apply_rope(q.view(), k.view(), q_out.view(), k_out.view(),
                 {std::nullopt, std::nullopt, d_ids.view(ids.view())}, options, nullptr);
      cuda::device_synchronize();
      q_out.download();
      k_out.download();
      const std::string what = std::string(dtype_name(dtype)) + (interleave ? " interleaved" : "");
      expect_close(q_out, q_ref, "q " + what);
      expect_close(k_out, k_ref, "k " + what);
    }
  }
  // Positions -5 and 10^9 read rows 0 and kRows - 1: as positions 0 and kRows - 1 on the CPU.
  HostTensor wild(DType::kI32, {2}), tame(DType::kI32, {2});
  wild.data<int32_t>()[0] = -5, wild.data<int32_t>()[1] = 1000000000;
  tame.data<int32_t>()[0] = 0, tame.data<int32_t>()[1] = kRows - 1;
  const DeviceCopy d_wild(wild);
  Rows q(DType::kBF16, 2, 1, 64, 25, true), k(DType::kBF16, 2, 1, 64, 26, true);
  Rows q_out(DType::kBF16, 2, 1, 64, 0, false), k_out(DType::kBF16, 2, 1, 64, 0, false);
  Rows q_ref(DType::kBF16, 2, 1, 64, 0, false), k_ref(DType::kBF16, 2, 1, 64, 0, false);
  RopeOptions options;
  options.cos_sin_cache = table.view();
  apply_rope(q.host, k.host, q_ref.host, k_ref.host, {std::nullopt, std::nullopt, tame.view()},
             options, nullptr);
  options.cos_sin_cache = d_table.view(table.view());
  apply_rope(q.view(), k.view(), q_out.view(), k_out.view(),
             {std::nullopt, std::nullopt, d_wild.view(wild.view())}, options, nullptr);
  cuda::device_synchronize();
  q_out.download();
  expect_close(q_out, q_ref, "clamped rows");
}

TEST(RopeGpuSafety, IndexArraysOfAnyValuesStayInsideTheTensors) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  // indptr falling, negative and past nnz, offsets huge: positions are wrong, nothing else.
  HostTensor indptr(DType::kI32, {4}), offsets(DType::kI32, {3});
  const int32_t bad_indptr[] = {-50, 1000, 3, -7};
  const int32_t bad_offsets[] = {INT32_MAX, -9, 0};
  std::memcpy(indptr.data<int32_t>(), bad_indptr, sizeof(bad_indptr));
  std::memcpy(offsets.data<int32_t>(), bad_offsets, sizeof(bad_offsets));
  const DeviceCopy d_indptr(indptr), d_offsets(offsets);
  Rows q(DType::kBF16, 11, 4, 128, 1, true), k(DType::kBF16, 11, 1, 128, 2, true);
  Rows q_out(DType::kBF16, 11, 4, 128, 0, false), k_out(DType::kBF16, 11, 1, 128, 0, false);
  apply_rope(q.view(), k.view(), q_out.view(), k_out.view(),
             {d_indptr.view(indptr.view()), d_offsets.view(offsets.view()), std::nullopt},
             RopeOptions{}, nullptr);
  cuda::device_synchronize();
  q_out.download();
  for (int64_t i = 0; i < q_out.storage.numel(); ++i) {  // rows written, padding NaN
    const int64_t head = i / 136 % 5;
    EXPECT_EQ(std::isnan(element_at(q_out.storage.view(), i)), head == 0 || i % 136 >= 128) << i;
  }
}

TEST(RopeGpuSafety, GpuLimitsAreRefusedBeforeLaunch) {
  SKIP_WITHOUT_GPU();
  cuda::set_device(0);
  Rows q(DType::kF16, 3, 2, 64, 1, true), k(DType::kF16, 3, 1, 64, 2, true);
  HostTensor ids(DType::kI32, {3});
  for (int32_t i = 0; i < 3; ++i) ids.data<int32_t>()[i] = i;
  const DeviceCopy d_ids(ids);
  const RopePositions positions{std::nullopt, std::nullopt, d_ids.view(ids.view())};
  RopeOptions eight;
  eight.rotary_dim = 8;  // pairs rotary_dim / 2 apart take 16 dims at a time
  EXPECT_FLARE_ERROR(apply_rope(q.view(), k.view(), q.view(), k.view(), positions, eight, nullptr),
                     ErrorCode::kUnsupported, "rotary_dim of 16");
  TensorView shifted = q.view();  // one element in: not 16-byte aligned
  shifted.data = static_cast<std::byte*>(shifted.data) + 2;
  shifted.shape[2] = 48;
  TensorView k_short = k.view();
  k_short.shape[2] = 48;
  EXPECT_FLARE_ERROR(
      apply_rope(shifted, k_short, shifted, k_short, positions, RopeOptions{}, nullptr),
      ErrorCode::kUnsupported, "16-byte aligned pointer");
  TensorView other = q.view();
  other.strides[1] = 64;  // the same start, other strides
  EXPECT_FLARE_ERROR(
      apply_rope(q.view(), k.view(), other, k.view(), positions, RopeOptions{}, nullptr),
      ErrorCode::kInvalidArgument, "q_out starts where q does but with other strides");
}

}  // namespace
}  // namespace flare
