// Persistent split-KV batch decode over a paged KV cache (papers 001 §3.2.2 with tile size 1,
// 002 appendix A head-group fusion): each CTA walks its plan work queue; a work item is up to
// kRows query heads of one KV head against one KV chunk, each K/V row read once. Split tiles are
// merged in the same launch by the CTA finishing their last chunk (kernels/decode_merge.cuh).
// The compute loop is compiled in: CUDA cores (kernels/decode_cuda_core.cuh) or tensor cores
// (kernels/decode_mma.cuh, FLARE_DECODE_MMA 1); both provide LoopState, begin_item,
// compute_tile and publish_state. The defines are listed in kernels/decode_pipeline.cuh.
#pragma once

#include "decode_merge.cuh"
#ifndef FLARE_DECODE_MMA
#error "FLARE_DECODE_MMA (0: CUDA cores, 1: tensor cores) must be defined"
#endif
#if FLARE_DECODE_MMA
#include "decode_mma.cuh"
#else
#include "decode_cuda_core.cuh"
#endif

namespace flare::decode {

// Writes dims [4 * quad, 4 * quad + 4) of packed row r of `item` to o, and the row's lse once.
__device__ __forceinline__ void store_output(const DecodeParams& p, const WorkItem& item, int r,
                                             int quad, const float (&acc)[4], float lse) {
  const int packed = item.row_begin + r;
  const long long token = item.request + packed / p.group_size;  // one query token per request
  const long long head = item.kv_head * p.group_size + packed % p.group_size;
  unsigned char* o = static_cast<unsigned char*>(p.o);
  store_16bit4<T::kQCode>(o + ((token * p.o_stride_token + head * p.o_stride_head) + quad * 4) * 2,
                          acc);
  if (p.lse != nullptr && quad == 0) {
    p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse * p.lse_scale;
  }
}

// Combines the groups' states through shared memory and writes the item's rows: the final o
// and lse (write-through) or a float32 partial slot.
__device__ __forceinline__ void write_item(const DecodeParams& p, const WorkItem& item,
                                           const LoopState& st, float* scratch) {
  float* s_o = scratch;                                         // [kStateGroups][kRows][D]
  float* s_m = s_o + T::kStateGroups * T::kRows * T::kHeadDim;  // [kStateGroups][kRows]
  float* s_d = s_m + T::kStateGroups * T::kRows;                // [kStateGroups][kRows]
  publish_state(st, s_o, s_m, s_d);
  __syncthreads();

  const int rows = item.row_end - item.row_begin;
  const float out_scale = p.v_scale * (T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f);
  constexpr int kQuads = T::kHeadDim / 4;
  // The state groups of one KV head: all of them, or one warp per head of a whole-page item.
  constexpr int kHeadGroups = T::kStateGroups / T::kItemHeads;
  const int group = p.group_size / T::kItemHeads;  // rows per KV head of a whole-page item
  for (int unit = threadIdx.x; unit < rows * kQuads; unit += T::kThreads) {
    const int row = unit / kQuads;  // of the item
    const int quad = unit % kQuads;
    const int head = T::kItemHeads == 1 ? 0 : row / group;
    const int r = T::kItemHeads == 1 ? row : row % group;  // of its head's state
    const int first_group = head * kHeadGroups;
    float m_max = negative_infinity();
#pragma unroll
    for (int gi = first_group; gi < first_group + kHeadGroups; ++gi) {
      m_max = fmaxf(m_max, s_m[gi * T::kRows + r]);
    }
    const float m_base = m_max == negative_infinity() ? 0.0f : m_max;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float denominator = 0.0f;
#pragma unroll
    for (int gi = first_group; gi < first_group + kHeadGroups; ++gi) {
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
    // Without softmax, o is the weighted sum itself and a partial slot's lse is 0 (variant.cuh).
    const float norm = !Variant::use_softmax ? out_scale : empty ? 0.0f : out_scale / denominator;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= norm;
    const float lse = !Variant::use_softmax ? 0.0f
                      : empty               ? negative_infinity()
                                            : (m_max + fast_log2(denominator)) * kLn2;

    if (item.partial_slot < 0) {
      store_output(p, item, row, quad, acc, lse);
    } else {
      const long long slot_row =
          static_cast<long long>(item.partial_slot) * p.offsets.partial_rows + row;
      *reinterpret_cast<float4*>(p.offsets.partial_o + slot_row * T::kHeadDim + quad * 4) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (quad == 0) p.offsets.partial_lse[slot_row] = lse;
    }
  }
}

// A work item and what it needs of its request and its merge (staged by the plan).
struct ItemRecord {
  WorkItem item;
  DecodeItemMeta meta;
};

__device__ __forceinline__ ItemRecord load_record(const DecodeParams& p, int w) {
  const auto* items = reinterpret_cast<const WorkItem*>(p.workspace + p.offsets.work_items);
  ItemRecord r;
  r.item = items[w];
  r.meta = p.item_meta[w];
  return r;
}

// Runs `record`'s item (the caller has the next item's record in flight meanwhile); `first`:
// the CTA's first item.
__device__ __forceinline__ void run_item(const DecodeParams& p, const ItemRecord& record,
                                         unsigned char* smem, bool first) {
  const WorkItem& item = record.item;
  const int kv_len = record.meta.kv_len;

  ItemGeometry g;
  g.kv_head = item.kv_head * T::kItemHeads;  // a super head of kItemHeads KV heads (Traits)
  g.page_base = record.meta.page_begin;
  g.kv_hi = item.kv_end;
  const int q_pos = kv_len - 1;  // one query token per request, bottom-right aligned
  const int visible = Variant::visible_begin(p.variant, item.request, q_pos);
  g.kv_lo = item.kv_begin > visible ? item.kv_begin : visible;
  g.num_tiles = g.kv_hi > g.kv_lo ? (g.kv_hi - g.kv_lo + T::kTileTokens - 1) / T::kTileTokens : 0;

  LoopState st;
  begin_item(p, item, q_pos, st);

  // Pipeline: kStages - 1 tiles in flight; page ids of the next tile fetched one tile ahead.
  // The first tiles' page ids load together: one dependent load before the item streams.
  int pages[T::kCopiesPerThread];
  {
    int first_pages[T::kStages - 1][T::kCopiesPerThread];
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) fetch_pages(p, g, s, first_pages[s]);
    // ptxas sinks the later tiles' page-id loads below the first tile's copies (a round trip
    // later) unless those copies depend on them: page ids are never negative.
    int all_pages = 0;
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
#pragma unroll
      for (int i = 0; i < T::kCopiesPerThread; ++i) all_pages |= first_pages[s][i];
    }
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
      if (s < g.num_tiles) issue_tile(p, g, s, first_pages[s], smem, all_pages >= 0);
      cp_async_commit();
    }
  }
  fetch_pages(p, g, T::kStages - 1, pages);
  // With the first tiles in flight: what waits for q, and the loop's per-CTA set-up (the loop's
  // first barrier publishes it).
  finish_query(p, q_pos, st);
  if (first) begin_cta(p, smem);
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
    compute_tile(p, g, tile, smem, st);
  }
  cp_async_wait<0>();
  check_item_pages(p, g, item.request);  // its barrier: the pipeline stages become the scratch
  write_item(p, item, st, reinterpret_cast<float*>(smem));
  if (item.partial_slot >= 0) {
    const MergeRange range = {item.reserved, record.meta.slot_begin, record.meta.slot_count};
    if (arrived_last(p.merge_counters, range, reinterpret_cast<int*>(smem))) {
      merge_split_tile<T>(p, item, range, smem,
                          [&p, item](int r, int quad, const float(&acc)[4], float lse) {
                            store_output(p, item, r, quad, acc, lse);
                          });
    }
  }
  __syncthreads();  // the next item's copies overwrite the scratch
}

}  // namespace flare::decode

extern "C" __global__ void __launch_bounds__(flare::decode::Traits::kThreads,
                                             flare::decode::Traits::kMinCtasPerSm)
    flare_decode(const flare::DecodeParams params) {
  extern __shared__ __align__(16) unsigned char flare_decode_smem[];
  flare::wait_for_prior_grids();
  // One load (64 bytes) to the CTA's queue and its first item; the next item's record is in
  // flight while each item streams. The empty-queue test reads a field of each 16-byte part
  // (request, kv_begin and page_begin are never negative): otherwise ptxas sinks three of the
  // four loads below the exit, a second round trip before the first page ids.
  const flare::DecodeCtaStart start = params.cta_starts[blockIdx.x];
  const int begin = start.begin;
  const int end = start.end;
  if (((end - begin - 1) | start.item.request | start.item.kv_begin | start.meta.page_begin) < 0) {
    return;  // begin >= end
  }
  flare::decode::ItemRecord current = {start.item, start.meta};
  for (int w = begin; w < end; ++w) {
    flare::decode::ItemRecord next = current;
    if (w + 1 < end) next = flare::decode::load_record(params, w + 1);
    flare::decode::run_item(params, current, flare_decode_smem, w == begin);
    current = next;
  }
}
