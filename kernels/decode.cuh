// Persistent split-KV batch decode on CUDA cores over a paged KV cache (papers 001 §3.2.2 with
// tile size 1, 002 appendix A head-group fusion): each CTA walks its plan work queue; a work
// item is up to kRows query heads of one KV head against one KV chunk, each K/V row read once.
//
// Compile-time defines: FLARE_HEAD_DIM (64 | 128 | 256), FLARE_ROWS (1 | 2 | 4 | 8),
// FLARE_PAGE_SIZE (>= 1), FLARE_Q_DTYPE / FLARE_KV_DTYPE (DTypeCode), and the tuning the host
// chose (src/api/batch_decode.cpp decode_geometry): FLARE_TOKENS_PER_GROUP, FLARE_STAGES and
// FLARE_SHARED_BYTES (the dynamic shared memory it launches with). `struct Variant` comes from
// the variant source (kernels/variant.cuh describes its interface).
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "plan_types.cuh"
#include "variant.cuh"

namespace flare::decode {

// Threads: kLanes lanes share one token row (8 head dims each, one 16-byte or 8-byte shared
// read); the CTA's kGroups token groups take different tokens of a tile and keep their own
// online-softmax state, combined through shared memory at the end of a work item.
struct Traits {
  static constexpr int kHeadDim = FLARE_HEAD_DIM;
  static constexpr int kRows = FLARE_ROWS;  // packed query rows per work item (<= 8)
  static constexpr int kPageSize = FLARE_PAGE_SIZE;
  static constexpr int kQCode = FLARE_Q_DTYPE;
  static constexpr int kKVCode = FLARE_KV_DTYPE;
  static constexpr bool kFp8 = kKVCode == kCodeE4M3 || kKVCode == kCodeE5M2;
  static constexpr int kKVBytes = kFp8 ? 1 : 2;

  static constexpr int kThreads = 128;
  static constexpr int kDimsPerLane = 8;
  static constexpr int kLanes = kHeadDim / kDimsPerLane;  // 8, 16 or 32: inside one warp
  static constexpr int kGroups = kThreads / kLanes;
  // Tokens one group handles per tile: scores live in registers (kTokensPerGroup * kRows).
  static constexpr int kTokensPerGroup = FLARE_TOKENS_PER_GROUP;
  static constexpr int kTileTokens = kGroups * kTokensPerGroup;

  // cp.async of 16-byte chunks: a thread copies the same chunk column of kCopiesPerThread rows.
  static constexpr int kRowBytes = kHeadDim * kKVBytes;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kCopyRowStride = kThreads / kChunksPerRow;
  static constexpr int kCopiesPerThread = kTileTokens / kCopyRowStride;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;  // K or V of one tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  // (kStages - 1) stages in flight per CTA (48 KiB with 16-bit KV and 4-token groups).
  static constexpr int kStages = FLARE_STAGES;

  static constexpr int kCombineFloats = kGroups * kRows * (kHeadDim + 2);
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kSharedBytes = kPipelineBytes > kCombineFloats * 4
                                          ? kPipelineBytes : kCombineFloats * 4;
  static_assert(FLARE_SHARED_BYTES >= kSharedBytes, "the host launches with too little smem");
  static_assert(kStages >= 2 && kTokensPerGroup >= 1, "pipeline");

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim");
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "rows per item");
  static_assert(kPageSize >= 1, "page size");
  static_assert(kQCode == kCodeF16 || kQCode == kCodeBF16, "q dtype");
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a token row stays inside one warp");
  static_assert(kThreads % kChunksPerRow == 0 && kTileTokens % kCopyRowStride == 0,
                "copies tile the stage exactly");
};

using T = Traits;

// Per-thread state of one work item: kRows query rows x this lane's 8 dims.
struct RowState {
  float q[T::kRows][T::kDimsPerLane];
  float o[T::kRows][T::kDimsPerLane];
  float m[T::kRows];  // running max (log2 units), -inf before any visible key
  float d[T::kRows];  // running sum of exp2(s - m)
};

struct ItemGeometry {
  int kv_lo, kv_hi;  // KV positions this item reads
  int page_base;     // first entry of the request's page list
  int num_tiles;
  int kv_head;
};

