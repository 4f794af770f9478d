// The Hopper family's CTA (FLARE_WARPGROUP, sm_90a): warp specialization over the mma.sync
// family's work items (paper 001 §3.2's FA3 template; docs/hopper_prefill_design.md).
//
// Three warpgroups on 128 query rows (two on 64): consumers first (threads [0, T::kThreads): the
// computing threads every shared helper indexes), then one producer. The producer loads Q with
// the mma.sync family's gathers, and the K and V halves of each stage by bulk tensor copies
// (ragged K/V without RoPE) or by those gathers (cp.async, any page size and layout; rotated
// when the variant has RoPE), and signals each half's `full` mbarrier; the consumers wait for
// it, compute S = Q K^T, the online softmax (the mma.sync family's, masks and variants included)
// and O += P V on warpgroup MMAs in ping-pong turns, and release each half through its `empty`
// mbarrier, so loads run ahead of the math without CTA-wide barriers. setmaxnreg moves
// registers from the producer to the consumers. The producer takes the work items from the
// plan's queue one item ahead and hands them over through two slots (run()), so that the next
// item's Q and first tiles load while the consumers finish this one; the epilogue writes from
// registers.
#pragma once

#include "prefill.cuh"

namespace flare::prefill::hopper {

// Registers: the launch gives every thread the same count (the cap of __launch_bounds__ at the
// family's CTAs per SM); the producer gives most of its share to the consumers. The consumers
// hold O, the next tile's S and the previous tile's P at once (consume_item); a producer that
// rotates landed rows (RoPE) or converts NVFP4 ones needs 56 registers, the others' 40 (paged
// gathers included), which leaves 232 to the consumers: at 224, variants with per-row state (ALiBi)
// spill.
constexpr int kCtasPerSm = prefill_warpgroup_ctas_per_sm(T::kShape);
constexpr int kEntryRegisters = 65536 / (kCtasPerSm * T::kLaunchThreads) / 8 * 8;
constexpr int kProducerRegisters = Variant::kRotary || T::kNvfp4 ? 56 : 40;
constexpr int kConsumerRegisters =
    (kEntryRegisters * (T::kLaunchThreads / 128) - kProducerRegisters) / (T::kThreads / 128) / 8 *
    8;
static_assert(kConsumerRegisters <= 256 && kConsumerRegisters >= kEntryRegisters, "register split");

// Ping-pong (FA3): the two consumer warpgroups take turns on the tensor cores, one's GEMM while
// the other's softmax, through a pair of named barriers: warpgroup w waits on kTurnBarrier + w
// before issuing its GEMMs and lets the other go once they are issued (consume_item says how
// many turns each takes).
constexpr bool kPingPong = T::kThreads == 256;
constexpr int kTurnBarrier = 4;  // and 5
__device__ __forceinline__ void turn_begin() {
  if constexpr (kPingPong) wgmma::named_sync<T::kThreads>(kTurnBarrier + thread_index() / 128);
}
__device__ __forceinline__ void turn_end() {
  if constexpr (kPingPong) wgmma::named_arrive<T::kThreads>(kTurnBarrier + 1 - thread_index() / 128);
}

// Named barriers (0 is __syncthreads'; 1 is math_sync's, the consumers'). The roles meet only
// through mbarriers (a named barrier reached from both roles' code is legal PTX, but
// compute-sanitizer's racecheck and synccheck take it for divergence).
constexpr int kProducerBarrier = 2;
__device__ __forceinline__ void producer_sync() {
  wgmma::named_sync<kProducerBarrier, kPrefillProducerThreads>();
}

__device__ __forceinline__ unsigned barrier_address(const unsigned long long& barrier) {
  return shared_address(&barrier);
}

// --- the warpgroup MMAs ---------------------------------------------------------------------

// A warp-uniform value broadcast from lane 0, so that the compiler knows it is uniform:
// descriptors derived from such values live in uniform registers, which the MMAs read, instead
// of being built per thread and moved over before every MMA (docs/perf.md, Hopper v7).
__device__ __forceinline__ int warp_uniform(int value) {
  return __shfl_sync(0xffffffffu, value, 0);
}
// The address of stage `stage`, broadcast (stage_address of a broadcast tile takes the modulo
// again in the uniform datapath: 16 more instructions per kernel, SASS).
__device__ __forceinline__ unsigned uniform_stage_address(const unsigned char* smem, int stage) {
  return shared_address(smem) + T::kQBytes + warp_uniform(stage) * T::kStageBytes;
}

// S = Q K^T for this warpgroup's 64 rows (issued, not waited for).
__device__ __forceinline__ void issue_scores(const unsigned char* smem, int stage,
                                             float (&s)[T::kMmaQ][T::kTilesS][4]) {
  const unsigned q_tile = shared_address(smem);
  const unsigned long long q_desc =
      wgmma::k_major_tile(q_tile + warp_uniform(thread_index() / 128) * 64 * wgmma::kPanelBytes);
  const unsigned long long k_desc = wgmma::k_major_tile(uniform_stage_address(smem, stage));
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < T::kStepsQK; ++ks) {
    wgmma::mma_ss<T::kCode>(s[0], wgmma::k_major<T::kQueryTile>(q_desc, 0, ks),
                            wgmma::k_major<T::kKvTile>(k_desc, 0, ks), ks > 0 ? 1 : 0);
  }
  wgmma::commit();
}

