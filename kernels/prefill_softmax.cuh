// The online softmax of a prefill tile, shared by both families (prefill.cuh's mma.sync CTA,
// prefill_hopper.cuh's warpgroups): which keys of a tile each row sees (masks, windows, custom
// bits, variants' masks), the key checks a tile needs, and the running max / sum update with the
// factor O takes.
#pragma once

#include "prefill_traits.cuh"

namespace flare::prefill {

__device__ __forceinline__ int mask_bit_index(int mi, int h, int nj, int e) {
  return ((mi * 2 + h) * T::kTilesS + nj) * 2 + e;
}

// Which of a row's key checks a tile needs: kBegin, the window's start (a variant with
// kMaskIsWindow: its logits_mask is exactly that); kEnd, everything else: the item's last key,
// the causal diagonal, the custom bits and a variant mask that is not a window. A tile usually
// straddles one boundary only: checking just that keeps one value per row live, not two (a
// causal window at 128x64 tiles spilled 56 bytes with both).
// Causal kernels of a window variant check the two boundaries apart; elsewhere a tile that needs
// a check takes both, as one instantiation (splitting there made ptxas spill 64 bytes in the
// non-causal window kernel at 128x64 tiles).
constexpr bool kSplitKeyChecks = Variant::kMaskIsWindow && T::kMask == kMaskCausal;

template <bool kValue>
struct KeyCheck {
  static constexpr bool value = kValue;
};

// Calls tile(KeyCheck<kBegin>{}, KeyCheck<kEnd>{}) with the key checks a tile needs whose first
// column (this warp's) is first_col, under the warp's span (warp-uniform), and returns what it
// returns. Only a window variant's tiles may straddle the first visible key (full_begin is 0
// else). Both families dispatch their tiles here.
template <class Tile>
__device__ __forceinline__ auto with_key_checks(int first_col, const WarpSpan& span, Tile&& tile) {
  const bool end_check = first_col + T::kKvPerWarp > span.full_end;
  const bool begin_check = Variant::kMaskIsWindow && first_col < span.full_begin;
  if (!begin_check && !end_check) return tile(KeyCheck<false>{}, KeyCheck<false>{});
  if constexpr (!kSplitKeyChecks) {
    return tile(KeyCheck<Variant::kMaskIsWindow>{}, KeyCheck<true>{});
  } else {
    if (!begin_check) return tile(KeyCheck<false>{}, KeyCheck<true>{});
    if (!end_check) return tile(KeyCheck<true>{}, KeyCheck<false>{});
    return tile(KeyCheck<true>{}, KeyCheck<true>{});
  }
}

template <bool kBegin, bool kEnd>
__device__ __forceinline__ bool visible(const ItemGeometry& g, const RowInfo& rows, int mi, int h,
                                        int nj, int e, int pos) {
  // The order of the checks is ptxas's: at 255 registers it decides whether 128x64 tiles
  // spill (the window first in the causal kernel, the last key first elsewhere: 0 bytes each).
  bool seen = true;
  if constexpr (kEnd && !kSplitKeyChecks) seen = pos < g.kv_hi;
  if constexpr (kBegin && Variant::kMaskIsWindow) {
    seen = seen && rows.variant[mi][h].logits_mask(pos);
  }
  if constexpr (kEnd) {
    if constexpr (kSplitKeyChecks) seen = seen && pos < g.kv_hi;
    if constexpr (!Variant::kMaskIsWindow) seen = seen && rows.variant[mi][h].logits_mask(pos);
    if constexpr (T::kMask == kMaskCausal) seen = seen && pos <= rows.q_pos[mi][h];
    if constexpr (T::kMask == kMaskCustom) {
      const int bit = mask_bit_index(mi, h, nj, e);
      seen = seen && ((rows.custom_bits[bit / 32] >> (bit % 32)) & 1) != 0;
    }
  }
  return seen;
}

// The factors the O accumulators take when a tile moved a row's running max (any: for some row
// of the warp; warp-uniform).
struct OutputRescale {
  float factor[T::kMmaQ][2];
  bool any;
};

__device__ __forceinline__ void rescale_output(RowState& acc, const OutputRescale& r) {
  if (!r.any) return;  // tiles where no row's max moved skip the multiplies entirely
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int dn = 0; dn < T::kTilesO; ++dn) {
      acc.o[mi][dn][0] *= r.factor[mi][0];
      acc.o[mi][dn][1] *= r.factor[mi][0];
      acc.o[mi][dn][2] *= r.factor[mi][1];
      acc.o[mi][dn][3] *= r.factor[mi][1];
    }
  }
}