__device__ __forceinline__ void fetch_pages(const DecodeParams& p, const ItemGeometry& g,
                                            int tile, int (&pages)[T::kCopiesPerThread]) {
  const int first_row = threadIdx.x / T::kChunksPerRow;
#pragma unroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int token = g.kv_lo + tile * T::kTileTokens + first_row + i * T::kCopyRowStride;
    pages[i] = token < g.kv_hi ? __ldg(p.kv_indices + g.page_base + token / T::kPageSize) : 0;
  }
}

// Gathers K and V rows of `tile` through the page table into its pipeline stage.
__device__ __forceinline__ void issue_tile(const DecodeParams& p, const ItemGeometry& g, int tile,
                                           const int (&pages)[T::kCopiesPerThread],
                                           unsigned char* smem) {
  const int column = threadIdx.x % T::kChunksPerRow;
  const int first_row = threadIdx.x / T::kChunksPerRow;
  const unsigned stage = shared_address(smem + (tile % T::kStages) * T::kStageBytes);
  const unsigned char* k = static_cast<const unsigned char*>(p.k);
  const unsigned char* v = static_cast<const unsigned char*>(p.v);
#pragma unroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int row = first_row + i * T::kCopyRowStride;
    const int token = g.kv_lo + tile * T::kTileTokens + row;
    const bool valid = token < g.kv_hi;
    const long long slot = token % T::kPageSize;
    const long long page = pages[i];
    const long long k_element =
        page * p.k_stride_page + slot * p.k_stride_slot + g.kv_head * p.k_stride_head;
    const long long v_element =
        page * p.v_stride_page + slot * p.v_stride_slot + g.kv_head * p.v_stride_head;
    const unsigned offset = row * T::kRowBytes + column * 16;
    cp_async_16(stage + offset, k + k_element * T::kKVBytes + column * 16, valid);
    cp_async_16(stage + T::kTileBytes + offset, v + v_element * T::kKVBytes + column * 16, valid);
  }
}

// Scores, online softmax and P.V of one tile for this thread's group.
__device__ __forceinline__ void compute_tile(const DecodeParams& p, const ItemGeometry& g,
                                             int tile, const unsigned char* smem,
                                             const Variant (&variant)[T::kRows], RowState& st) {
  const int lane = threadIdx.x % T::kLanes;
  const int group = threadIdx.x / T::kLanes;
  const unsigned char* stage = smem + (tile % T::kStages) * T::kStageBytes;
  const int lane_offset = lane * T::kDimsPerLane * T::kKVBytes;

  float s[T::kTokensPerGroup][T::kRows];
#pragma unroll
  for (int i = 0; i < T::kTokensPerGroup; ++i) {
    float k[T::kDimsPerLane];
    load_kv8<T::kKVCode>(stage + (i * T::kGroups + group) * T::kRowBytes + lane_offset, k);
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) acc = fmaf(st.q[r][e], k[e], acc);
      s[i][r] = acc;
    }
  }
  // Sum the partial dot products of the kLanes lanes of each token row.
#pragma unroll
  for (int offset = T::kLanes / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int i = 0; i < T::kTokensPerGroup; ++i) {
#pragma unroll
      for (int r = 0; r < T::kRows; ++r) s[i][r] += __shfl_xor_sync(0xffffffffu, s[i][r], offset);
    }
  }

  const int first_token = g.kv_lo + tile * T::kTileTokens + group;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    float tile_max = negative_infinity();
#pragma unroll
    for (int i = 0; i < T::kTokensPerGroup; ++i) {
      const int token = first_token + i * T::kGroups;
      const bool visible = token < g.kv_hi && variant[r].logits_mask(token);
      s[i][r] = visible ? variant[r].logits_transform(p.variant, s[i][r], token)
                        : negative_infinity();
      tile_max = fmaxf(tile_max, s[i][r]);
    }
    const float m_new = fmaxf(st.m[r], tile_max);
    // Rows that saw no visible key yet keep m = -inf; subtracting 0 then keeps exp2 at 0.
    const float m_base = m_new == negative_infinity() ? 0.0f : m_new;
    const float rescale = fast_exp2(st.m[r] - m_base);
    st.m[r] = m_new;
    float tile_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < T::kTokensPerGroup; ++i) {
      s[i][r] = fast_exp2(s[i][r] - m_base);
      tile_sum += s[i][r];
    }
    st.d[r] = st.d[r] * rescale + tile_sum;
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; ++e) st.o[r][e] *= rescale;
  }

  const unsigned char* v_tile = stage + T::kTileBytes;
