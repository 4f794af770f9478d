// TensorView (strided, non-owning) and HostTensor (owning, contiguous CPU) methods, plus the
// Device names "cpu" / "cuda:N".
#include "flare/core/tensor.h"

#include <charconv>
#include <cstring>
#include <sstream>

#include "flare/core/error.h"

namespace flare {
namespace {

void check_shape(const int64_t* shape, size_t ndim, const char* who) {
  FLARE_CHECK(ndim <= static_cast<size_t>(kMaxDims), ErrorCode::kInvalidArgument, who,
              ": ndim must be <= ", kMaxDims, ", got ", ndim);
  for (size_t d = 0; d < ndim; ++d) {
    FLARE_CHECK(shape[d] >= 0, ErrorCode::kInvalidArgument, who, ": shape[", d,
                "] must be >= 0, got ", shape[d]);
  }
}

TensorView make_contiguous(void* data, DType dtype, const int64_t* shape, size_t ndim,
                           Device device) {
  check_shape(shape, ndim, "TensorView::contiguous");
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.ndim = static_cast<int>(ndim);
  int64_t stride = 1;
  for (int d = view.ndim - 1; d >= 0; --d) {
    view.shape[d] = shape[d];
    view.strides[d] = stride;
    stride *= shape[d];
  }
  return view;
}

// Resolves a possibly negative `dim` of a view with `ndim` dimensions, or throws.
int checked_dim(int dim, int ndim, const char* who) {
  const int resolved = dim < 0 ? dim + ndim : dim;
  FLARE_CHECK(resolved >= 0 && resolved < ndim, ErrorCode::kInvalidArgument, who, ": dim ", dim,
              " out of range for a tensor of ", ndim, " dimensions");
  return resolved;
}

}  // namespace

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (text.size() > kCudaPrefix.size() && text.compare(0, kCudaPrefix.size(), kCudaPrefix) == 0) {
    const char* first = text.data() + kCudaPrefix.size();
    const char* last = text.data() + text.size();
    int index = -1;
    const auto [end, error] = std::from_chars(first, last, index);
    if (error == std::errc() && end == last && index >= 0) return Device::cuda(index);
  }
  fail(ErrorCode::kInvalidArgument, "parse_device: expected 'cpu', 'cuda' or 'cuda:N', got '", text,
       "'");
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return make_contiguous(data, dtype, shape.begin(), shape.size(), device);
}

TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                                  Device device) {
  return make_contiguous(data, dtype, shape.data(), shape.size(), device);
}

int64_t TensorView::numel() const {
  int64_t count = 1;
  for (int d = 0; d < ndim; ++d) count *= shape[d];
  return count;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // no element to address, so any strides describe it
  int64_t expected_stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    // A size-1 dimension is never stepped along, so its stride does not matter.
    if (shape[d] == 1) continue;
    if (strides[d] != expected_stride) return false;
    expected_stride *= shape[d];
  }
  return true;
}

int64_t TensorView::offset(std::initializer_list<int64_t> index) const {
  FLARE_CHECK(static_cast<int>(index.size()) == ndim, ErrorCode::kInvalidArgument,
              "TensorView::offset: expected ", ndim, " indices, got ", index.size());
  int64_t result = 0;
  int d = 0;
  for (int64_t i : index) {
    FLARE_CHECK(i >= 0 && i < shape[d], ErrorCode::kInvalidArgument, "TensorView::offset: index ",
                i, " out of range [0, ", shape[d], ") in dim ", d, " of shape ", shape_str());
    result += i * strides[d];
    ++d;
  }
  return result;
}

TensorView TensorView::select(int dim, int64_t i) const {
  const int d = checked_dim(dim, ndim, "TensorView::select");
  FLARE_CHECK(i >= 0 && i < shape[d], ErrorCode::kInvalidArgument, "TensorView::select: index ", i,
              " out of range [0, ", shape[d], ") in dim ", d, " of shape ", shape_str());
  TensorView result = *this;
  result.data =
      static_cast<std::byte*>(data) + i * strides[d] * static_cast<int64_t>(dtype_bytes(dtype));
  for (int k = d; k + 1 < ndim; ++k) {
    result.shape[k] = shape[k + 1];
    result.strides[k] = strides[k + 1];
  }
  result.shape[ndim - 1] = 0;
  result.strides[ndim - 1] = 0;
  result.ndim = ndim - 1;
  return result;
}

TensorView TensorView::slice(int dim, int64_t begin, int64_t end) const {
  const int d = checked_dim(dim, ndim, "TensorView::slice");
  FLARE_CHECK(0 <= begin && begin <= end && end <= shape[d], ErrorCode::kInvalidArgument,
              "TensorView::slice: range [", begin, ", ", end,
              ") must satisfy 0 <= begin <= end <= ", shape[d], " in dim ", d, " of shape ",
              shape_str());
  TensorView result = *this;
  result.data =
      static_cast<std::byte*>(data) + begin * strides[d] * static_cast<int64_t>(dtype_bytes(dtype));
  result.shape[d] = end - begin;
  return result;
}

std::string TensorView::shape_str() const {
  std::ostringstream text;
  text << '[';
  for (int d = 0; d < ndim; ++d) text << (d ? ", " : "") << shape[d];
  text << ']';
  return text.str();
}

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  check_shape(shape_.data(), shape_.size(), "HostTensor");
  bytes_.resize(static_cast<size_t>(numel()) * dtype_bytes(dtype_));  // value-initialized: zeros
}

TensorView HostTensor::view() const {
  return TensorView::contiguous(const_cast<std::byte*>(bytes_.data()), dtype_, shape_);
}

int64_t HostTensor::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape_) count *= extent;
  return count;
}

void HostTensor::fill(float x) {
  FLARE_CHECK(is_floating(dtype_), ErrorCode::kInvalidArgument,
              "HostTensor::fill: dtype must be floating, got ", dtype_name(dtype_));
  const int64_t count = numel();
  if (count == 0) return;
  // Round once, then replicate the element's bytes.
  store_float(bytes_.data(), dtype_, 0, x);
  const size_t element_bytes = dtype_bytes(dtype_);
  for (int64_t i = 1; i < count; ++i) {
    std::memcpy(bytes_.data() + i * element_bytes, bytes_.data(), element_bytes);
  }
}

}  // namespace flare
