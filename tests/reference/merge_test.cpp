// The merge operator: merge_into against its float64 definition, identity and -inf handling,
// commutativity (bitwise), associativity, no overflow for distant scales; merge_state,
// merge_state_in_place (with mask) and merge_states on strided f32/f16/bf16 tensors.
#include "flare/reference/merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/expect_error.h"
#include "testing/random.h"

namespace flare {
namespace {

using testing::fill_random;
using testing::Rng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kDim = 24;

struct State {
  std::vector<float> o;
  float lse;
};

State random_state(Rng& rng, double lse_spread = 5.0) {
  State state{std::vector<float>(kDim), static_cast<float>(rng.uniform(-lse_spread, lse_spread))};
  for (float& x : state.o) x = static_cast<float>(rng.normal());
  return state;
}

State merged(State a, const State& b) {
  merge_into(a.o.data(), &a.lse, b.o.data(), b.lse, kDim);
  return a;
}

// The definition of ⊕ in float64 (papers 001 §2.2, equation 3).
State definition(const State& a, const State& b) {
  const double ea = std::exp(double{a.lse}), eb = std::exp(double{b.lse});
  State out{std::vector<float>(kDim), static_cast<float>(std::log(ea + eb))};
  for (int64_t d = 0; d < kDim; ++d) {
    out.o[d] = static_cast<float>((ea * a.o[d] + eb * b.o[d]) / (ea + eb));
  }
  return out;
}

void expect_state_near(const State& actual, const State& expected, double tolerance) {
  EXPECT_NEAR(actual.lse, expected.lse, tolerance);
  for (int64_t d = 0; d < kDim; ++d) EXPECT_NEAR(actual.o[d], expected.o[d], tolerance) << d;
}

TEST(MergeInto, MatchesTheDefinition) {
  Rng rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    const State a = random_state(rng), b = random_state(rng);
    expect_state_near(merged(a, b), definition(a, b), 1e-5);
  }
}

TEST(MergeInto, IsCommutativeBitwise) {
  Rng rng(2);
  for (int trial = 0; trial < 50; ++trial) {
    const State a = random_state(rng), b = random_state(rng);
    const State ab = merged(a, b), ba = merged(b, a);
    EXPECT_EQ(ab.lse, ba.lse);
    EXPECT_EQ(ab.o, ba.o);
  }
}

TEST(MergeInto, IsAssociative) {
  Rng rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const State a = random_state(rng), b = random_state(rng), c = random_state(rng);
    expect_state_near(merged(merged(a, b), c), merged(a, merged(b, c)), 1e-5);
  }
}

TEST(MergeInto, MinusInfinityIsTheIdentityOnEitherSide) {
  Rng rng(4);
  const State a = random_state(rng);
  const State empty{std::vector<float>(kDim, 123.0f), -kInf};  // o of an empty state is ignored
  const State a_empty = merged(a, empty), empty_a = merged(empty, a);
  EXPECT_EQ(a_empty.o, a.o);
  EXPECT_EQ(a_empty.lse, a.lse);
  EXPECT_EQ(empty_a.o, a.o);
  EXPECT_EQ(empty_a.lse, a.lse);
}

TEST(MergeInto, TwoEmptyStatesGiveZeroAndMinusInfinity) {
  const State empty{std::vector<float>(kDim, NAN), -kInf};
  const State both = merged(empty, empty);
  EXPECT_EQ(both.o, std::vector<float>(kDim, 0.0f));
  EXPECT_EQ(both.lse, -kInf);
}

TEST(MergeInto, DistantScalesDoNotOverflow) {
  Rng rng(5);
  State big = random_state(rng), small = random_state(rng);
  big.lse = 1000.0f;  // e^1000 overflows even float64
  small.lse = -1000.0f;
  const State result = merged(small, big);
  EXPECT_EQ(result.lse, 1000.0f);
  EXPECT_EQ(result.o, big.o);
  State equal = big;
  equal.lse = 1000.0f;
  EXPECT_NEAR(merged(big, equal).lse, 1000.0 + std::log(2.0), 1e-4);
}

// [seq, H, D] states of `dtype`, optionally views into padded buffers, and float32 [seq, H] s.
struct StateTensors {
  HostTensor v_storage, s_storage;
  TensorView v, s;

