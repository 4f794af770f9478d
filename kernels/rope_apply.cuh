// Rotary position encoding of q and k outside attention (flare/api/rope.h apply_rope; FlashInfer's
// apply_rope family): every (token, head) row of q and k turns its pairs of dims by its token's
// position times each pair's frequency, rounded once to the row's 16-bit type.
//
// One thread a unit of 16 bytes in each of heads_per_thread (1 to kRopeHeadsPerThread) heads of
// one token: with interleaved pairs (2 i, 2 i + 1) a piece of 8 rotary dims (4 pairs); with
// pairs (i, i + rotary_dim / 2) a piece of 8 dims of the low half and its partner piece
// rotary_dim / 2 on (8 pairs); past rotary_dim, a piece copied unchanged (out of place only). The
// heads of a token share its angles: a thread finds the position and computes the cos and sin of
// its pairs once for its heads (the per-element angle reduction made the kernel ALU-bound at 32768
// tokens, docs/perf.md forty-second session A); the host keeps one head a thread where fewer
// threads would not fill the GPU (a thread's heads run one after another). The angle of each pair
// comes from the host's turns table (hi + lo turns per position, exact to ~1e-7 turns at any
// position: kernels/rotary.cuh rotary_turn_fraction).
//
// With FLARE_ROPE_COS_SIN_CACHE the (cos, sin) of a pair come from the caller's float32 table
// instead (row pos clamped into the table).
//
// Compile-time defines: FLARE_ROPE_DTYPE (kCodeF16 | kCodeBF16), FLARE_ROPE_INTERLEAVE (0 | 1),
// FLARE_ROPE_POSITIONS (0: indptr and offsets, 32 or 64: pos_ids of that width),
// FLARE_ROPE_COS_SIN_CACHE (0 | 1, with pos_ids).
#pragma once

#include "fixed_width_ints.cuh"

namespace flare {

constexpr int kRopeApplyThreads = 256;
constexpr int kRopeHeadsPerThread = 8;   // the most heads of a token a thread turns
constexpr int kRopeApplyMaxPairs = 256;  // flare::kRopeMaxPairs on the host

// Turns per position of one pair, hi + lo (the host's double split into two floats).
struct RopeTurns {
  float hi, lo;
};

// A tensor [nnz, H, D] of 16-bit elements, its strides in bytes (D contiguous).
struct RopeTensor {
  const char* in;
  char* out;
  int64_t in_token_stride, in_head_stride;
  int64_t out_token_stride, out_head_stride;
};

struct RopeApplyParams {
  RopeTensor q, k;
  // tokens * ceil((q_heads + k_heads) / heads_per_thread) * units_per_row, below 2^31 (with
  // tokens_from_indptr: their bound, for the capacity's tokens)
  int32_t num_units;
  int32_t q_heads, k_heads;
  int32_t units_per_row;  // rotary units, then copy units (0 copy units in place)
  int32_t rotary_units;   // rotary_dim / 8 interleaved, rotary_dim / 16 otherwise
  int32_t half_bytes;     // rotary_dim / 2 * 2 bytes: from a low piece to its partner
  int32_t batch;          // requests of indptr / offsets (>= 1 with tokens)
  int32_t heads_per_thread;  // 1 .. kRopeHeadsPerThread
  // FLARE_ROPE_POSITIONS 0: the tokens are indptr[batch], read on the device (a captured
  // launch serves every later plan: BatchPrefill's staged RoPE under CUDA graphs).
  int32_t tokens_from_indptr;
  const int32_t* indptr;                // [batch + 1], with offsets (FLARE_ROPE_POSITIONS 0)
  const int32_t* offsets;               // [batch]
  const void* pos_ids;                  // [nnz] int32 or int64 (FLARE_ROPE_POSITIONS 32 or 64)
  const float* cos_sin;                 // [cos_sin_rows, 2 * pairs] (FLARE_ROPE_COS_SIN_CACHE)
  int64_t cos_sin_row_stride;           // in floats
  int32_t cos_sin_rows;
  int32_t pairs;                        // rotary_dim / 2: a row's sin columns start there
  RopeTurns turns[kRopeApplyMaxPairs];  // of pair i (not with a cos_sin table)
};

#ifndef __CUDACC_RTC__
// Host: the heads a thread turns for `pieces` = tokens x heads x units_per_row: one while that
// many threads would not fill the GPU (2^19: two waves of 2048 threads on 132 SMs), then more,
// up to kRopeHeadsPerThread.
inline int rope_heads_per_thread(long long pieces) {
  constexpr long long kFillingThreads = 1LL << 19;
  const long long heads = pieces / kFillingThreads;
  return static_cast<int>(heads < 1                     ? 1
                          : heads > kRopeHeadsPerThread ? kRopeHeadsPerThread
                                                        : heads);
}
#endif

}  // namespace flare

