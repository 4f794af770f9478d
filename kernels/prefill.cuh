// Persistent split-KV batch prefill/append on tensor cores: the FlashAttention-2 template of
// paper 001 §3.2 (mma.sync m16n8k16, ldmatrix, cp.async gathers; 002 appendix A head-group
// fusion). Each CTA walks its plan work queue; a work item is a tile of packed query rows of one
// KV head against one KV chunk, written through to o/lse or into a float32 partial slot.
//
// Compile-time defines: FLARE_HEAD_DIM_QK, FLARE_HEAD_DIM_VO (64 | 128 | 256, or 192 / 128),
// FLARE_QUERY_TILE (16 | 32 | 64 | 128), FLARE_KV_TILE (32 | 64 | 128), FLARE_Q_DTYPE (q, k, v
// and o: f16 | bf16), FLARE_KV_PAGED (0 ragged | 1 paged), FLARE_PAGE_SIZE (paged), FLARE_MASK
// (PrefillMaskCode). `struct Variant` comes from the variant source (kernels/variant.cuh); the
// prefill kernel relies on its logits_mask excluding exactly the keys before
// visible_begin(q_pos), which lets tiles past every row's window start skip per-key masking.
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "mma_utils.cuh"
#include "plan_types.cuh"
#include "prefill_params.cuh"
#include "variant.cuh"

#ifndef FLARE_PAGE_SIZE
#define FLARE_PAGE_SIZE 1
#endif

namespace flare::prefill {

struct Traits {
  static constexpr int kHeadDimQK = FLARE_HEAD_DIM_QK;
  static constexpr int kHeadDimVO = FLARE_HEAD_DIM_VO;
  static constexpr int kQueryTile = FLARE_QUERY_TILE;  // packed rows per CTA tile
  static constexpr int kKvTile = FLARE_KV_TILE;        // KV rows per pipeline stage
  static constexpr int kCode = FLARE_Q_DTYPE;
  static constexpr bool kPaged = FLARE_KV_PAGED != 0;
  static constexpr int kPageSize = FLARE_PAGE_SIZE;
  static constexpr int kMask = FLARE_MASK;

  static constexpr int kMmaQ = prefill_mma_q(kQueryTile, kHeadDimVO);  // m16 tiles per warp
  static constexpr int kWarpsQ = prefill_warps_q(kQueryTile, kHeadDimVO);
  static constexpr int kWarpsKV = prefill_warps_kv(kQueryTile, kHeadDimVO);
  static constexpr int kThreads = prefill_threads(kQueryTile, kHeadDimVO);
  static constexpr int kRowsPerWarp = 16 * kMmaQ;
  static constexpr int kKvPerWarp = kKvTile / kWarpsKV;  // KV columns of S one warp owns
  static constexpr int kTilesS = kKvPerWarp / 8;         // n8 tiles of S per warp
  static constexpr int kTilesO = kHeadDimVO / 8;         // n8 tiles of O per warp
  static constexpr int kStepsQK = kHeadDimQK / 16;       // k16 steps of Q.K^T
  static constexpr int kStepsPV = kKvPerWarp / 16;       // k16 steps of P.V

  static constexpr int kQKRowBytes = kHeadDimQK * 2;
  static constexpr int kVRowBytes = kHeadDimVO * 2;
  static constexpr int kQKChunks = kHeadDimQK / 8;  // 16-byte chunks per row
  static constexpr int kVChunks = kHeadDimVO / 8;
  static constexpr int kStages = kPrefillKvStages;
  static constexpr int kQBytes = kQueryTile * kQKRowBytes;
  static constexpr int kKBytes = kKvTile * kQKRowBytes;
  static constexpr int kStageBytes = kKBytes + kKvTile * kVRowBytes;
  static constexpr int kPageIdsOffset = kQBytes + kStages * kStageBytes;
  static constexpr int kStageRowFloats = kHeadDimVO + kPrefillStagePad;
  static constexpr int kSharedBytes =
      prefill_shared_bytes(kQueryTile, kKvTile, kHeadDimQK, kHeadDimVO);

