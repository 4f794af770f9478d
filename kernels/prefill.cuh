// The batch prefill/append kernel on tensor cores (the FlashAttention-2 template of paper 001
// §3.2): Q.K^T, online softmax and P.V per KV tile, and the work-item loop of the mma.sync
// family (the entry point: prefill_kernel.cuh).
//
// mma.sync m16n8k16, ldmatrix and cp.async gathers; 002 appendix A head-group fusion. CTAs take
// the plan's work items from one queue (an atomic counter); a work item is a tile of packed
// query rows of one KV head against one KV chunk, written through to o/lse or into a float32
// partial slot. Tile configuration and state: prefill_traits.cuh; loading: prefill_load.cuh;
// epilogue: prefill_epilogue.cuh.
#pragma once

#include "prefill_epilogue.cuh"
#include "prefill_load.cuh"
#include "prefill_nvfp4_load.cuh"
#include "prefill_softmax.cuh"
#include "prefill_traits.cuh"
#include "rotary.cuh"

namespace flare::prefill {

// --- compute ------------------------------------------------------------------------------

// Per-thread ldmatrix offsets (ks = 0, nj = 0, mi = 0) into the Q tile and a K stage: row
// and chunk of this lane's row address; later k-steps are mma::chunk_step of these (one XOR
// with an immediate), later row tiles add immediates.
__device__ __forceinline__ unsigned q_fragment_offset() {
  const int lane = thread_index() % 32;
  return mma::swizzled_offset<T::kQKRowBytes>(warp_q() * T::kRowsPerWarp + lane % 16, lane / 16);
}
__device__ __forceinline__ unsigned k_fragment_offset() {
  const int lane = thread_index() % 32;
  return mma::swizzled_offset<T::kQKRowBytes>(
      warp_kv() * T::kKvPerWarp + lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
}
__device__ __forceinline__ unsigned v_fragment_offset() {
  const int lane = thread_index() % 32;
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
      mma::ldmatrix_x4(mma::chunk_step(q_frag, 2 * ks) + mi * 16 * T::kQKRowBytes, a[mi]);
    }
#pragma unroll
    for (int nj = 0; nj < T::kTilesS; nj += 2) {
      unsigned b[4];
      mma::ldmatrix_x4(mma::chunk_step(k_frag, 2 * ks) + nj * 8 * T::kQKRowBytes, b);
#pragma unroll
      for (int mi = 0; mi < T::kMmaQ; ++mi) {
        mma::mma_16816<T::kCode>(s[mi][nj], a[mi], b[0], b[1]);
        mma::mma_16816<T::kCode>(s[mi][nj + 1], a[mi], b[2], b[3]);
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
      mma::ldmatrix_x4_trans(mma::chunk_step(v_frag, dn) + kk * 16 * T::kVRowBytes, b);
#pragma unroll
      for (int mi = 0; mi < T::kMmaQ; ++mi) {
        mma::mma_16816<T::kCode>(st.o[mi][dn], a[mi], b[0], b[1]);
        mma::mma_16816<T::kCode>(st.o[mi][dn + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// --- one work item ------------------------------------------------------------------------

__device__ __forceinline__ ItemGeometry item_geometry(const PrefillParams& p,
                                                      const WorkItem& item) {
  ItemGeometry g;
  g.kv_head = item.kv_head;
  g.request = item.request;
  g.rows = item.row_end - item.row_begin;
  g.qo_begin = __ldg(p.qo_begin + item.request);
  const int kv_begin = __ldg(p.kv_indptr + item.request);
  const int kv_count = __ldg(p.kv_indptr + item.request + 1) - kv_begin;
  int kv_len = kv_count;
  if constexpr (T::kPaged) {
    kv_len = kv_count == 0
                 ? 0
                 : (kv_count - 1) * T::kPageSize + __ldg(p.kv_last_page_len + item.request);
  }
  g.kv_base = kv_begin;
  // Token t of the request sits at KV position q_offset + t: kv_len - q_len (bottom-right
  // alignment) from plan(), kv_len - 1 for a causal cascade's shared levels (all keys visible).
  g.q_offset = __ldg(p.q_offset + item.request);
  g.q_pos_first = g.q_offset + item.row_begin / p.group_size;
  g.q_pos_last = g.q_offset + (item.row_end - 1) / p.group_size;
  // Keys past the variant's visible end for the item's last row are invisible to every row.
  g.kv_hi = min(item.kv_end, Variant::visible_end(p.variant, item.request, g.q_pos_last));
  const int visible_from = Variant::visible_begin(p.variant, item.request, g.q_pos_first);
  g.kv_lo = item.kv_begin > visible_from ? item.kv_begin : visible_from;
  g.num_tiles = g.kv_hi > g.kv_lo ? (g.kv_hi - g.kv_lo + T::kKvTile - 1) / T::kKvTile : 0;
  g.kv_len = kv_len;
  g.mask_base = 0;
  if constexpr (T::kMask == kMaskCustom) g.mask_base = 8LL * __ldg(p.mask_indptr + item.request);
  return g;
}

// The row tables of an item (KV position and query head of each packed row), rows
// [first, kQueryTile) by `stride`.
__device__ __forceinline__ void write_row_tables(const PrefillParams& p, const WorkItem& item,
                                                 const ItemGeometry& g, int* row_q_pos,
                                                 int* row_qo_head, int first, int stride) {
  for (int r = first; r < T::kQueryTile; r += stride) {
    // Rows past the item are computed on zero queries and never written; repeating the last
    // row keeps their mask reads inside the request's bits.
    const int packed = item.row_begin + min(r, g.rows - 1);
    row_q_pos[r] = g.q_offset + packed / p.group_size;
    row_qo_head[r] = item.kv_head * p.group_size + packed % p.group_size;
  }
}

// The item record and row tables; visible to every thread after the next barrier.
__device__ __forceinline__ void write_item_shared(const PrefillParams& p, const WorkItem& item,
                                                  const ItemGeometry& g, ItemShared& shared) {
  if (thread_index() == 0) shared.record = ItemRecord{item, g};
  write_row_tables(p, item, g, shared.row_q_pos, shared.row_qo_head, thread_index(), T::kThreads);
}

// The custom mask's bits of this thread's S elements (first_col: its first S column), gathered
// from the request's packed bits by the rows' positions in the item's row table.
__device__ __forceinline__ void gather_mask_bits(const PrefillParams& p, const ItemShared& shared,
                                                 int first_col,
                                                 unsigned (&bits)[RowInfo::kMaskWords]) {
  const ItemGeometry& g = item_record(shared).g;
#pragma unroll
  for (int w = 0; w < RowInfo::kMaskWords; ++w) bits[w] = 0;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long row_bit =
          g.mask_base +
          static_cast<long long>(shared.row_q_pos[local_row(mi, h)] - g.q_offset) * g.kv_len;
#pragma unroll
      for (int nj = 0; nj < T::kTilesS; ++nj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = first_col + nj * 8 + e;
          const long long bit = row_bit + pos;
          // Columns past kv_hi may lie past the request's bits; visible() drops them anyway.
          const unsigned set =
              pos < g.kv_hi ? (__ldg(p.custom_mask + (bit >> 3)) >> (bit & 7)) & 1u : 0u;
          const int index = mask_bit_index(mi, h, nj, e);
          bits[index / 32] |= set << (index % 32);
        }
      }
    }
  }
}

// first_col: this thread's first S column (KV position). kMaskBits: gather the custom mask's
// bits too (the Hopper family gathers them earlier, outside the softmax's register peak).
template <bool kMaskBits = true>
__device__ __forceinline__ RowInfo row_info(const PrefillParams& p, const ItemShared& shared,
                                            int first_col) {
  RowInfo rows;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = local_row(mi, h);
      rows.q_pos[mi][h] = shared.row_q_pos[r];
      const int qo_head = shared.row_qo_head[r];
      const ItemRecord& record = item_record(shared);
      const ItemGeometry& g = record.g;
      rows.variant[mi][h].init(p.variant, {record.item.request, qo_head, qo_head / p.group_size,
                                           rows.q_pos[mi][h], g.kv_len, g.kv_len - g.q_offset});
    }
  }
  if constexpr (T::kMask == kMaskCustom && kMaskBits) {
    gather_mask_bits(p, shared, first_col, rows.custom_bits);
  }
  return rows;
}

__device__ __forceinline__ void init_state(RowState& acc, RowStats& st) {
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.m[mi][h] = row_max_start<Variant>();
      st.d[mi][h] = 0.0f;
    }
#pragma unroll
    for (int dn = 0; dn < T::kTilesO; ++dn) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc.o[mi][dn][e] = 0.0f;
    }
  }
}

