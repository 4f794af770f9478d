// The prefill kernel's epilogue: combines the KV warps' softmax states of a work item and
// writes its rows (final o and lse, or a float32 partial slot for the merge kernel).
#pragma once

#include "prefill_traits.cuh"

namespace flare::prefill {

// The output's factor: run()'s v_scale, and with NVFP4 V the 2^8 its conversion left out
// (prefill_load.cuh convert_nvfp4_rows).
__device__ __forceinline__ float output_scale(const PrefillParams& p) {
  return T::kNvfp4 ? p.v_scale * kNvfp4ConvertedInverse : p.v_scale;
}

// A row's softmax denominator: the four threads of a quad hold parts of one row.
__device__ __forceinline__ float row_sum(float d) {
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  return d + __shfl_xor_sync(0xffffffffu, d, 2);
}

// A final row with the attention sink of its head (PrefillParams::sink: one more key of value 0
// and logit sink[head]): its factor `norm` and lse (log2 units, `lse2`) recomputed from its
// running max m2 (log2 units) and sum d. The two sums meet at the larger maximum, so a sink far
// above the row's logits cannot overflow; a row that saw no key gets o = 0 and the sink's lse.
// Only where p.sink is set (run() refuses a sink without softmax).
__device__ __forceinline__ void add_sink(const PrefillParams& p, long long head, float m2, float d,
                                         float& norm, float& lse2) {
  const float s2 = __ldg(p.sink + head) * kLog2e;
  if (d == 0.0f) {
    norm = 0.0f;
    lse2 = s2;
    return;
  }
  const float top = fmaxf(m2, s2);
  const float weight = fast_exp2(m2 - top);
  const float total = fmaf(d, weight, fast_exp2(s2 - top));
  norm = output_scale(p) * weight / total;
  lse2 = top + fast_log2(total);
}

// One row's words of four consecutive n8 tiles, transposed across its quad: thread q holds
// word k of tile j as columns j * 8 + 2q and 2q + 1 (the MMA's layout), and gets back tile q's
// four words, its 8 columns in order (16 contiguous bytes), in two exchanges of pairs. Every
// lane of the warp takes part.
__device__ __forceinline__ uint4 quad_transpose(unsigned w0, unsigned w1, unsigned w2,
                                                unsigned w3) {
  const bool odd = thread_index() & 1;
  const bool high = thread_index() & 2;
  // Pairs of threads swap the off-diagonal words of each 2 x 2 block.
  const unsigned r0 = __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);
  const unsigned r1 = __shfl_xor_sync(0xffffffffu, odd ? w2 : w3, 1);
  const unsigned a0 = odd ? r0 : w0, a1 = odd ? w1 : r0;
  const unsigned a2 = odd ? r1 : w2, a3 = odd ? w3 : r1;
  // Then the two threads two apart swap the off-diagonal 2 x 2 blocks.
  const unsigned u0 = __shfl_xor_sync(0xffffffffu, high ? a0 : a2, 2);
  const unsigned u1 = __shfl_xor_sync(0xffffffffu, high ? a1 : a3, 2);
  return high ? make_uint4(u0, u1, a2, a3) : make_uint4(a0, a1, u0, u1);
}

