// The tensor-core compute loop of the decode kernel (kernels/decode.cuh, FLARE_DECODE_MMA 1).
// The CUDA-core loop issues ~80 warp instructions per (token, KV head) and is issue-bound on an
// H200; this one issues ~5 (docs/perf.md, decode experiments 3 and 4).
//
// Each warp takes kWarpTokens tokens of a tile (the host picks 16; 32 for fp8 K/V up to D 128),
// in slices of 16. With the head group's query rows as the N (8) of m16n8k16:
//   S^T = K Q^T   M = 16 tokens, N = 8 rows (kRows of them real), K = the head dims:
//                 D / 16 ldmatrix.x4 of K (swizzled stage rows; D / 32 for fp8) and D / 16
//                 mma; Q^T stays in registers as B fragments of the mma's operand type.
//   softmax       on the accumulator: lane (g = lane / 4, t = lane % 4) holds tokens g and g + 8
//                 of rows 2t and 2t + 1, so a row's max over the 16 tokens is 3 shuffles and
//                 each lane rescales its own two rows of O^T.
//   P^T           the probabilities of tokens 0-7 (and 8-15), packed to 16 bits, are an 8x8
//                 matrix in the accumulator layout; movmatrix.trans turns each into the B
//                 fragment of O^T += V^T P^T.
//   O^T           M = 16 head dims per m-tile (D / 16 of them), K = the 16 tokens: D / 16
//                 ldmatrix.x4.trans of V (D / 32 for fp8) and D / 16 mma. O^T is D / 4 fp32
//                 registers a lane.
// The 4 warps' states combine at the end of an item like the CUDA-core loop's groups.
//
// fp8 K/V (decode v15) run the same mma in f16, which holds every e4m3 and e5m2 value exactly:
// ldmatrix reads the fp8 stage as b16 pairs, and each 32-bit register then holds 4 fp8 values
// that convert to two f16x2 words (decode_utils.cuh fp8x4_to_f16x2_pairs). The fragments keep
// the head dims in a permuted order, which both operands of a product share:
//   K     non-transposed, a lane holds dims 4t..4t+3 of a token: in k-step ks (dims 16 ks..),
//         mma k-column 2t + e is dim 4t + e and 2t + 8 + e is dim 4t + 2 + e. Q^T's B
//         fragments are loaded in that order, so S^T is unchanged.
//   V^T   transposed, a lane holds dims 2g, 2g + 1 of tokens 2t, 2t + 1: m-tile row g is dim
//         2g and row g + 8 dim 2g + 1 of the tile's 16, which publish_state undoes.
// bf16 q becomes f16 exactly, times a power of two per item that puts its largest magnitude in
// [2^14, 2^15) (f16 holds 2^15, and no element above it overflows); the scores take 2^-e back
// in fp32. P rounds to f16 (11 significant bits against bf16's 8).
#pragma once

#include "decode_pipeline.cuh"

namespace flare::decode {

static_assert(T::kMma && T::kRows <= 8 && T::kThreads % 32 == 0, "decode_mma.cuh geometry");
static_assert(T::kFp8 || T::kQCode == T::kKVCode,
              "mma operands: q and 16-bit K/V of one type, or fp8 K/V (run in f16)");

constexpr int kKSteps = T::kHeadDim / 16;                  // S^T k-steps = O^T m-tiles
constexpr int kMmaCode = T::kFp8 ? kCodeF16 : T::kKVCode;  // the mma's operand type

// e such that x * 2^e lies in [2^14, 2^15) for a finite x > 0, within [-126, 126] (2^e and
// 2^-e are normal floats); 0 for x = 0.
__device__ __forceinline__ int f16_headroom_exponent(float x) {
  const int biased = static_cast<int>((__float_as_uint(x) >> 23) & 0xffu);  // floor(log2 x) + 127
  const int e = 141 - biased;
  return x == 0.0f ? 0 : (e < -126 ? -126 : (e > 126 ? 126 : e));
}
__device__ __forceinline__ float exp2_int(int e) {
  return __uint_as_float(static_cast<unsigned>(e + 127) << 23);
}

// The loop's per-thread state of one work item.
struct LoopState {
  unsigned q[kKSteps][2];  // Q^T B fragments: dims 16 ks + 2t (+8), row g
  float o[kKSteps][4];     // O^T: dims 16 mt + g (+8) x rows 2t, 2t + 1
  float m[2];              // rows 2t + j: running max (log2 units), -inf before a visible key
  float d[2];              // this lane's share of the running sum of exp2(s - m)
  float q_scale;           // applied to the scores (fp32)
  Variant variant[2];
};

// Q^T B fragments of an fp8 item: dims 16 ks + 4t .. + 3 of row g (the K fragments' dim order,
// see the top), in q's type until scale_q_for_fp8.
__device__ __forceinline__ void load_q_for_fp8(const unsigned short* q_row_t, bool real_row,
                                               unsigned (&q)[kKSteps][2]) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    Vec8 v = {0u, 0u};
    if (real_row) v = *reinterpret_cast<const Vec8*>(q_row_t + 16 * ks);
    q[ks][0] = v.x;
    q[ks][1] = v.y;
  }
}