  StateTensors(DType dtype, int64_t seq, int64_t heads, int64_t dim, bool strided, uint64_t seed)
      : v_storage(dtype, {seq, heads + strided, dim + 5 * strided}),
        s_storage(DType::kF32, {seq, heads + 2 * strided}) {
    v_storage.fill(NAN);
    s_storage.fill(NAN);
    v = testing::sub_view(v_storage, {0, strided, 0}, {seq, heads, dim});
    s = testing::sub_view(s_storage, {0, strided}, {seq, heads});
    fill_random(v, seed);
    fill_random(s, seed + 1, 3.0f);
  }
};

TEST(MergeState, TensorsMatchTheDefinitionForEveryDtype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (strided ? " strided" : ""));
      StateTensors a(dtype, 7, 3, 16, strided, 1), b(dtype, 7, 3, 16, !strided, 3);
      StateTensors out(dtype, 7, 3, 16, strided, 5);
      testing::poison(out.v);
      testing::poison(out.s);
      // An empty row in a and one in b.
      a.s.ptr<float>()[2 * a.s.strides[0]] = -kInf;
      b.s.ptr<float>()[4 * b.s.strides[0] + 1] = -kInf;
      merge_state(a.v, a.s, b.v, b.s, out.v, out.s);
      const std::vector<double> va = testing::to_double_vector(a.v),
                                vb = testing::to_double_vector(b.v),
                                sa = testing::to_double_vector(a.s),
                                sb = testing::to_double_vector(b.s);
      std::vector<double> v_expected(va.size()), s_expected(sa.size());
      for (size_t row = 0; row < sa.size(); ++row) {
        const double ea = std::exp(sa[row]), eb = std::exp(sb[row]);
        s_expected[row] = std::log(ea + eb);
        for (int64_t d = 0; d < 16; ++d) {
          v_expected[row * 16 + d] = (ea * va[row * 16 + d] + eb * vb[row * 16 + d]) / (ea + eb);
        }
      }
      // Float32 arithmetic, then the rounding of the result to the dtype (half an ulp).
      const double rounding = dtype == DType::kBF16  ? std::ldexp(1.0, -8)
                              : dtype == DType::kF16 ? std::ldexp(1.0, -11)
                                                     : 0.0;
      double largest = 0.0;
      for (double x : v_expected) largest = std::max(largest, std::fabs(x));
      EXPECT_LE(testing::max_abs_error(out.v, v_expected), 1e-5 + rounding * largest);
      EXPECT_LE(testing::max_abs_error(out.s, s_expected), 1e-5);
    }
  }
}

TEST(MergeState, InPlaceMergesOnlyTheMaskedRows) {
  StateTensors state(DType::kF32, 6, 2, 8, true, 11), other(DType::kF32, 6, 2, 8, false, 13);
  StateTensors expected(DType::kF32, 6, 2, 8, false, 17);
  merge_state(state.v, state.s, other.v, other.s, expected.v, expected.s);
  const std::vector<double> before = testing::to_double_vector(state.v);
  HostTensor mask(DType::kU8, {6});
  const std::vector<uint8_t> bits = {1, 0, 0, 7, 1, 0};
  for (int i = 0; i < 6; ++i) mask.data<uint8_t>()[i] = bits[i];
  merge_state_in_place(state.v, state.s, other.v, other.s, mask.view());
  const std::vector<double> after = testing::to_double_vector(state.v),
                            merged_rows = testing::to_double_vector(expected.v);
  for (size_t i = 0; i < after.size(); ++i) {
    const size_t seq = i / 16;
    EXPECT_EQ(after[i], bits[seq] ? merged_rows[i] : before[i]) << i;
  }
  // Without a mask every row merges.
  merge_state_in_place(other.v, other.s, state.v, state.s);
  EXPECT_EQ(testing::count_nan(other.v), 0);
}

