// apply_rope on CPU tensors (the reference of the GPU path): rotations against values written out
// by hand, both pair layouts, a partial rotary_dim, Llama 3.1's frequencies, both position forms,
// in place, and every argument error; the kernel specs, and their compiles for sm_80 and sm_90a
// (no spills, no local memory). The GPU against this reference: tests/gpu/rope_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "flare/api/rope.h"
#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "jit/jit_test_support.h"
#include "testing/elements.h"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"
#include "testing/random.h"

namespace flare {
namespace {

using testing::element_at;

// One int32 vector as a CPU tensor.
struct Ints {
  HostTensor t;
  explicit Ints(const std::vector<int32_t>& values)
      : t(DType::kI32, {static_cast<int64_t>(values.size())}) {
    for (size_t i = 0; i < values.size(); ++i) t.data<int32_t>()[i] = values[i];
  }
  TensorView view() const { return t.view(); }
};

RopePositions by_ids(const Ints& ids) { return {std::nullopt, std::nullopt, ids.view()}; }

// Element (t, h, d) of a [nnz, H, D] view.
float at(const TensorView& v, int64_t t, int64_t h, int64_t d) {
  return element_at(v, t * v.strides[0] + h * v.strides[1] + d * v.strides[2]);
}

// Dims (a, b) of row (t, h) of `out` are those of `in` turned by `angle` radians.
void expect_pair_turned(const TensorView& in, const TensorView& out, int64_t t, int64_t h,
                        int64_t a, int64_t b, double angle) {
  const double x = at(in, t, h, a), y = at(in, t, h, b);
  EXPECT_NEAR(at(out, t, h, a), x * std::cos(angle) - y * std::sin(angle), 1e-6);
  EXPECT_NEAR(at(out, t, h, b), y * std::cos(angle) + x * std::sin(angle), 1e-6);
}

TEST(ApplyRopeCpu, RotatesEachPairByPositionTimesFrequency) {
  // One head of 8 float32 dims at position 5: pairs (i, i + 4), frequency theta^(-2i/8).
  HostTensor q = testing::random_tensor(DType::kF32, {1, 1, 8}, 1);
  HostTensor k = testing::random_tensor(DType::kF32, {1, 2, 8}, 2);
  HostTensor q_out(DType::kF32, {1, 1, 8}), k_out(DType::kF32, {1, 2, 8});
  const Ints pos({5});
  RopeOptions options;
  options.rope_theta = 100.0f;
  apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), by_ids(pos), options, nullptr);
  for (int64_t i = 0; i < 4; ++i) {
    const double angle = 5.0 * std::pow(100.0, -2.0 * static_cast<double>(i) / 8.0);
    expect_pair_turned(q.view(), q_out.view(), 0, 0, i, i + 4, angle);
    for (int64_t h = 0; h < 2; ++h) {  // every head of k at the same position
      const double a = at(k.view(), 0, h, i), b = at(k.view(), 0, h, i + 4);
      EXPECT_NEAR(at(k_out.view(), 0, h, i), a * std::cos(angle) - b * std::sin(angle), 1e-6);
    }
  }
}

TEST(ApplyRopeCpu, InterleavedPairsAndAPartialRotaryDimLeaveTheTailUnchanged) {
  // Pairs (2i, 2i + 1) over the first 4 of 8 dims; dims 4-7 copied.
  HostTensor q = testing::random_tensor(DType::kF32, {2, 1, 8}, 3);
  HostTensor k = testing::random_tensor(DType::kF32, {2, 1, 8}, 4);
  HostTensor q_out(DType::kF32, {2, 1, 8}), k_out(DType::kF32, {2, 1, 8});
  const Ints pos({0, 3});
  RopeOptions options;
  options.rotary_dim = 4;
  options.interleave = true;
  options.rope_scale = 2.0f;  // positions halved
  apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), by_ids(pos), options, nullptr);
  for (int64_t d = 0; d < 8; ++d) {  // position 0: the identity
    EXPECT_EQ(at(q_out.view(), 0, 0, d), at(q.view(), 0, 0, d));
  }
  for (int64_t i = 0; i < 2; ++i) {
    const double angle = 3.0 / 2.0 * std::pow(1e4, -2.0 * static_cast<double>(i) / 4.0);
    expect_pair_turned(q.view(), q_out.view(), 1, 0, 2 * i, 2 * i + 1, angle);
  }
  for (int64_t d = 4; d < 8; ++d) EXPECT_EQ(at(k_out.view(), 1, 0, d), at(k.view(), 1, 0, d));
}