#ifdef __CUDACC_RTC__

#ifndef FLARE_ROPE_DTYPE
#error "FLARE_ROPE_DTYPE (kCodeF16 or kCodeBF16) must be defined"
#endif
#ifndef FLARE_ROPE_INTERLEAVE
#error "FLARE_ROPE_INTERLEAVE (0 or 1) must be defined"
#endif
#ifndef FLARE_ROPE_POSITIONS
#error "FLARE_ROPE_POSITIONS (0, 32 or 64) must be defined"
#endif
#ifndef FLARE_ROPE_COS_SIN_CACHE
#error "FLARE_ROPE_COS_SIN_CACHE (0 or 1) must be defined"
#endif

#include "decode_utils.cuh"
#include "rotary_angle.cuh"

namespace flare::rope_apply_kernel {

constexpr int kCode = FLARE_ROPE_DTYPE;
constexpr bool kInterleave = FLARE_ROPE_INTERLEAVE != 0;
constexpr int kPositions = FLARE_ROPE_POSITIONS;
static_assert(kCode == kCodeF16 || kCode == kCodeBF16, "16-bit rows");
static_assert(kPositions == 0 || kPositions == 32 || kPositions == 64, "position form");
constexpr bool kCosSinCache = FLARE_ROPE_COS_SIN_CACHE != 0;
static_assert(!kCosSinCache || kPositions != 0, "a cos_sin table with pos_ids");

// The token's position: pos_ids[token], or offsets[b] + token - indptr[b] for the request b
// whose range holds it (binary search; indptr is read as given, b clamped into the batch).
__device__ __forceinline__ int position(const RopeApplyParams& p, int token) {
  if constexpr (kPositions == 32) {
    return static_cast<const int32_t*>(p.pos_ids)[token];
  } else if constexpr (kPositions == 64) {
    return static_cast<int>(static_cast<const long long*>(p.pos_ids)[token]);
  } else {
    int lo = 0, hi = p.batch - 1;  // the last request whose indptr entry is <= token
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (__ldg(p.indptr + mid) <= token) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return __ldg(p.offsets + lo) + token - __ldg(p.indptr + lo);
  }
}

// cos and sin of pair `pair` at `pos`: from the caller's table (its row clamped into it), or
// computed with the angle reduced to [-1/2, 1/2] turns first (rotary_angle.cuh).
__device__ __forceinline__ void cos_sin(const RopeApplyParams& p, int pair, int pos, float& c,
                                        float& s) {
  if constexpr (kCosSinCache) {
    const int row = min(max(pos, 0), p.cos_sin_rows - 1);
    const float* values = p.cos_sin + row * p.cos_sin_row_stride;
    c = __ldg(values + pair);
    s = __ldg(values + p.pairs + pair);
    return;
  }
  const RopeTurns turns = p.turns[pair];
  __sincosf(rotary_turn_fraction(pos, make_float2(turns.hi, turns.lo)) * kTwoPi, &s, &c);
}

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
  const float x = a * c - b * s;
  b = b * c + a * s;
  a = x;
}

__device__ __forceinline__ void unpack(const Vec16& v, float (&x)[8]) {
  pair16_to_float2<kCode>(v.x, x[0], x[1]);
  pair16_to_float2<kCode>(v.y, x[2], x[3]);
  pair16_to_float2<kCode>(v.z, x[4], x[5]);
  pair16_to_float2<kCode>(v.w, x[6], x[7]);
}

__device__ __forceinline__ Vec16 pack(const float (&x)[8]) {
  return Vec16{float2_to_16bit2<kCode>(x[0], x[1]), float2_to_16bit2<kCode>(x[2], x[3]),
               float2_to_16bit2<kCode>(x[4], x[5]), float2_to_16bit2<kCode>(x[6], x[7])};
}

constexpr int kPairsPerUnit = kInterleave ? 4 : 8;

