// Fused rotary position encoding (RoPE, Llama's rotate-half form) for a variant with kRotary
// (kernels/variant.cuh): dims i and i + D/2 of q and of k turn together by pos * frequency(i)
// radians (pos * turns(i) turns), q at its query position and k at its KV position, before q.k:
//   x_i' = x_i cos - x_{i+D/2} sin,   x_{i+D/2}' = x_{i+D/2} cos + x_i sin.
// The CUDA-core decode and the prefill kernels rotate K tiles where they land in shared memory
// (every thread some rows, then a barrier: one rotation per tile however many query rows read
// it); the tensor-core decode rotates its K fragments in registers, its angles from a table
// (decode_mma.cuh SliceAngles); every kernel rotates q where it loads it.
// Rotated 16-bit rows are rounded back to their type, as FlashInfer's kernels do.
#pragma once

#include "decode_utils.cuh"
#include "rotary_angle.cuh"
#include "variant.cuh"

namespace flare {

// Turns (2 pi radians) per position of dim pair `pair` of variant V, as hi + lo: V's
// rotary_turns where it has one, else its rotary_frequency / 2 pi (lo 0).
template <class V, int kHeadDim>
__device__ __forceinline__ float2 rotary_turns(const VariantParams& p, int pair) {
  if constexpr (variant_detail::has_rotary_turns<V>::value) {
    return V::rotary_turns(p, pair, kHeadDim);
  } else {
    return make_float2(V::rotary_frequency(p, pair, kHeadDim) * (1.0f / kTwoPi), 0.0f);
  }
}

// cos and sin of 2 pi * pos * (turns.x + turns.y): the angle reaching __sincosf lies in
// [-pi, pi] (abs error ~1e-6).
__device__ __forceinline__ void rotary_cos_sin(int pos, float2 turns, float& c, float& s) {
  __sincosf(rotary_turn_fraction(pos, turns) * kTwoPi, &s, &c);
}

// Rotates the 8 pairs of a 16-byte chunk of the low half (lo) and its partner chunk D/2 on
// (hi), kCode elements in shared memory, by (c[i], s[i]).
template <int kCode>
__device__ __forceinline__ void rotate_chunks(Vec16* lo_chunk, Vec16* hi_chunk, const float (&c)[8],
                                              const float (&s)[8]) {
  const Vec16 lo_in = *lo_chunk;
  const Vec16 hi_in = *hi_chunk;
  const unsigned lo_words[4] = {lo_in.x, lo_in.y, lo_in.z, lo_in.w};
  const unsigned hi_words[4] = {hi_in.x, hi_in.y, hi_in.z, hi_in.w};
  unsigned lo_out[4], hi_out[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float lo[2], hi[2];
    pair16_to_float2<kCode>(lo_words[w], lo[0], lo[1]);
    pair16_to_float2<kCode>(hi_words[w], hi[0], hi[1]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = 2 * w + e;
      const float x = lo[e] * c[i] - hi[e] * s[i];
      hi[e] = hi[e] * c[i] + lo[e] * s[i];
      lo[e] = x;
    }
    lo_out[w] = float2_to_16bit2<kCode>(lo[0], lo[1]);
    hi_out[w] = float2_to_16bit2<kCode>(hi[0], hi[1]);
  }
  *lo_chunk = Vec16{lo_out[0], lo_out[1], lo_out[2], lo_out[3]};
  *hi_chunk = Vec16{hi_out[0], hi_out[1], hi_out[2], hi_out[3]};
}

// Rotates (x_lo, x_hi), the values of dims pair and pair + D/2, at position pos.
__device__ __forceinline__ void rotate_pair(float& x_lo, float& x_hi, int pos, float2 turns) {
  float c, s;
  rotary_cos_sin(pos, turns, c, s);
  const float lo = x_lo * c - x_hi * s;
  x_hi = x_hi * c + x_lo * s;
  x_lo = lo;
}

// Rotates kRows rows of kHeadDim 16-bit elements (kCode) in shared memory at `base`, in place:
// 16-byte chunk `chunk` of row `row` lies at base + offset(row, chunk), and the row's position
// is position(row). kThreads threads share the work (this one is `thread`). Where the threads
// divide into the chunk columns of the low half and the rows into whole passes, each thread
// keeps one chunk column (and its partner D/2 on) and takes every kRowStep-th row, its rows
// independent (turning one row's (cos, sin) into the next one's by a table step made the
// decode 25% slower: a chain where the rows overlapped). Elsewhere (head dim 192) threads take
// (row, chunk) units in turn. The caller synchronises before and after.
template <class V, int kCode, int kHeadDim, int kRows, int kThreads, class Offset, class Position>
__device__ __forceinline__ void rotate_shared_rows(unsigned char* base, const VariantParams& p,
                                                   int thread, Offset offset, Position position) {
  constexpr int kHalfChunks = kHeadDim / 16;  // chunks of 8 dims in half a row
  static_assert(kHeadDim % 16 == 0, "rotary pairs of whole chunks");
  constexpr int kRowStep = kThreads / kHalfChunks;
  const auto rotate_unit = [&](int row, int chunk) {
    const int pos = position(row);
    float c[8], s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      rotary_cos_sin(pos, rotary_turns<V, kHeadDim>(p, chunk * 8 + i), c[i], s[i]);
    }
    rotate_chunks<kCode>(reinterpret_cast<Vec16*>(base + offset(row, chunk)),
                         reinterpret_cast<Vec16*>(base + offset(row, chunk + kHalfChunks)), c, s);
  };
  if constexpr (kThreads % kHalfChunks == 0 && kRows % kRowStep == 0) {
#pragma unroll
    for (int row = thread / kHalfChunks; row < kRows; row += kRowStep) {
      rotate_unit(row, thread % kHalfChunks);
    }
  } else {
#pragma unroll 1
    for (int unit = thread; unit < kRows * kHalfChunks; unit += kThreads) {
      rotate_unit(unit / kHalfChunks, unit % kHalfChunks);
    }
  }
}