TEST(MergeState, MergeStatesEqualsRepeatedMergeState) {
  const int64_t seq = 5, states = 4, heads = 3, dim = 8;
  HostTensor v = testing::random_tensor(DType::kF32, {seq, states, heads, dim}, 21);
  HostTensor s = testing::random_tensor(DType::kF32, {seq, states, heads}, 22, 4.0f);
  s.set((1 * states + 2) * heads + 0, -kInf);  // an empty state in the middle
  HostTensor v_out(DType::kF32, {seq, heads, dim}), s_out(DType::kF32, {seq, heads});
  testing::poison(v_out.view());
  testing::poison(s_out.view());
  merge_states(v.view(), s.view(), v_out.view(), s_out.view());

  HostTensor v_acc(DType::kF32, {seq, heads, dim}), s_acc(DType::kF32, {seq, heads});
  HostTensor v_next(DType::kF32, {seq, heads, dim}), s_next(DType::kF32, {seq, heads});
  for (int64_t state = 0; state < states; ++state) {
    const TensorView v_state = v.view().select(1, state), s_state = s.view().select(1, state);
    if (state == 0) {
      const HostTensor v0 = testing::to_contiguous(v_state), s0 = testing::to_contiguous(s_state);
      std::copy(v0.data<float>(), v0.data<float>() + v0.numel(), v_acc.data<float>());
      std::copy(s0.data<float>(), s0.data<float>() + s0.numel(), s_acc.data<float>());
      continue;
    }
    merge_state(v_acc.view(), s_acc.view(), v_state, s_state, v_next.view(), s_next.view());
    std::swap(v_acc, v_next);
    std::swap(s_acc, s_next);
  }
  EXPECT_TRUE(
      std::equal(v_acc.data<float>(), v_acc.data<float>() + v_acc.numel(), v_out.data<float>()));
  EXPECT_TRUE(
      std::equal(s_acc.data<float>(), s_acc.data<float>() + s_acc.numel(), s_out.data<float>()));
}

// Base-2 LSEs (FlashInfer's convention) merge as their natural-log equivalents: the same v, and
// s that is the natural result over ln 2, for all three operators, strided s included.
TEST(MergeState, Base2LsesMergeAsTheirNaturalLogs) {
  const auto to_base2 = [](const TensorView& s) {
    for (int64_t i = 0; i < s.shape[0]; ++i) {
      for (int64_t j = 0; j < s.shape[1]; ++j) {
        s.ptr<float>()[i * s.strides[0] + j * s.strides[1]] /= std::log(2.0f);
      }
    }
  };
  StateTensors a(DType::kF32, 5, 3, 8, true, 41), b(DType::kF32, 5, 3, 8, false, 43);
  a.s.ptr<float>()[a.s.strides[0]] = -kInf;
  StateTensors natural(DType::kF32, 5, 3, 8, false, 45), base2(DType::kF32, 5, 3, 8, true, 47);
  merge_state(a.v, a.s, b.v, b.s, natural.v, natural.s);
  StateTensors a2(DType::kF32, 5, 3, 8, true, 41), b2(DType::kF32, 5, 3, 8, false, 43);
  a2.s.ptr<float>()[a2.s.strides[0]] = -kInf;
  to_base2(a2.s);
  to_base2(b2.s);
  merge_state(a2.v, a2.s, b2.v, b2.s, base2.v, base2.s, LseBase::kBase2);
  to_base2(natural.s);
  EXPECT_LE(testing::max_abs_error(base2.v, testing::to_double_vector(natural.v)), 1e-6);
  EXPECT_LE(testing::max_abs_error(base2.s, testing::to_double_vector(natural.s)), 1e-5);

  // In place: a2 becomes a2 ⊕ b2, in base 2.
  merge_state_in_place(a2.v, a2.s, b2.v, b2.s, std::nullopt, LseBase::kBase2);
  EXPECT_LE(testing::max_abs_error(a2.v, testing::to_double_vector(natural.v)), 1e-6);
  EXPECT_LE(testing::max_abs_error(a2.s, testing::to_double_vector(natural.s)), 1e-5);

  // merge_states of [seq, 2, H] states in base 2 against merge_state in natural log.
  HostTensor v(DType::kF32, {5, 2, 3, 8}), s(DType::kF32, {5, 2, 3});
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t k = 0; k < 2; ++k) {
        const StateTensors& from = k == 0 ? a : b;
        s.data<float>()[(i * 2 + k) * 3 + h] =
            from.s.ptr<float>()[i * from.s.strides[0] + h * from.s.strides[1]] / std::log(2.0f);
        for (int64_t d = 0; d < 8; ++d) {
          v.data<float>()[((i * 2 + k) * 3 + h) * 8 + d] =
              from.v.ptr<float>()[i * from.v.strides[0] + h * from.v.strides[1] + d];
        }
      }
    }
  }
  HostTensor v_out(DType::kF32, {5, 3, 8}), s_out(DType::kF32, {5, 3});
  merge_states(v.view(), s.view(), v_out.view(), s_out.view(), LseBase::kBase2);
  EXPECT_LE(testing::max_abs_error(v_out.view(), testing::to_double_vector(natural.v)), 1e-6);
  EXPECT_LE(testing::max_abs_error(s_out.view(), testing::to_double_vector(natural.s)), 1e-5);
}