TEST(ApplyRopeCpu, Llama31FrequenciesAreRopeFrequencyOfTheRotaryDim) {
  HostTensor q = testing::random_tensor(DType::kF32, {1, 1, 64}, 5);
  HostTensor k = testing::random_tensor(DType::kF32, {1, 1, 64}, 6);
  HostTensor q_out(DType::kF32, {1, 1, 64}), k_out(DType::kF32, {1, 1, 64});
  const Ints pos({12345});
  RopeOptions options;
  options.rope_theta = 5e5f;
  options.rope_scale = 8.0f;
  options.llama31 = AttentionParams::Llama31Scaling{};
  apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), by_ids(pos), options, nullptr);
  AttentionParams params;
  params.pos_encoding = PosEncoding::kRopeLlama;
  params.rope_theta = 5e5f;
  params.rope_scale = 8.0f;
  params.rope_llama31 = AttentionParams::Llama31Scaling{};
  for (int64_t i = 0; i < 32; ++i) {
    const double angle = 12345.0 * rope_frequency(params, i, 64);
    const double x = at(q.view(), 0, 0, i), y = at(q.view(), 0, 0, i + 32);
    EXPECT_NEAR(at(q_out.view(), 0, 0, i), x * std::cos(angle) - y * std::sin(angle), 1e-5)
        << "pair " << i;
  }
}

TEST(ApplyRopeCpu, IndptrAndOffsetsEqualPerTokenPositionsAndInPlaceEqualsOutOfPlace) {
  // Requests of 3, 0 and 2 tokens at offsets 7, 100 and 0: positions 7 8 9 0 1.
  HostTensor q = testing::random_tensor(DType::kBF16, {5, 4, 32}, 7);
  HostTensor k = testing::random_tensor(DType::kBF16, {5, 2, 32}, 8);
  HostTensor q1(DType::kBF16, {5, 4, 32}), k1(DType::kBF16, {5, 2, 32});
  HostTensor q2(DType::kBF16, {5, 4, 32}), k2(DType::kBF16, {5, 2, 32});
  const Ints indptr({0, 3, 3, 5}), offsets({7, 100, 0}), ids({7, 8, 9, 0, 1});
  apply_rope(q.view(), k.view(), q1.view(), k1.view(),
             {indptr.view(), offsets.view(), std::nullopt}, RopeOptions{}, nullptr);
  apply_rope(q.view(), k.view(), q2.view(), k2.view(), by_ids(ids), RopeOptions{}, nullptr);
  EXPECT_EQ(std::memcmp(q1.data<std::byte>(), q2.data<std::byte>(), 5 * 4 * 32 * 2), 0);
  EXPECT_EQ(std::memcmp(k1.data<std::byte>(), k2.data<std::byte>(), 5 * 2 * 32 * 2), 0);
  apply_rope(q.view(), k.view(), q.view(), k.view(), by_ids(ids), RopeOptions{}, nullptr);
  EXPECT_EQ(std::memcmp(q.data<std::byte>(), q1.data<std::byte>(), 5 * 4 * 32 * 2), 0);
  EXPECT_EQ(std::memcmp(k.data<std::byte>(), k1.data<std::byte>(), 5 * 2 * 32 * 2), 0);
}