// Per row of the thread (mi, h): the logit at its first column and the slope per key, where a
// tile's logits are affine in the KV position (kAffineLogits, kAffineLogitsOnSomeKeys).
struct AffineLogits {
  float base[T::kMmaQ][2];
  float slope[T::kMmaQ][2];
};

// Fills `affine` for this thread's rows over the warp's columns of the tile starting at
// first_col: the variant's affine form on every key (kAffineLogits; returns true), or where
// logits_affine_on says so (kAffineLogitsOnSomeKeys; returns whether every row of the thread
// said so).
__device__ __forceinline__ bool affine_rows(const PrefillParams& p, const RowInfo& rows,
                                            int first_col, AffineLogits& affine) {
  bool every_row = true;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kAffineLogits) {
        affine.base[mi][h] = rows.variant[mi][h].logits_transform(p.variant, 0.0f, first_col);
        affine.slope[mi][h] = rows.variant[mi][h].logits_kv_slope();
      } else if constexpr (kAffineLogitsOnSomeKeys) {
        every_row = rows.variant[mi][h].logits_affine_on(p.variant, first_col,
                                                         first_col + (T::kTilesS - 1) * 8 + 1,
                                                         affine.base[mi][h], affine.slope[mi][h]) &&
                    every_row;
      }
    }
  }
  // The offset form takes the max of q.k for the max of the logits: a positive scale only.
  if constexpr (kOffsetLogitsOnSomeKeys) every_row = every_row && score_scale(p) > 0.0f;
  return every_row;
}

// The logit of s (q.k) at (mi, h, nj, e), column pos: two FMAs from `affine` (kAffine), else the
// variant's logits_transform of s * q_scale; s itself for linear logits (the scale folds into
// the exp2 argument).
template <bool kAffine>
__device__ __forceinline__ float logit_of(const PrefillParams& p, const RowInfo& rows,
                                          const AffineLogits& affine, float q_scale, float s,
                                          int mi, int h, int nj, int e, int pos) {
  if constexpr (kAffine) {  // the row's term at the first column, slope * offset on top
    return fmaf(s, q_scale,
                fmaf(affine.slope[mi][h], static_cast<float>(nj * 8 + e), affine.base[mi][h]));
  } else if constexpr (!kLinearLogits) {
    return rows.variant[mi][h].logits_transform(p.variant, s * q_scale, pos);
  }
  return s;
}

// The tile's logits into s where the variant's logits are by distance (kLogitsByDistance): each
// fmaf(q.k, scale, bias), the bias logits_transform(p, 0, pos). A thread holds rows r and r + 8
// of each m16 tile; where they are one distance_key()'s tokens q and q + 8 (MHA), row r + 8's
// bias at column c is row r's at column c - 8, taken from the load before: 34 table loads for
// the thread's 64 logits, not 64. Other row pairs (GQA packing, the item's last rows) take
// their own.
// A template (V: Variant) so that variants without distance_key() compile: the body is checked
// only where a kLogitsByDistance kernel instantiates it.
template <class V>
__device__ __forceinline__ void distance_logits(const PrefillParams& p,
                                                const V (&variants)[T::kMmaQ][2],
                                                const int (&q_pos)[T::kMmaQ][2], int first_col,
                                                float q_scale,
                                                float (&s)[T::kMmaQ][T::kTilesS][4]) {
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
    const V& upper = variants[mi][0];
    const V& lower = variants[mi][1];
    if (upper.distance_key() == lower.distance_key() && q_pos[mi][1] == q_pos[mi][0] + 8) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[mi][0][2 + e] =
            fmaf(s[mi][0][2 + e], q_scale, lower.logits_transform(p.variant, 0.0f, first_col + e));
      }