// The loaded fragments as f16 (the mma's type): bf16 q scaled by 2^e. Returns 2^-e.
__device__ __forceinline__ float scale_q_for_fp8(unsigned (&q)[kKSteps][2]) {
  if constexpr (T::kQCode == kCodeF16) {
    return 1.0f;
  } else {
    float values[kKSteps][2][2];
    float largest = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        bf16x2_to_float2(q[ks][h], values[ks][h][0], values[ks][h][1]);
        largest = fmaxf(largest, fmaxf(fabsf(values[ks][h][0]), fabsf(values[ks][h][1])));
      }
    }
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
    }
    const int e = f16_headroom_exponent(largest);
    const float up = exp2_int(e);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      q[ks][0] = float2_to_16bit2<kCodeF16>(values[ks][0][0] * up, values[ks][0][1] * up);
      q[ks][1] = float2_to_16bit2<kCodeF16>(values[ks][1][0] * up, values[ks][1][1] * up);
    }
    return exp2_int(-e);
  }
}

// The head dim (below D / 2) of value e of fragment register r in k-step ks of this lane (t =
// lane % 4): 16-bit operands hold mma k-columns 2t + e (r < 2) and 2t + 8 + e in dim order;
// fp8 items (kFp8Order) their permuted order, dims 4t + e and 4t + 2 + e (see the top). The
// same slot of k-step ks + kKSteps / 2 holds the dim D / 2 on: RoPE's pair. As this lane's part
// plus the rest, which the unrolled loops make a constant (the RoPE table's reads then take it as
// an immediate offset: SliceAngles below).
template <bool kFp8Order>
__device__ __forceinline__ int rotary_pair_of_lane() {
  return (kFp8Order ? 4 : 2) * (threadIdx.x % 4);
}
template <bool kFp8Order>
__device__ __forceinline__ int rotary_pair_rest(int ks, int r, int e) {
  return kFp8Order ? 16 * ks + 2 * (r >> 1) + e : 16 * ks + 8 * (r >> 1) + e;
}
template <bool kFp8Order>
__device__ __forceinline__ int rotary_pair(int ks, int r, int e) {
  return rotary_pair_of_lane<kFp8Order>() + rotary_pair_rest<kFp8Order>(ks, r, e);
}

// RoPE on the Q^T fragments (kernels/rotary.cuh): each lane rotates its own values (B fragment
// h of k-step ks holds the k-columns of A register 2h). kCode: the fragments' type (f16 for
// fp8 items, whose q was converted and scaled by a power of two: the rotation is linear).
template <bool kFp8Order, int kCode>
__device__ __forceinline__ void rotate_q_fragments(const DecodeParams& p, int q_pos,
                                                   unsigned (&q)[kKSteps][2]) {
#pragma unroll
  for (int ks = 0; ks < kKSteps / 2; ++ks) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lo[2], hi[2];
      pair16_to_float2<kCode>(q[ks][h], lo[0], lo[1]);
      pair16_to_float2<kCode>(q[ks + kKSteps / 2][h], hi[0], hi[1]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        rotate_pair(
            lo[e], hi[e], q_pos,
            rotary_turns<Variant, T::kHeadDim>(p.variant, rotary_pair<kFp8Order>(ks, 2 * h, e)));
      }
      q[ks][h] = float2_to_16bit2<kCode>(lo[0], lo[1]);
      q[ks + kKSteps / 2][h] = float2_to_16bit2<kCode>(hi[0], hi[1]);
    }
  }
}

// This warp's KV head within the item (whole-page items: one warp per head).
__device__ __forceinline__ int warp_head() { return threadIdx.x / 32 / T::kWarpsPerHead; }