// P of one tile as the A fragments of O += P V: two adjacent n8 tiles of S are one m16k16
// fragment.
struct Probabilities {
  unsigned a[T::kStepsPV][4];
};
__device__ __forceinline__ void to_fragments(const float (&s)[T::kMmaQ][T::kTilesS][4],
                                             Probabilities& p) {
#pragma unroll
  for (int kk = 0; kk < T::kStepsPV; ++kk) {
    p.a[kk][0] = float2_to_16bit2<T::kCode>(s[0][2 * kk][0], s[0][2 * kk][1]);
    p.a[kk][1] = float2_to_16bit2<T::kCode>(s[0][2 * kk][2], s[0][2 * kk][3]);
    p.a[kk][2] = float2_to_16bit2<T::kCode>(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
    p.a[kk][3] = float2_to_16bit2<T::kCode>(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
  }
}

// O += P V with the V of stage `stage` (issued, not waited for).
__device__ __forceinline__ void issue_pv(const unsigned char* smem, int stage, const Probabilities& p,
                                         RowState& acc) {
  const unsigned long long v_desc =
      wgmma::mn_major_tile<T::kKvTile>(uniform_stage_address(smem, stage) + T::kKBytes);
  wgmma::hold(acc.o[0]);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < T::kStepsPV; ++kk) {
    wgmma::mma_rs<T::kCode>(acc.o[0], p.a[kk], wgmma::mn_major(v_desc, kk), 1);
  }
  wgmma::commit();
}

// The custom mask's bits of tile `tile` for this thread (none without a custom mask): gathered
// before the tile's S = Q K^T is issued, while only O and the previous tile's P are live (in the
// softmax, beside S, the gather's addresses spill at head dim 256).
struct TileMaskBits {
  unsigned w[RowInfo::kMaskWords];  // unused (and dropped) without a custom mask
};
__device__ __forceinline__ TileMaskBits tile_mask_bits(const PrefillParams& p,
                                                       const ItemShared& shared, int tile) {
  TileMaskBits bits;
  if constexpr (T::kMask == kMaskCustom) {
    const int first_col = warp_uniform(first_column(shared, tile)) + thread_index() % 4 * 2;
    gather_mask_bits(p, shared, first_col, bits.w);
  }
  return bits;
}

// The online softmax of a tile's scores (masks and variants as the mma.sync family's
// process_tile), with the key checks with_key_checks picked.
template <bool kBegin, bool kEnd>
__device__ __forceinline__ OutputRescale tile_softmax(const PrefillParams& p, ItemShared& shared,
                                                      int first_col, const TileMaskBits& bits,
                                                      float (&s)[T::kMmaQ][T::kTilesS][4]) {
  const int thread_col = first_col + thread_index() % 4 * 2;
  RowInfo rows;
  if (T::kMask == kMaskCustom || kBegin || kEnd || !kLinearLogits) {
    rows = row_info<false>(p, shared, thread_col);
  }
  if constexpr (T::kMask == kMaskCustom) {
#pragma unroll
    for (int w = 0; w < RowInfo::kMaskWords; ++w) rows.custom_bits[w] = bits.w[w];
  }
  RowStats st = load_stats(shared);
  const OutputRescale r = softmax_scores<kBegin, kEnd>(p, shared.record.g, rows, thread_col, s, st);
  store_stats(shared, st);
  return r;
}

// --- the roles ------------------------------------------------------------------------------

// Each role's phase bits, one register (a second one live across the item spills at the
// softmax's peak): bits [0, 2 * kStages) are the parities of the next `full` (consumers) or
// `empty` (producer) phase of each half stage, bit kStageBaseBit the stage of the item's first
// tile (the stages run on across items, so that the next item's first tile goes to the stage its
// predecessor's last tile did not use), and the consumers count their items from kItemCountBit
// up (the low bit: the item's hand-off slot; the next: that slot's item_ready parity).
constexpr int kStageBaseBit = 2 * T::kStages;
constexpr int kItemCountBit = 8;
static_assert(T::kStages == 2, "a stage base of one bit");
// The stage of the item's tile `tile` (and the argument the stage helpers below take).
__device__ __forceinline__ int stage_of(unsigned phases, int tile) {
  return (tile + static_cast<int>(phases >> kStageBaseBit)) & 1;
}
// After an item of num_tiles tiles: the next item's first stage.
__device__ __forceinline__ void advance_stages(unsigned& phases, int num_tiles) {
  phases ^= static_cast<unsigned>(num_tiles & 1) << kStageBaseBit;
}

// Waits for the next phase of half `half` of stage `stage` in `barriers` (`full` or `empty`),
// whose parity is bit half * kStages + stage of `bits`, and flips that bit.
__device__ __forceinline__ void wait_half(const unsigned long long (&barriers)[2][T::kStages],
                                          unsigned& bits, int half, int stage) {
  const int bit = half * T::kStages + stage;
  wgmma::barrier_wait(barrier_address(barriers[half][stage]), (bits >> bit) & 1u);
  bits ^= 1u << bit;
}

// Ragged K/V without RoPE arrive by bulk tensor copies when run() could encode their maps
// (p.bulk_kv: 16-byte aligned base and strides): one producer thread per half stage, one box per
// 64-dim panel, the half's bytes counted on its `full` barrier. Rows past the tensor come back as
// zeros; rows past the item (another request's) are masked by kv_hi like the gathered ones.
// RoPE (which rotates the landed rows with ordinary stores) gathers with cp.async.
constexpr bool kBulkRagged = !T::kPaged && !Variant::kRotary && !T::kNvfp4;
// Paged K/V of pages of at least 64 rows likewise, box by box (kBoxRows rows of one page, page
// ids read by the issuing thread), for the tiles wholly inside the item whose first row starts
// a box (items starting mid-box, a window's or a split's, gather): see produce_paged_bulk.
constexpr int kBoxRows = T::kPaged ? prefill_paged_box_rows(T::kPageSize, T::kKvTile) : 0;
constexpr bool kBulkPaged = kBoxRows > 0 && !Variant::kRotary && !T::kNvfp4;
constexpr int kBoxesPerTile = kBulkPaged ? T::kKvTile / kBoxRows : 1;

template <int kHalf>
__device__ __forceinline__ void issue_bulk_half(const PrefillParams& p, const ItemGeometry& g,
                                                int tile, int stage, unsigned char* smem,
                                                unsigned full) {
  constexpr int kDim = kHalf == kHalfK ? T::kHeadDimQK : T::kHeadDimVO;
  const unsigned dst = stage_address(smem, stage) + (kHalf == kHalfK ? 0 : T::kKBytes);
  const int row = static_cast<int>(g.kv_base) + g.kv_lo + tile * T::kKvTile;
  wgmma::barrier_arrive_expect(full, T::kKvTile * kDim * 2);
#pragma unroll
  for (int panel = 0; panel < kDim / 64; ++panel) {
    wgmma::bulk_copy_3d(dst + panel * T::kKvTile * wgmma::kPanelBytes,
                        kHalf == kHalfK ? &p.k_map : &p.v_map, panel * 64, g.kv_head, row, full);
  }
}

// The page ids of tile `tile`'s boxes (issuing thread only). An entry past kv_indices or an id
// outside the cache is recorded and read as page -1, outside the map: its box lands as zeros.
__device__ __forceinline__ void bulk_tile_pages(const PrefillParams& p, const ItemGeometry& g,
                                                int tile, int (&pages)[kBoxesPerTile]) {
#pragma unroll
  for (int b = 0; b < kBoxesPerTile; ++b) {
    const int pos = g.kv_lo + tile * T::kKvTile + b * kBoxRows;
    const long long entry = g.kv_base + pos / T::kPageSize;
    int page = -1;
    if (entry < p.num_indices) {
      page = __ldg(p.kv_indices + entry);
      if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) {
        record_index_error(p.index_error, kIndexErrorPageId, g.request, entry, page);
        page = -1;
      }
    } else {
      record_index_error(p.index_error, kIndexErrorEntry, g.request, entry, -1);
    }
    pages[b] = page;
  }
}