TEST(MergeState, MergeStatesOfNoStatesIsEmpty) {
  HostTensor v(DType::kF32, {2, 0, 3, 8}), s(DType::kF32, {2, 0, 3});
  HostTensor v_out(DType::kF32, {2, 3, 8}), s_out(DType::kF32, {2, 3});
  testing::poison(v_out.view());
  testing::poison(s_out.view());
  merge_states(v.view(), s.view(), v_out.view(), s_out.view());
  for (int64_t i = 0; i < v_out.numel(); ++i) EXPECT_EQ(v_out.get(i), 0.0f);
  for (int64_t i = 0; i < s_out.numel(); ++i) EXPECT_EQ(s_out.get(i), -kInf);
}

TEST(MergeState, MalformedTensorsAreRejectedAndOutputsUntouched) {
  HostTensor v(DType::kF32, {4, 2, 8}), s(DType::kF32, {4, 2});
  HostTensor v_out(DType::kF32, {4, 2, 8}), s_out(DType::kF32, {4, 2});
  HostTensor v_short(DType::kF32, {3, 2, 8}), s_wrong(DType::kF32, {4, 3});
  HostTensor v_fp8(DType::kE4M3, {4, 2, 8}), s_half(DType::kF16, {4, 2}), v_flat(DType::kF32, {8});
  testing::poison(v_out.view());
  testing::poison(s_out.view());
  const auto untouched = [&] {
    EXPECT_EQ(testing::count_nan(v_out.view()), v_out.numel());
    EXPECT_EQ(testing::count_nan(s_out.view()), s_out.numel());
  };
  const ErrorCode invalid = ErrorCode::kInvalidArgument;
  EXPECT_FLARE_ERROR(
      merge_state(v.view(), s.view(), v_short.view(), s.view(), v_out.view(), s_out.view()),
      invalid, "s_b must have the shape of v_b");
  EXPECT_FLARE_ERROR(
      merge_state(v.view(), s.view(), v.view(), s_wrong.view(), v_out.view(), s_out.view()),
      invalid, "s_b must have the shape of v_b");
  EXPECT_FLARE_ERROR(
      merge_state(v_fp8.view(), s.view(), v.view(), s.view(), v_out.view(), s_out.view()), invalid,
      "v_a dtype must be float32, float16 or bfloat16");
  EXPECT_FLARE_ERROR(
      merge_state(v.view(), s_half.view(), v.view(), s.view(), v_out.view(), s_out.view()), invalid,
      "s_a dtype must be float32");
  EXPECT_FLARE_ERROR(
      merge_state(v_flat.view(), s.view(), v.view(), s.view(), v_out.view(), s_out.view()), invalid,
      "v_a must have rank 3");
  HostTensor v_other(DType::kF32, {4, 2, 16}), s_other(DType::kF32, {4, 2});
  EXPECT_FLARE_ERROR(
      merge_state_in_place(v_out.view(), s_out.view(), v_other.view(), s_other.view()), invalid,
      "v_other must have the shape of v");
  HostTensor mask(DType::kU8, {5}), mask_i32(DType::kI32, {4});
  EXPECT_FLARE_ERROR(
      merge_state_in_place(v_out.view(), s_out.view(), v.view(), s.view(), mask.view()), invalid,
      "mask must have shape [seq] = [4]");
  EXPECT_FLARE_ERROR(
      merge_state_in_place(v_out.view(), s_out.view(), v.view(), s.view(), mask_i32.view()),
      invalid, "mask dtype must be uint8");
  HostTensor v4(DType::kF32, {4, 3, 2, 8}), s3(DType::kF32, {4, 3, 2});
  HostTensor v_out_wrong(DType::kF32, {4, 2, 4}), s3_wrong(DType::kF32, {4, 2, 2});
  EXPECT_FLARE_ERROR(merge_states(v4.view(), s3.view(), v_out_wrong.view(), s_out.view()), invalid,
                     "v_out must have shape [seq, num_heads, head_dim] = [4, 2, 8]");
  EXPECT_FLARE_ERROR(merge_states(v4.view(), s3_wrong.view(), v_out.view(), s_out.view()), invalid,
                     "s must have the shape of v without its last dimension");
  untouched();
}