// The packed rows of the item this warp's head holds: [*first, *first + *count).
__device__ __forceinline__ void warp_rows(const DecodeParams& p, const WorkItem& item, int* first,
                                          int* count) {
  if constexpr (T::kItemHeads == 1) {
    *first = item.row_begin;
    *count = item.row_end - item.row_begin;
  } else {  // an item holds every row of its heads: G' = kItemHeads x G (Traits)
    const int group = p.group_size / T::kItemHeads;
    *first = item.row_begin + warp_head() * group;
    *count = group;
  }
}

// Loads the item's query rows as B fragments and starts the softmax state.
__device__ __forceinline__ void begin_item(const DecodeParams& p, const WorkItem& item, int q_pos,
                                           LoopState& st) {
  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  int first_row, rows;
  warp_rows(p, item, &first_row, &rows);
  const int packed_g = first_row + g;
  const long long token = item.request + packed_g / p.group_size;
  const long long head = item.kv_head * p.group_size + packed_g % p.group_size;
  const unsigned short* q_row =
      static_cast<const unsigned short*>(p.q) + token * p.q_stride_token + head * p.q_stride_head;
  if constexpr (T::kFp8) {
    load_q_for_fp8(q_row + 4 * t, g < rows, st.q);
  } else {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st.q[ks][h] =
            g < rows ? *reinterpret_cast<const unsigned*>(q_row + 2 * t + 16 * ks + 8 * h) : 0u;
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < kKSteps; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[mt][e] = 0.0f;
  }
  st.q_scale = Variant::query_scale(p.variant) * p.k_scale;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = 2 * t + j;
    const int packed = first_row + (r < rows ? r : 0);  // padding rows: any valid head
    st.variant[j].init(p.variant, row_context(p, item, packed, q_pos));
    st.m[j] = row_max_start<Variant>();
    st.d[j] = 0.0f;
  }
}

// What the item's query needs beyond its load: fp8 items' conversion to f16, RoPE. Called
// once the item's first tiles are in flight (kernels/decode.cuh run_item): it waits for q,
// which begin_item only loaded, so that wait overlaps the page ids' and the tiles' round trips.
__device__ __forceinline__ void finish_query(const DecodeParams& p, int q_pos, LoopState& st) {
  if constexpr (T::kFp8) {
    st.q_scale *= scale_q_for_fp8(st.q) * (T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f);
    if constexpr (Variant::kRotary) rotate_q_fragments<true, kCodeF16>(p, q_pos, st.q);
  } else if constexpr (Variant::kRotary) {
    rotate_q_fragments<false, T::kQCode>(p, q_pos, st.q);
  }
}

// Two A fragments (m16 x k16, f16) of fp8 rows from one ldmatrix.x4 whose matrix i holds rows
// +8 for odd i and the next 16-byte chunk for i >= 2; fragment h comes from chunk h. K (not
// transposed): a lane's bytes 0-1 are a[0] / a[1], bytes 2-3 a[2] / a[3]. V^T (transposed):
// bytes 0 and 2 (dim 2g of tokens 2t, 2t + 1) are m-tile row g, bytes 1 and 3 row g + 8.
template <bool kTransposed>
__device__ __forceinline__ void fp8_a_fragment(const unsigned (&r)[4], int h, unsigned (&a)[4]) {
  constexpr int kSecond = kTransposed ? 1 : 2;  // where a lane's second pair goes
  fp8x4_to_f16x2_pairs<T::kKVCode, !kTransposed>(r[2 * h], a[0], a[kSecond]);
  fp8x4_to_f16x2_pairs<T::kKVCode, !kTransposed>(r[2 * h + 1], a[3 - kSecond], a[3]);
}
template <bool kTransposed>
__device__ __forceinline__ void fp8_a_fragments(unsigned address, unsigned (&a)[2][4]) {
  unsigned r[4];
  if constexpr (kTransposed) {
    mma::ldmatrix_x4_trans(address, r);
  } else {
    mma::ldmatrix_x4(address, r);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) fp8_a_fragment<kTransposed>(r, h, a[h]);
}

// RoPE's angles for the K fragments (Traits::kRotaryTable). A slice's token first + o, o < 16,
// turns pair j by the product of first's (cos, sin) and o's: the CTA computes o's for every
// pair once (begin_cta, with its first item), each warp first's for its slice (2
// pairs a lane at D 128), so a (token, pair) costs two shared-memory reads and 4 FMAs instead
// of its own angle and sincos (~10 instructions in a dependent chain through two MUFU ops:
// RoPE / plain 1.09 -> 1.01 at b64 kv8192, docs/perf.md thirty-ninth session A).
__device__ __forceinline__ float2* rotary_table(unsigned char* smem) {
  return reinterpret_cast<float2*>(smem + dynamic_shared_bytes() - T::kRotaryTableBytes);
}