// cos and sin of the pairs of rotary unit `unit` at `pos`.
__device__ __forceinline__ void unit_angles(const RopeApplyParams& p, int unit, int pos,
                                            float (&c)[kPairsPerUnit], float (&s)[kPairsPerUnit]) {
#pragma unroll
  for (int i = 0; i < kPairsPerUnit; ++i) cos_sin(p, kPairsPerUnit * unit + i, pos, c[i], s[i]);
}

// Rotary unit `unit` of the row at `in` / `out` by the unit's angles.
__device__ __forceinline__ void rotate_unit(const RopeApplyParams& p, const char* in, char* out,
                                            int unit, const float (&c)[kPairsPerUnit],
                                            const float (&s)[kPairsPerUnit]) {
  const int64_t offset = 16 * static_cast<int64_t>(unit);
  if constexpr (kInterleave) {
    float x[8];
    unpack(*reinterpret_cast<const Vec16*>(in + offset), x);
#pragma unroll
    for (int i = 0; i < 4; ++i) rotate(x[2 * i], x[2 * i + 1], c[i], s[i]);
    *reinterpret_cast<Vec16*>(out + offset) = pack(x);
  } else {
    float lo[8], hi[8];
    unpack(*reinterpret_cast<const Vec16*>(in + offset), lo);
    unpack(*reinterpret_cast<const Vec16*>(in + offset + p.half_bytes), hi);
#pragma unroll
    for (int i = 0; i < 8; ++i) rotate(lo[i], hi[i], c[i], s[i]);
    *reinterpret_cast<Vec16*>(out + offset) = pack(lo);
    *reinterpret_cast<Vec16*>(out + offset + p.half_bytes) = pack(hi);
  }
}

// Unit `unit` past rotary_dim: copied.
__device__ __forceinline__ void copy_unit(const RopeApplyParams& p, const char* in, char* out,
                                          int unit) {
  const int64_t offset =
      16 * static_cast<int64_t>(unit - p.rotary_units) +
      (kInterleave ? 16 * static_cast<int64_t>(p.rotary_units) : 2 * int64_t{p.half_bytes});
  *reinterpret_cast<Vec16*>(out + offset) = *reinterpret_cast<const Vec16*>(in + offset);
}

}  // namespace flare::rope_apply_kernel

// Units in (token, head group, unit) order, q's heads before k's, over a grid-stride loop; a
// group is heads_per_thread heads of the token (fewer in its last).
extern "C" __global__ void __launch_bounds__(flare::kRopeApplyThreads)
    flare_rope_apply(const __grid_constant__ flare::RopeApplyParams p) {
  using namespace flare;
  using namespace flare::rope_apply_kernel;
  const int heads = p.q_heads + p.k_heads;
  const int groups = (heads + p.heads_per_thread - 1) / p.heads_per_thread;
  long long num_units = p.num_units;
  if constexpr (kPositions == 0) {
    if (p.tokens_from_indptr != 0) {
      num_units = min(num_units, static_cast<long long>(max(__ldg(p.indptr + p.batch), 0)) *
                                     groups * p.units_per_row);
    }
  }
  // 64-bit: num_units may lie within one grid stride of 2^31.
  for (long long index = blockIdx.x * blockDim.x + threadIdx.x; index < num_units;
       index += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int unit = static_cast<int>(index) % p.units_per_row;
    const int row = static_cast<int>(index) / p.units_per_row;
    const int token = row / groups;
    const int first = row % groups * p.heads_per_thread;
    const int end = min(first + p.heads_per_thread, heads);
    const bool rotary = unit < p.rotary_units;
    float c[kPairsPerUnit], s[kPairsPerUnit];
    if (rotary) unit_angles(p, unit, position(p, token), c, s);
#pragma unroll
    for (int i = 0; i < kRopeHeadsPerThread; ++i) {
      const int head = first + i;
      if (head >= end) break;
      const bool is_q = head < p.q_heads;
      const RopeTensor& t = is_q ? p.q : p.k;
      const int h = is_q ? head : head - p.q_heads;
      const char* in = t.in + token * t.in_token_stride + h * t.in_head_stride;
      char* out = t.out + token * t.out_token_stride + h * t.out_head_stride;
      if (rotary) {
        rotate_unit(p, in, out, unit, c, s);
      } else {
        copy_unit(p, in, out, unit);
      }
    }
  }
}

#endif  // __CUDACC_RTC__
