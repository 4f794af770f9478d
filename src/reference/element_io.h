// Fast reading of strided runs of tensor elements as float or double, and writing float runs
// back in any floating dtype: the reference backend's only path between tensors and math.
#pragma once

#include <cstdint>

#include "flare/core/dtype.h"

namespace flare::reference_detail {

// out[i] = element (offset + i * stride) of `data` (dtype `dtype`) times `scale`, for
// i < count. Conversions are exact (the core decoders, tabulated); the scale multiply rounds
// once in T. Any floating dtype.
template <class T>
void load_elements(const void* data, DType dtype, int64_t offset, int64_t stride, int64_t count,
                   T scale, T* out);

// Element (offset + i * stride) of `data` <- values[i] rounded to `dtype`, for i < count.
void store_elements(void* data, DType dtype, int64_t offset, int64_t stride, int64_t count,
                    const float* values);

}  // namespace flare::reference_detail
