// The Hopper family's producer warpgroup (kernels/prefill_hopper.cuh): per work item, Q and the
// K / V halves of every tile into the stages, by bulk tensor copies or gathers (16-bit K/V), or
// converted from NVFP4 raw rows (prefill_hopper_nvfp4.cuh); each half published on its `full`
// mbarrier once the consumers released the stage.
#pragma once

#include "prefill_hopper_nvfp4.cuh"
#include "prefill_hopper_sync.cuh"

namespace flare::prefill::hopper {

// Ragged K/V without RoPE arrive by bulk tensor copies when run() could encode their maps
// (p.bulk_kv: 16-byte aligned base and strides): one producer thread per half stage, one box per
// 64-dim panel, the half's bytes counted on its `full` barrier. Rows past the tensor come back as
// zeros; rows past the item (another request's) are masked by kv_hi like the gathered ones.
// RoPE (which rotates the landed rows with ordinary stores) gathers with cp.async.
constexpr bool kBulkRagged = !T::kPaged && !Variant::kRotary && !T::kNvfp4;
// Q arrives by bulk tensor copies too when run() could encode q_map (p.bulk_q: the group size
// divides the query tile) and the item's rows start a token (row_begin a multiple of the group):
// one box per 64-dim panel, the tile's packed rows in order, issued by one thread as soon as the
// consumers released the Q tile, before the item's first K/V copies (the gather took the
// producer's four warps ~16 copies a thread, the consumers' largest wait at L 1024: docs/perf.md,
// thirty-fifth session). Rows past the item are the next tokens' (or zeros past q): their
// scores stay in their own rows, which are never written. RoPE rotates Q where it lands:
// gathered.
constexpr bool kBulkQ = !Variant::kRotary;
// Paged K/V of pages of 16, 32, 64, ... rows likewise, box by box (kBoxRows rows of one page),
// for the tiles wholly inside the item whose first row starts a box (items starting mid-box, a
// window's or a split's, gather): see produce_paged_bulk. The boxes of a tile are spread over the
// producer's four warps, kBoxesPerWarp lanes each: a lane reads its box's page id and issues the
// box's copies. A warp issues its lanes' copies one after another (each lane's page id moves to
// uniform registers first): from one warp, the 32 copies of a tile of 16-row pages took ~45% of
// that warp's time and delayed V's arrival (ncu, docs/perf.md twenty-third session).
constexpr int kBoxRows = T::kPaged ? prefill_paged_box_rows(T::kPageSize, T::kKvTile) : 0;
constexpr bool kBulkPaged = kBoxRows > 0 && !Variant::kRotary && !T::kNvfp4;
constexpr int kBoxesPerTile = kBulkPaged ? T::kKvTile / kBoxRows : 1;
constexpr int kProducerWarps = kPrefillProducerThreads / 32;
constexpr int kBoxesPerWarp = (kBoxesPerTile + kProducerWarps - 1) / kProducerWarps;
static_assert(kBoxesPerWarp <= 32, "one producer lane a box");

// The box this producer thread copies, or -1 for none.
__device__ __forceinline__ int box_of_thread() {
  const int lane = load_thread() % 32;
  const int box = load_thread() / 32 * kBoxesPerWarp + lane;
  return lane < kBoxesPerWarp && box < kBoxesPerTile ? box : -1;
}

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

// The item's Q tile by one bulk copy per panel (one thread), counted on q_full.
__device__ __forceinline__ void issue_bulk_q(const PrefillParams& p, const ItemRecord& record,
                                             unsigned char* smem, unsigned q_full) {
  const int token = record.g.qo_begin + record.item.row_begin / p.group_size;
  wgmma::barrier_arrive_expect(q_full, T::kQueryTile * T::kHeadDimQK * 2);
#pragma unroll
  for (int panel = 0; panel < T::kHeadDimQK / 64; ++panel) {
    wgmma::bulk_copy_3d(shared_address(smem) + panel * T::kQueryTile * wgmma::kPanelBytes, &p.q_map,
                        panel * 64, record.item.kv_head * p.group_size, token, q_full);
  }
}

// The page id of box `box` of tile `tile`. An entry past kv_indices or an id outside the cache
// is recorded and read as page -1, outside the map: its box lands as zeros.
__device__ __forceinline__ int bulk_box_page(const PrefillParams& p, const ItemGeometry& g,
                                             int tile, int box) {
  const int pos = g.kv_lo + tile * T::kKvTile + box * kBoxRows;
  const long long entry = g.kv_base + pos / T::kPageSize;
  if (entry >= p.num_indices) {
    record_index_error(p.index_error, kIndexErrorEntry, g.request, entry, -1);
    return -1;
  }
  const int page = __ldg(p.kv_indices + entry);
  if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) {
    record_index_error(p.index_error, kIndexErrorPageId, g.request, entry, page);
    return -1;
  }
  return page;
}