// Write-through of an item computed by one KV warp per row (kWarpsKV == 1): each thread
// normalizes its own accumulators, stages them in o's 16-bit type in the swizzled rows of the
// Q tile (its ldmatrix layout: a warp's 4-byte stores hit 32 distinct banks), and the CTA then
// stores whole 16-byte chunks. Half the shared traffic of the float32 staging and no second
// pass over the statistics: at seq 1024 the epilogue was ~18% of the kernel's stall samples.
__device__ __forceinline__ void write_item_direct(const PrefillParams& p, const WorkItem& item,
                                                  const ItemGeometry& g, const RowState& acc,
                                                  const RowStats& st, unsigned char* smem) {
  static_assert(T::kQueryTile * T::kVRowBytes <= T::kQBytes, "o staging fits the Q tile");
  const int lane = thread_index() % 32;
  const float m_scale = kLinearLogits ? score_scale(p) : 1.0f;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float d = row_sum(st.d[mi][h]);
      const bool empty = d == 0.0f;
      // Without softmax, o is the weighted sum itself (kernels/variant.cuh).
      float norm = !Variant::use_softmax ? output_scale(p) : empty ? 0.0f : output_scale(p) / d;
      float lse2 = empty ? negative_infinity() : st.m[mi][h] * m_scale + fast_log2(d);
      const int r = local_row(mi, h);
      if (Variant::use_softmax && p.sink != nullptr) {
        add_sink(p, item.kv_head * p.group_size + (item.row_begin + r) % p.group_size,
                 st.m[mi][h] * m_scale, d, norm, lse2);
      }
#pragma unroll
      for (int dn = 0; dn < T::kTilesO; ++dn) {
        unsigned char* word = smem + mma::swizzled_offset<T::kVRowBytes>(r, dn) + (lane % 4) * 4;
        *reinterpret_cast<unsigned*>(word) = float2_to_16bit2<T::kCode>(
            acc.o[mi][dn][2 * h] * norm, acc.o[mi][dn][2 * h + 1] * norm);
      }
      if (p.lse != nullptr && lane % 4 == 0 && r < g.rows) {
        const int packed = item.row_begin + r;
        const long long token = g.qo_begin + packed / p.group_size;
        const long long head = item.kv_head * p.group_size + packed % p.group_size;
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse2 * kLn2 * p.lse_scale;
      }
    }
  }
  math_sync();
  for (int unit = thread_index(); unit < g.rows * T::kVChunks; unit += T::kThreads) {
    const int r = unit / T::kVChunks;
    const int chunk = unit % T::kVChunks;
    const int packed = item.row_begin + r;
    const long long token = g.qo_begin + packed / p.group_size;
    const long long head = item.kv_head * p.group_size + packed % p.group_size;
    const Vec16 out =
        *reinterpret_cast<const Vec16*>(smem + mma::swizzled_offset<T::kVRowBytes>(r, chunk));
    unsigned char* o = static_cast<unsigned char*>(p.o);
    *reinterpret_cast<Vec16*>(o + (token * p.o_stride_token + head * p.o_stride_head + chunk * 8) *
                                      2) = out;
  }
}