// vLLM's table: row p holds cos of pair i at column i and sin at rotary_dim / 2 + i. Filled
// with the angles theta 1e4 gives, the table path equals the computed one to float rounding.
TEST(ApplyRopeCpu, CosSinCacheRowsGiveTheAngles) {
  constexpr int64_t kRows = 40, kRotary = 16;
  HostTensor table(DType::kF32, {kRows, kRotary});
  AttentionParams params;
  params.pos_encoding = PosEncoding::kRopeLlama;
  for (int64_t p = 0; p < kRows; ++p) {
    for (int64_t i = 0; i < kRotary / 2; ++i) {
      const double angle = static_cast<double>(p) * rope_frequency(params, i, kRotary);
      table.data<float>()[p * kRotary + i] = static_cast<float>(std::cos(angle));
      table.data<float>()[p * kRotary + kRotary / 2 + i] = static_cast<float>(std::sin(angle));
    }
  }
  for (const bool interleave : {false, true}) {
    HostTensor q = testing::random_tensor(DType::kF32, {3, 2, 32}, 13);
    HostTensor k = testing::random_tensor(DType::kF32, {3, 1, 32}, 14);
    HostTensor q1(DType::kF32, {3, 2, 32}), k1(DType::kF32, {3, 1, 32});
    HostTensor q2(DType::kF32, {3, 2, 32}), k2(DType::kF32, {3, 1, 32});
    const Ints ids({39, 0, 17});
    RopeOptions computed;
    computed.rotary_dim = kRotary;
    computed.interleave = interleave;
    apply_rope(q.view(), k.view(), q1.view(), k1.view(), by_ids(ids), computed, nullptr);
    RopeOptions cached;
    cached.interleave = interleave;
    cached.cos_sin_cache = table.view();
    apply_rope(q.view(), k.view(), q2.view(), k2.view(), by_ids(ids), cached, nullptr);
    for (int64_t i = 0; i < 3 * 2 * 32; ++i) {
      EXPECT_NEAR(element_at(q2.view(), i), element_at(q1.view(), i), 1e-6) << i;
    }
    for (int64_t i = 0; i < 3 * 32; ++i) {
      EXPECT_NEAR(element_at(k2.view(), i), element_at(k1.view(), i), 1e-6) << i;
    }
  }
  // Errors: a position past the table (nothing written), positions by indptr, a width that
  // disagrees with rotary_dim, a table of another dtype.
  HostTensor q = testing::random_tensor(DType::kF32, {2, 1, 32}, 15);
  HostTensor k = testing::random_tensor(DType::kF32, {2, 1, 32}, 16);
  HostTensor q_out(DType::kF32, {2, 1, 32}), k_out(DType::kF32, {2, 1, 32});
  q_out.fill(7.0f);
  RopeOptions cached;
  cached.cos_sin_cache = table.view();
  const Ints past({3, 40}), indptr({0, 2}), offsets({0});
  constexpr auto kBad = ErrorCode::kInvalidArgument;
  EXPECT_FLARE_ERROR(
      apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), by_ids(past), cached, nullptr),
      kBad, "position 40 of token 1 is outside cos_sin_cache's 40 rows");
  EXPECT_EQ(element_at(q_out.view(), 0), 7.0f);
  EXPECT_FLARE_ERROR(apply_rope(q.view(), k.view(), q_out.view(), k_out.view(),
                                {indptr.view(), offsets.view(), std::nullopt}, cached, nullptr),
                     kBad, "cos_sin_cache takes the positions as pos_ids");
  RopeOptions wide = cached;
  wide.rotary_dim = 32;
  EXPECT_FLARE_ERROR(
      apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), by_ids(past), wide, nullptr), kBad,
      "rotary_dim 32 differs from cos_sin_cache's width 16");
  HostTensor half_table(DType::kF16, {kRows, kRotary});
  RopeOptions f16 = cached;
  f16.cos_sin_cache = half_table.view();
  EXPECT_FLARE_ERROR(
      apply_rope(q.view(), k.view(), q_out.view(), k_out.view(), by_ids(past), f16, nullptr), kBad,
      "cos_sin_cache must be float32 [max_position >= 1, rotary_dim]");
}

