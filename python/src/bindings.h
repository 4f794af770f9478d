// The pieces of the _flare module, one binding file per C++ API area.
#pragma once

#include <nanobind/nanobind.h>

namespace flare::python {

namespace nb = nanobind;

void bind_tensor_arg(nb::module_& m);     // tensor_arg.cpp
void bind_params_arg(nb::module_& m);     // params_arg.cpp
void bind_cpu_attention(nb::module_& m);  // bind_cpu_attention.cpp
void bind_batch_decode(nb::module_& m);   // bind_batch_decode.cpp
void bind_index_staging(nb::module_& m);  // bind_index_staging.cpp
void bind_batch_prefill(nb::module_& m);  // bind_batch_prefill.cpp
void bind_merge(nb::module_& m);          // bind_merge.cpp
void bind_formats(nb::module_& m);        // bind_formats.cpp
void bind_rope(nb::module_& m);           // bind_rope.cpp
void bind_append(nb::module_& m);         // bind_append.cpp
void bind_precompile(nb::module_& m);     // bind_precompile.cpp
void bind_variants(nb::module_& m);       // bind_variants.cpp
void bind_sparse(nb::module_& m);         // bind_sparse.cpp
void bind_model(nb::module_& m);          // bind_model.cpp

}  // namespace flare::python
