// The sparse CPU references in float16 and bfloat16 (flare/sparse/csr.h): every format's SpMM
// (CSR, COO, ELL, hyb(c, k), BSR with its CSR remainder) and SDDMM (CSR, COO) against float64
// sums over the 16-bit operands' exact values, within half a unit in the last place of the
// output type (the references round the float64 sum once to float32, then to the 16-bit type);
// mixed dtypes are refused naming the operand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "flare/core/dtype.h"
#include "flare/sparse/bsr.h"
#include "flare/sparse/coo.h"
#include "flare/sparse/csr.h"
#include "flare/sparse/ell.h"
#include "flare/sparse/hyb.h"
#include "sparse/random_csr.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using sparse_testing::random_csr;
using sparse_testing::random_dense;

uint16_t to_bits(float v, DType dtype) {
  return dtype == DType::kF16 ? float_to_f16_bits(v) : float_to_bf16_bits(v);
}
double from_bits(uint16_t bits, DType dtype) {
  return dtype == DType::kF16 ? f16_bits_to_float(bits) : bf16_bits_to_float(bits);
}

// A float32 tensor rounded to `dtype` (same shape).
HostTensor rounded(const HostTensor& t, DType dtype) {
  const TensorView v = t.view();
  std::vector<int64_t> shape(v.shape.begin(), v.shape.begin() + v.ndim);
  HostTensor out(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    out.data<uint16_t>()[i] = to_bits(t.data<float>()[i], dtype);
  }
  return out;
}

// Half a unit in the last place of `dtype` at |v|, plus float32's rounding on the way.
double half_ulp(double v, DType dtype) {
  const int mantissa = dtype == DType::kF16 ? 10 : 7;
  const int min_exponent = dtype == DType::kF16 ? -14 : -126;
  const int e = v == 0 ? min_exponent : std::max(min_exponent, std::ilogb(v));
  return 0.5 * std::ldexp(1.0, e - mantissa) + std::abs(v) * std::ldexp(1.0, -23);
}

class SparseDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(SparseDtypes, EveryFormatsSpmmAndSddmmRoundTheFloat64Sum) {
  const DType dtype = GetParam();
  constexpr int64_t kRows = 70, kCols = 90, kD = 9;
  sparse::CsrStorage a = random_csr(kRows, kCols, 0.08, 0.3, 21);
  for (float& v : a.values) v = static_cast<float>(from_bits(to_bits(v, dtype), dtype));
  std::vector<uint16_t> value_bits;
  for (const float v : a.values) value_bits.push_back(to_bits(v, dtype));
  sparse::Csr view = a.view();
  view.values =
      TensorView::contiguous(value_bits.data(), dtype, {static_cast<int64_t>(value_bits.size())});
  const HostTensor x = rounded(random_dense(kCols, kD, 22), dtype);

  std::vector<double> expected(static_cast<size_t>(kRows * kD), 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int32_t e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
      for (int64_t f = 0; f < kD; ++f) {
        expected[static_cast<size_t>(r * kD + f)] +=
            double{a.values[e]} * from_bits(x.data<uint16_t>()[a.indices[e] * kD + f], dtype);
      }
    }
  }
  const auto check = [&](const char* format, const auto& run) {
    SCOPED_TRACE(format);
    HostTensor y(dtype, {kRows, kD});
    std::fill_n(y.data<uint16_t>(), kRows * kD, uint16_t{0xFFFF});  // NaN in both types
    run(y);
    for (int64_t i = 0; i < kRows * kD; ++i) {
      const double want = expected[static_cast<size_t>(i)];
      ASSERT_LE(std::abs(from_bits(y.data<uint16_t>()[i], dtype) - want), half_ulp(want, dtype))
          << "element " << i;
    }
  };
  check("csr", [&](HostTensor& y) { sparse::spmm_reference(view, x.view(), y.view()); });
  check("coo", [&](HostTensor& y) {
    sparse::spmm_reference(sparse::coo_from_csr(view), x.view(), y.view());
  });
  check("ell", [&](HostTensor& y) {
    sparse::spmm_reference(sparse::ell_from_csr(view), x.view(), y.view());
  });
  check("hyb(2, 3)", [&](HostTensor& y) {
    sparse::spmm_reference(sparse::hyb_from_csr(view, 2, 3), x.view(), y.view());
  });
  check("bsr 4x4", [&](HostTensor& y) {
    sparse::spmm_reference(sparse::bsr_from_csr(view, 4, 4), x.view(), y.view());
  });

  const HostTensor q = rounded(random_dense(kRows, kD, 23), dtype);
  const HostTensor k = rounded(random_dense(kCols, kD, 24), dtype);
  const auto nnz = static_cast<int64_t>(a.indices.size());
  for (const bool coo : {false, true}) {
    SCOPED_TRACE(coo ? "sddmm coo" : "sddmm csr");
    HostTensor out(dtype, {nnz});
    std::fill_n(out.data<uint16_t>(), nnz, uint16_t{0xFFFF});
    if (coo) {
      sparse::sddmm_reference(sparse::coo_from_csr(view), q.view(), k.view(), out.view());
    } else {
      sparse::sddmm_reference(view, q.view(), k.view(), out.view());
    }
    for (int64_t r = 0; r < kRows; ++r) {
      for (int32_t e = a.indptr[r]; e < a.indptr[r + 1]; ++e) {
        double want = 0.0;
        for (int64_t f = 0; f < kD; ++f) {
          want += from_bits(q.data<uint16_t>()[r * kD + f], dtype) *
                  from_bits(k.data<uint16_t>()[a.indices[e] * kD + f], dtype);
        }
        ASSERT_LE(std::abs(from_bits(out.data<uint16_t>()[e], dtype) - want), half_ulp(want, dtype))
            << "nonzero " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, SparseDtypes, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(SparseDtypeErrors, MixedOperandsAreRefusedNamingThem) {
  const sparse::CsrStorage a = random_csr(10, 8, 0.3, 0.0, 25);
  const HostTensor x = rounded(random_dense(8, 4, 26), DType::kF16);
  HostTensor y(DType::kF32, {10, 4});
  y.fill(std::nanf(""));
  EXPECT_FLARE_ERROR(sparse::spmm_reference(a.view(), x.view(), y.view()),
                     ErrorCode::kInvalidArgument, "Y must have X's dtype float16, got float32");
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_TRUE(std::isnan(y.data<float>()[i]));
  HostTensor ints(DType::kI32, {8, 4});
  EXPECT_FLARE_ERROR(sparse::spmm_reference(a.view(), ints.view(), y.view()),
                     ErrorCode::kInvalidArgument,
                     "X must be a 2-D float32, float16 or bfloat16 CPU tensor, got int32");
  const HostTensor q = rounded(random_dense(10, 4, 27), DType::kBF16);
  const HostTensor k = random_dense(8, 4, 28);
  HostTensor out(DType::kBF16, {static_cast<int64_t>(a.indices.size())});
  EXPECT_FLARE_ERROR(sparse::sddmm_reference(a.view(), q.view(), k.view(), out.view()),
                     ErrorCode::kInvalidArgument, "K must have Q's dtype bfloat16, got float32");
  const HostTensor k16 = rounded(k, DType::kBF16);
  HostTensor out32(DType::kF32, {static_cast<int64_t>(a.indices.size())});
  EXPECT_FLARE_ERROR(sparse::sddmm_reference(a.view(), q.view(), k16.view(), out32.view()),
                     ErrorCode::kInvalidArgument, "out must be bfloat16 [");
}

}  // namespace
}  // namespace flare
