// TensorArg: nanobind's DLPack import, converted into flare's TensorView by flare::from_dlpack
// (which names unsupported dtypes and devices).
#include "tensor_arg.h"

#include "bindings.h"

#include <nanobind/stl/vector.h>

#include <vector>

#include "flare/core/dlpack.h"
#include "flare/core/error.h"
#include "flare/format/validate.h"

namespace flare::python {

TensorArg::TensorArg(nb::ndarray<nb::ro> array, const std::optional<std::string>& dtype)
    : array_(std::move(array)) {
  const auto ndim = static_cast<int32_t>(array_.ndim());
  FLARE_CHECK(ndim <= kMaxDims, ErrorCode::kInvalidArgument, "flare tensors have at most ",
              kMaxDims, " dimensions, got ", ndim);
  std::vector<int64_t> shape(static_cast<size_t>(ndim));
  std::vector<int64_t> strides(static_cast<size_t>(ndim));
  for (int32_t d = ndim - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    shape[i] = static_cast<int64_t>(array_.shape(i));
    strides[i] = array_.stride(i);
  }
  regularize_unit_strides(ndim, shape.data(), strides.data());
  const nb::dlpack::dtype type = array_.dtype();
  DLTensor tensor{};
  tensor.data = const_cast<void*>(array_.data());  // data() already includes the byte offset
  tensor.device = {static_cast<DLDeviceType>(array_.device_type()),
                   static_cast<int32_t>(array_.device_id())};
  tensor.ndim = ndim;
  tensor.dtype = {type.code, type.bits, type.lanes};
  tensor.shape = shape.data();
  tensor.strides = strides.data();
  tensor.byte_offset = 0;
  view_ = from_dlpack(tensor);
  if (dtype) {
    const DType reinterpreted = parse_dtype(*dtype);
    FLARE_CHECK(dtype_bytes(reinterpreted) == dtype_bytes(view_.dtype),
                ErrorCode::kInvalidArgument, "cannot view ", dtype_name(view_.dtype), " as ",
                dtype_name(reinterpreted), ": element sizes differ");
    view_.dtype = reinterpreted;
  }
}

std::span<const int32_t> host_int32_span(const TensorView& array, const char* name) {
  validate_dtype(array, name, DType::kI32);
  FLARE_CHECK(array.device.is_cpu() && array.ndim == 1 &&
                  (array.shape[0] <= 1 || array.strides[0] == 1),
              ErrorCode::kInvalidArgument, name, " must be a contiguous 1-D CPU array, got ",
              array.shape_str(), " on ", array.device.str());
  return {array.ptr<const int32_t>(), static_cast<size_t>(array.shape[0])};
}

void bind_tensor_arg(nb::module_& m) {
  nb::class_<TensorArg>(m, "Tensor",
                        "A tensor imported through DLPack without a copy (internal argument type).")
      .def(nb::init<nb::ndarray<nb::ro>, const std::optional<std::string>&>(), nb::arg("array"),
           nb::arg("dtype") = nb::none())
      .def_prop_ro("dtype", [](const TensorArg& t) { return std::string(dtype_name(t.view().dtype)); })
      .def_prop_ro("device", [](const TensorArg& t) { return t.view().device.str(); })
      .def_prop_ro("shape",
                   [](const TensorArg& t) {
                     const TensorView& v = t.view();
                     return std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim);
                   })
      .def_prop_ro("strides", [](const TensorArg& t) {
        const TensorView& v = t.view();
        return std::vector<int64_t>(v.strides.begin(), v.strides.begin() + v.ndim);
      });
}

}  // namespace flare::python