// The states [begin, end) of a [total, H, D] / [total, H] pair as merge_states' input
// [1, end - begin, H, D] / [1, end - begin, H] (no copy).
TensorView states_of(const TensorView& t, int64_t begin, int64_t end) {
  const TensorView rows = t.slice(0, begin, end);
  TensorView stacked = rows;
  stacked.ndim = rows.ndim + 1;
  stacked.shape[0] = 1;
  stacked.strides[0] = 0;
  for (int dim = 0; dim < rows.ndim; ++dim) {
    stacked.shape[dim + 1] = rows.shape[dim];
    stacked.strides[dim + 1] = rows.strides[dim];
  }
  return stacked;
}

// merge_states_ragged (FlashInfer's variable_length_merge_states) is merge_states over each row's
// range, bit for bit: empty ranges, one state, long ranges, a -inf state, bf16 v, base 2.
TEST(MergeState, RaggedEqualsMergeStatesOfEachRange) {
  const std::vector<int32_t> lengths = {3, 0, 1, 17, 0, 5, 2};
  std::vector<int32_t> offsets = {0};
  for (const int32_t length : lengths) offsets.push_back(offsets.back() + length);
  const int64_t seq = static_cast<int64_t>(lengths.size()), total = offsets.back(), heads = 3,
                dim = 40;
  const HostTensor v = testing::random_tensor(DType::kBF16, {total, heads, dim}, 31);
  HostTensor s = testing::random_tensor(DType::kF32, {total, heads}, 32, 4.0f);
  s.set(4 * heads + 1, -kInf);
  HostTensor indptr(DType::kI32, {seq + 1});
  std::copy(offsets.begin(), offsets.end(), indptr.data<int32_t>());
  HostTensor v_out(DType::kBF16, {seq, heads, dim}), s_out(DType::kF32, {seq, heads});
  testing::poison(v_out.view());
  testing::poison(s_out.view());
  merge_states_ragged(v.view(), s.view(), indptr.view(), v_out.view(), s_out.view(),
                      LseBase::kBase2);
  for (int64_t row = 0; row < seq; ++row) {
    HostTensor v_row(DType::kBF16, {1, heads, dim}), s_row(DType::kF32, {1, heads});
    merge_states(states_of(v.view(), offsets[row], offsets[row + 1]),
                 states_of(s.view(), offsets[row], offsets[row + 1]), v_row.view(), s_row.view(),
                 LseBase::kBase2);
    for (int64_t i = 0; i < heads * dim; ++i) {
      EXPECT_EQ(v_out.get(row * heads * dim + i), v_row.get(i)) << "row " << row << " at " << i;
    }
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_EQ(s_out.get(row * heads + h), s_row.get(h)) << "row " << row << " head " << h;
      if (lengths[static_cast<size_t>(row)] == 0) {
        EXPECT_EQ(s_out.get(row * heads + h), -kInf);
      }
    }
  }
}

TEST(MergeState, RaggedIndptrIsCheckedAndOutputsUntouched) {
  HostTensor v(DType::kF32, {6, 2, 8}), s(DType::kF32, {6, 2});
  HostTensor v_out(DType::kF32, {3, 2, 8}), s_out(DType::kF32, {3, 2});
  testing::poison(v_out.view());
  testing::poison(s_out.view());
  const auto with = [](std::vector<int32_t> values) {
    HostTensor t(DType::kI32, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), t.data<int32_t>());
    return t;
  };
  const auto rejects = [&](const HostTensor& indptr, const std::string& message) {
    EXPECT_FLARE_ERROR(
        merge_states_ragged(v.view(), s.view(), indptr.view(), v_out.view(), s_out.view()),
        ErrorCode::kInvalidArgument, message);
  };
  rejects(with({0, 4, 2, 6}), "indptr[2] = 2 after 4");
  rejects(with({0, 2, 4, 7}), "at most total_states = 6 (v's first dimension); indptr[3] = 7");
  rejects(with({-1, 2, 4, 6}), "indptr[0] = -1");
  rejects(with({0, 2, 6}), "indptr must have shape [seq + 1] = [4] (seq from v_out), got [3]");
  HostTensor as_int64(DType::kI64, {4});
  rejects(as_int64, "indptr dtype must be int32, got int64");
  HostTensor v_wide(DType::kF32, {3, 2, 9});
  EXPECT_FLARE_ERROR(merge_states_ragged(v.view(), s.view(), with({0, 2, 4, 6}).view(),
                                         v_wide.view(), s_out.view()),
                     ErrorCode::kInvalidArgument,
                     "v_out must have shape [seq, num_heads, head_dim]");
  EXPECT_EQ(testing::count_nan(v_out.view()), v_out.numel());
  EXPECT_EQ(testing::count_nan(s_out.view()), s_out.numel());
}

}  // namespace
}  // namespace flare