// What a CTA sets up once, with its first item (kernels/decode.cuh run_item): RoPE's offsets
// 0..15 of every pair into the table; the item loop's first barrier publishes them.
__device__ __forceinline__ void begin_cta(const DecodeParams& p, unsigned char* smem) {
  if constexpr (T::kRotaryTable) {
    float2* offsets = rotary_table(smem);
    for (int i = threadIdx.x; i < T::kRotaryPairs * 16; i += T::kThreads) {
      const int pair = i / 16;
      float c, s;
      rotary_cos_sin(i % 16, rotary_turns<Variant, T::kHeadDim>(p.variant, pair), c, s);
      offsets[pair * T::kRotaryOffsetStride + i % 16] = make_float2(c, s);
    }
  }
}

struct SliceAngles {
  const float2* offsets;  // offset g of pair rotary_pair_of_lane (row kRotaryOffsetStride long)
  const float2* first;    // this warp's slice's first token, at pair rotary_pair_of_lane

  // (cos, sin) at token first + g + 8 * half of pair rotary_pair_of_lane() + rest.
  __device__ __forceinline__ float2 at(int rest, int half) const {
    const float2 a = first[rest];
    const float2 b = offsets[rest * T::kRotaryOffsetStride + 8 * half];
    return make_float2(a.x * b.x - a.y * b.y, a.y * b.x + a.x * b.y);
  }
};

// This warp's angles at its slice's first token `first_token` (every lane of the warp calls it).
template <bool kFp8Order>
__device__ __forceinline__ SliceAngles slice_angles(const DecodeParams& p, float2* table,
                                                    int first_token) {
  const int lane = threadIdx.x % 32;
  float2* first =
      table + T::kRotaryPairs * T::kRotaryOffsetStride + threadIdx.x / 32 * T::kRotaryPairs;
  __syncwarp();  // the previous slice's reads are done
#pragma unroll
  for (int pair = lane; pair < T::kRotaryPairs; pair += 32) {
    float c, s;
    rotary_cos_sin(first_token, rotary_turns<Variant, T::kHeadDim>(p.variant, pair), c, s);
    first[pair] = make_float2(c, s);
  }
  __syncwarp();
  const int pair = rotary_pair_of_lane<kFp8Order>();
  return {table + pair * T::kRotaryOffsetStride + lane / 4, first + pair};
}

// RoPE on a slice's K A fragments (kernels/rotary.cuh), in registers: no pass over the stage
// and no barrier, each K element rotated once (a warp's tokens are its own). Register r of
// k-step ks (`lo`) holds dims rotary_pair(ks, r, 0..1) of token g (+8 for odd r) of the slice;
// the same register of k-step ks + kKSteps / 2 (`hi`) holds their pairs, D / 2 on. kCode: the
// fragments' type (fp8 K rotates after its conversion to f16: rounded once, as 16-bit K).
template <bool kFp8Order, int kCode>
__device__ __forceinline__ void rotate_k_fragments(const SliceAngles& angles, int ks,
                                                   unsigned (&lo_frag)[4], unsigned (&hi_frag)[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float lo[2], hi[2];
    pair16_to_float2<kCode>(lo_frag[r], lo[0], lo[1]);
    pair16_to_float2<kCode>(hi_frag[r], hi[0], hi[1]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float2 cs = angles.at(rotary_pair_rest<kFp8Order>(ks, r, e), r & 1);
      const float x = lo[e] * cs.x - hi[e] * cs.y;
      hi[e] = hi[e] * cs.x + lo[e] * cs.y;
      lo[e] = x;
    }
    lo_frag[r] = float2_to_16bit2<kCode>(lo[0], lo[1]);
    hi_frag[r] = float2_to_16bit2<kCode>(hi[0], hi[1]);
  }
}