// The Hopper family's epilogue (one KV warp per row): each thread stores its own rows from its
// accumulators, the final o and lse or a float32 partial slot, with no staging and no barrier:
// by now the Q tile and the stages hold the next item's rows (kernels/prefill_hopper.cuh). Each
// thread stores whole 16-byte chunks of o (quad_transpose; where o's width is a multiple of 32
// columns), 8 bytes of a partial slot; the values and the lse are those write_item computes for
// a single KV warp.
// The rows' tokens and heads come from the row tables (no division by the group per row), the
// rows' sums are taken before any row branches off (its shuffles then need no divergence
// check), and the normalization is one reciprocal (the sum is at least 1 with softmax).
template <int kWarpsKV = T::kWarpsKV>  // checked where it is called
__device__ __forceinline__ void write_item_registers(const PrefillParams& p, const WorkItem& item,
                                                     const ItemGeometry& g,
                                                     const ItemShared& shared, const RowState& acc,
                                                     const RowStats& st) {
  static_assert(kWarpsKV == 1, "one KV warp per row");
  // Not with T5's far-key logits (kAffineLogitsOnSomeKeys): its Hopper units have no registers
  // to spare for the transpose (48 bytes spilled).
  constexpr bool kQuadRowStores = T::kTilesO % 4 == 0 && !kAffineLogitsOnSomeKeys;
  const int quad_col = (thread_index() % 4) * 2;
  const float m_scale = kLinearLogits ? score_scale(p) : 1.0f;
  float sums[T::kMmaQ][2];
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) sums[mi][h] = row_sum(st.d[mi][h]);
  }
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float d = sums[mi][h];
      const bool empty = d == 0.0f;
      // Without softmax, o is the weighted sum itself (kernels/variant.cuh) and a partial slot's
      // lse is 0, which the merge kernel adds up under MergeParams::sum_partials.
      const float norm = !Variant::use_softmax ? output_scale(p)
                         : empty               ? 0.0f
                                               : __fdividef(output_scale(p), d);
      const int r = local_row(mi, h);
      const bool in_item = r < g.rows;            // quad-uniform
      if (!kQuadRowStores && !in_item) continue;  // (quad_transpose needs every lane)
      const float lse2 = empty ? negative_infinity() : st.m[mi][h] * m_scale + fast_log2(d);
      if (item.partial_slot < 0) {  // CTA-uniform
        // (Rows past the item read stale row-table entries and store nothing.)
        const long long token = g.qo_begin + (shared.row_q_pos[r] - g.q_offset);
        const long long head = shared.row_qo_head[r];
        float row_norm = norm, row_lse2 = lse2;
        if (Variant::use_softmax && p.sink != nullptr) {
          // (A row past the item takes head 0's sink: its table entry may never have been set.)
          add_sink(p, in_item ? head : 0, st.m[mi][h] * m_scale, d, row_norm, row_lse2);
        }
        unsigned char* row = static_cast<unsigned char*>(p.o) +
                             (token * p.o_stride_token + head * p.o_stride_head) * 2;
        if constexpr (kQuadRowStores) {
          // Four tiles at a time, transposed by every lane (before any row branches off): a
          // warp's store then writes 64 contiguous bytes of each of its 8 rows instead of 16, a
          // quarter of the store instructions and of their L1 wavefronts (the 4-byte stores made
          // half the kernel's L2 sectors at L 1024; this took causal L 1024 from 374 to 411
          // TFLOP/s, docs/perf.md, thirty-sixth session). Whole 16-byte chunks: run() checks o's
          // alignment.
#pragma unroll
          for (int dn = 0; dn < T::kTilesO; dn += 4) {
            unsigned w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              w[j] = float2_to_16bit2<T::kCode>(acc.o[mi][dn + j][2 * h] * row_norm,
                                                acc.o[mi][dn + j][2 * h + 1] * row_norm);
            }
            const uint4 chunk = quad_transpose(w[0], w[1], w[2], w[3]);
            if (in_item) *reinterpret_cast<uint4*>(row + (dn + quad_col / 2) * 16) = chunk;
          }
        } else if (in_item) {
#pragma unroll
          for (int dn = 0; dn < T::kTilesO; ++dn) {
            *reinterpret_cast<unsigned*>(row + (dn * 8 + quad_col) * 2) =
                float2_to_16bit2<T::kCode>(acc.o[mi][dn][2 * h] * row_norm,
                                           acc.o[mi][dn][2 * h + 1] * row_norm);
          }
        }
        if (in_item && p.lse != nullptr && quad_col == 0) {
          p.lse[token * p.lse_stride_token + head * p.lse_stride_head] =
              row_lse2 * kLn2 * p.lse_scale;
        }
      } else if (in_item) {
        const long long slot_row =
            static_cast<long long>(item.partial_slot) * p.offsets.partial_rows + r;
        float* dst = p.offsets.partial_o + slot_row * T::kHeadDimVO + quad_col;
#pragma unroll
        for (int dn = 0; dn < T::kTilesO; ++dn) {
          *reinterpret_cast<float2*>(dst + dn * 8) =
              make_float2(acc.o[mi][dn][2 * h] * norm, acc.o[mi][dn][2 * h + 1] * norm);
        }
        if (quad_col == 0) {
          p.offsets.partial_lse[slot_row] = !Variant::use_softmax ? 0.0f : lse2 * kLn2;
        }
      }
    }
  }
}

