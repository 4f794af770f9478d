// The Hopper family's producer on NVFP4 K/V (T::kNvfp4; prefill_hopper_producer.cuh takes it
// at 64-row tiles). The producer warpgroup copies tiles t + 1 and t + 2's code and scale rows
// into a ring of raw stages while it converts tile t's into the 16-bit stage the consumers'
// warpgroup MMAs read (prefill_nvfp4_load.cuh convert_landed_nvfp4), K half then V half, each
// published on its `full` mbarrier like a gathered half: the conversion runs beside the consumers'
// MMAs instead of between them (the mma.sync family converts with the warps that then compute).
#pragma once

#include "prefill_hopper_sync.cuh"

namespace flare::prefill::hopper {

// produce_item for NVFP4 K/V (num_tiles > 0). Copy groups: the page ids of tiles
// [0, kPageIdSlots), then one group per tile of the first kTileLead, then per tile t one group
// with tile t + kTileLead's raw rows and tile t + kPageIdSlots's page ids (Q with tile 0's rows).
// At the top of iteration t the producer waits for all but the newest kTileLead - 1 groups: tile
// t's rows landed (issued kTileLead conversions earlier), and with them the ids of tile
// t + kTileLead, before its copies are issued. Raw stage (t + kTileLead) % kRawStages is tile
// t - 1's, rewritten after every producer thread's conversion of it (the barrier in
// publish_written_half); page-id slot t % kPageIdSlots at iteration t, after tile t's issue at
// iteration t - kTileLead and the barrier at the top of iteration t - kTileLead + 1.
template <class PrepareNext>
__device__ __forceinline__ void produce_item_nvfp4(const PrefillParams& p, const ItemHandOff& hand,
                                                   unsigned char* smem, unsigned& empty_phases,
                                                   ItemQ q, PrepareNext prepare_next) {
  constexpr int kLead = T::kTileLead;
  static_assert(T::kRawStages == kLead + 1 && T::kPageIdSlots == 2 * kLead, "the raw ring");
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = hand.record.g;
  const int num_tiles = g.num_tiles;
  const int prepare_tile = min(num_tiles, 2) - 1;
  if constexpr (T::kPaged) {
    issue_first_page_ids(p, g, smem);
    cp_async_commit();
    cp_async_wait<0>();
    producer_sync();  // the first tiles' page ids, for every producer thread
  }
  q.issue(p, hand, smem);
  issue_first_tiles(p, g, smem);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = stage_of(empty_phases, tile);
    cp_async_wait<kLead - 1>();
    producer_sync();  // tile's rows (Q with tile 0) landed for every producer thread
    const int next = tile + kLead;
    if (next < num_tiles) issue_kv_nvfp4(p, g, next, next % T::kRawStages, smem);
    if (T::kPaged && tile + T::kPageIdSlots < num_tiles) {
      issue_page_ids(p, g, tile + T::kPageIdSlots, smem);
    }
    cp_async_commit();
    const int raw_stage = tile % T::kRawStages;
    wait_half(shared.empty, empty_phases, kHalfK, stage);
    convert_landed_nvfp4<true, false>(raw_stage, stage, smem);
    publish_written_half(shared, kHalfK, stage);
    if (tile == 0) q.landed(shared);  // Q landed with tile 0's rows, fenced above
    wait_half(shared.empty, empty_phases, kHalfV, stage);
    convert_landed_nvfp4<false, true>(raw_stage, stage, smem);
    publish_written_half(shared, kHalfV, stage);
    if (tile == prepare_tile) prepare_next();
  }
  advance_stages(empty_phases, num_tiles);
}

}  // namespace flare::prefill::hopper