// rotate_shared_rows for rows at consecutive positions (row r at first_pos + r: K tiles). Where
// each thread keeps one chunk column and takes every kRowStep-th row, its k-th row's angle is
// its first row's plus k steps of kRowStep positions, t0 + k * step in turns, each row's one
// FFMA from t0 (no chain through the rows, unlike v3's rotations of (cos, sin): docs/perf.md
// RoPE v3) instead of the exact product's five instructions; step is kRowStep * turns reduced
// to (-1/2, 1/2] exactly (kRowStep a power of two), and the sum, within a few turns, differs
// from the exact angle by ~1e-7 turns a row (MUFU.SIN / COS take it whole).
template <class V, int kCode, int kHeadDim, int kRows, int kThreads, class Offset>
__device__ __forceinline__ void rotate_shared_rows_from(unsigned char* base, const VariantParams& p,
                                                        int thread, Offset offset, int first_pos) {
  constexpr int kHalfChunks = kHeadDim / 16;
  constexpr int kRowStep = kThreads / kHalfChunks;
  if constexpr (kThreads % kHalfChunks == 0 && kRows % kRowStep == 0 &&
                (kRowStep & (kRowStep - 1)) == 0 && kRows / kRowStep > 2) {
    const int chunk = thread % kHalfChunks;
    const int row0 = thread / kHalfChunks;
    float t0[8], step[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 turns = rotary_turns<V, kHeadDim>(p, chunk * 8 + i);
      t0[i] = rotary_turn_fraction(first_pos + row0, turns);
      const float stride = static_cast<float>(kRowStep) * turns.x;  // exact: a power of two
      step[i] = (stride - rintf(stride)) + static_cast<float>(kRowStep) * turns.y;
    }
#pragma unroll
    for (int k = 0; k < kRows / kRowStep; ++k) {
      const int row = row0 + k * kRowStep;
      float c[8], s[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        __sincosf(fmaf(static_cast<float>(k), step[i], t0[i]) * kTwoPi, &s[i], &c[i]);
      }
      rotate_chunks<kCode>(reinterpret_cast<Vec16*>(base + offset(row, chunk)),
                           reinterpret_cast<Vec16*>(base + offset(row, chunk + kHalfChunks)), c, s);
    }
  } else {
    rotate_shared_rows<V, kCode, kHeadDim, kRows, kThreads>(
        base, p, thread, offset, [first_pos](int row) { return first_pos + row; });
  }
}

}  // namespace flare
