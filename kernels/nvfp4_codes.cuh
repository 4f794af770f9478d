// The E2M1 rounding of NVFP4 (include/flare/format/nvfp4.h), one definition for the host
// quantizer (src/format/nvfp4.cpp) and the GPU append kernel (kernels/append_paged_kv_nvfp4.cuh),
// so both compute the same codes.
#pragma once

#ifdef __CUDACC_RTC__
#define FLARE_NVFP4_FN __device__ __forceinline__
#else
#include <math.h>
#define FLARE_NVFP4_FN inline
#endif

namespace flare::nvfp4 {

// Round to the nearest E2M1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to even, saturating;
// bit 3 the sign (-0 codes 8); NaN codes 0.
FLARE_NVFP4_FN unsigned e2m1_code(float x) {
  if (x != x) return 0u;
  const unsigned sign = copysignf(1.0f, x) < 0.0f ? 8u : 0u;
  const float m = fabsf(x);
  unsigned code;
  if (!(m > 0.25f)) {
    code = 0;
  } else if (m < 0.75f) {
    code = 1;
  } else if (m <= 1.25f) {
    code = 2;
  } else if (m < 1.75f) {
    code = 3;
  } else if (m <= 2.5f) {
    code = 4;
  } else if (m < 3.5f) {
    code = 5;
  } else if (m <= 5.0f) {
    code = 6;
  } else {
    code = 7;
  }
  return sign | code;
}

}  // namespace flare::nvfp4

#undef FLARE_NVFP4_FN
