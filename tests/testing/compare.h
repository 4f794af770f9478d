// Numeric comparison of test outputs with a (float64) reference: max |a - b|, relative L2
// error ||a - b|| / ||b||, NaN counting, and NaN-poisoning of outputs before a run.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "testing/elements.h"

namespace flare::testing {

// How far `actual` is from `expected`, element by element in row-major order.
//  - An element pair that is exactly equal counts as error 0, which includes equal
//    infinities (e.g. LSE = -inf for empty rows on both sides).
//  - Any NaN on either side makes max_abs and relative_l2 NaN; an infinity on one side that
//    the other side does not match exactly makes them +inf (either way EXPECT_LE(err, tol)
//    fails).
//  - relative_l2 = ||a - b||_2 / ||b||_2 over the elements where b is finite; when ||b|| is 0
//    it is 0 if a equals b everywhere and +inf otherwise.
struct ErrorStats {
  double max_abs = 0.0;
  double relative_l2 = 0.0;
  int64_t worst_index = -1;  // row-major index of the largest |a - b| (first NaN if any)
  int64_t count = 0;         // elements compared
};

inline std::ostream& operator<<(std::ostream& os, const ErrorStats& stats) {
  return os << "max_abs=" << stats.max_abs << " relative_l2=" << stats.relative_l2
            << " worst_index=" << stats.worst_index << " count=" << stats.count;
}

namespace detail {

// `expected_at(linear)` returns the expected value of row-major element `linear`.
template <class ExpectedAt>
ErrorStats error_stats_impl(const TensorView& actual, int64_t expected_count,
                            ExpectedAt&& expected_at) {
  require_cpu(actual, "compared tensor");
  FLARE_CHECK(is_floating(actual.dtype), ErrorCode::kInvalidArgument,
              "comparison needs a floating dtype, got ", dtype_name(actual.dtype));
  ErrorStats stats;
  stats.count = element_count(actual);
  FLARE_CHECK(stats.count == expected_count, ErrorCode::kInvalidArgument,
              "compared tensors differ in size: actual has ", stats.count,
              " elements, expected has ", expected_count);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double diff_sq = 0.0;
  double ref_sq = 0.0;
  bool saw_nan = false;
  for_each_element(actual, [&](int64_t linear, int64_t offset) {
    const double a = element_at(actual, offset);
    const double b = expected_at(linear);
    if (std::isfinite(b)) ref_sq += b * b;
    if (a == b) return;
    const double diff = std::fabs(a - b);
    if (std::isnan(diff)) {
      if (!saw_nan) stats.worst_index = linear;
      saw_nan = true;
      return;
    }
    diff_sq += diff * diff;
    if (diff > stats.max_abs) {
      stats.max_abs = diff;
      if (!saw_nan) stats.worst_index = linear;
    }
  });
  if (saw_nan) {
    stats.max_abs = nan;
    stats.relative_l2 = nan;
  } else if (ref_sq > 0.0) {
    stats.relative_l2 = std::sqrt(diff_sq) / std::sqrt(ref_sq);
  } else {
    stats.relative_l2 = diff_sq == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return stats;
}

}  // namespace detail

// `actual` and `expected`: CPU views of floating dtypes (may differ) with the same number
// of elements (shapes are compared flattened), any strides.
inline ErrorStats error_stats(const TensorView& actual, const TensorView& expected) {
  require_cpu(expected, "expected tensor");
  const std::vector<double> values = to_double_vector(expected);
  return detail::error_stats_impl(actual, static_cast<int64_t>(values.size()),
                                  [&](int64_t i) { return values[static_cast<size_t>(i)]; });
}
// `expected` holds the row-major values of a tensor shaped like `actual`.
inline ErrorStats error_stats(const TensorView& actual, const std::vector<double>& expected) {
  return detail::error_stats_impl(actual, static_cast<int64_t>(expected.size()),
                                  [&](int64_t i) { return expected[static_cast<size_t>(i)]; });
}
inline ErrorStats error_stats(const TensorView& actual, const std::vector<float>& expected) {
  return detail::error_stats_impl(actual, static_cast<int64_t>(expected.size()),
                                  [&](int64_t i) { return expected[static_cast<size_t>(i)]; });
}

inline double max_abs_error(const TensorView& actual, const TensorView& expected) {
  return error_stats(actual, expected).max_abs;
}
inline double max_abs_error(const TensorView& actual, const std::vector<double>& expected) {
  return error_stats(actual, expected).max_abs;
}
inline double max_abs_error(const TensorView& actual, const std::vector<float>& expected) {
  return error_stats(actual, expected).max_abs;
}

inline double relative_l2_error(const TensorView& actual, const TensorView& expected) {
  return error_stats(actual, expected).relative_l2;
}
inline double relative_l2_error(const TensorView& actual, const std::vector<double>& expected) {
  return error_stats(actual, expected).relative_l2;
}
inline double relative_l2_error(const TensorView& actual, const std::vector<float>& expected) {
  return error_stats(actual, expected).relative_l2;
}

// Largest |element| of a floating CPU view (any strides); NaN if one is NaN.
inline double max_abs(const TensorView& t) {
  require_cpu(t, "max_abs input");
  double largest = 0.0;
  for_each_element(t, [&](int64_t, int64_t offset) {
    const double x = std::fabs(element_at(t, offset));
    largest = std::isnan(x) || std::isnan(largest) ? NAN : std::max(largest, x);
  });
  return largest;
}

// Number of NaN elements of a floating CPU view (any strides).
inline int64_t count_nan(const TensorView& t) {
  require_cpu(t, "count_nan input");
  FLARE_CHECK(is_floating(t.dtype), ErrorCode::kInvalidArgument,
              "count_nan needs a floating dtype, got ", dtype_name(t.dtype));
  int64_t nans = 0;
  for_each_element(t, [&](int64_t, int64_t offset) { nans += std::isnan(element_at(t, offset)); });
  return nans;
}

// Sets every element of a floating CPU view (any strides) to NaN, so that an element the
// code under test fails to write shows up in the comparison. Padding between strided
// elements is left alone.
inline void poison(const TensorView& t) {
  require_cpu(t, "poison target");
  FLARE_CHECK(is_floating(t.dtype), ErrorCode::kInvalidArgument,
              "poison needs a floating dtype, got ", dtype_name(t.dtype));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for_each_element(t, [&](int64_t, int64_t offset) { set_element_at(t, offset, nan); });
}

}  // namespace flare::testing