// 16 tokens of `tile` from stage row `row0`: scores, online softmax and P.V.
__device__ __forceinline__ void compute_slice(const DecodeParams& p, const ItemGeometry& geo,
                                              int tile, int row0, unsigned k_stage,
                                              unsigned v_stage, float2* rotary, LoopState& st) {
  const int lane = threadIdx.x % 32;

  // A fragments of K (tokens x dims): matrix i = lane / 8 holds tokens +8 for odd i and the
  // next 16-byte chunk for i >= 2: dims +8 (16-bit, mma_16816's a[0..3] order) or the next
  // k-step (fp8).
  const int k_row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (T::kFp8 && Variant::kRotary) {  // ldmatrix pairs D / 2 apart, rotated in f16
    static_assert(kKSteps % 4 == 0, "fp8 RoPE: whole ldmatrix pairs in each half of D");
    constexpr int kHalf = kKSteps / 4;  // fp8 ldmatrix.x4 (two k-steps each) per half of D
    const SliceAngles angles =
        slice_angles<true>(p, rotary, geo.kv_lo + tile * T::kTileTokens + row0);
#pragma unroll
    for (int kk = 0; kk < kHalf; ++kk) {
      unsigned raw_lo[4], raw_hi[4];  // converted a k-step at a time (registers at D 256)
      mma::ldmatrix_x4(k_stage + stage_offset(k_row, 2 * kk + (lane >> 4)), raw_lo);
      mma::ldmatrix_x4(k_stage + stage_offset(k_row, 2 * (kk + kHalf) + (lane >> 4)), raw_hi);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned lo[4], hi[4];
        fp8_a_fragment<false>(raw_lo, h, lo);
        fp8_a_fragment<false>(raw_hi, h, hi);
        rotate_k_fragments<true, kCodeF16>(angles, 2 * kk + h, lo, hi);
        mma::mma_16816<kMmaCode>(s, lo, st.q[2 * kk + h][0], st.q[2 * kk + h][1]);
        mma::mma_16816<kMmaCode>(s, hi, st.q[2 * (kk + kHalf) + h][0],
                                 st.q[2 * (kk + kHalf) + h][1]);
      }
    }
  } else if constexpr (T::kFp8) {
#pragma unroll
    for (int kk = 0; kk < kKSteps / 2; ++kk) {
      unsigned a[2][4];
      fp8_a_fragments<false>(k_stage + stage_offset(k_row, 2 * kk + (lane >> 4)), a);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mma::mma_16816<kMmaCode>(s, a[h], st.q[2 * kk + h][0], st.q[2 * kk + h][1]);
      }
    }
  } else if constexpr (Variant::kRotary) {  // k-steps in pairs D / 2 apart
    const SliceAngles angles =
        slice_angles<false>(p, rotary, geo.kv_lo + tile * T::kTileTokens + row0);
#pragma unroll
    for (int ks = 0; ks < kKSteps / 2; ++ks) {
      unsigned lo[4], hi[4];
      mma::ldmatrix_x4(k_stage + stage_offset(k_row, 2 * ks + (lane >> 4)), lo);
      mma::ldmatrix_x4(k_stage + stage_offset(k_row, 2 * (ks + kKSteps / 2) + (lane >> 4)), hi);
      rotate_k_fragments<false, T::kKVCode>(angles, ks, lo, hi);
      mma::mma_16816<kMmaCode>(s, lo, st.q[ks][0], st.q[ks][1]);
      mma::mma_16816<kMmaCode>(s, hi, st.q[ks + kKSteps / 2][0], st.q[ks + kKSteps / 2][1]);
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      unsigned a[4];
      mma::ldmatrix_x4(k_stage + stage_offset(k_row, 2 * ks + (lane >> 4)), a);
      mma::mma_16816<kMmaCode>(s, a, st.q[ks][0], st.q[ks][1]);
    }
  }

  // s[e]: token g + 8 (e / 2) of the slice, row 2t + e % 2.
  const int token = geo.kv_lo + tile * T::kTileTokens + row0 + lane / 4;
  if constexpr (!Variant::use_softmax) {  // the weights themselves; m stays 0, o unscaled
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int position = token + (e >> 1) * 8;
      const int j = e & 1;
      const bool visible = position < geo.kv_hi && st.variant[j].logits_mask(position);
      s[e] =
          visible ? st.variant[j].logits_transform(p.variant, s[e] * st.q_scale, position) : 0.0f;
    }
  } else {
    float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int position = token + (e >> 1) * 8;
      const int j = e & 1;
      const bool visible = position < geo.kv_hi && st.variant[j].logits_mask(position);
      s[e] = visible ? st.variant[j].logits_transform(p.variant, s[e] * st.q_scale, position)
                     : negative_infinity();
      tile_max[j] = fmaxf(tile_max[j], s[e]);
    }
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        tile_max[j] = fmaxf(tile_max[j], __shfl_xor_sync(0xffffffffu, tile_max[j], offset));
      }
    }
    float rescale[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float m_new = fmaxf(st.m[j], tile_max[j]);
      // Rows that saw no visible key yet keep m = -inf; subtracting 0 then keeps exp2 at 0.
      const float m_base = m_new == negative_infinity() ? 0.0f : m_new;
      rescale[j] = fast_exp2(st.m[j] - m_base);
      st.m[j] = m_new;
      s[j] = fast_exp2(s[j] - m_base);
      s[j + 2] = fast_exp2(s[j + 2] - m_base);
      st.d[j] = st.d[j] * rescale[j] + s[j] + s[j + 2];
    }