__device__ __forceinline__ WarpSpan warp_span(const PrefillParams& p, const WorkItem& item,
                                              const ItemGeometry& g) {
  // The rows of the warp's MMAs: its own, or its warpgroup's (warpgroup-uniform spans keep the
  // warpgroup's MMAs convergent).
  const int first_row = warp_q() * T::kRowsPerWarp / T::kSpanRows * T::kSpanRows;
  const int last_row = min(first_row + T::kSpanRows, g.rows) - 1;
  const int first_pos = g.q_offset + (item.row_begin + first_row) / p.group_size;
  const int last_pos = g.q_offset + (item.row_begin + max(last_row, 0)) / p.group_size;
  WarpSpan span;
  span.kv_end = min(g.kv_hi, Variant::visible_end(p.variant, item.request, last_pos));
  // Keys past the first row's visible_end are hidden from it (visible_end never decreases in
  // q_pos): only a mask that is exactly visible_end (kMaskIsVisibleEnd) leaves the keys before
  // it unchecked; other variant masks zero full_end below.
  span.full_end = min(g.kv_hi, Variant::visible_end(p.variant, item.request, first_pos));
  if constexpr (T::kMask == kMaskCausal) {
    span.kv_end = min(span.kv_end, last_pos + 1);
    span.full_end = min(span.full_end, first_pos + 1);
  }
  // A custom mask, or a variant mask that is not a window: every key is checked.
  if constexpr (T::kMask == kMaskCustom || masks_every_key<Variant>) span.full_end = 0;
  if (last_row < first_row) span.kv_end = 0;  // a warp past the item's rows
  span.full_begin = Variant::visible_begin(p.variant, item.request, last_pos);
  return span;
}

