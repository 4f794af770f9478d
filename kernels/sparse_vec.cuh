// Element vectors of the sparse kernels (spmm_csr.cuh, sddmm_csr.cuh): kVec consecutive
// elements of float32, float16 or bfloat16 read as one 2- to 16-byte load and widened to
// float32, float32 results rounded to nearest even on the way out. A vector stays in its stored
// form (half the registers of float32 for the 16-bit types) until it is used.
#pragma once

#include "decode_params.cuh"

namespace flare {

// FLARE_SPMM_DTYPE / FLARE_SDDMM_DTYPE: float32, or the decode kernels' 16-bit codes.
constexpr int kSparseF32 = 0;
static_assert(kCodeF16 != kSparseF32 && kCodeBF16 != kSparseF32, "distinct dtype codes");

}  // namespace flare

#ifdef __CUDACC_RTC__

#include "decode_utils.cuh"

namespace flare::sparse_vec {

template <int kDType>
constexpr int element_bytes() {
  return kDType == kSparseF32 ? 4 : 2;
}

// kVec elements as stored: 32-bit words, a lone 16-bit element in the low half of one.
template <int kDType, int kVec>
struct Stored {
  static constexpr int kBytes = kVec * element_bytes<kDType>();
  static constexpr int kWords = kBytes < 4 ? 1 : kBytes / 4;
  unsigned words[kWords];
};

// A T at `src`: through the read-only path, or (kCoherent) a plain load, for memory the kernel
// itself writes (an accumulated Y).
template <class T, bool kCoherent>
__device__ __forceinline__ T load_raw(const void* src) {
  if constexpr (kCoherent) {
    return *static_cast<const T*>(src);
  } else {
    return __ldg(static_cast<const T*>(src));
  }
}

// The vector at `src` (aligned to its size: checked on the host), read-only by default.
template <int kDType, int kVec, bool kCoherent = false>
__device__ __forceinline__ Stored<kDType, kVec> load(const void* src) {
  using S = Stored<kDType, kVec>;
  S out;
  if constexpr (S::kBytes == 16) {
    const uint4 raw = load_raw<uint4, kCoherent>(src);
    out.words[0] = raw.x, out.words[1] = raw.y, out.words[2] = raw.z, out.words[3] = raw.w;
  } else if constexpr (S::kBytes == 8) {
    const uint2 raw = load_raw<uint2, kCoherent>(src);
    out.words[0] = raw.x, out.words[1] = raw.y;
  } else if constexpr (S::kBytes == 4) {
    out.words[0] = load_raw<unsigned, kCoherent>(src);
  } else {
    out.words[0] = load_raw<unsigned short, kCoherent>(src);
  }
  return out;
}

template <int kDType, int kVec>
__device__ __forceinline__ void to_float(const Stored<kDType, kVec>& in, float (&out)[kVec]) {
  if constexpr (kDType == kSparseF32) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = __uint_as_float(in.words[i]);
  } else if constexpr (kVec == 1) {
    float high_unused;
    pair16_to_float2<kDType>(in.words[0], out[0], high_unused);
  } else {
#pragma unroll
    for (int w = 0; w < kVec / 2; ++w)
      pair16_to_float2<kDType>(in.words[w], out[2 * w], out[2 * w + 1]);
  }
}

// One element at `src`, widened (A's values).
template <int kDType>
__device__ __forceinline__ float load_scalar(const void* src) {
  float out[1];
  to_float<kDType, 1>(load<kDType, 1>(src), out);
  return out[0];
}

// kVec float32 rounded to the dtype at `dst` (aligned to the vector's size).
template <int kDType, int kVec>
__device__ __forceinline__ void store(void* dst, const float (&in)[kVec]) {
  using S = Stored<kDType, kVec>;
  unsigned words[S::kWords];
  if constexpr (kDType == kSparseF32) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) words[i] = __float_as_uint(in[i]);
  } else if constexpr (kVec == 1) {
    words[0] = float2_to_16bit2<kDType>(in[0], 0.0f);
  } else {
#pragma unroll
    for (int w = 0; w < kVec / 2; ++w)
      words[w] = float2_to_16bit2<kDType>(in[2 * w], in[2 * w + 1]);
  }
  if constexpr (S::kBytes == 16) {
    *static_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (S::kBytes == 8) {
    *static_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
  } else if constexpr (S::kBytes == 4) {
    *static_cast<unsigned*>(dst) = words[0];
  } else {
    *static_cast<unsigned short*>(dst) = static_cast<unsigned short>(words[0]);
  }
}

// kVec float32 at `src` / to `dst` in the kernels' float32 workspaces, in 16-byte pieces where
// kVec allows (the workspace rows are aligned to the vector: d is a multiple of kVec).
template <int kVec>
__device__ __forceinline__ void load_floats(const float* src, float (&out)[kVec]) {
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(src + i);
      out[i] = f.x, out[i + 1] = f.y, out[i + 2] = f.z, out[i + 3] = f.w;
    }
  } else {
    to_float<kSparseF32, kVec>(load<kSparseF32, kVec>(src), out);
  }
}

template <int kVec>
__device__ __forceinline__ void store_floats(float* dst, const float (&in)[kVec]) {
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kVec; i += 4)
      *reinterpret_cast<float4*>(dst + i) = make_float4(in[i], in[i + 1], in[i + 2], in[i + 3]);
  } else {
    store<kSparseF32, kVec>(dst, in);
  }
}

}  // namespace flare::sparse_vec

#endif  // __CUDACC_RTC__