// One half of a paged tile by bulk copies: every box of every 64-dim panel, the half's bytes
// counted on its `full` barrier (issuing thread only).
template <int kHalf>
__device__ __forceinline__ void issue_bulk_paged_half(const PrefillParams& p, const ItemGeometry& g,
                                                      int tile, int stage, unsigned char* smem,
                                                      unsigned full,
                                                      const int (&pages)[kBoxesPerTile]) {
  constexpr int kDim = kHalf == kHalfK ? T::kHeadDimQK : T::kHeadDimVO;
  const unsigned dst = stage_address(smem, stage) + (kHalf == kHalfK ? 0 : T::kKBytes);
  const int first_slot = (g.kv_lo + tile * T::kKvTile) % T::kPageSize;
  wgmma::barrier_arrive_expect(full, T::kKvTile * kDim * 2);
#pragma unroll
  for (int panel = 0; panel < kDim / 64; ++panel) {
#pragma unroll
    for (int b = 0; b < kBoxesPerTile; ++b) {
      // Box b fills rows [b * kBoxRows, (b + 1) * kBoxRows) of the panel: the 128-byte swizzle
      // follows the shared address, whole 8-row groups here, as one box of the tile would.
      wgmma::bulk_copy_4d(dst + (panel * T::kKvTile + b * kBoxRows) * wgmma::kPanelBytes,
                          kHalf == kHalfK ? &p.k_map : &p.v_map, panel * 64, g.kv_head,
                          kBoxesPerTile > 1 ? 0 : first_slot, pages[b], full);
    }
  }
}

