// TensorView: a non-owning strided view (pointer, dtype, device, shape, strides in elements)
// that every API takes; HostTensor: an owning, contiguous CPU buffer for tools and tests.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "flare/core/dtype.h"

namespace flare {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;  // "cpu", "cuda:1"
  friend bool operator==(const Device&, const Device&) = default;
};

// Parses "cpu", "cuda", "cuda:N". Throws kInvalidArgument otherwise.
Device parse_device(const std::string& text);

constexpr int kMaxDims = 6;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements, may be any non-negative value

  // A contiguous (row-major) view of `data`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());
  static TensorView contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                               Device device = Device::cpu());

  int64_t numel() const;
  int64_t size(int dim) const { return shape[wrap(dim)]; }  // negative dims count from the end
  int64_t stride(int dim) const { return strides[wrap(dim)]; }
  bool is_contiguous() const;
  // Offset in elements of the element at `index` (ndim entries).
  int64_t offset(std::initializer_list<int64_t> index) const;
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // The view with dimension `dim` fixed at `i` (one dimension fewer).
  TensorView select(int dim, int64_t i) const;
  // The view restricted to [begin, end) along `dim`.
  TensorView slice(int dim, int64_t begin, int64_t end) const;
  std::string shape_str() const;  // "[4, 32, 128]"

 private:
  int wrap(int dim) const { return dim < 0 ? dim + ndim : dim; }
};

// Owning contiguous CPU tensor. Moves, never copies implicitly.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);
  HostTensor(HostTensor&&) noexcept = default;
  HostTensor& operator=(HostTensor&&) noexcept = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;

  TensorView view() const;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(const_cast<std::byte*>(bytes_.data()));
  }
  float get(int64_t flat_index) const { return load_float(bytes_.data(), dtype_, flat_index); }
  void set(int64_t flat_index, float x) { store_float(bytes_.data(), dtype_, flat_index, x); }
  void fill(float x);  // floating dtypes: every element becomes x (NaN to poison)

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::vector<std::byte> bytes_;
};

}  // namespace flare
