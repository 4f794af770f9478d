// User-defined variants from the Python wrappers (flare.AttentionVariant): the declaration an
// engine is created with, and the scalar values of each run().
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>

#include "flare/api/run_options.h"
#include "flare/core/error.h"
#include "flare/variant/user_variant.h"

namespace flare::python {

namespace nb = nanobind;

// An object with name, source and scalars (a sequence of names), or None.
inline std::optional<UserVariant> user_variant_arg(nb::handle variant) {
  if (variant.is_none()) return std::nullopt;
  UserVariant v;
  v.name = nb::cast<std::string>(variant.attr("name"));
  v.source = nb::cast<std::string>(variant.attr("source"));
  for (nb::handle scalar : variant.attr("scalars"))
    v.scalars.push_back(nb::cast<std::string>(scalar));
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

}  // namespace flare::python