// Combines the KV warps' states through shared memory and writes the item's rows: the final o
// and lse (write-through) or a float32 partial slot for the merge kernel.
__device__ __forceinline__ void write_item(const PrefillParams& p, const WorkItem& item,
                                           const ItemGeometry& g, const RowState& acc,
                                           const RowStats& st, unsigned char* smem) {
  if constexpr (T::kWarpsKV == 1) {
    if (item.partial_slot < 0) {  // CTA-uniform
      write_item_direct(p, item, g, acc, st, smem);
      return;
    }
  }
  const int lane = thread_index() % 32;
  float* stage_o = reinterpret_cast<float*>(smem);  // [kWarpsKV][kQueryTile][kStageRowFloats]
  float* stage_m = stage_o + T::kWarpsKV * T::kQueryTile * T::kStageRowFloats;
  float* stage_d = stage_m + T::kWarpsKV * T::kQueryTile;  // [kWarpsKV][kQueryTile] each
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float d = row_sum(st.d[mi][h]);
      const int row = warp_kv() * T::kQueryTile + local_row(mi, h);
      if (lane % 4 == 0) {
        stage_m[row] = kLinearLogits ? st.m[mi][h] * score_scale(p) : st.m[mi][h];
        stage_d[row] = d;
      }
#pragma unroll
      for (int dn = 0; dn < T::kTilesO; ++dn) {
        *reinterpret_cast<float2*>(stage_o + row * T::kStageRowFloats + dn * 8 + (lane % 4) * 2) =
            make_float2(acc.o[mi][dn][2 * h], acc.o[mi][dn][2 * h + 1]);
      }
    }
  }
  math_sync();

  for (int unit = thread_index(); unit < g.rows * T::kVChunks; unit += T::kThreads) {
    const int r = unit / T::kVChunks;
    const int chunk = unit % T::kVChunks;
    float m_max = negative_infinity();
#pragma unroll
    for (int w = 0; w < T::kWarpsKV; ++w) m_max = fmaxf(m_max, stage_m[w * T::kQueryTile + r]);
    const float m_base = m_max == negative_infinity() ? 0.0f : m_max;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float denominator = 0.0f;
#pragma unroll
    for (int w = 0; w < T::kWarpsKV; ++w) {
      const float weight = fast_exp2(stage_m[w * T::kQueryTile + r] - m_base);
      denominator = fmaf(weight, stage_d[w * T::kQueryTile + r], denominator);
      const float* src = stage_o + (w * T::kQueryTile + r) * T::kStageRowFloats + chunk * 8;
      const float4 lo = *reinterpret_cast<const float4*>(src);
      const float4 hi = *reinterpret_cast<const float4*>(src + 4);
      acc[0] = fmaf(weight, lo.x, acc[0]);
      acc[1] = fmaf(weight, lo.y, acc[1]);
      acc[2] = fmaf(weight, lo.z, acc[2]);
      acc[3] = fmaf(weight, lo.w, acc[3]);
      acc[4] = fmaf(weight, hi.x, acc[4]);
      acc[5] = fmaf(weight, hi.y, acc[5]);
      acc[6] = fmaf(weight, hi.z, acc[6]);
      acc[7] = fmaf(weight, hi.w, acc[7]);
    }
    const bool empty = denominator == 0.0f;
    // Without softmax, o is the weighted sum itself and a partial slot's lse is 0, which the
    // merge kernel adds up under MergeParams::sum_partials (kernels/variant.cuh).
    float norm = !Variant::use_softmax ? output_scale(p)
                 : empty               ? 0.0f
                                       : output_scale(p) / denominator;
    float lse2 = !Variant::use_softmax ? 0.0f
                 : empty               ? negative_infinity()
                                       : m_max + fast_log2(denominator);
    const int packed = item.row_begin + r;
    const long long head = item.kv_head * p.group_size + packed % p.group_size;
    if (Variant::use_softmax && p.sink != nullptr && item.partial_slot < 0) {
      add_sink(p, head, m_max, denominator, norm, lse2);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= norm;
    const float lse = lse2 * kLn2;

    if (item.partial_slot < 0) {
      const long long token = g.qo_begin + packed / p.group_size;
      Vec16 out;
      out.x = float2_to_16bit2<T::kCode>(acc[0], acc[1]);
      out.y = float2_to_16bit2<T::kCode>(acc[2], acc[3]);
      out.z = float2_to_16bit2<T::kCode>(acc[4], acc[5]);
      out.w = float2_to_16bit2<T::kCode>(acc[6], acc[7]);
      unsigned char* o = static_cast<unsigned char*>(p.o);
      *reinterpret_cast<Vec16*>(
          o + (token * p.o_stride_token + head * p.o_stride_head + chunk * 8) * 2) = out;
      if (p.lse != nullptr && chunk == 0) {
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse * p.lse_scale;
      }
    } else {
      const long long slot_row =
          static_cast<long long>(item.partial_slot) * p.offsets.partial_rows + r;
      float* dst = p.offsets.partial_o + slot_row * T::kHeadDimVO + chunk * 8;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (chunk == 0) p.offsets.partial_lse[slot_row] = lse;
    }
  }
}

}  // namespace flare::prefill