// The KV tile being processed (the thread's loop position minus one; re-read after Q.K^T instead
// of held across it), its first KV position for this warp, and its stage.
__device__ __forceinline__ int current_tile(const ItemShared& shared) {
  return shared.loop_tile[thread_index()] - 1;
}
__device__ __forceinline__ int first_column(const ItemShared& shared, int tile) {
  return item_record(shared).g.kv_lo + tile * T::kKvTile + warp_kv() * T::kKvPerWarp;
}
__device__ __forceinline__ unsigned stage_address(const unsigned char* smem, int tile) {
  return shared_address(smem) + T::kQBytes + (tile % T::kStages) * T::kStageBytes;
}

// Q.K^T, softmax and P.V of this warp's rows against its KV columns of tile `tile`. Tile
// dependent values are re-derived from shared memory after Q.K^T and the V address from the K
// address, so that nothing but the accumulators and fragments lives across the QK^T peak;
// `tile` itself arrives in a register (a shared read here would queue behind the copies just
// issued).
template <bool kBegin, bool kEnd>
__device__ __forceinline__ void process_tile(const PrefillParams& p, unsigned char* smem, int tile,
                                             RowState& acc) {
  ItemShared& shared = item_shared(smem);
  // Row data only where something reads it: masks, or logits that are not linear. Custom-mask
  // rows are gathered before Q.K^T, while the S accumulators are not yet live; the rest after.
  // Except at head_dim_vo 256 on sm_90, where ptxas spills the early gather's state across Q.K^T
  // (32 bytes at 64- and 128-row tiles) and not the late one (which sm_80 spills: 8 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kMaskRowsFirst = T::kMask == kMaskCustom && T::kHeadDimVO <= 128;
#else
  constexpr bool kMaskRowsFirst = T::kMask == kMaskCustom;
#endif
  RowInfo rows;
  if constexpr (kMaskRowsFirst) {
    rows = row_info(p, shared, first_column(shared, tile) + thread_index() % 4 * 2);
  }
  unsigned k_frag = stage_address(smem, tile) + k_fragment_offset();
  float s[T::kMmaQ][T::kTilesS][4];
  score_tile(shared_address(smem) + q_fragment_offset(), k_frag, s);
  asm volatile("" : "+r"(k_frag));  // opaque: the V address below derives from it
  const unsigned v_frag = k_frag + T::kKBytes + v_fragment_offset() - k_fragment_offset();
  const int thread_col = first_column(shared, current_tile(shared)) + thread_index() % 4 * 2;
  if constexpr (!kMaskRowsFirst) {
    if (T::kMask == kMaskCustom || kBegin || kEnd || !kLinearLogits) {
      rows = row_info(p, shared, thread_col);
    }
  }
  RowStats st = load_stats(shared);
  softmax_tile<kBegin, kEnd>(p, shared.record.g, rows, thread_col, s, st, acc);
  store_stats(shared, st);
  accumulate_pv(v_frag, s, acc);
}