// One half of a paged tile by bulk copies (every producer thread): the first counts the half's
// bytes on its `full` barrier, and the thread of box `box` (box_of_thread(), -1 for none) copies
// it (page `page`) for every 64-dim panel. A box of another warp may complete before the bytes
// are expected: the barrier's transaction count then goes below zero for a while, and its phase
// still waits for the one arrival that comes with the expectation.
template <int kHalf>
__device__ __forceinline__ void issue_bulk_paged_half(const PrefillParams& p, const ItemGeometry& g,
                                                      int tile, int stage, unsigned char* smem,
                                                      unsigned full, int box, int page) {
  constexpr int kDim = kHalf == kHalfK ? T::kHeadDimQK : T::kHeadDimVO;
  const unsigned dst = stage_address(smem, stage) + (kHalf == kHalfK ? 0 : T::kKBytes);
  const int first_slot = (g.kv_lo + tile * T::kKvTile) % T::kPageSize;
  if (load_thread() == 0) wgmma::barrier_arrive_expect(full, T::kKvTile * kDim * 2);
  if (box < 0) return;
#pragma unroll
  for (int panel = 0; panel < kDim / 64; ++panel) {
    // Box b fills rows [b * kBoxRows, (b + 1) * kBoxRows) of the panel: the 128-byte swizzle
    // follows the shared address, whole 8-row groups here, as one box of the tile would.
    wgmma::bulk_copy_4d(dst + (panel * T::kKvTile + box * kBoxRows) * wgmma::kPanelBytes,
                        kHalf == kHalfK ? &p.k_map : &p.v_map, panel * 64, g.kv_head,
                        kBoxesPerTile > 1 ? 0 : first_slot, page, full);
  }
}

// Publishes a gathered half once this thread's copies but the newest kPending groups landed.
template <int kPending>
__device__ __forceinline__ void publish_half(ItemShared& shared, int half, int stage) {
  cp_async_wait<kPending>();
  publish_written_half(shared, half, stage);  // the half (and Q, page ids) for every thread
}

// Q, gathered (packed rows) by every producer thread while the first K's bulk copy is in
// flight, then published on q_full.
__device__ __forceinline__ void load_q_beside_bulk_k(const PrefillParams& p,
                                                     const ItemHandOff& hand, unsigned char* smem,
                                                     ItemQ q) {
  if (!q.gather) return;  // its bulk copy is in flight (issue_bulk_q)
  q.issue(p, hand, smem);
  cp_async_commit();
  cp_async_wait<0>();
  wgmma::fence_async_shared();
  producer_sync();
  q.landed(item_shared(smem));
}