  static_assert(kQueryTile == 16 || kQueryTile == 32 || kQueryTile == 64 || kQueryTile == 128,
                "query tile");
  static_assert(kKvTile == 32 || kKvTile == 64 || kKvTile == 128, "kv tile");
  static_assert(kHeadDimQK % 64 == 0 && kHeadDimQK <= 256 && kHeadDimVO % 64 == 0 &&
                    kHeadDimVO <= 256,
                "head dims: multiples of 64 up to 256 (whole 128-byte swizzle lines)");
  static_assert(kCode == kCodeF16 || kCode == kCodeBF16, "dtype");
  static_assert(kPageSize >= 1, "page size");
  static_assert(kMask == kMaskNone || kMask == kMaskCausal || kMask == kMaskCustom, "mask");
  static_assert(kWarpsQ * kRowsPerWarp == kQueryTile, "warps cover the query tile");
  static_assert(kKvPerWarp % 16 == 0, "each KV warp owns whole k16 steps of P.V");
  static_assert(kTilesO % 2 == 0 && kTilesS % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
  static_assert(kThreads >= kKvTile, "one thread per page id of a tile");
  static_assert(kPageIdsOffset % 16 == 0 && kSharedBytes % 16 == 0, "16-byte alignment");
};

using T = Traits;

// Per-thread softmax state: kMmaQ m16 tiles, each with two rows (g and g + 8) per thread.
struct RowState {
  float o[T::kMmaQ][T::kTilesO][4];  // unnormalized output accumulators
  float m[T::kMmaQ][2];              // running max (log2 units), -inf before any visible key
  float d[T::kMmaQ][2];              // this thread's part of the running sum of exp2(s - m)
};

// What one thread needs about each of its rows to mask it.
struct RowInfo {
  int q_pos[T::kMmaQ][2];  // KV position of the row's token (causal)
  int token[T::kMmaQ][2];  // the row's token in its request (custom mask row)
  long long mask_base;     // custom mask: first bit of the request
  int kv_len;
  Variant variant[T::kMmaQ][2];
};

struct ItemGeometry {
  int kv_head;
  int rows;          // packed rows of the item
  int qo_begin;      // first query token of the request
  int kv_lo, kv_hi;  // KV positions this item reads
  int num_tiles;
  long long kv_base; // ragged: first KV token of the request; paged: first page-table entry
  int q_pos_first, q_pos_last;  // KV positions of the item's first and last token
};

__device__ __forceinline__ int warp_q() { return (threadIdx.x / 32) % T::kWarpsQ; }
__device__ __forceinline__ int warp_kv() { return (threadIdx.x / 32) / T::kWarpsQ; }
// Tile-local packed row of this thread's row h (0: g, 1: g + 8) of m16 tile mi.
__device__ __forceinline__ int local_row(int mi, int h) {
  return warp_q() * T::kRowsPerWarp + mi * 16 + h * 8 + (threadIdx.x % 32) / 4;
}

// --- loading module: the only place ragged and paged KV differ (001 §3.2.1) ----------------

__device__ __forceinline__ int page_id(const PrefillParams& p, const ItemGeometry& g, int tile,
                                       int row) {
  const int pos = g.kv_lo + tile * T::kKvTile + row;
  return pos < g.kv_hi ? __ldg(p.kv_indices + g.kv_base + pos / T::kPageSize) : 0;
}

// Element offset of KV position `pos` (row `row` of its tile) under this item's KV head.
__device__ __forceinline__ long long kv_element(const ItemGeometry& g, int pos, int row,
                                                const int* page_ids, long long stride_page,
                                                long long stride_slot, long long stride_head) {
  if constexpr (T::kPaged) {
    return page_ids[row] * stride_page + (pos % T::kPageSize) * stride_slot +
           g.kv_head * stride_head;
  } else {
    return (g.kv_base + pos) * stride_page + g.kv_head * stride_head;
  }
}

// Rows [0, kRows) of 16-byte chunks into swizzled shared rows; rows where element(row) < 0
// are zero-filled (their probabilities are 0, and 0 * NaN would be NaN).
template <int kRows, int kChunks, class ElementOf>
__device__ __forceinline__ void copy_rows(unsigned dst, const void* base, ElementOf element_of) {
  const unsigned char* src = static_cast<const unsigned char*>(base);
#pragma unroll 1
  for (int i = 0; i < kRows * kChunks / T::kThreads + (kRows * kChunks % T::kThreads != 0); ++i) {
    const int index = i * T::kThreads + threadIdx.x;
    if (kRows * kChunks % T::kThreads == 0 || index < kRows * kChunks) {
      const int row = index / kChunks;
      const int chunk = index % kChunks;
      const long long element = element_of(row);
      const bool valid = element >= 0;
      cp_async_16(dst + mma::swizzled_offset<kChunks * 16>(row, chunk),
                  src + (valid ? element * 2 + chunk * 16 : 0), valid);
    }
  }
}

__device__ __forceinline__ void issue_kv(const PrefillParams& p, const ItemGeometry& g, int tile,
                                         unsigned char* smem) {
  const int stage = tile % T::kStages;
  const unsigned k_dst = shared_address(smem + T::kQBytes + stage * T::kStageBytes);
  const int* page_ids = reinterpret_cast<const int*>(smem + T::kPageIdsOffset) + stage * T::kKvTile;
  const int start = g.kv_lo + tile * T::kKvTile;
  copy_rows<T::kKvTile, T::kQKChunks>(k_dst, p.k, [&](int row) -> long long {
    const int pos = start + row;
    return pos < g.kv_hi ? kv_element(g, pos, row, page_ids, p.k_stride_page, p.k_stride_slot,
                                      p.k_stride_head)
                         : -1;
  });
  copy_rows<T::kKvTile, T::kVChunks>(k_dst + T::kKBytes, p.v, [&](int row) -> long long {
    const int pos = start + row;
    return pos < g.kv_hi ? kv_element(g, pos, row, page_ids, p.v_stride_page, p.v_stride_slot,
                                      p.v_stride_head)
                         : -1;
  });
}

__device__ __forceinline__ void issue_q(const PrefillParams& p, const WorkItem& item,
                                        const ItemGeometry& g, unsigned char* smem) {
  copy_rows<T::kQueryTile, T::kQKChunks>(shared_address(smem), p.q, [&](int row) -> long long {
    if (row >= g.rows) return -1;
    const int packed = item.row_begin + row;
    const long long token = g.qo_begin + packed / p.group_size;
    const long long head = item.kv_head * p.group_size + packed % p.group_size;
    return token * p.q_stride_token + head * p.q_stride_head;
  });
}

// --- compute ------------------------------------------------------------------------------

// Per-thread ldmatrix offsets (ks = 0, nj = 0, mi = 0) into the Q tile and a K stage: row
// and chunk of this lane's row address; later steps are mma::swizzle_at of these.
__device__ __forceinline__ unsigned q_fragment_offset() {
  const int lane = threadIdx.x % 32;
  return mma::swizzled_offset<T::kQKRowBytes>(warp_q() * T::kRowsPerWarp + lane % 16, lane / 16);
}
__device__ __forceinline__ unsigned k_fragment_offset() {
  const int lane = threadIdx.x % 32;
  return mma::swizzled_offset<T::kQKRowBytes>(
      warp_kv() * T::kKvPerWarp + lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
}
__device__ __forceinline__ unsigned v_fragment_offset() {
  const int lane = threadIdx.x % 32;
  return mma::swizzled_offset<T::kVRowBytes>(
      warp_kv() * T::kKvPerWarp + lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
}

// S = Q K^T for this warp's rows and KV columns (fp32, raw dot products).
__device__ __forceinline__ void score_tile(unsigned q_frag, unsigned k_frag,
                                           float (&s)[T::kMmaQ][T::kTilesS][4]) {
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][nj][e] = 0.0f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < T::kStepsQK; ++ks) {
    unsigned a[T::kMmaQ][4];
#pragma unroll
    for (int mi = 0; mi < T::kMmaQ; ++mi) {
      mma::ldmatrix_x4(mma::swizzle_at(q_frag, ks) + mi * 16 * T::kQKRowBytes, a[mi]);
    }
#pragma unroll
    for (int nj = 0; nj < T::kTilesS; nj += 2) {
      unsigned b[4];
      mma::ldmatrix_x4(mma::swizzle_at(k_frag, ks) + nj * 8 * T::kQKRowBytes, b);
#pragma unroll
      for (int mi = 0; mi < T::kMmaQ; ++mi) {
        mma::mma_16816<T::kCode>(s[mi][nj], a[mi], b[0], b[1]);
        mma::mma_16816<T::kCode>(s[mi][nj + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

__device__ __forceinline__ bool visible(const PrefillParams& p, const ItemGeometry& g,
                                        const RowInfo& rows, int mi, int h, int pos) {
  bool seen = pos < g.kv_hi && rows.variant[mi][h].logits_mask(pos);
  if constexpr (T::kMask == kMaskCausal) seen = seen && pos <= rows.q_pos[mi][h];
  if constexpr (T::kMask == kMaskCustom) {
    const long long bit =
        rows.mask_base + static_cast<long long>(rows.token[mi][h]) * rows.kv_len + pos;
    seen = seen && ((__ldg(p.custom_mask + (bit >> 3)) >> (bit & 7)) & 1) != 0;
  }
  return seen;
}

// Logits transform and mask, online softmax update; s becomes the probabilities.
__device__ __forceinline__ void softmax_tile(const PrefillParams& p, const ItemGeometry& g,
                                             const RowInfo& rows, int tile,
                                             float (&s)[T::kMmaQ][T::kTilesS][4], RowState& st) {
  const int lane = threadIdx.x % 32;
  const int start = g.kv_lo + tile * T::kKvTile;
  const int first_col = start + warp_kv() * T::kKvPerWarp + (lane % 4) * 2;
  // Per-key masking only where some row of the item can lose a key of this tile.
  bool masked = start + T::kKvTile > g.kv_hi || T::kMask == kMaskCustom ||
                start < Variant::visible_begin(p.variant, g.q_pos_last);
  if (T::kMask == kMaskCausal) masked = masked || start + T::kKvTile - 1 > g.q_pos_first;
  const float q_scale = Variant::query_scale(p.variant);

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
          float x = rows.variant[mi][h].logits_transform(p.variant, s[mi][nj][2 * h + e] * q_scale,
                                                         pos);
          if (masked && !visible(p, g, rows, mi, h, pos)) x = negative_infinity();
          s[mi][nj][2 * h + e] = x;
          tile_max = fmaxf(tile_max, x);
        }
      }
      // The four threads of a quad hold one row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(st.m[mi][h], tile_max);
      // A row that saw no visible key keeps m = -inf; subtracting 0 keeps exp2 at 0.
      const float m_base = m_new == negative_infinity() ? 0.0f : m_new;
      const float rescale = fast_exp2(st.m[mi][h] - m_base);
      st.m[mi][h] = m_new;
      float tile_sum = 0.0f;
#pragma unroll
      for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float prob = fast_exp2(s[mi][nj][2 * h + e] - m_base);
          s[mi][nj][2 * h + e] = prob;
          tile_sum += prob;
        }
      }
      st.d[mi][h] = st.d[mi][h] * rescale + tile_sum;
#pragma unroll
      for (int dn = 0; dn < T::kTilesO; ++dn) {
        st.o[mi][dn][2 * h] *= rescale;
        st.o[mi][dn][2 * h + 1] *= rescale;
      }
    }
  }
}

// O += P V: the S accumulators of two adjacent n8 tiles are exactly one m16k16 A fragment.
__device__ __forceinline__ void accumulate_pv(unsigned v_frag,
                                              const float (&s)[T::kMmaQ][T::kTilesS][4],
                                              RowState& st) {
#pragma unroll
  for (int kk = 0; kk < T::kStepsPV; ++kk) {
    unsigned a[T::kMmaQ][4];
#pragma unroll
    for (int mi = 0; mi < T::kMmaQ; ++mi) {
      a[mi][0] = float2_to_16bit2<T::kCode>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
      a[mi][1] = float2_to_16bit2<T::kCode>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
      a[mi][2] = float2_to_16bit2<T::kCode>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
      a[mi][3] = float2_to_16bit2<T::kCode>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < T::kTilesO; dn += 2) {
      unsigned b[4];
      mma::ldmatrix_x4_trans(mma::swizzle_at(v_frag, dn / 2) + kk * 16 * T::kVRowBytes, b);
#pragma unroll
      for (int mi = 0; mi < T::kMmaQ; ++mi) {
        mma::mma_16816<T::kCode>(st.o[mi][dn], a[mi], b[0], b[1]);
        mma::mma_16816<T::kCode>(st.o[mi][dn + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// --- epilogue -----------------------------------------------------------------------------

// Combines the KV warps' states through shared memory and writes the item's rows: the final o
// and lse (write-through) or a float32 partial slot for the merge kernel.
__device__ __forceinline__ void write_item(const PrefillParams& p, const WorkItem& item,
                                           const ItemGeometry& g, const RowState& st,
                                           unsigned char* smem) {
  const int lane = threadIdx.x % 32;
  float* stage_o = reinterpret_cast<float*>(smem);  // [kWarpsKV][kQueryTile][kStageRowFloats]
  float* stage_m = stage_o + T::kWarpsKV * T::kQueryTile * T::kStageRowFloats;
  float* stage_d = stage_m + T::kWarpsKV * T::kQueryTile;  // [kWarpsKV][kQueryTile] each
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float d = st.d[mi][h];
      d += __shfl_xor_sync(0xffffffffu, d, 1);
      d += __shfl_xor_sync(0xffffffffu, d, 2);
      const int row = warp_kv() * T::kQueryTile + local_row(mi, h);
      if (lane % 4 == 0) {
        stage_m[row] = st.m[mi][h];
        stage_d[row] = d;
      }
#pragma unroll
      for (int dn = 0; dn < T::kTilesO; ++dn) {
        *reinterpret_cast<float2*>(stage_o + row * T::kStageRowFloats + dn * 8 + (lane % 4) * 2) =
            make_float2(st.o[mi][dn][2 * h], st.o[mi][dn][2 * h + 1]);
      }
    }
  }
  __syncthreads();

  for (int unit = threadIdx.x; unit < g.rows * T::kVChunks; unit += T::kThreads) {
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
    const float norm = empty ? 0.0f : 1.0f / denominator;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= norm;
    const float lse = empty ? negative_infinity() : (m_max + fast_log2(denominator)) * kLn2;

    const int packed = item.row_begin + r;
    if (item.partial_slot < 0) {
      const long long token = g.qo_begin + packed / p.group_size;
      const long long head = item.kv_head * p.group_size + packed % p.group_size;
      Vec16 out;
      out.x = float2_to_16bit2<T::kCode>(acc[0], acc[1]);
      out.y = float2_to_16bit2<T::kCode>(acc[2], acc[3]);
      out.z = float2_to_16bit2<T::kCode>(acc[4], acc[5]);
      out.w = float2_to_16bit2<T::kCode>(acc[6], acc[7]);
      unsigned char* o = static_cast<unsigned char*>(p.o);
      *reinterpret_cast<Vec16*>(
          o + (token * p.o_stride_token + head * p.o_stride_head + chunk * 8) * 2) = out;
      if (p.lse != nullptr && chunk == 0) {
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse;
      }
    } else {
      const long long slot_row =
          static_cast<long long>(item.partial_slot) * p.offsets.partial_rows + r;
      float* partial_o = reinterpret_cast<float*>(p.workspace + p.offsets.partial_o);
      float* partial_lse = reinterpret_cast<float*>(p.workspace + p.offsets.partial_lse);
      float* dst = partial_o + slot_row * T::kHeadDimVO + chunk * 8;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (chunk == 0) partial_lse[slot_row] = lse;
    }
  }
}

// --- one work item ------------------------------------------------------------------------

__device__ __forceinline__ ItemGeometry item_geometry(const PrefillParams& p,
                                                      const WorkItem& item) {
  ItemGeometry g;
  g.kv_head = item.kv_head;
  g.rows = item.row_end - item.row_begin;
  g.qo_begin = __ldg(p.qo_indptr + item.request);
  const int q_len = __ldg(p.qo_indptr + item.request + 1) - g.qo_begin;
  const int kv_begin = __ldg(p.kv_indptr + item.request);
  const int kv_count = __ldg(p.kv_indptr + item.request + 1) - kv_begin;
  int kv_len = kv_count;
  if constexpr (T::kPaged) {
    kv_len = kv_count == 0
                 ? 0
                 : (kv_count - 1) * T::kPageSize + __ldg(p.kv_last_page_len + item.request);
  }
  g.kv_base = kv_begin;
  // Bottom-right alignment: token t of the request sits at KV position kv_len - q_len + t.
  g.q_pos_first = kv_len - q_len + item.row_begin / p.group_size;
  g.q_pos_last = kv_len - q_len + (item.row_end - 1) / p.group_size;
  g.kv_hi = item.kv_end;
  const int visible_from = Variant::visible_begin(p.variant, g.q_pos_first);
  g.kv_lo = item.kv_begin > visible_from ? item.kv_begin : visible_from;
  g.num_tiles = g.kv_hi > g.kv_lo ? (g.kv_hi - g.kv_lo + T::kKvTile - 1) / T::kKvTile : 0;
  return g;
}

__device__ __forceinline__ void init_rows(const PrefillParams& p, const WorkItem& item,
                                          const ItemGeometry& g, RowInfo& rows, RowState& st) {
  const int q_offset = g.q_pos_first - item.row_begin / p.group_size;  // kv_len - q_len
  rows.mask_base = 0;
  if constexpr (T::kMask == kMaskCustom) rows.mask_base = 8LL * __ldg(p.mask_indptr + item.request);
  rows.kv_len = q_offset + (__ldg(p.qo_indptr + item.request + 1) - g.qo_begin);
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Rows past the item are computed on zero queries and never written; clamping keeps
      // their mask reads inside the request's bits.
      const int r = min(local_row(mi, h), g.rows - 1);
      const int packed = item.row_begin + r;
      const int token = packed / p.group_size;
      rows.q_pos[mi][h] = q_offset + token;
      rows.token[mi][h] = token;
      rows.variant[mi][h].init(p.variant, item.kv_head * p.group_size + packed % p.group_size,
                               q_offset + token);
      st.m[mi][h] = negative_infinity();
      st.d[mi][h] = 0.0f;
#pragma unroll
      for (int dn = 0; dn < T::kTilesO; ++dn) {
        st.o[mi][dn][2 * h] = 0.0f;
        st.o[mi][dn][2 * h + 1] = 0.0f;
      }
    }
  }
}

__device__ __forceinline__ void run_item(const PrefillParams& p, const WorkItem& item,
                                         unsigned char* smem) {
  const ItemGeometry g = item_geometry(p, item);
  int* page_ids = reinterpret_cast<int*>(smem + T::kPageIdsOffset);  // [kStages][kKvTile]
  // Page ids of tile t sit in slot t % 2 from one iteration before their copies are issued;
  // the ids of the tile after that wait in a register (no dependent load in the issue path).
  int next_page_id = 0;
  if constexpr (T::kPaged) {
    if (threadIdx.x < T::kKvTile) {
      page_ids[threadIdx.x] = page_id(p, g, 0, threadIdx.x);
      page_ids[T::kKvTile + threadIdx.x] = page_id(p, g, 1, threadIdx.x);
      next_page_id = page_id(p, g, 2, threadIdx.x);
    }
    __syncthreads();
  }
  issue_q(p, item, g, smem);
  if (g.num_tiles > 0) issue_kv(p, g, 0, smem);
  cp_async_commit();

  RowInfo rows;
  RowState st;
  init_rows(p, item, g, rows, st);

  const unsigned smem_base = shared_address(smem);
  const unsigned q_frag = smem_base + q_fragment_offset();
  const unsigned k_frag = k_fragment_offset();
  const unsigned v_frag = v_fragment_offset();
  for (int tile = 0; tile < g.num_tiles; ++tile) {
    cp_async_wait<0>();
    // Tile `tile` (and Q) landed for every thread; every thread is done with tile - 1, whose
    // stage and page-id slot the next issue and the page-id store overwrite.
    __syncthreads();
    if (tile + 1 < g.num_tiles) issue_kv(p, g, tile + 1, smem);
    cp_async_commit();
    if constexpr (T::kPaged) {
      if (threadIdx.x < T::kKvTile) {
        page_ids[(tile % T::kStages) * T::kKvTile + threadIdx.x] = next_page_id;
        next_page_id = page_id(p, g, tile + 3, threadIdx.x);
      }
    }
    const unsigned stage = smem_base + T::kQBytes + (tile % T::kStages) * T::kStageBytes;
    float s[T::kMmaQ][T::kTilesS][4];
    score_tile(q_frag, stage + k_frag, s);
    softmax_tile(p, g, rows, tile, s, st);
    accumulate_pv(stage + T::kKBytes + v_frag, s, st);
  }
  cp_async_wait<0>();
  __syncthreads();  // the Q tile and the stages become the output staging
  write_item(p, item, g, st, smem);
  __syncthreads();  // the next item's copies overwrite the staging
}

}  // namespace flare::prefill

// minBlocks 1: without it ptxas caps some small-tile configs at 128 registers and spills.
extern "C" __global__ void __launch_bounds__(flare::prefill::Traits::kThreads, 1)
    flare_prefill(const flare::PrefillParams params) {
  extern __shared__ __align__(128) unsigned char flare_prefill_smem[];
  const unsigned char* ws = params.workspace;
  const auto* counts = reinterpret_cast<const flare::PlanCounts*>(ws + params.offsets.counts);
  if (static_cast<int>(blockIdx.x) >= counts->num_ctas) return;
  const int* cta_indptr = reinterpret_cast<const int*>(ws + params.offsets.cta_indptr);
  const auto* items = reinterpret_cast<const flare::WorkItem*>(ws + params.offsets.work_items);
  const int end = cta_indptr[blockIdx.x + 1];
  for (int w = cta_indptr[blockIdx.x]; w < end; ++w) {
    const flare::WorkItem item = items[w];
    flare::prefill::run_item(params, item, flare_prefill_smem);
  }
}