// Publishes a gathered half once this thread's copies but the newest kPending groups landed.
template <int kPending>
__device__ __forceinline__ void publish_half(ItemShared& shared, int half, int stage) {
  cp_async_wait<kPending>();
  wgmma::fence_async_shared();
  producer_sync();  // the half (and Q, page ids) landed for every producer thread
  if (load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.full[half][stage]));
}

// Q, gathered (packed rows) by every producer thread while the first K's bulk copy is in
// flight, then published on q_full.
template <class QLanded>
__device__ __forceinline__ void load_q_beside_bulk_k(const PrefillParams& p,
                                                     const ItemHandOff& hand, unsigned char* smem,
                                                     QLanded q_landed) {
  issue_q(p, hand.record.g, hand.row_q_pos, hand.row_qo_head, smem);
  cp_async_commit();
  cp_async_wait<0>();
  wgmma::fence_async_shared();
  producer_sync();
  q_landed();
}

// produce_item for paged K/V in boxes (kBulkPaged, p.bulk_kv, the item's first row starts a
// box): the tiles wholly inside the item by bulk copies, the page ids of the next read by the
// issuing thread while this one lands; the last tile, past kv_hi in part, gathered (its rows
// past kv_hi zero-filled: a page's stale tail could hold NaNs, and 0 * NaN is NaN in P.V).
template <class QLanded, class PrepareNext>
__device__ __forceinline__ void produce_paged_bulk(const PrefillParams& p, const ItemHandOff& hand,
                                                   unsigned char* smem, unsigned& empty_phases,
                                                   QLanded q_landed, PrepareNext prepare_next) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const int bulk_tiles = (g.kv_hi - g.kv_lo) / T::kKvTile;
  int pages[kBoxesPerTile];
  if (load_thread() == 0 && bulk_tiles > 0) bulk_tile_pages(p, g, 0, pages);
  const int prepare_tile = min(num_tiles, 2) - 1;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = stage_of(empty_phases, tile);
    if (tile < bulk_tiles) {
      wait_half(shared.empty, empty_phases, kHalfK, stage);
      if (load_thread() == 0) {
        issue_bulk_paged_half<kHalfK>(p, g, tile, stage, smem,
                                      barrier_address(shared.full[kHalfK][stage]), pages);
      }
      if (tile == 0) load_q_beside_bulk_k(p, hand, smem, q_landed);
      wait_half(shared.empty, empty_phases, kHalfV, stage);
      if (load_thread() == 0) {
        issue_bulk_paged_half<kHalfV>(p, g, tile, stage, smem,
                                      barrier_address(shared.full[kHalfV][stage]), pages);
        if (tile + 1 < bulk_tiles) bulk_tile_pages(p, g, tile + 1, pages);
      }
      if (tile == prepare_tile) prepare_next();
      continue;
    }
    issue_page_ids(p, g, tile, smem);
    cp_async_commit();
    cp_async_wait<0>();
    producer_sync();  // the tile's page ids landed for every producer thread
    wait_half(shared.empty, empty_phases, kHalfK, stage);
    if (tile == 0) issue_q(p, g, hand.row_q_pos, hand.row_qo_head, smem);
    issue_kv<true, false>(p, g, tile, stage, smem);
    cp_async_commit();
    wait_half(shared.empty, empty_phases, kHalfV, stage);
    issue_kv<false, true>(p, g, tile, stage, smem);
    cp_async_commit();
    publish_half<1>(shared, kHalfK, stage);
    if (tile == 0) q_landed();
    publish_half<0>(shared, kHalfV, stage);
    if (tile == prepare_tile) prepare_next();
  }
  advance_stages(empty_phases, num_tiles);
}

}  // namespace flare::prefill::hopper