// RoPE (kernels/rotary.cuh) on what landed for tile `tile` in stage `stage`: its K rows (KV
// positions kv_lo + tile * kKvTile + r), and with tile 0 the Q tile (row r at row_q_pos[r]).
// Rows past the item hold zeros or keys no row sees.
__device__ __forceinline__ void rotate_landed(const PrefillParams& p, const ItemGeometry& g,
                                              const int* row_q_pos, int tile, int stage,
                                              unsigned char* smem) {
  if (tile == 0) {
    rotate_shared_rows<Variant, T::kCode, T::kHeadDimQK, T::kQueryTile, T::kLoadThreads>(
        smem, p.variant, load_thread(),
        [](int row, int chunk) { return tile_offset<T::kQKRowBytes, T::kQueryTile>(row, chunk); },
        [row_q_pos](int row) { return row_q_pos[row]; });
  }
  rotate_shared_rows_from<Variant, T::kCode, T::kHeadDimQK, T::kKvTile, T::kLoadThreads>(
      smem + T::kQBytes + stage * T::kStageBytes, p.variant, load_thread(),
      [](int row, int chunk) { return tile_offset<T::kQKRowBytes, T::kKvTile>(row, chunk); },
      g.kv_lo + tile * T::kKvTile);
}

// Tile `tile` into stage `stage`: 16-bit K/V (prefill_load.cuh), or NVFP4 rows into raw stage
// `stage` (prefill_nvfp4_load.cuh).
__device__ __forceinline__ void issue_tile(const PrefillParams& p, const ItemGeometry& g, int tile,
                                           int stage, unsigned char* smem) {
  if constexpr (T::kNvfp4) {
    issue_kv_nvfp4(p, g, tile, stage, smem);
  } else {
    issue_kv(p, g, tile, stage, smem);
  }
}

