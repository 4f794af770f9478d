// TensorArg: a framework tensor (anything with __dlpack__, or a DLPack capsule) imported
// through nanobind without a copy, held alive while flare reads it as a TensorView.
#pragma once

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "flare/core/tensor.h"

namespace flare::python {

namespace nb = nanobind;

class TensorArg {
 public:
  // `dtype` reinterprets the elements (same element size): the Python side passes fp8 torch
  // tensors as uint8 views, since not every framework exports fp8 through DLPack.
  TensorArg(nb::ndarray<nb::ro> array, const std::optional<std::string>& dtype);

  const TensorView& view() const { return view_; }

 private:
  nb::ndarray<nb::ro> array_;  // owns the producer's reference to the memory
  TensorView view_;
};

// The view of an optional argument.
inline std::optional<TensorView> view_of(const std::optional<TensorArg>& arg) {
  if (!arg) return std::nullopt;
  return arg->view();
}

// A size-1 dimension never steps, and producers export any stride for it (torch may give 1):
// gives each the contiguous value, so stride and alignment checks see a regular layout.
inline void regularize_unit_strides(int ndim, const int64_t* shape, int64_t* strides) {
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) strides[d] = d + 1 < ndim ? strides[d + 1] * shape[d + 1] : 1;
  }
}

// The values of a contiguous 1-D int32 CPU array (host index arrays of plan() calls); throws
// kInvalidArgument naming `name` otherwise.
std::span<const int32_t> host_int32_span(const TensorView& array, const char* name);

}  // namespace flare::python
