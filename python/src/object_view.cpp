// object_view: torch tensors by attribute, everything else through TensorArg (DLPack).
#include "object_view.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "flare/core/error.h"
#include "tensor_arg.h"

namespace flare::python {
namespace {

// DLPack 1.3's C exchange API (dlpack.h: DLTensor, DLPackExchangeAPI), the fields flare reads,
// in the ABI the standard fixes. torch >= 2.10 publishes its table on the type, as the capsule
// torch.Tensor.__dlpack_c_exchange_api__ ("dlpack_exchange_api"): dltensor_from_py_object_no_sync
// fills a non-owning view (torch's own shape and stride arrays, valid while the tensor lives)
// without the interpreter, ~0.05 us against ~0.8 us for five attribute reads.
namespace dlpack {
struct Device {
  int32_t type, id;  // kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3
};
struct DataType {
  uint8_t code, bits;  // code: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6,
  uint16_t lanes;      // kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct Version {
  uint32_t major, minor;
};
struct ExchangeApiHeader {
  Version version;
  ExchangeApiHeader* prev_api;  // the tables of older versions, newest first
};
struct ExchangeApi {
  ExchangeApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);  // 0, or -1 and a
  int (*current_work_stream)(int32_t device_type, int32_t device_id,     // Python error set
                             void** out_current_stream);
};
constexpr int32_t kCpu = 1, kCuda = 2, kCudaHost = 3;

// The table of `type` (its __dlpack_c_exchange_api__) at major version 1, minor 3 or later
// (the layout above), with both functions flare calls; else null.
const ExchangeApi* exchange_api(PyObject* type) {
  PyObject* capsule = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const nb::object owner = nb::steal(capsule);  // the table outlives it (the process's)
  auto* header = static_cast<const ExchangeApiHeader*>(
      PyCapsule_IsValid(capsule, "dlpack_exchange_api")
          ? PyCapsule_GetPointer(capsule, "dlpack_exchange_api")
          : nullptr);
  while (header != nullptr && !(header->version.major == 1 && header->version.minor >= 3)) {
    header = header->prev_api;
  }
  const auto* api = reinterpret_cast<const ExchangeApi*>(header);
  if (api == nullptr || api->dltensor_from_py_object_no_sync == nullptr ||
      api->current_work_stream == nullptr) {
    return nullptr;
  }
  return api;
}

// flare's dtype of a DLPack one, where flare takes it (torch.bool reads as uint8, as below).
std::optional<DType> dtype_of(DataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch ((t.code << 8) | t.bits) {
    case (2 << 8) | 32:
      return DType::kF32;
    case (2 << 8) | 16:
      return DType::kF16;
    case (4 << 8) | 16:
      return DType::kBF16;
    case (10 << 8) | 8:
      return DType::kE4M3;
    case (12 << 8) | 8:
      return DType::kE5M2;
    case (0 << 8) | 32:
      return DType::kI32;
    case (0 << 8) | 64:
      return DType::kI64;
    case (1 << 8) | 8:
    case (6 << 8) | 8:
      return DType::kU8;
    default:
      return std::nullopt;
  }
}
}  // namespace dlpack

// What flare needs of the torch module, looked up once: torch cannot be unloaded, and its
// type and dtype objects live as long as it does.
struct Torch {
  PyObject* tensor_type = nullptr;
  PyObject* parameter_type = nullptr;  // torch.nn.Parameter
  std::array<std::pair<PyObject*, DType>, 9> dtypes{};
  PyObject* current_raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream
  const dlpack::ExchangeApi* dlpack = nullptr;  // torch.Tensor's, where it has one
};

// Interned attribute names.
struct Names {
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* stride = PyUnicode_InternFromString("stride");
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* get_device = PyUnicode_InternFromString("get_device");
};

const Names& names() {
  static const Names n;
  return n;
}

// The torch module's objects once the caller has imported torch, else null.
const Torch* torch_objects() {
  static Torch torch;
  static bool loaded = false;
  if (loaded) return &torch;
  PyObject* module = PyImport_GetModule(nb::str("torch").ptr());  // new reference or null
  if (module == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const nb::object t = nb::steal(module);
  torch.tensor_type = nb::object(t.attr("Tensor")).release().ptr();
  const std::pair<const char*, DType> dtypes[] = {
      {"float32", DType::kF32},        {"float16", DType::kF16},      {"bfloat16", DType::kBF16},
      {"float8_e4m3fn", DType::kE4M3}, {"float8_e5m2", DType::kE5M2}, {"int32", DType::kI32},
      {"int64", DType::kI64},          {"uint8", DType::kU8},         {"bool", DType::kU8},
  };
  for (size_t i = 0; i < std::size(dtypes); ++i) {
    torch.dtypes[i] = {nb::object(t.attr(dtypes[i].first)).release().ptr(), dtypes[i].second};
  }
  torch.parameter_type = nb::object(t.attr("nn").attr("Parameter")).release().ptr();
  torch.dlpack = dlpack::exchange_api(torch.tensor_type);
  const nb::object c_module = t.attr("_C");
  if (nb::hasattr(c_module, "_cuda_getCurrentRawStream")) {
    torch.current_raw_stream =
        nb::object(c_module.attr("_cuda_getCurrentRawStream")).release().ptr();
  }
  loaded = true;
  return &torch;
}

// A new reference from `call`, or the Python error as an exception.
nb::object checked(PyObject* result) {
  if (result == nullptr) throw nb::python_error();
  return nb::steal(result);
}

int64_t as_int64(PyObject* value) {
  const long long x = PyLong_AsLongLong(value);
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  return x;
}

// The view through torch's DLPack table, for a plain torch.Tensor or Parameter (a subclass,
// e.g. a fake tensor under torch.compile's tracing, keeps the attribute reads and their errors)
// of a dtype, device and rank flare takes; nullopt sends the tensor to the attribute reads,
// which name what flare does not take.
std::optional<TensorView> dlpack_view(PyObject* tensor, const Torch& torch) {
  const auto* type = reinterpret_cast<PyObject*>(Py_TYPE(tensor));
  if (torch.dlpack == nullptr || (type != torch.tensor_type && type != torch.parameter_type)) {
    return std::nullopt;
  }
  dlpack::Tensor t{};
  if (torch.dlpack->dltensor_from_py_object_no_sync(tensor, &t) != 0) throw nb::python_error();
  const std::optional<DType> dtype = dlpack::dtype_of(t.dtype);
  const bool cpu = t.device.type == dlpack::kCpu || t.device.type == dlpack::kCudaHost;
  if (!dtype || t.ndim < 0 || t.ndim > kMaxDims || (!cpu && t.device.type != dlpack::kCuda)) {
    return std::nullopt;
  }
  TensorView view;
  view.dtype = *dtype;
  view.ndim = t.ndim;
  int64_t compact = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    view.shape[i] = t.shape[d];
    view.strides[i] = t.strides != nullptr ? t.strides[d] : compact;
    compact *= t.shape[d];
  }
  regularize_unit_strides(view.ndim, view.shape.data(), view.strides.data());
  view.data = static_cast<char*>(t.data) + t.byte_offset;
  view.device = cpu ? Device::cpu() : Device::cuda(t.device.id);
  return view;
}

TensorView torch_view(PyObject* tensor, const Torch& torch, const char* name) {
  if (std::optional<TensorView> fast = dlpack_view(tensor, torch)) return *fast;
  const Names& n = names();
  TensorView view;
  const nb::object dtype = checked(PyObject_GetAttr(tensor, n.dtype));
  bool known = false;
  for (const auto& [object, type] : torch.dtypes) {
    if (object == dtype.ptr()) {
      view.dtype = type;
      known = true;
      break;
    }
  }
  FLARE_CHECK(known, ErrorCode::kInvalidArgument, name, " has dtype ", nb::str(dtype).c_str(),
              ", which flare does not take");
  const nb::object shape = checked(PyObject_GetAttr(tensor, n.shape));
  const nb::object strides = checked(PyObject_CallMethodNoArgs(tensor, n.stride));
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  FLARE_CHECK(ndim <= kMaxDims, ErrorCode::kInvalidArgument, name, " has ", ndim,
              " dimensions; flare tensors have at most ", kMaxDims);
  view.ndim = static_cast<int>(ndim);
  for (Py_ssize_t d = 0; d < ndim; ++d) {
    view.shape[static_cast<size_t>(d)] = as_int64(PyTuple_GET_ITEM(shape.ptr(), d));
    view.strides[static_cast<size_t>(d)] = as_int64(PyTuple_GET_ITEM(strides.ptr(), d));
  }
  regularize_unit_strides(view.ndim, view.shape.data(), view.strides.data());
  const nb::object pointer = checked(PyObject_CallMethodNoArgs(tensor, n.data_ptr));
  view.data = PyLong_AsVoidPtr(pointer.ptr());
  if (view.data == nullptr && PyErr_Occurred()) throw nb::python_error();
  const nb::object device = checked(PyObject_CallMethodNoArgs(tensor, n.get_device));
  const int64_t index = as_int64(device.ptr());
  view.device = index < 0 ? Device::cpu() : Device::cuda(static_cast<int>(index));
  return view;
}

}  // namespace