// NVFP4: the producer converts (after the stage helpers above, before produce_item).
#include "prefill_hopper_nvfp4.cuh"

namespace flare::prefill::hopper {

// produce_item for 16-bit K/V (num_tiles > 0): bulk copies or gathers, as produce_item says.
template <class QLanded, class PrepareNext>
__device__ __forceinline__ void produce_item_16bit(const PrefillParams& p, const ItemHandOff& hand,
                                                   unsigned char* smem, unsigned& empty_phases,
                                                   QLanded q_landed, PrepareNext prepare_next) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const int prepare_tile = min(num_tiles, 2) - 1;
  if constexpr (kBulkPaged) {
    if (p.bulk_kv != 0 && g.kv_lo % kBoxRows == 0) {
      produce_paged_bulk(p, hand, smem, empty_phases, q_landed, prepare_next);
      return;
    }
  }
  if constexpr (T::kPaged) {
    issue_page_ids(p, g, 0, smem);
    issue_page_ids(p, g, 1, smem);
    cp_async_commit();
    cp_async_wait<0>();
    producer_sync();
  }
  if (kBulkRagged && p.bulk_kv != 0) {
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = stage_of(empty_phases, tile);
      wait_half(shared.empty, empty_phases, kHalfK, stage);
      if (load_thread() == 0) {
        issue_bulk_half<kHalfK>(p, g, tile, stage, smem,
                                barrier_address(shared.full[kHalfK][stage]));
      }
      if (tile == 0) load_q_beside_bulk_k(p, hand, smem, q_landed);
      wait_half(shared.empty, empty_phases, kHalfV, stage);
      if (load_thread() == 0) {
        issue_bulk_half<kHalfV>(p, g, tile, stage, smem,
                                barrier_address(shared.full[kHalfV][stage]));
      }
      if (tile == prepare_tile) prepare_next();
    }
    advance_stages(empty_phases, num_tiles);
    return;
  }
  // Both halves' copies are in flight before the producer waits for K's (one round trip per
  // tile, not two).
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = stage_of(empty_phases, tile);
    wait_half(shared.empty, empty_phases, kHalfK, stage);
    if (tile == 0) issue_q(p, g, hand.row_q_pos, hand.row_qo_head, smem);
    issue_kv<true, false>(p, g, tile, stage, smem);
    cp_async_commit();
    if constexpr (Variant::kRotary) {
      cp_async_wait<0>();
      producer_sync();
      rotate_landed(p, g, hand.row_q_pos, tile, stage, smem);
    }
    wait_half(shared.empty, empty_phases, kHalfV, stage);
    issue_kv<false, true>(p, g, tile, stage, smem);
    cp_async_commit();
    publish_half<1>(shared, kHalfK, stage);  // Q, with tile 0, in the same group as K
    if (tile == 0) q_landed();
    publish_half<0>(shared, kHalfV, stage);
    if (tile == prepare_tile) prepare_next();
    // Slot tile % 2 was read by every producer thread's issue_kv(tile), before the barrier.
    if (T::kPaged && tile + 2 < num_tiles) {
      issue_page_ids(p, g, tile + 2, smem);
      cp_async_commit();
    }
  }
  advance_stages(empty_phases, num_tiles);
}