TEST(ApplyRopeCpu, ArgumentErrorsNameTheArgumentAndWriteNothing) {
  HostTensor q = testing::random_tensor(DType::kF16, {3, 2, 16}, 9);
  HostTensor k = testing::random_tensor(DType::kF16, {3, 1, 16}, 10);
  HostTensor q_out(DType::kF16, {3, 2, 16}), k_out(DType::kF16, {3, 1, 16});
  q_out.fill(7.0f);
  const Ints ids({0, 1, 2});
  const auto run = [&](const TensorView& qv, const TensorView& kv, const RopePositions& positions,
                       const RopeOptions& options) {
    apply_rope(qv, kv, q_out.view(), k_out.view(), positions, options, nullptr);
  };
  constexpr auto kBad = ErrorCode::kInvalidArgument;
  RopeOptions odd;
  odd.rotary_dim = 5;
  EXPECT_FLARE_ERROR(run(q.view(), k.view(), by_ids(ids), odd), kBad,
                     "rotary_dim must be even and in [2, head_dim = 16], got 5");
  RopeOptions theta;
  theta.rope_theta = -1.0f;
  EXPECT_FLARE_ERROR(run(q.view(), k.view(), by_ids(ids), theta), kBad, "rope_theta");
  HostTensor k_short = testing::random_tensor(DType::kF16, {2, 1, 16}, 11);
  EXPECT_FLARE_ERROR(run(q.view(), k_short.view(), by_ids(ids), RopeOptions{}), kBad,
                     "k must have q's nnz and head_dim");
  HostTensor k_bf16 = testing::random_tensor(DType::kBF16, {3, 1, 16}, 12);
  EXPECT_FLARE_ERROR(run(q.view(), k_bf16.view(), by_ids(ids), RopeOptions{}), kBad,
                     "k dtype must be q's float16");
  const Ints indptr({0, 2, 3}), offsets({0, 0});
  EXPECT_FLARE_ERROR(
      run(q.view(), k.view(), {indptr.view(), offsets.view(), ids.view()}, RopeOptions{}), kBad,
      "either pos_ids or indptr and offsets");
  EXPECT_FLARE_ERROR(
      run(q.view(), k.view(), {indptr.view(), std::nullopt, std::nullopt}, RopeOptions{}), kBad,
      "indptr and offsets come together");
  const Ints short_ids({0, 1});
  EXPECT_FLARE_ERROR(run(q.view(), k.view(), by_ids(short_ids), RopeOptions{}), kBad,
                     "pos_ids must have shape [nnz] = [3]");
  const Ints negative({0, -1, 2});
  EXPECT_FLARE_ERROR(run(q.view(), k.view(), by_ids(negative), RopeOptions{}), kBad,
                     "pos_ids[1] must be >= 0, got -1");
  const Ints short_end({0, 2, 2});
  EXPECT_FLARE_ERROR(
      run(q.view(), k.view(), {short_end.view(), offsets.view(), std::nullopt}, RopeOptions{}),
      kBad, "indptr must start at 0 and end at nnz = 3");
  const Ints falling({0, 3, 2, 3}), three({0, 0, 0});
  EXPECT_FLARE_ERROR(
      run(q.view(), k.view(), {falling.view(), three.view(), std::nullopt}, RopeOptions{}), kBad,
      "indptr must be non-decreasing: indptr[1]=3 > indptr[2]=2");
  const Ints past_end({0, 100, 3}), two({0, 0});  // an entry past nnz, caught before writing
  EXPECT_FLARE_ERROR(
      run(q.view(), k.view(), {past_end.view(), two.view(), std::nullopt}, RopeOptions{}), kBad,
      "indptr must be non-decreasing: indptr[1]=100 > indptr[2]=3");
  const Ints negative_offset({0, -4});
  EXPECT_FLARE_ERROR(
      run(q.view(), k.view(), {indptr.view(), negative_offset.view(), std::nullopt}, RopeOptions{}),
      kBad, "offsets[1] must be >= 0, got -4");
  for (int64_t i = 0; i < 3 * 2 * 16; ++i) {
    ASSERT_EQ(element_at(q_out.view(), i), 7.0f) << "q_out written at " << i;
  }
}

TEST(RopeKernelSpec, ShippedSpecsCoverEveryDtypePairLayoutAndPositionForm) {
  std::set<std::string> units;
  for (const jit::KernelSpec& spec : shipped_rope_kernel_specs()) {
    EXPECT_EQ(spec.family_header, "rope_apply.cuh");
    EXPECT_EQ(spec.entry, "flare_rope_apply");
    units.insert(spec.translation_unit());
  }
  // {f16, bf16} x {halves, interleaved} x {indptr, int32, int64, int32 + table, int64 + table}
  EXPECT_EQ(units.size(), 20u);
  EXPECT_FLARE_ERROR(rope_kernel_spec(DType::kF32, false, 0), ErrorCode::kInvalidArgument,
                     "rope kernels take float16 or bfloat16 rows, got float32");
  EXPECT_FLARE_ERROR(rope_kernel_spec(DType::kF16, false, 16), ErrorCode::kInvalidArgument,
                     "got 16");
  EXPECT_FLARE_ERROR(rope_kernel_spec(DType::kF16, false, 0, true), ErrorCode::kInvalidArgument,
                     "a cos_sin_cache with pos_ids only");
}

class ShippedRopeKernels : public jit::testing::JitTest,
                           public ::testing::WithParamInterface<const char*> {};

TEST_P(ShippedRopeKernels, CompileWithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const std::string arch = GetParam();
  constexpr int kMaxRegisters = 64;  // memory-bound: many warps per SM
  for (const jit::KernelSpec& spec : shipped_rope_kernel_specs()) {
    const jit::CompiledKernel compiled = jit::compile(spec, arch);
    ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
    testing::expect_shipped_usage(compiled, spec.label + " on " + arch, kMaxRegisters);
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShippedRopeKernels, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare
