// The GPU SpMM tests' check (tests/gpu/spmm_gpu_test.cpp, hyb_gpu_test.cpp): y = A x on the
// device by a given runner against the float64 CPU reference, with operands rounded to the
// dtype first, NaN-poisoned outputs and workspace, and an error bound of (terms + 8) float32
// unit roundoffs of the L1 sum plus the output's rounding(s).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "flare/jit/cuda_sync.h"
#include "flare/sparse/spmm_gpu.h"
#include "gpu/decode_test_support.h"
#include "sparse/random_csr.h"
#include "testing/random.h"

namespace flare::spmm_testing {

using gpu_testing::DeviceCopy;
using gpu_testing::to_device;

// A [rows, d] float32 view of `data` with rows `stride` elements apart.
inline TensorView rows_view(void* data, int64_t rows, int64_t d, int64_t stride, Device device) {
  TensorView t = TensorView::contiguous(data, DType::kF32, {rows, d}, device);
  t.strides[0] = stride;
  return t;
}

inline HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

inline HostTensor float_tensor(const std::vector<float>& values) {
  HostTensor t(DType::kF32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

// `t`'s elements rounded to `dtype` (nearest even), as a tensor of that dtype.
inline HostTensor rounded_to(const HostTensor& t, DType dtype) {
  HostTensor out(dtype, t.view().ndim == 2
                            ? std::vector<int64_t>{t.view().shape[0], t.view().shape[1]}
                            : std::vector<int64_t>{t.view().shape[0]});
  for (int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

// `t`'s elements (any floating dtype) as float32.
inline HostTensor widened(const HostTensor& t) { return rounded_to(t, DType::kF32); }

// The unit roundoff of the result's dtype: the GPU rounds its float32 sum once.
inline double output_roundoff(DType dtype) {
  return dtype == DType::kBF16 ? 0x1p-8 : dtype == DType::kF16 ? 0x1p-11 : 0.0;
}

// The largest error of rounding a result below the dtype's smallest normal (float16's
// subnormals are 2^-24 apart: a sum that cancels to 1e-7 rounds with 300 times its relative
// bound).
inline double subnormal_rounding(DType dtype) {
  return dtype == DType::kF16 ? 0x1p-25 : dtype == DType::kBF16 ? 0x1p-134 : 0x1p-150;
}

// Computes y = A x on the device (the default: sparse::spmm with its default schedule).
using SpmmRunner = std::function<void(const sparse::Csr& a, const TensorView& x,
                                      const TensorView& y, const TensorView& workspace)>;

// y = A x on the GPU in `dtype` (x and y with rows of `stride` elements, d used; A's values and
// x rounded to dtype first) by `run` against the reference run on `reference` (A with the same
// pattern; its values zero where a column was corrupted) with the same rounded operands.
// partial_roundings: roundings of partial sums to the dtype on top of the output's (a
// decomposition's partitions), each bounded by the dtype's unit roundoff of the L1 sum.
inline void check_spmm(const sparse::CsrStorage& a, const sparse::CsrStorage& reference, int64_t d,
                       int64_t stride, uint64_t seed, DType dtype = DType::kF32,
                       const SpmmRunner& run = {}, int partial_roundings = 0) {
  SCOPED_TRACE(::testing::Message()
               << a.rows << " x " << a.cols << " nnz " << a.indices.size() << " d " << d
               << " stride " << stride << " " << dtype_name(dtype));
  HostTensor x_random(DType::kF32, {std::max<int64_t>(a.cols, 1), stride});
  testing::fill_random(x_random.view(), seed);
  const HostTensor x_stored = rounded_to(x_random, dtype);
  HostTensor x_storage = widened(x_stored);  // the operand the GPU sees, as float32
  const HostTensor values_stored = rounded_to(float_tensor(a.values), dtype);
  sparse::CsrStorage rounded = reference;
  for (size_t e = 0; e < rounded.values.size(); ++e) {
    rounded.values[e] =
        reference.values[e] == 0.0f ? 0.0f : values_stored.get(static_cast<int64_t>(e));
  }
  const TensorView x_host = rows_view(x_storage.data<float>(), a.cols, d, stride, Device::cpu());
  HostTensor expected(DType::kF32, {a.rows, d});
  sparse::spmm_reference(rounded.view(), x_host, expected.view());
  // The float32 sums' error bound: (terms + 8) unit roundoffs of sum |a_ij x_jf| (the long
  // rows' 8 partial sums add 8 roundings), then the output's rounding.
  sparse::CsrStorage magnitude = rounded;
  for (float& v : magnitude.values) v = std::abs(v);
  HostTensor x_abs(DType::kF32, {std::max<int64_t>(a.cols, 1), stride});
  for (int64_t i = 0; i < x_abs.numel(); ++i)
    x_abs.data<float>()[i] = std::abs(x_storage.data<float>()[i]);
  HostTensor l1(DType::kF32, {a.rows, d});
  sparse::spmm_reference(magnitude.view(),
                         rows_view(x_abs.data<float>(), a.cols, d, stride, Device::cpu()),
                         l1.view());

  const HostTensor indptr = int32_tensor(a.indptr), indices = int32_tensor(a.indices);
  HostTensor y_storage(dtype, {std::max<int64_t>(a.rows, 1), stride});
  y_storage.fill(std::nanf(""));
  const DeviceCopy indptr_d = to_device(indptr), indices_d = to_device(indices);
  const DeviceCopy values_d = to_device(values_stored);
  const DeviceCopy x_d = to_device(x_stored), y_d = to_device(y_storage);
  sparse::Csr a_d;
  a_d.rows = a.rows;
  a_d.cols = a.cols;
  a_d.indptr = indptr_d.view;
  a_d.indices = indices_d.view;
  a_d.values = values_d.view;
  TensorView x_view = rows_view(x_d.buffer.data(), a.cols, d, stride, Device::cuda(0));
  TensorView y_view = rows_view(y_d.buffer.data(), a.rows, d, stride, Device::cuda(0));
  x_view.dtype = y_view.dtype = dtype;
  // The workspace poisoned too: the carries kernel must read only what the chunks wrote.
  HostTensor scratch(DType::kU8, {static_cast<int64_t>(sparse::spmm_workspace_bytes(
                                     a.rows, static_cast<int64_t>(a.indices.size()), d))});
  std::fill_n(scratch.data<uint8_t>(), scratch.numel(), uint8_t{0xff});
  const DeviceCopy workspace = to_device(scratch);
  if (run) {
    run(a_d, x_view, y_view, workspace.view);
  } else {
    sparse::spmm(a_d, x_view, y_view, workspace.view, nullptr);
  }
  cuda::device_synchronize();
  HostTensor y_back(dtype, {std::max<int64_t>(a.rows, 1), stride});
  cuda::memcpy_dtoh(y_back.data<std::byte>(), y_d.buffer.data(),
                    static_cast<size_t>(y_back.numel()) * dtype_bytes(dtype));
  double worst = 0.0;  // the largest error over its bound, and where
  std::string worst_at;
  for (int64_t r = 0; r < a.rows; ++r) {
    const double terms = a.indptr[static_cast<size_t>(r) + 1] - a.indptr[static_cast<size_t>(r)];
    for (int64_t f = 0; f < stride; ++f) {
      const float got = y_back.get(r * stride + f);
      if (f >= d) {  // the padding stays poisoned: nothing written past d
        ASSERT_TRUE(std::isnan(got)) << "row " << r << " padding " << f;
        continue;
      }
      const double want = expected.data<float>()[r * d + f];
      ASSERT_FALSE(std::isnan(got)) << "row " << r << " feature " << f << " unwritten";
      const double bound = (terms + 8.0 + partial_roundings * output_roundoff(dtype) / 0x1p-24) *
                               0x1p-24 * l1.data<float>()[r * d + f] +
                           output_roundoff(dtype) * std::abs(want) +
                           (1 + partial_roundings) * subnormal_rounding(dtype) + 1e-30;
      const double excess = std::abs(got - want) / bound;
      if (excess > worst) {
        worst = excess;
        char text[160];
        std::snprintf(text, sizeof(text), "row %lld feature %lld: got %.6g, want %.6g, bound %.3g",
                      static_cast<long long>(r), static_cast<long long>(f), got, want, bound);
        worst_at = text;
      }
    }
  }
  EXPECT_LE(worst, 1.0) << worst_at;
}

// values[source[s]] (0 where source is -1) on the device, in values' dtype: a decomposition's
// slots.
inline DeviceCopy gathered(const std::vector<int64_t>& source, const HostTensor& values) {
  HostTensor out(values.dtype(), {static_cast<int64_t>(source.size())});
  for (size_t s = 0; s < source.size(); ++s)
    out.set(static_cast<int64_t>(s), source[s] >= 0 ? values.get(source[s]) : 0.0);
  return to_device(out);
}

// A matrix whose rows hold `lengths` nonzeros each (columns 0, 1, ...), normal values.
inline sparse::CsrStorage rows_of_lengths(const std::vector<int64_t>& lengths, int64_t cols,
                                          uint64_t seed) {
  testing::Rng rng(seed);
  sparse::CsrStorage a;
  a.rows = static_cast<int64_t>(lengths.size());
  a.cols = cols;
  a.indptr.push_back(0);
  for (const int64_t length : lengths) {
    for (int64_t c = 0; c < length; ++c) {
      a.indices.push_back(static_cast<int32_t>(c));
      a.values.push_back(static_cast<float>(rng.normal()));
    }
    a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
  }
  return a;
}

// The chunk walk's edges (chunks of 128 merge items at d <= 128, d above): leading and trailing
// empty rows, rows ending at a chunk's end, a row spanning many chunks, runs of empty rows
// longer than a chunk, fewer items than a chunk, and no nonzeros at all.
}  // namespace flare::spmm_testing