#pragma unroll
  for (int i = 0; i < T::kTokensPerGroup; ++i) {
    float v[T::kDimsPerLane];
    load_kv8<T::kKVCode>(v_tile + (i * T::kGroups + group) * T::kRowBytes + lane_offset, v);
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) st.o[r][e] = fmaf(s[i][r], v[e], st.o[r][e]);
    }
  }
}

// Combines the groups' states through shared memory and writes the item's rows: the final o
// and lse (write-through) or a float32 partial slot.
__device__ __forceinline__ void write_item(const DecodeParams& p, const WorkItem& item,
                                           const RowState& st, float* scratch) {
  const int lane = threadIdx.x % T::kLanes;
  const int group = threadIdx.x / T::kLanes;
  float* s_o = scratch;                                        // [kGroups][kRows][D]
  float* s_m = s_o + T::kGroups * T::kRows * T::kHeadDim;      // [kGroups][kRows]
  float* s_d = s_m + T::kGroups * T::kRows;                    // [kGroups][kRows]
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    float* dst = s_o + (group * T::kRows + r) * T::kHeadDim + lane * T::kDimsPerLane;
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; e += 4) {
      *reinterpret_cast<float4*>(dst + e) =
          make_float4(st.o[r][e], st.o[r][e + 1], st.o[r][e + 2], st.o[r][e + 3]);
    }
    if (lane == 0) {
      s_m[group * T::kRows + r] = st.m[r];
      s_d[group * T::kRows + r] = st.d[r];
    }
  }
  __syncthreads();

  const int rows = item.row_end - item.row_begin;
  const float out_scale = p.v_scale * (T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f);
  constexpr int kQuads = T::kHeadDim / 4;
  for (int unit = threadIdx.x; unit < rows * kQuads; unit += T::kThreads) {
    const int r = unit / kQuads;
    const int quad = unit % kQuads;
    float m_max = negative_infinity();
#pragma unroll
    for (int gi = 0; gi < T::kGroups; ++gi) m_max = fmaxf(m_max, s_m[gi * T::kRows + r]);
    const float m_base = m_max == negative_infinity() ? 0.0f : m_max;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float denominator = 0.0f;
#pragma unroll
    for (int gi = 0; gi < T::kGroups; ++gi) {
      const float w = fast_exp2(s_m[gi * T::kRows + r] - m_base);
      denominator = fmaf(w, s_d[gi * T::kRows + r], denominator);
      const float4 part =
          *reinterpret_cast<const float4*>(s_o + (gi * T::kRows + r) * T::kHeadDim + quad * 4);
      acc[0] = fmaf(w, part.x, acc[0]);
      acc[1] = fmaf(w, part.y, acc[1]);
      acc[2] = fmaf(w, part.z, acc[2]);
      acc[3] = fmaf(w, part.w, acc[3]);
    }
    const bool empty = denominator == 0.0f;
    const float norm = empty ? 0.0f : out_scale / denominator;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= norm;
    const float lse = empty ? negative_infinity() : (m_max + fast_log2(denominator)) * kLn2;

    const int packed = item.row_begin + r;
    if (item.partial_slot < 0) {
      const long long token = item.request + packed / p.group_size;
      const long long head = item.kv_head * p.group_size + packed % p.group_size;
      unsigned char* o = static_cast<unsigned char*>(p.o);
      store_16bit4<T::kQCode>(
          o + ((token * p.o_stride_token + head * p.o_stride_head) + quad * 4) * 2, acc);
      if (p.lse != nullptr && quad == 0) {
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse;
      }
    } else {
      const long long slot_row =
          static_cast<long long>(item.partial_slot) * p.offsets.partial_rows + r;
      float* partial_o = reinterpret_cast<float*>(p.workspace + p.offsets.partial_o);
      float* partial_lse = reinterpret_cast<float*>(p.workspace + p.offsets.partial_lse);
      *reinterpret_cast<float4*>(partial_o + slot_row * T::kHeadDim + quad * 4) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (quad == 0) partial_lse[slot_row] = lse;
    }
  }
}