// The producer's part of an item: Q with the first tile, then every tile into stage
// tile % kStages, K once the consumers released the stage's K half and V once they released its
// V half (a turn later: consume_item). A gathered half is published after every producer
// thread's copies of it landed: each waits for its own and fences them for the tensor cores, the
// producer barrier joins them (and orders the page-id slots and RoPE's rows), and one thread
// arrives on `full` (128 arrivals on one word every tile measured ~10% slower at L 4096).
// empty_phases: bit half * kStages + s is the parity of the next `empty` phase of that half.
// prepare_next() (every producer thread, once per item) writes the next item's hand-off slot:
// called once the item's first two tiles are issued (the producer then waits for the consumers to
// free a stage anyway), so that the next item's record is ready long before its Q may load.
template <class PrepareNext>
__device__ __forceinline__ void produce_item(const PrefillParams& p, const ItemHandOff& hand,
                                             unsigned char* smem, unsigned& empty_phases,
                                             PrepareNext prepare_next) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const auto q_landed = [&shared] {
    if (load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.q_full));
  };
  if (num_tiles == 0) {
    q_landed();  // nothing to load, but one q_full phase per item
    prepare_next();
    return;
  }
  if constexpr (T::kNvfp4) {
    produce_item_nvfp4(p, hand, smem, empty_phases, q_landed, prepare_next);
  } else {
    produce_item_16bit(p, hand, smem, empty_phases, q_landed, prepare_next);
  }
}