// An item's first kPageIdSlots tiles' page ids (slot t % kPageIdSlots), before any of its copies
// is issued; the loop issues the rest kPageIdSlots tiles ahead. The 16-bit kernels' two are two
// calls: written as the loop, ptxas allocates their registers differently (SASS compared).
__device__ __forceinline__ void issue_first_page_ids(const PrefillParams& p, const ItemGeometry& g,
                                                     unsigned char* smem) {
  if constexpr (T::kPageIdSlots == 2) {
    issue_page_ids(p, g, 0, smem);
    issue_page_ids(p, g, 1, smem);
  } else {
#pragma unroll
    for (int t = 0; t < T::kPageIdSlots; ++t) issue_page_ids(p, g, t, smem);
  }
}

// An item's tiles [0, kTileLead) in flight (with Q, issued before), one copy group each (empty
// past the item) for the loop's wait count. NVFP4's loop is not unrolled: three inlined copies
// of issue_kv spill its 128-row tile.
__device__ __forceinline__ void issue_first_tiles(const PrefillParams& p, const ItemGeometry& g,
                                                  unsigned char* smem) {
  if constexpr (T::kTileLead == 1) {
    if (g.num_tiles > 0) issue_tile(p, g, 0, 0, smem);
    cp_async_commit();
  } else {
#pragma unroll 1
    for (int t = 0; t < T::kTileLead; ++t) {
      if (t < g.num_tiles) issue_tile(p, g, t, t % T::kCopyStages, smem);
      cp_async_commit();
    }
  }
}

// The workspace pointer as a fresh copy of the kernel parameter: pointers derived from it are
// recomputed per work item instead of living in registers across the KV loop (see
// thread_index()).
__device__ __forceinline__ const unsigned char* workspace_of(const PrefillParams& p) {
  const unsigned char* workspace = p.workspace;
  asm volatile("" : "+l"(workspace));
  return workspace;
}
__device__ __forceinline__ const PlanCounts* plan_counts(const PrefillParams& p) {
  return reinterpret_cast<const PlanCounts*>(workspace_of(p) + p.offsets.counts);
}
// Queue entry `entry`: work item entry / item_heads under its KV head + entry % item_heads
// (head major: item entry % num_work_items under its KV head + entry / num_work_items), writing
// its partial slot + that head offset when split (plan/plan.h Plan::item_heads,
// head_major_queue).
__device__ __forceinline__ WorkItem queue_item(const PrefillParams& p, int entry) {
  const auto* items = reinterpret_cast<const WorkItem*>(workspace_of(p) + p.offsets.work_items);
  const PlanCounts* counts = plan_counts(p);
  const int per_item = counts->head_major ? counts->num_work_items : counts->item_heads;
  const int quotient = entry / per_item;
  const int remainder = entry - quotient * per_item;
  const int head = counts->head_major ? quotient : remainder;
  WorkItem item = items[counts->head_major ? remainder : quotient];
  item.kv_head += head;
  if (item.partial_slot >= 0) item.partial_slot += head;
  return item;
}
__device__ __forceinline__ int queue_entries(const PrefillParams& p) {
  return plan_counts(p)->num_work_items * plan_counts(p)->item_heads;
}

// The queue's entries: CTA c's first is entry c, each later one the next entry past the
// planned CTAs that no CTA has taken (the counter). When every CTA took its first entry from
// the counter, the CTAs that reached it first won the race, and which CTAs those are is set by
// where the counter sits in L2, near some GPCs: with fewer entries than CTAs, busy CTAs paired
// on some SMs while others idled, and the same plan ran 0.89-1.07x as fast from one wrapper's
// counter to another's (H100, b16 q16 kv4096 110 / 128 us; docs/perf.md, twenty-seventh
// session). By block index the first entries spread as the CTAs do, one an SM first.
__device__ __forceinline__ int first_entry() { return static_cast<int>(blockIdx.x); }
__device__ __forceinline__ int next_entry(const PrefillParams& p) {
  return plan_counts(p)->num_ctas + atomicAdd(p.next_work_item, 1);
}