#pragma unroll
    for (int mt = 0; mt < kKSteps; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mt][e] *= rescale[e & 1];
    }
  }

  // P^T as B fragments (tokens x rows): the accumulator's 8x8 blocks, transposed.
  unsigned p_lo, p_hi;
  const unsigned lo = float2_to_16bit2<kMmaCode>(s[0], s[1]);
  const unsigned hi = float2_to_16bit2<kMmaCode>(s[2], s[3]);
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(p_lo) : "r"(lo));
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(p_hi) : "r"(hi));

  // A fragments of V^T (dims x tokens) from V's token rows, transposed. 16-bit: matrix i holds
  // dims +8 for odd i, tokens +8 for i >= 2. fp8: tokens +8 for odd i, the next m-tile's chunk
  // for i >= 2.
  if constexpr (T::kFp8) {
    const int v_row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int mm = 0; mm < kKSteps / 2; ++mm) {
      unsigned a[2][4];
      fp8_a_fragments<true>(v_stage + stage_offset(v_row, 2 * mm + (lane >> 4)), a);
#pragma unroll
      for (int h = 0; h < 2; ++h) mma::mma_16816<kMmaCode>(st.o[2 * mm + h], a[h], p_lo, p_hi);
    }
  } else {
    const int v_row = row0 + (lane & 7) + (lane >> 4) * 8;
#pragma unroll
    for (int mt = 0; mt < kKSteps; ++mt) {
      unsigned a[4];
      mma::ldmatrix_x4_trans(v_stage + stage_offset(v_row, 2 * mt + ((lane >> 3) & 1)), a);
      mma::mma_16816<kMmaCode>(st.o[mt], a, p_lo, p_hi);
    }
  }
}

// This warp's kWarpTokens tokens of its head's share of `tile`, 16 at a time.
__device__ __forceinline__ void compute_tile(const DecodeParams& p, const ItemGeometry& geo,
                                             int tile, unsigned char* smem, LoopState& st) {
  const int warp_in_head = threadIdx.x / 32 % T::kWarpsPerHead;
  const unsigned k_stage =
      shared_address(smem + (tile % T::kStages) * T::kStageBytes) + warp_head() * T::kHeadTileBytes;
  const unsigned v_stage = k_stage + T::kTileBytes;
  float2* const rotary = T::kRotaryTable ? rotary_table(smem) : nullptr;
#pragma unroll
  for (int slice = 0; slice < T::kWarpTokens / T::kSliceTokens; ++slice) {
    compute_slice(p, geo, tile, warp_in_head * T::kWarpTokens + slice * T::kSliceTokens, k_stage,
                  v_stage, rotary, st);
  }
}

// Writes this warp's unnormalized o rows, running max and sum into the combine scratch:
// s_o [kStateGroups][kRows][D], s_m and s_d [kStateGroups][kRows].
__device__ __forceinline__ void publish_state(const LoopState& st, float* s_o, float* s_m,
                                              float* s_d) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float d = st.d[j];
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) d += __shfl_xor_sync(0xffffffffu, d, offset);
    const int r = 2 * t + j;
    if (r < T::kRows) {
      // m-tile rows g and g + 8: dims g and g + 8 of the tile, or 2g and 2g + 1 for fp8 K/V.
      constexpr int kSecond = T::kFp8 ? 1 : 8;
      float* row = s_o + (warp * T::kRows + r) * T::kHeadDim + (T::kFp8 ? 2 * g : g);
#pragma unroll
      for (int mt = 0; mt < kKSteps; ++mt) {
        row[16 * mt] = st.o[mt][j];
        row[16 * mt + kSecond] = st.o[mt][j + 2];
      }
      if (g == 0) {
        s_m[warp * T::kRows + r] = st.m[j];
        s_d[warp * T::kRows + r] = d;
      }
    }
  }
}

}  // namespace flare::decode