__device__ __forceinline__ void run_item(const DecodeParams& p, const WorkItem& item,
                                         unsigned char* smem) {
  const int lane = threadIdx.x % T::kLanes;
  const int page_begin = __ldg(p.kv_indptr + item.request);
  const int num_pages = __ldg(p.kv_indptr + item.request + 1) - page_begin;
  const int kv_len =
      num_pages == 0 ? 0 : (num_pages - 1) * T::kPageSize + __ldg(p.kv_last_page_len + item.request);

  ItemGeometry g;
  g.kv_head = item.kv_head;
  g.page_base = page_begin;
  g.kv_hi = item.kv_end;
  const int q_pos = kv_len - 1;  // one query token per request, bottom-right aligned
  const int visible = Variant::visible_begin(p.variant, q_pos);
  g.kv_lo = item.kv_begin > visible ? item.kv_begin : visible;
  g.num_tiles = g.kv_hi > g.kv_lo ? (g.kv_hi - g.kv_lo + T::kTileTokens - 1) / T::kTileTokens : 0;

  RowState st;
  Variant variant[T::kRows];
  const float fp8_fix = T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f;
  const float q_scale = Variant::query_scale(p.variant) * p.k_scale * fp8_fix;
  const int rows = item.row_end - item.row_begin;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    const int packed = item.row_begin + r;
    const long long token = item.request + packed / p.group_size;
    const int head = item.kv_head * p.group_size + packed % p.group_size;
    variant[r].init(p.variant, r < rows ? head : item.kv_head * p.group_size, q_pos);
    if (r < rows) {
      const unsigned char* q = static_cast<const unsigned char*>(p.q) +
                               ((token * p.q_stride_token + head * p.q_stride_head) +
                                lane * T::kDimsPerLane) * 2;
      load_global_16bit8<T::kQCode>(q, st.q[r]);
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) st.q[r][e] *= q_scale;
    } else {
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) st.q[r][e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; ++e) st.o[r][e] = 0.0f;
    st.m[r] = negative_infinity();
    st.d[r] = 0.0f;
  }

  // Pipeline: kStages - 1 tiles in flight; page ids of the next tile fetched one tile ahead.
  int pages[T::kCopiesPerThread];
  fetch_pages(p, g, 0, pages);
#pragma unroll
  for (int s = 0; s < T::kStages - 1; ++s) {
    if (s < g.num_tiles) {
      issue_tile(p, g, s, pages, smem);
      fetch_pages(p, g, s + 1, pages);
    }
    cp_async_commit();
  }
  for (int tile = 0; tile < g.num_tiles; ++tile) {
    cp_async_wait<T::kStages - 2>();
    // Tile `tile` has landed for every thread, and every thread is done with tile - 1, whose
    // stage the next issue overwrites.
    __syncthreads();
    const int next = tile + T::kStages - 1;
    if (next < g.num_tiles) {
      issue_tile(p, g, next, pages, smem);
      fetch_pages(p, g, next + 1, pages);
    }
    cp_async_commit();
    compute_tile(p, g, tile, smem, variant, st);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline stages become the combine scratch
  write_item(p, item, st, reinterpret_cast<float*>(smem));
  __syncthreads();  // the next item's copies overwrite the scratch
}

}  // namespace flare::decode

extern "C" __global__ void __launch_bounds__(flare::decode::Traits::kThreads)
    flare_decode(const flare::DecodeParams params) {
  extern __shared__ __align__(16) unsigned char flare_decode_smem[];
  const unsigned char* ws = params.workspace;
  const auto* counts = reinterpret_cast<const flare::PlanCounts*>(ws + params.offsets.counts);
  if (static_cast<int>(blockIdx.x) >= counts->num_ctas) return;
  const int* cta_indptr = reinterpret_cast<const int*>(ws + params.offsets.cta_indptr);
  const auto* items = reinterpret_cast<const flare::WorkItem*>(ws + params.offsets.work_items);
  const int end = cta_indptr[blockIdx.x + 1];
  for (int w = cta_indptr[blockIdx.x]; w < end; ++w) {
    const flare::WorkItem item = items[w];
    flare::decode::run_item(params, item, flare_decode_smem);
  }
}
