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

template <class Bits, class T>
void load_through_table(const Bits* data, const std::vector<float>& table, int64_t offset,
                        int64_t stride, int64_t count, T scale, T* out) {
  for (int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<T>(table[data[offset + i * stride]]) * scale;
  }
}

}  // namespace

template <class T>
void load_elements(const void* data, DType dtype, int64_t offset, int64_t stride, int64_t count,
                   T scale, T* out) {
  switch (dtype) {
    case DType::kF32: {
      const float* values = static_cast<const float*>(data);
      for (int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<T>(values[offset + i * stride]) * scale;
      }
      return;
    }
    case DType::kBF16: {
      // bfloat16 is the high half of a float32: widening is a shift, exact for every pattern.
      const uint16_t* bits = static_cast<const uint16_t*>(data);
      for (int64_t i = 0; i < count; ++i) {
        const uint32_t wide = static_cast<uint32_t>(bits[offset + i * stride]) << 16;
        out[i] = static_cast<T>(std::bit_cast<float>(wide)) * scale;
      }
      return;
    }
    case DType::kF16:
      load_through_table(static_cast<const uint16_t*>(data),
                         decode_table<uint16_t, f16_bits_to_float>(), offset, stride, count,
                         scale, out);
      return;
    case DType::kE4M3:
      load_through_table(static_cast<const uint8_t*>(data),
                         decode_table<uint8_t, e4m3_bits_to_float>(), offset, stride, count,
                         scale, out);
      return;
    case DType::kE5M2:
      load_through_table(static_cast<const uint8_t*>(data),
                         decode_table<uint8_t, e5m2_bits_to_float>(), offset, stride, count,
                         scale, out);
      return;
    default:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = static_cast<T>(load_float(data, dtype, offset + i * stride)) * scale;
      }
      return;
  }
}

template void load_elements<float>(const void*, DType, int64_t, int64_t, int64_t, float, float*);
template void load_elements<double>(const void*, DType, int64_t, int64_t, int64_t, double,
                                    double*);

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