// The consumers' part of an item, in FA3's order: one tensor-core turn per KV tile issues
// S = Q K^T of this tile and O += P V of the previous one back to back, so that the other
// warpgroup's whole turn (both GEMMs) covers this one's softmax. Per tile, once its K and the
// previous tile's V are full: the turn; the wait for S (the older P.V may still run), which
// releases the K half; the online softmax; the wait for P.V, which releases the previous tile's
// V half; then O takes the softmax's rescale and P becomes the next turn's A fragments. (K and V
// released apart: the producer then loads the K of tile + 1 while P.V of tile - 1 still reads
// its stage's V; with one release per stage after P.V, the load came too late, docs/perf.md.)
// Every warpgroup takes num_tiles + 1 turns per item (the tiles past its span,
// warpgroup-uniform and the item's last, take empty turns; every consumer warp still waits for
// and releases their stages, so that no warp runs a phase ahead of the others), which keeps the
// two warpgroups' turns paired. Then the epilogue.
__device__ __forceinline__ void consume_item(const PrefillParams& p, unsigned char* smem,
                                             unsigned& full_phases) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = shared.record.g;
  RowState acc;
  {
    RowStats st;
    init_state(acc, st);
    store_stats(shared, st);
  }
  // Releases a half of stage `stage`, and with `q` the Q tile: once this warp's last
  // S = Q K^T landed, the producer may load the next item's (one lane's arrivals in one branch:
  // a second __syncwarp under its own condition made ptxas duplicate the softmax, SASS).
  const auto release = [&shared](int half, int stage, bool q = false) {
    __syncwarp();
    if (thread_index() % 32 == 0) {
      if (half >= 0) wgmma::barrier_arrive(barrier_address(shared.empty[half][stage]));
      if (q) wgmma::barrier_arrive(barrier_address(shared.q_empty));
    }
  };
  const int num_tiles = g.num_tiles;
  const WarpSpan span = shared.spans[thread_index() / 32];
  const int computed =
      max(0, min(num_tiles, (span.kv_end - g.kv_lo + T::kKvTile - 1) / T::kKvTile));
  if (computed == 0) release(-1, 0, true);
  // The softmax of tile `tile`, whose S landed; O then takes its rescale and P its fragments.
  // The key-check dispatch reads its operands as warp-uniform values (re-read from shared
  // memory, not held across the loop): it then branches uniformly, and the softmax's shuffles
  // need no divergence fallback, a divergent path that would serialize the MMAs in flight
  // across it (C7518).
  const auto softmax = [&](int tile, const TileMaskBits& bits, float(&s)[T::kMmaQ][T::kTilesS][4]) {
    const int first_col = warp_uniform(first_column(shared, tile));
    const WarpSpan& shared_span = shared.spans[thread_index() / 32];
    const WarpSpan uniform_span{warp_uniform(shared_span.kv_end),
                                warp_uniform(shared_span.full_begin),
                                warp_uniform(shared_span.full_end)};
    return with_key_checks(first_col, uniform_span, [&](auto begin, auto end) {
      return tile_softmax<decltype(begin)::value, decltype(end)::value>(p, shared, first_col, bits,
                                                                        s);
    });
  };
  // The first and the last turn are loops of at most one trip: an MMA issued under an `if`
  // makes ptxas serialize every MMA of the kernel (C7520).
  Probabilities probabilities;
  for (int tile = 0; tile < min(computed, 1); ++tile) {
    wgmma::barrier_wait(barrier_address(shared.q_full), (full_phases >> kItemCountBit) & 1u);
    wait_half(shared.full, full_phases, kHalfK, stage_of(full_phases, tile));
    const TileMaskBits bits = tile_mask_bits(p, shared, tile);
    float s[T::kMmaQ][T::kTilesS][4];
    turn_begin();
    issue_scores(smem, stage_of(full_phases, tile), s);
    turn_end();
    wgmma::wait<0>();
    wgmma::hold(s[0]);
    release(kHalfK, stage_of(full_phases, tile), computed == 1);
    softmax(tile, bits, s);  // O is still zero: no rescale
    to_fragments(s, probabilities);
  }
  for (int tile = 1; tile < computed; ++tile) {
    wait_half(shared.full, full_phases, kHalfK, stage_of(full_phases, tile));
    wait_half(shared.full, full_phases, kHalfV, stage_of(full_phases, tile - 1));
    const TileMaskBits bits = tile_mask_bits(p, shared, tile);
    float s[T::kMmaQ][T::kTilesS][4];
    turn_begin();
    issue_scores(smem, stage_of(full_phases, tile), s);
    issue_pv(smem, stage_of(full_phases, tile - 1), probabilities, acc);
    turn_end();
    wgmma::wait<1>();  // S; the previous tile's P.V may still run
    wgmma::hold(s[0]);
    release(kHalfK, stage_of(full_phases, tile), tile == computed - 1);
    const OutputRescale rescale = softmax(tile, bits, s);
    wgmma::wait<0>();
    wgmma::hold(acc.o[0]);
    release(kHalfV, stage_of(full_phases, tile - 1));
    rescale_output(acc, rescale);
    to_fragments(s, probabilities);
  }
  // The last turn: the last tile's P.V, with its wait in the same trip (a P.V the compiler
  // could see issued twice before a wait would make it insert waits between the MMAs, C7517).
  turn_begin();
  if (computed == 0) turn_end();
  for (int tile = max(computed, 1) - 1; tile < computed; ++tile) {
    wait_half(shared.full, full_phases, kHalfV, stage_of(full_phases, tile));
    issue_pv(smem, stage_of(full_phases, tile), probabilities, acc);
    turn_end();
    wgmma::wait<0>();
    wgmma::hold(acc.o[0]);
    release(kHalfV, stage_of(full_phases, tile));
  }
  for (int tile = computed; tile < num_tiles; ++tile) {
    wait_half(shared.full, full_phases, kHalfK, stage_of(full_phases, tile));
    wait_half(shared.full, full_phases, kHalfV, stage_of(full_phases, tile));
    turn_begin();
    turn_end();
    release(kHalfK, stage_of(full_phases, tile));
    release(kHalfV, stage_of(full_phases, tile));
  }
  advance_stages(full_phases, num_tiles);
  write_item_registers(p, shared.record.item, g, acc, load_stats(shared));
}