#pragma unroll
      for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float bias = upper.logits_transform(p.variant, 0.0f, first_col + nj * 8 + e);
          s[mi][nj][e] = fmaf(s[mi][nj][e], q_scale, bias);
          if (nj + 1 < T::kTilesS) s[mi][nj + 1][2 + e] = fmaf(s[mi][nj + 1][2 + e], q_scale, bias);
        }
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            s[mi][nj][2 * h + e] =
                fmaf(s[mi][nj][2 * h + e], q_scale,
                     variants[mi][h].logits_transform(p.variant, 0.0f, first_col + nj * 8 + e));
          }
        }
      }
    }
  }
}

// The softmax with a fixed offset (kernels/variant.cuh has_logits_bound): each probability is
// exp2(logit - offset) straight after its logit, no row max, no rescale; m holds the offset
// for the lse.
template <bool kBegin, bool kEnd, bool kAffine>
__device__ __forceinline__ void fixed_offset_scores(const PrefillParams& p, const ItemGeometry& g,
                                                    const RowInfo& rows, int first_col,
                                                    float (&s)[T::kMmaQ][T::kTilesS][4],
                                                    RowStats& st, const AffineLogits& affine,
                                                    float q_scale) {
  const float offset = Variant::logits_bound(p.variant) - kFixedOffsetHeadroom;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_sum = 0.0f;
#pragma unroll
      for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = first_col + nj * 8 + e;
          const float x =
              logit_of<kAffine>(p, rows, affine, q_scale, s[mi][nj][2 * h + e], mi, h, nj, e, pos);
          const float shifted =
              visible<kBegin, kEnd>(g, rows, mi, h, nj, e, pos) ? x - offset : negative_infinity();
          const float prob = fast_exp2(shifted);
          s[mi][nj][2 * h + e] = prob;
          tile_sum += prob;
        }
      }
      st.m[mi][h] = offset;
      st.d[mi][h] += tile_sum;
    }
  }
}

// softmax_scores below, with the tile's logits taken as two FMAs from `affine` (kAffine) or
// from the variant's logits_transform per logit.
template <bool kBegin, bool kEnd, bool kAffine>
__device__ __forceinline__ OutputRescale
softmax_scores_as(const PrefillParams& p, const ItemGeometry& g, const RowInfo& rows, int first_col,
                  float (&s)[T::kMmaQ][T::kTilesS][4], RowStats& st, const AffineLogits& affine) {
  OutputRescale r;
  r.any = false;
  const float q_scale = score_scale(p);
  if constexpr (!Variant::use_softmax) {  // the weights themselves; m stays 0, o unscaled
#pragma unroll
    for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int pos = first_col + nj * 8 + e;
            float x = s[mi][nj][2 * h + e] * q_scale;
            if constexpr (!kLinearLogits) {
              x = rows.variant[mi][h].logits_transform(p.variant, x, pos);
            }
            if (!visible<kBegin, kEnd>(g, rows, mi, h, nj, e, pos)) x = 0.0f;
            s[mi][nj][2 * h + e] = x;
          }
        }
      }
    }
    return r;
  }
  if constexpr (kFixedOffsetSoftmax) {
    fixed_offset_scores<kBegin, kEnd, kAffine>(p, g, rows, first_col, s, st, affine, q_scale);
    return r;
  }
  // x (what m tracks) -> log2 units: raw q.k scale for linear logits, else x is log2 already.
  const float to_log2 = kLinearLogits ? q_scale : 1.0f;
  // Logits s * q_scale + base on this tile (kOffsetLogitsOnSomeKeys, q_scale > 0): x stays q.k,
  // its max maps to the logits' max, and base joins the exp2 argument's offset.
  constexpr bool kOffset = kAffine && kOffsetLogitsOnSomeKeys;
  // Logits by distance (kLogitsByDistance) off the affine path: s holds them from here.
  constexpr bool kByDistance = !kAffine && kLogitsByDistance;
  if constexpr (kByDistance) distance_logits(p, rows.variant, rows.q_pos, first_col, q_scale, s);
  bool any_moved = false;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = negative_infinity();
