// Strided element runs as float/double: table decoders built once from the core conversions
// (so values are bit-identical to load_float), with a plain copy for float32.
#include "src/reference/element_io.h"

#include <bit>
#include <vector>

namespace flare::reference_detail {
namespace {

// Decoded value of every bit pattern of a narrow dtype, built from the core decoder.
template <class Bits, float (*decode)(Bits)>
const std::vector<float>& decode_table() {
  static const std::vector<float> table = [] {
    std::vector<float> values(size_t{1} << (8 * sizeof(Bits)));
    for (size_t bits = 0; bits < values.size(); ++bits) {
      values[bits] = decode(static_cast<Bits>(bits));
    }
    return values;
  }();
  return table;
}

// Calls convert(i, element i) for the `count` elements starting at data[offset], `stride`
// apart. Unit stride (the common, innermost-contiguous case) gets its own loop so that the
// compiler can vectorize it.
template <class Element, class Convert>
void for_each_strided(const void* data, int64_t offset, int64_t stride, int64_t count,
                      Convert&& convert) {
  const Element* elements = static_cast<const Element*>(data) + offset;
  if (stride == 1) {
    for (int64_t i = 0; i < count; ++i) convert(i, elements[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) convert(i, elements[i * stride]);
  }
}

}  // namespace

template <class T>
void load_elements(const void* data, DType dtype, int64_t offset, int64_t stride, int64_t count,
                   T scale, T* out) {
  switch (dtype) {
    case DType::kF32:
      for_each_strided<float>(data, offset, stride, count,
                              [&](int64_t i, float x) { out[i] = static_cast<T>(x) * scale; });
      return;
    case DType::kBF16:
      // bfloat16 is the high half of a float32: widening is a shift, exact for every pattern.
      for_each_strided<uint16_t>(data, offset, stride, count, [&](int64_t i, uint16_t bits) {
        out[i] = static_cast<T>(std::bit_cast<float>(static_cast<uint32_t>(bits) << 16)) * scale;
      });
      return;
    case DType::kF16: {
      const float* table = decode_table<uint16_t, f16_bits_to_float>().data();
      for_each_strided<uint16_t>(data, offset, stride, count, [&](int64_t i, uint16_t bits) {
        out[i] = static_cast<T>(table[bits]) * scale;
      });
      return;
    }
    case DType::kE4M3: {
      const float* table = decode_table<uint8_t, e4m3_bits_to_float>().data();
      for_each_strided<uint8_t>(data, offset, stride, count, [&](int64_t i, uint8_t bits) {
        out[i] = static_cast<T>(table[bits]) * scale;
      });
      return;
    }
    case DType::kE5M2: {
      const float* table = decode_table<uint8_t, e5m2_bits_to_float>().data();
      for_each_strided<uint8_t>(data, offset, stride, count, [&](int64_t i, uint8_t bits) {
        out[i] = static_cast<T>(table[bits]) * scale;
      });
      return;
    }
    default:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<T>(load_float(data, dtype, offset + i * stride)) * scale;
      }
      return;
  }
}

template void load_elements<float>(const void*, DType, int64_t, int64_t, int64_t, float, float*);
template void load_elements<double>(const void*, DType, int64_t, int64_t, int64_t, double, double*);

void store_elements(void* data, DType dtype, int64_t offset, int64_t stride, int64_t count,
                    const float* values) {
  if (dtype == DType::kF32) {
    float* out = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) out[offset + i * stride] = values[i];
    return;
  }
  for (int64_t i = 0; i < count; ++i) store_float(data, dtype, offset + i * stride, values[i]);
}

}  // namespace flare::reference_detail
