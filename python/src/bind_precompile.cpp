// flare::precompile for flare.jit.precompile: lists of DecodeConfig / PrefillConfig (the
// engines' configs, bind_batch_decode.cpp / bind_batch_prefill.cpp), compiled in parallel
// into the JIT disk cache with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include "bindings.h"
#include "flare/api/precompile.h"

namespace flare::python {

namespace {

nb::dict precompile_configs(const std::vector<BatchDecodeConfig>& decode,
                            const std::vector<BatchPrefillConfig>& prefill, int device,
                            int num_threads) {
  PrecompileReport report;
  {
    nb::gil_scoped_release release;
    report = precompile(decode, prefill, device, num_threads);
  }
  nb::dict out;
  out["kernels"] = report.kernels;
  out["compiled"] = report.compiled;
  out["from_cache"] = report.from_cache;
  out["wall_seconds"] = report.wall_seconds;
  out["compile_seconds"] = report.compile_seconds;
  return out;
}

}  // namespace

void bind_precompile(nb::module_& m) {
  m.def("precompile", &precompile_configs, nb::arg("decode"), nb::arg("prefill"),
        nb::arg("device"), nb::arg("num_threads"),
        "flare::precompile: every kernel of the configs into the JIT disk cache, in parallel; "
        "returns {kernels, compiled, from_cache, wall_seconds, compile_seconds}.");
}

}  // namespace flare::python