#pragma unroll
      for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = first_col + nj * 8 + e;
          float x = kOffset || kByDistance
                        ? s[mi][nj][2 * h + e]
                        : logit_of<kAffine>(p, rows, affine, q_scale, s[mi][nj][2 * h + e], mi, h,
                                            nj, e, pos);
          if (!visible<kBegin, kEnd>(g, rows, mi, h, nj, e, pos)) x = negative_infinity();
          s[mi][nj][2 * h + e] = x;
          tile_max = fmaxf(tile_max, x);
        }
      }
      // The four threads of a quad hold one row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      if constexpr (kOffset) tile_max = fmaf(tile_max, q_scale, affine.base[mi][h]);  // -inf stays
      // -inf before any visible key: then any finite max moves (inf > threshold), -inf does not
      // (NaN compares false).
      const float m_old = st.m[mi][h];
      const bool moves = (tile_max - m_old) * to_log2 > kRescaleThreshold;
      r.factor[mi][h] = 1.0f;
      if (moves) {
        r.factor[mi][h] = fast_exp2((m_old - tile_max) * to_log2);  // 0 when m_old = -inf
        st.m[mi][h] = tile_max;
        st.d[mi][h] *= r.factor[mi][h];
      }
      any_moved = any_moved || moves;
      // A row that saw no visible key keeps m = -inf; subtracting 0 keeps exp2 at 0.
      const float m_base = st.m[mi][h] == negative_infinity() ? 0.0f : st.m[mi][h];
      const float offset = kOffset ? affine.base[mi][h] - m_base : -m_base * to_log2;
      float tile_sum = 0.0f;
#pragma unroll
      for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float prob =
              fast_exp2(fmaf(s[mi][nj][2 * h + e], kOffset ? q_scale : to_log2, offset));
          s[mi][nj][2 * h + e] = prob;
          tile_sum += prob;
        }
      }
      st.d[mi][h] += tile_sum;
    }
  }
  r.any = __any_sync(0xffffffffu, any_moved);
  return r;
}

// Online softmax update over this warp's S tile; s becomes the probabilities and the returned
// factors are what O must be scaled by before this tile's P.V (the Hopper family applies them
// after the previous tile's P.V finishes). kBegin / kEnd: the key checks of visible() the tile
// needs (none: every key is visible to every row of the warp). Logits affine in the KV position
// (variant.cuh, has_affine_logits: every tile; has_affine_logits_on_some_keys: the tiles where
// every row of the warp says so for its columns, one warp-uniform choice a tile) take two FMAs
// a logit.
template <bool kBegin, bool kEnd>
__device__ __forceinline__ OutputRescale softmax_scores(const PrefillParams& p,
                                                        const ItemGeometry& g, const RowInfo& rows,
                                                        int first_col,
                                                        float (&s)[T::kMmaQ][T::kTilesS][4],
                                                        RowStats& st) {
  AffineLogits affine;
  if constexpr (kAffineLogits) {
    affine_rows(p, rows, first_col, affine);
    return softmax_scores_as<kBegin, kEnd, true>(p, g, rows, first_col, s, st, affine);
  } else if constexpr (kAffineLogitsOnSomeKeys) {
    if (__all_sync(0xffffffffu, affine_rows(p, rows, first_col, affine))) {
      return softmax_scores_as<kBegin, kEnd, true>(p, g, rows, first_col, s, st, affine);
    }
  }
  return softmax_scores_as<kBegin, kEnd, false>(p, g, rows, first_col, s, st, affine);
}

template <bool kBegin, bool kEnd>
__device__ __forceinline__ void softmax_tile(const PrefillParams& p, const ItemGeometry& g,
                                             const RowInfo& rows, int first_col,
                                             float (&s)[T::kMmaQ][T::kTilesS][4], RowStats& st,
                                             RowState& acc) {
  rescale_output(acc, softmax_scores<kBegin, kEnd>(p, g, rows, first_col, s, st));
}

}  // namespace flare::prefill
