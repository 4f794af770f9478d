// The _flare extension module: flare's C++ API for the Python wrappers in python/flare, with
// flare::Error translated to ValueError (invalid argument), NotImplementedError (unsupported)
// or RuntimeError (everything else), carrying the C++ message.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <exception>
#include <string>

#include "bindings.h"
#include "flare/core/dtype.h"
#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "flare/jit/cuda_driver.h"
#include "object_view.h"

namespace nb = nanobind;

namespace {

PyObject* exception_type(flare::ErrorCode code) {
  switch (code) {
    case flare::ErrorCode::kInvalidArgument:
      return PyExc_ValueError;
    case flare::ErrorCode::kUnsupported:
      return PyExc_NotImplementedError;
    case flare::ErrorCode::kIndexOutOfRange:
      return PyExc_IndexError;
    default:
      return PyExc_RuntimeError;
  }
}

void translate_flare_error(const std::exception_ptr& error, void*) {
  try {
    std::rethrow_exception(error);
  } catch (const flare::Error& e) {
    PyErr_SetString(exception_type(e.code()), e.what());
  }
}

}  // namespace

NB_MODULE(_flare, m) {
  m.doc() = "flare's C++ engine (internal: use the flare package's functions and wrappers)";
  nb::register_exception_translator(translate_flare_error);
  m.def("cuda_available", &flare::cuda::available,
        "True when the CUDA driver loads and a device exists.");
  m.def("cuda_unavailable_reason", &flare::cuda::unavailable_reason);
  m.def("cuda_device_count", &flare::cuda::device_count);
  m.def("current_stream", &flare::python::torch_current_stream, nb::arg("device"),
        "torch's current CUDA stream on `device`, as an int (the stream flare launches on).");
  m.def(
      "_object_view",
      [](nb::handle object) {
        const flare::TensorView v = flare::python::object_view(object, "object");
        nb::list shape, strides;
        for (int d = 0; d < v.ndim; ++d) {
          shape.append(v.shape[static_cast<size_t>(d)]);
          strides.append(v.strides[static_cast<size_t>(d)]);
        }
        return nb::make_tuple(std::string(flare::dtype_name(v.dtype)), nb::tuple(shape),
                              nb::tuple(strides), reinterpret_cast<uintptr_t>(v.data),
                              v.device.is_cuda() ? v.device.index : -1);
      },
      nb::arg("object"),
      "For tests: (dtype, shape, strides, data pointer, CUDA device or -1) of the view flare's "
      "calls read of `object`.");
  flare::python::bind_tensor_arg(m);
  flare::python::bind_params_arg(m);
  flare::python::bind_cpu_attention(m);
  flare::python::bind_batch_decode(m);
  flare::python::bind_index_staging(m);
  flare::python::bind_batch_prefill(m);
  flare::python::bind_merge(m);
  flare::python::bind_formats(m);
  flare::python::bind_rope(m);
  flare::python::bind_append(m);
  flare::python::bind_precompile(m);
  flare::python::bind_variants(m);
  flare::python::bind_sparse(m);
  flare::python::bind_model(m);
}
