// The Hopper family's producer on NVFP4 K/V (T::kNvfp4; prefill_hopper_producer.cuh takes it
// at 64-row tiles). The producer warpgroup copies tile t + 1's code and scale rows
// into a raw stage while it converts tile t's into the 16-bit stage the consumers' warpgroup
// MMAs read (prefill_nvfp4_load.cuh convert_landed_nvfp4), K half then V half, each published
// on its `full` mbarrier like a gathered half: the conversion runs beside the consumers' MMAs
// instead of between them (the mma.sync family converts with the warps that then compute).
#pragma once

#include "prefill_hopper_sync.cuh"

namespace flare::prefill::hopper {

// produce_item for NVFP4 K/V (num_tiles > 0). Copy groups: the page ids of tiles 0 and 1, then
// per tile t one group with tile t + 1's raw rows and tile t + 2's page ids (Q with tile 0's
// rows). At the top of iteration t the producer waits for all of them: tile t's rows landed a
// conversion earlier, and the ids of tile t + 1 with them, before its copies are issued. Raw
// stage t % 2 is rewritten at iteration t + 1, after every producer thread's conversion of tile
// t (the barrier in publish_written_half); page-id slot t % 2 at iteration t, after the issue of
// tile t's copies at iteration t - 1 and the barrier at the top of iteration t.
template <class QLanded, class PrepareNext>
__device__ __forceinline__ void produce_item_nvfp4(const PrefillParams& p, const ItemHandOff& hand,
                                                   unsigned char* smem, unsigned& empty_phases,
                                                   QLanded q_landed, PrepareNext prepare_next) {
  static_assert(T::kRawStages == 2 && T::kPageIdSlots == 2, "one tile ahead");
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const int prepare_tile = min(num_tiles, 2) - 1;
  if constexpr (T::kPaged) {
    issue_page_ids(p, g, 0, smem);
    issue_page_ids(p, g, 1, smem);
    cp_async_commit();
    cp_async_wait<0>();
    producer_sync();  // the first two tiles' page ids, for every producer thread
  }
  issue_q(p, g, hand.row_q_pos, hand.row_qo_head, smem);
  issue_kv_nvfp4(p, g, 0, 0, smem);
  cp_async_commit();
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = stage_of(empty_phases, tile);
    cp_async_wait<0>();
    producer_sync();  // tile's rows (Q with tile 0) landed for every producer thread
    if (tile + 1 < num_tiles) issue_kv_nvfp4(p, g, tile + 1, (tile + 1) % 2, smem);
    if (T::kPaged && tile + 2 < num_tiles) issue_page_ids(p, g, tile + 2, smem);
    cp_async_commit();
    wait_half(shared.empty, empty_phases, kHalfK, stage);
    convert_landed_nvfp4<true, false>(tile % 2, stage, smem);
    publish_written_half(shared, kHalfK, stage);
    if (tile == 0) q_landed();  // Q landed with tile 0's rows, fenced above
    wait_half(shared.empty, empty_phases, kHalfV, stage);
    convert_landed_nvfp4<false, true>(tile % 2, stage, smem);
    publish_written_half(shared, kHalfV, stage);
    if (tile == prepare_tile) prepare_next();
  }
  advance_stages(empty_phases, num_tiles);
}

}  // namespace flare::prefill::hopper