namespace {

// A (tensor, shape) pair from the wrappers: the contiguous tensor viewed with `shape`, as
// tensor.reshape(shape) would without copying (each torch reshape costs ~1.5-2 us of host time a
// call; here the view is a few stores).
TensorView reshaped_view(nb::handle pair, const char* name) {
  const TensorView given = object_view(PyTuple_GET_ITEM(pair.ptr(), 0), name);
  PyObject* shape = PyTuple_GET_ITEM(pair.ptr(), 1);
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
  FLARE_CHECK(given.is_contiguous() && ndim <= kMaxDims, ErrorCode::kInvalidArgument, name,
              " viewed with ", ndim, " dimensions must be contiguous, got shape ",
              given.shape_str());
  TensorView view = given;
  view.ndim = static_cast<int>(ndim);
  int64_t stride = 1;
  for (Py_ssize_t d = ndim - 1; d >= 0; --d) {
    const int64_t extent = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    if (extent == -1 && PyErr_Occurred()) throw nb::python_error();
    view.shape[static_cast<size_t>(d)] = extent;
    view.strides[static_cast<size_t>(d)] = stride;  // row-major, size-1 dims too (as torch_view)
    stride *= extent;
  }
  FLARE_CHECK(view.numel() == given.numel(), ErrorCode::kInvalidArgument, name, " of shape ",
              given.shape_str(), " cannot be viewed as ", view.shape_str());
  return view;
}

}  // namespace