// The CTA: barriers, then each role's loop over the queue. The producer takes the entries:
// it writes entry n's hand-off slot n % 2 (-1 once the queue is empty) while item n - 1 loads,
// waits on q_empty for the consumers to be done with item n - 1's Q tile, completes the slot's
// item_ready and loads item n (q_full once per item: its Q tile landed, or it has no tiles). The
// consumers copy the slot into their record, compute the item and write its output. A slot is
// rewritten two entries later, during the load of the entry between, which starts after the
// producer's q_empty wait for the item before it: the consumers complete that release only
// after copying the slot. For the same reason none of item_ready, q_full and q_empty can
// complete twice before its waiter's next wait.
__device__ __forceinline__ void run(const PrefillParams& p, unsigned char* smem) {
  ItemShared& shared = item_shared(smem);
  if (thread_index() == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int s = 0; s < T::kStages; ++s) {
        wgmma::barrier_init(barrier_address(shared.full[half][s]), 1);
        wgmma::barrier_init(barrier_address(shared.empty[half][s]), T::kThreads / 32);
      }
      wgmma::barrier_init(barrier_address(shared.item_ready[half]), 1);
    }
    wgmma::barrier_init(barrier_address(shared.q_full), 1);
    wgmma::barrier_init(barrier_address(shared.q_empty), T::kThreads / 32);
  }
  __syncthreads();
  if (thread_index() >= T::kThreads) {
    wgmma::shrink_registers<kProducerRegisters>();
    unsigned empty_phases = 0;
    unsigned q_parity = 0;
    // Item n + 1's hand-off slot is written while item n loads (produce_item's prepare_next,
    // once n's first two tiles are issued): the chain ahead of an item's Q load (queue atomic,
    // work item, request tables, row tables), on which the consumers waited at every item at
    // L 1024 (q_full; docs/perf.md, nineteenth session), then runs while the item before
    // computes. A CTA holds at most the item after the one it loads, as the mma.sync family
    // does (taken during the current one), so the queue still balances its tail. The slot of
    // n + 1 is free then: its last reader, the consumers' copy for item n - 1, came before their
    // release of item n - 1's Q, which the producer waited for before loading item n.
    const auto prepare = [&](ItemHandOff& hand) {
      if (load_thread() == 0) {
        const int entry = atomicAdd(p.next_work_item, 1);
        hand.entry = entry < queue_entries(p) ? entry : -1;
      }
      producer_sync();
      const int entry = hand.entry;
      if (entry < 0) return;
      const WorkItem item = queue_item(p, entry);
      const ItemGeometry g = item_geometry(p, item);
      if (load_thread() == 0) hand.record = ItemRecord{item, g};
      write_row_tables(p, item, g, hand.row_q_pos, hand.row_qo_head, load_thread(),
                       kPrefillProducerThreads);
      producer_sync();  // the record and row tables, for every producer thread
    };
    prepare(shared.hand[0]);
    for (int slot = 0;; slot ^= 1) {
      ItemHandOff& hand = shared.hand[slot];
      const int entry = hand.entry;
      wgmma::barrier_wait(barrier_address(shared.q_empty), q_parity);
      q_parity ^= 1u;
      if (load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.item_ready[slot]));
      if (entry < 0) break;
      produce_item(p, hand, smem, empty_phases, [&] { prepare(shared.hand[slot ^ 1]); });
    }
  } else {
    wgmma::grow_registers<kConsumerRegisters>();
    // Every stage and the Q tile start released: the producer's first waits pass.
    if (thread_index() % 32 == 0) {
#pragma unroll
      for (int s = 0; s < T::kStages; ++s) {
        wgmma::barrier_arrive(barrier_address(shared.empty[kHalfK][s]));
        wgmma::barrier_arrive(barrier_address(shared.empty[kHalfV][s]));
      }
      wgmma::barrier_arrive(barrier_address(shared.q_empty));
    }
    if (kPingPong && thread_index() >= 128) wgmma::named_arrive<T::kThreads>(kTurnBarrier);
    // The phase bits (stage_of) with the item count.
    for (unsigned phases = 0;; phases += 1u << kItemCountBit) {
      const unsigned count = phases >> kItemCountBit;
      const int slot = count & 1u;
      wgmma::barrier_wait(barrier_address(shared.item_ready[slot]), (count >> 1) & 1u);
      const ItemHandOff& hand = shared.hand[slot];
      if (hand.entry < 0) break;
      math_sync();  // every consumer is done with the previous item's record (its epilogue)
      if (thread_index() == 0) shared.record = hand.record;
      for (int r = thread_index(); r < T::kQueryTile; r += T::kThreads) {
        shared.row_q_pos[r] = hand.row_q_pos[r];
        shared.row_qo_head[r] = hand.row_qo_head[r];
      }
      if (thread_index() % 32 == 0) {
        shared.spans[thread_index() / 32] = warp_span(p, hand.record.item, hand.record.g);
      }
      math_sync();  // the record, row tables and spans are visible to every consumer
      consume_item(p, smem, phases);
    }
  }
}

}  // namespace flare::prefill::hopper
