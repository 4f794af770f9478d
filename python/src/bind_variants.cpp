// flare::variants (the shipped library of variants, flare/variant/library.h) for
// python/flare/variants.py: each variant's declaration as plain Python values.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "flare/core/dtype.h"
#include "flare/variant/library.h"

namespace flare::python {

namespace {

// {"name", "source", "scalars": tuple, "tensors": tuple of (name, dtype, shape), "use_softmax",
// "requires_causal"},
// shape extents as declared (kAnyExtent and the symbolic extents are negative codes).
nb::dict library_variant(const std::string& name) {
  const UserVariant v = variants::by_name(name);
  nb::list scalars, tensors;
  for (const std::string& scalar : v.scalars) scalars.append(scalar);
  for (const UserVariantTensor& t : v.tensors) {
    nb::list shape;
    for (const int64_t extent : t.shape) shape.append(extent);
    tensors.append(nb::make_tuple(t.name, std::string(dtype_name(t.dtype)), nb::tuple(shape)));
  }
  nb::dict out;
  out["name"] = v.name;
  out["source"] = v.source;
  out["scalars"] = nb::tuple(scalars);
  out["tensors"] = nb::tuple(tensors);
  out["use_softmax"] = v.use_softmax;
  out["requires_causal"] = v.requires_causal;
  return out;
}

}  // namespace

void bind_variants(nb::module_& m) {
  m.def("library_variant", &library_variant, nb::arg("name"),
        "The declaration of flare::variants::<name> (flare/variant/library.h).");
}

}  // namespace flare::python
