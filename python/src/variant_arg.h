// User-defined variants from the Python wrappers (flare.AttentionVariant): the declaration an
// engine is created with, and the scalar values of each run().
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "flare/api/run_options.h"
#include "flare/core/dtype.h"
#include "flare/core/error.h"
#include "flare/variant/user_variant.h"
#include "object_view.h"

namespace flare::python {

namespace nb = nanobind;

// An object with name, source, scalars (a sequence of names) and tensors (a sequence of
// (name, dtype name, shape with -1 for any extent) triples), or None.
inline std::optional<UserVariant> user_variant_arg(nb::handle variant) {
  if (variant.is_none()) return std::nullopt;
  UserVariant v;
  v.name = nb::cast<std::string>(variant.attr("name"));
  v.source = nb::cast<std::string>(variant.attr("source"));
  for (nb::handle scalar : variant.attr("scalars")) {
    v.scalars.push_back(nb::cast<std::string>(scalar));
  }
  for (nb::handle tensor : variant.attr("tensors")) {
    UserVariantTensor decl{
        nb::cast<std::string>(tensor[0]), parse_dtype(nb::cast<std::string>(tensor[1])), {}};
    for (nb::handle extent : tensor[2]) decl.shape.push_back(nb::cast<int64_t>(extent));
    v.tensors.push_back(std::move(decl));
  }
  return v;
}

// run()'s scalar values: None, or a tuple of floats in the variant's declared order, copied
// into `storage` and viewed by options (the engine checks the count against the variant).
inline void set_variant_scalars(nb::handle values, std::array<float, kMaxUserScalars>& storage,
                                RunOptions& options) {
  if (values.is_none()) return;
  const size_t count = nb::len(values);
  FLARE_CHECK(count <= storage.size(), ErrorCode::kInvalidArgument, "run(): ", count,
              " variant scalars; a variant declares at most ", kMaxUserScalars);
  for (size_t i = 0; i < count; ++i) storage[i] = nb::cast<float>(values[i]);
  options.variant_scalars = {storage.data(), count};
}

// run()'s variant tensors: None, or a tuple of tensors in the variant's declared order (the
// engine checks their count, dtypes and device).
inline void set_variant_tensors(nb::handle tensors,
                                std::array<TensorView, kMaxUserTensors>& storage,
                                RunOptions& options) {
  if (tensors.is_none()) return;
  const size_t count = nb::len(tensors);
  FLARE_CHECK(count <= storage.size(), ErrorCode::kInvalidArgument, "run(): ", count,
              " variant tensors; a variant declares at most ", kMaxUserTensors);
  for (size_t i = 0; i < count; ++i) storage[i] = object_view(tensors[i], "variant tensor");
  options.variant_tensors = {storage.data(), count};
}

}  // namespace flare::python
