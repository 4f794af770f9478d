// flare::variants (the shipped library of variants, flare/variant/library.h) for
// python/flare/variants.py, and FlashInfer's variant declarations (flashinfer_variant.h) for
// python/flare/jit.py: each variant's declaration as plain Python values.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "flare/core/dtype.h"
#include "flare/variant/flashinfer_variant.h"
#include "flare/variant/library.h"

namespace flare::python {

namespace {

// {"name", "source", "scalars": tuple, "tensors": tuple of (name, dtype, shape), "use_softmax",
// "requires_causal"}, shape extents as declared (kAnyExtent and the symbolic extents are
// negative codes).
nb::dict variant_dict(const UserVariant& v) {
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

nb::dict library_variant(const std::string& name) { return variant_dict(variants::by_name(name)); }

nb::dict flashinfer_variant(const std::string& variant_name, const std::string& variant_decl,
                            std::vector<std::string> tensor_names,
                            std::vector<std::string> tensor_dtypes,
                            std::vector<std::string> scalar_names,
                            std::vector<std::string> scalar_dtypes) {
  return variant_dict(flare::flashinfer_variant({variant_name, variant_decl,
                                                 std::move(tensor_names), std::move(tensor_dtypes),
                                                 std::move(scalar_names),
                                                 std::move(scalar_dtypes)}));
}

}  // namespace

void bind_variants(nb::module_& m) {
  m.def("library_variant", &library_variant, nb::arg("name"),
        "The declaration of flare::variants::<name> (flare/variant/library.h).");
  m.def("t5_distance_buckets", &variants::t5_distance_buckets, nb::arg("max_distance"),
        "T5's bucket of each distance 0 .. ceil(max_distance) (flare/variant/library.h).");
  m.def("flashinfer_variant", &flashinfer_variant, nb::arg("variant_name"),
        nb::arg("variant_decl"), nb::arg("tensor_names"), nb::arg("tensor_dtypes"),
        nb::arg("scalar_names"), nb::arg("scalar_dtypes"),
        "A FlashInfer variant_decl as a flare variant (flare/variant/flashinfer_variant.h).");
}

}  // namespace flare::python