// One work item by the whole CTA (the mma.sync family; the Hopper family's CTA is
// prefill_hopper.cuh's).
__device__ __forceinline__ void run_item(const PrefillParams& p, const WorkItem& item_in,
                                         unsigned char* smem) {
  ItemShared& shared = item_shared(smem);
  {
    const ItemGeometry g = item_geometry(p, item_in);
    write_item_shared(p, item_in, g, shared);
    if (thread_index() % 32 == 0) shared.spans[thread_index() / 32] = warp_span(p, item_in, g);
    if constexpr (T::kPaged) {
      issue_first_page_ids(p, g, smem);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();  // the record, row tables, spans and first page ids are visible
    // Every thread has read next_item (this item's index) before the barrier above; the
    // atomic's latency hides behind the item, the barrier at its end publishes the result.
    if (thread_index() == 0) shared.next_item = next_entry(p);
    issue_q(p, g, shared.row_q_pos, shared.row_qo_head, smem);
    issue_first_tiles(p, g, smem);
  }
  // From here on the item lives in shared memory.
  const ItemGeometry& g = shared.record.g;

  RowState acc;
  {
    RowStats st;
    init_state(acc, st);
    store_stats(shared, st);
  }
  // The loop position lives in shared memory (each thread its own copy) and g.num_tiles is
  // re-read there: registers carried through the loop spill at the QK^T peak.
  shared.loop_tile[thread_index()] = 0;
  for (;;) {
    const int tile = shared.loop_tile[thread_index()];
    if (tile >= g.num_tiles) break;
    shared.loop_tile[thread_index()] = tile + 1;
    cp_async_wait<T::kTileLead - 1>();
    // Tile `tile` (and Q) landed for every thread; every thread is done with tile - 1, whose
    // stage (NVFP4: raw stage) the next issue overwrites, and with the page ids of tile
    // `tile` (read when its copies were issued), whose slot the page-id store overwrites.
    __syncthreads();
    // Read before the copies are issued: their asm clobbers memory, and a shared load after
    // them waits behind them in the memory queue.
    const int first_col = first_column(shared, tile);
    const WarpSpan span = shared.spans[thread_index() / 32];
    const int next = tile + T::kTileLead;
    if (next < g.num_tiles) {
      issue_tile(p, g, next, next % T::kCopyStages, smem);
    }
    if (T::kPaged && tile + T::kPageIdSlots < g.num_tiles) {
      issue_page_ids(p, g, tile + T::kPageIdSlots, smem);
    }
    cp_async_commit();
    if constexpr (T::kNvfp4) {
      convert_landed_nvfp4(tile % T::kRawStages, 0, smem);  // one 16-bit stage (T::kStages)
      __syncthreads();                                      // the converted rows are visible
    }
    if constexpr (Variant::kRotary) {
      rotate_landed(p, g, shared.row_q_pos, tile, tile % T::kStages, smem);
      __syncthreads();  // the rotated rows are visible
    }
    // Warp-uniform: columns no row of the warp sees contribute exactly nothing (skipped);
    // per-key masks only where some row may lose a key.
    if (first_col >= span.kv_end) continue;
    with_key_checks(first_col, span, [&](auto begin, auto end) {
      process_tile<decltype(begin)::value, decltype(end)::value>(p, smem, tile, acc);
    });
  }
  cp_async_wait<0>();
  __syncthreads();  // the Q tile and the stages become the output staging
  write_item(p, shared.record.item, g, acc, load_stats(shared), smem);
  __syncthreads();  // the next item's copies and record overwrite the staging and the record
}

// The mma.sync family's CTA: one queue for all CTAs, the next entry goes to whichever CTA
// finishes first. The entry index is re-read from shared memory per entry rather than carried in
// a register.
__device__ __forceinline__ void run_items(const PrefillParams& p, unsigned char* smem) {
  ItemShared& shared = item_shared(smem);
  if (thread_index() == 0) shared.next_item = first_entry();
  __syncthreads();
  while (shared.next_item < queue_entries(p)) run_item(p, queue_item(p, shared.next_item), smem);
}

}  // namespace flare::prefill