// produce_item for paged K/V in boxes (kBulkPaged, p.bulk_kv, the item's first row starts a
// box): the tiles wholly inside the item by bulk copies, K of tile + 1 before V of tile (its
// stage frees when S of tile - 1 lands, before P.V of tile - 2 frees V's: the consumers' turn
// tile + 1 then waits for the later of two copies issued at once, not for K issued behind V),
// each page id read a tile before its copies; the last tile, past kv_hi in part, gathered (its
// rows past kv_hi zero-filled: a page's stale tail could hold NaNs, and 0 * NaN is NaN in P.V).
template <class PrepareNext>
__device__ __forceinline__ void produce_paged_bulk(const PrefillParams& p, const ItemHandOff& hand,
                                                   unsigned char* smem, unsigned& empty_phases,
                                                   ItemQ q, PrepareNext prepare_next) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const int bulk_tiles = (g.kv_hi - g.kv_lo) / T::kKvTile;
  const int box = box_of_thread();
  // This thread's box pages: of the tile whose V is next, and of the one after (its K next).
  int page = -1;
  int next_page = -1;
  if (box >= 0 && bulk_tiles > 0) page = bulk_box_page(p, g, 0, box);
  if (bulk_tiles > 0) {
    const int stage = stage_of(empty_phases, 0);
    wait_half(shared.empty, empty_phases, kHalfK, stage);
    issue_bulk_paged_half<kHalfK>(p, g, 0, stage, smem, barrier_address(shared.full[kHalfK][stage]),
                                  box, page);
    if (box >= 0 && bulk_tiles > 1) next_page = bulk_box_page(p, g, 1, box);
    load_q_beside_bulk_k(p, hand, smem, q);
  }
  const int prepare_tile = min(num_tiles, 2) - 1;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = stage_of(empty_phases, tile);
    if (tile < bulk_tiles) {
      if (tile + 1 < bulk_tiles) {
        const int next_stage = stage_of(empty_phases, tile + 1);
        wait_half(shared.empty, empty_phases, kHalfK, next_stage);
        issue_bulk_paged_half<kHalfK>(p, g, tile + 1, next_stage, smem,
                                      barrier_address(shared.full[kHalfK][next_stage]), box,
                                      next_page);
      }
      const int after_next =
          box >= 0 && tile + 2 < bulk_tiles ? bulk_box_page(p, g, tile + 2, box) : -1;
      wait_half(shared.empty, empty_phases, kHalfV, stage);
      issue_bulk_paged_half<kHalfV>(p, g, tile, stage, smem,
                                    barrier_address(shared.full[kHalfV][stage]), box, page);
      page = next_page;
      next_page = after_next;
      if (tile == prepare_tile) prepare_next();
      continue;
    }
    issue_page_ids(p, g, tile, smem);
    cp_async_commit();
    cp_async_wait<0>();
    producer_sync();  // the tile's page ids landed for every producer thread
    wait_half(shared.empty, empty_phases, kHalfK, stage);
    if (tile == 0) q.issue(p, hand, smem);
    issue_kv<true, false>(p, g, tile, stage, smem);
    cp_async_commit();
    wait_half(shared.empty, empty_phases, kHalfV, stage);
    issue_kv<false, true>(p, g, tile, stage, smem);
    cp_async_commit();
    publish_half<1>(shared, kHalfK, stage);
    if (tile == 0) q.landed(shared);
    publish_half<0>(shared, kHalfV, stage);
    if (tile == prepare_tile) prepare_next();
  }
  advance_stages(empty_phases, num_tiles);
}

// produce_item for 16-bit K/V (num_tiles > 0): bulk copies or gathers, as produce_item says.
template <class PrepareNext>
__device__ __forceinline__ void produce_item_16bit(const PrefillParams& p, const ItemHandOff& hand,
                                                   unsigned char* smem, unsigned& empty_phases,
                                                   ItemQ q, PrepareNext prepare_next) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const int prepare_tile = min(num_tiles, 2) - 1;
  if constexpr (kBulkPaged) {
    if (p.bulk_kv != 0 && g.kv_lo % kBoxRows == 0) {
      produce_paged_bulk(p, hand, smem, empty_phases, q, prepare_next);
      return;
    }
  }
  if constexpr (T::kPaged) {
    issue_first_page_ids(p, g, smem);
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
      if (tile == 0) load_q_beside_bulk_k(p, hand, smem, q);
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
    if (tile == 0) q.issue(p, hand, smem);
    issue_kv<true, false>(p, g, tile, stage, smem);
    cp_async_commit();
    wait_half(shared.empty, empty_phases, kHalfV, stage);
    issue_kv<false, true>(p, g, tile, stage, smem);
    cp_async_commit();
    if constexpr (Variant::kRotary) {  // V's copies in flight meanwhile
      cp_async_wait<1>();
      producer_sync();
      rotate_landed(p, g, hand.row_q_pos, tile, stage, smem);
    }
    publish_half<1>(shared, kHalfK, stage);  // Q, with tile 0, in the same group as K
    if (tile == 0) q.landed(shared);
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
  if (num_tiles == 0) {  // nothing to load, but one q_full phase per item
    if (load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.q_full));
    prepare_next();
    return;
  }
  // A gathered Q is published (once it landed) with the first tile's K.
  const ItemQ q{!kBulkQ || p.bulk_q == 0 || hand.record.item.row_begin % p.group_size != 0};
  if (!q.gather && load_thread() == 0) {
    issue_bulk_q(p, hand.record, smem, barrier_address(shared.q_full));
  }
  if constexpr (T::kNvfp4) {
    produce_item_nvfp4(p, hand, smem, empty_phases, q, prepare_next);
  } else {
    produce_item_16bit(p, hand, smem, empty_phases, q, prepare_next);
  }
}

}  // namespace flare::prefill::hopper