TensorView object_view(nb::handle object, const char* name) {
  const Torch* torch = torch_objects();
  if (torch != nullptr) {
    const int is_tensor = PyObject_IsInstance(object.ptr(), torch->tensor_type);
    if (is_tensor < 0) throw nb::python_error();
    if (is_tensor == 1) return torch_view(object.ptr(), *torch, name);
  }
  if (PyTuple_Check(object.ptr()) && PyTuple_GET_SIZE(object.ptr()) == 2 &&
      PyTuple_Check(PyTuple_GET_ITEM(object.ptr(), 1))) {
    return reshaped_view(object, name);
  }
  if (nb::isinstance<TensorArg>(object)) return nb::cast<const TensorArg&>(object).view();
  nb::ndarray<nb::ro> array;
  FLARE_CHECK(nb::try_cast(object, array), ErrorCode::kInvalidArgument, name,
              " must be a tensor (a torch tensor, a numpy array or a DLPack producer), got ",
              nb::str(nb::type_name(object.type())).c_str());
  // A DLPack import owns a reference to its producer, which the caller holds anyway.
  return TensorArg(std::move(array), std::nullopt).view();
}

std::optional<TensorView> optional_object_view(nb::handle object, const char* name) {
  if (object.is_none()) return std::nullopt;
  return object_view(object, name);
}

namespace {

// K and V pages from a (k, v) pair or one [pages, 2, ...] tensor named `name`.
std::pair<TensorView, TensorView> kv_pair(nb::handle cache, const std::string& name) {
  if (PyTuple_Check(cache.ptr()) || PyList_Check(cache.ptr())) {
    const nb::sequence pair = nb::borrow<nb::sequence>(cache);
    FLARE_CHECK(nb::len(pair) == 2, ErrorCode::kInvalidArgument, name,
                " as a tuple must be (k, v), got ", nb::len(pair), " tensors");
    return {object_view(pair[0], (name + "[0]").c_str()),
            object_view(pair[1], (name + "[1]").c_str())};
  }
  const TensorView both = object_view(cache, name.c_str());
  FLARE_CHECK(both.ndim == 5 && both.shape[1] == 2, ErrorCode::kInvalidArgument, name,
              " must be [pages, 2, page_size, H_kv, D] (NHD) or [pages, 2, H_kv, page_size, D] "
              "(HND), or a (k, v) tuple; got shape ",
              both.shape_str());
  return {both.select(1, 0), both.select(1, 1)};
}

}  // namespace

PagedKVPages paged_kv_pages(nb::handle paged_kv_cache, KVLayout layout, nb::handle indices,
                            const char* indices_name, nb::handle kv_cache_sf) {
  PagedKVPages pages;
  pages.layout = layout;
  pages.indices = object_view(indices, indices_name);
  std::tie(pages.k, pages.v) = kv_pair(paged_kv_cache, "paged_kv_cache");
  if (!kv_cache_sf.is_none()) {
    std::tie(pages.k_scales, pages.v_scales) = kv_pair(kv_cache_sf, "kv_cache_sf");
  }
  return pages;
}

uintptr_t torch_current_stream(int device) {
  const Torch* torch = torch_objects();
  if (torch != nullptr && torch->dlpack != nullptr) {
    void* stream = nullptr;
    if (torch->dlpack->current_work_stream(dlpack::kCuda, device, &stream) != 0) {
      throw nb::python_error();
    }
    return reinterpret_cast<uintptr_t>(stream);
  }
  FLARE_CHECK(torch != nullptr && torch->current_raw_stream != nullptr, ErrorCode::kInternal,
              "CUDA tensors without torch's current-stream function");
  const nb::object stream =
      checked(PyObject_CallOneArg(torch->current_raw_stream, nb::int_(device).ptr()));
  const unsigned long long handle = PyLong_AsUnsignedLongLong(stream.ptr());
  if (handle == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    throw nb::python_error();
  }
  return static_cast<uintptr_t>(handle);
}

}  // namespace flare::python
