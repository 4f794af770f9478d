// The Hopper family's CTA (FLARE_WARPGROUP, sm_90a): warp specialization over the mma.sync
// family's work items (paper 001 §3.2's FA3 template; docs/hopper_prefill_design.md).
//
// Three warpgroups on 128 query rows (two on 64): consumers first (threads [0, T::kThreads): the
// computing threads every shared helper indexes), then one producer. The producer loads Q and
// the K/V stages with the mma.sync family's gathers (cp.async, any page size and layout),
// rotates them when the variant has RoPE, and signals each stage's `full` mbarrier; the
// consumers wait for it, compute S = Q K^T, the online softmax and O += P V on warpgroup MMAs
// (process_tile), and release the stage through its `empty` mbarrier, so loads run ahead of
// the math without CTA-wide barriers. setmaxnreg moves registers from the producer to the
// consumers. Work items are taken from the plan's queue as in the mma.sync family; two more
// mbarriers per item publish its record and retire it (the epilogue reuses the Q tile).
#pragma once

#include "prefill.cuh"

namespace flare::prefill::hopper {

// Registers: the launch gives every thread the same count (the cap of __launch_bounds__ at the
// family's CTAs per SM); the producer gives most of its share to the consumers.
constexpr int kCtasPerSm = prefill_warpgroup_ctas_per_sm(T::kShape);
constexpr int kEntryRegisters = 65536 / (kCtasPerSm * T::kLaunchThreads) / 8 * 8;
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters =
    (kEntryRegisters * (T::kLaunchThreads / 128) - kProducerRegisters) / (T::kThreads / 128) / 8 *
    8;
static_assert(kConsumerRegisters <= 256 && kConsumerRegisters >= kEntryRegisters, "register split");

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

// The producer's part of an item: Q with the first tile, then every tile into stage
// tile % kStages once the consumers released it. A stage is published after all of its copies
// (and, paged, the page ids the next copies read) landed: each producer thread waits for its own
// copies, fences them for the tensor cores and arrives on `full` (the producer barrier orders the
// page-id slots and RoPE's rows between the producer threads). empty_parity: bit s is the parity
// of the next `empty` phase of stage s. Every thread arrives on the mbarriers that publish its
// own writes, so compute-sanitizer's racecheck sees each ordering.
__device__ __forceinline__ void produce_item(const PrefillParams& p, unsigned char* smem,
                                             unsigned& empty_parity) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = shared.record.g;
  const int num_tiles = g.num_tiles;
  if (num_tiles == 0) return;
  if constexpr (T::kPaged) {
    issue_page_ids(p, g, 0, smem);
    issue_page_ids(p, g, 1, smem);
    cp_async_commit();
    cp_async_wait<0>();
    producer_sync();
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % T::kStages;
    wgmma::barrier_wait(barrier_address(shared.empty[stage]), (empty_parity >> stage) & 1u);
    empty_parity ^= 1u << stage;
    if (tile == 0) issue_q(p, g, shared.row_q_pos, shared.row_qo_head, smem);
    issue_kv(p, g, tile, smem);
    cp_async_commit();
    cp_async_wait<0>();
    wgmma::fence_async_shared();
    producer_sync();  // the stage (and the page ids of tile + 1) landed for every producer thread
    if constexpr (Variant::kRotary) {
      rotate_landed(p, g, tile, smem);
      wgmma::fence_async_shared();
      producer_sync();
    }
    wgmma::barrier_arrive(barrier_address(shared.full[stage]));
    // Slot tile % 2 was read by every producer thread's issue_kv(tile), before the barrier.
    if (T::kPaged && tile + 2 < num_tiles) {
      issue_page_ids(p, g, tile + 2, smem);
      cp_async_commit();
    }
  }
}

// The consumers' part of an item: each tile once its stage is full (every consumer waits for
// every tile, also one it skips, so that no warp runs a phase ahead of the others), then the
// epilogue. full_parity: bit s is the parity of the next `full` phase of stage s.
__device__ __forceinline__ void consume_item(const PrefillParams& p, unsigned char* smem,
                                             unsigned& full_parity) {
  ItemShared& shared = item_shared(smem);
  const ItemGeometry& g = shared.record.g;
  RowState acc;
  {
    RowStats st;
    init_state(acc, st);
    store_stats(shared, st);
  }
  const int num_tiles = g.num_tiles;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % T::kStages;
    wgmma::barrier_wait(barrier_address(shared.full[stage]), (full_parity >> stage) & 1u);
    full_parity ^= 1u << stage;
    shared.loop_tile[thread_index()] = tile + 1;  // process_tile's current_tile
    const int first_col = first_column(shared, tile);
    const WarpSpan span = shared.spans[thread_index() / 32];
    // Warpgroup-uniform (warp_span): columns no row of the warpgroup sees are skipped, per-key
    // masks only where some row may lose a key.
    if (first_col < span.kv_end) {
      const bool end_check = first_col + T::kKvTile > span.full_end;
      const bool begin_check = Variant::kMaskIsWindow && first_col < span.full_begin;
      if (!begin_check && !end_check) {
        process_tile<false, false>(p, smem, tile, acc);
      } else if constexpr (!kSplitKeyChecks) {
        process_tile<Variant::kMaskIsWindow, true>(p, smem, tile, acc);
      } else if (!begin_check) {
        process_tile<false, true>(p, smem, tile, acc);
      } else if (!end_check) {
        process_tile<true, false>(p, smem, tile, acc);
      } else {
        process_tile<true, true>(p, smem, tile, acc);
      }
    }
    __syncwarp();
    if (thread_index() % 32 == 0) wgmma::barrier_arrive(barrier_address(shared.empty[stage]));
  }
  write_item(p, shared.record.item, g, acc, load_stats(shared), smem);
}

// The CTA: barriers, then each role's loop over the same queue entries. Per entry, the
// consumers write the item's record and row tables and arrive on item_ready (thread 0 then
// takes the next entry); the producer loads the item's tiles, then waits for item_done, which
// the consumers arrive on after its output is written (thread 0 wrote next_item before).
__device__ __forceinline__ void run(const PrefillParams& p, unsigned char* smem) {
  ItemShared& shared = item_shared(smem);
  if (thread_index() == 0) {
#pragma unroll
    for (int s = 0; s < T::kStages; ++s) {
      wgmma::barrier_init(barrier_address(shared.full[s]), kPrefillProducerThreads);
      wgmma::barrier_init(barrier_address(shared.empty[s]), T::kThreads / 32);
    }
    wgmma::barrier_init(barrier_address(shared.item_ready), T::kThreads);
    wgmma::barrier_init(barrier_address(shared.item_done), T::kThreads);
    shared.next_item = atomicAdd(p.next_work_item, 1);
  }
  __syncthreads();
  if (thread_index() >= T::kThreads) {
    wgmma::shrink_registers<kProducerRegisters>();
    unsigned empty_parity = 0;
    unsigned item_parity = 0;  // of item_ready and item_done alike
    // next_item is read after item_done: thread 0 wrote it before arriving there.
    while (shared.next_item < queue_entries(p)) {
      wgmma::barrier_wait(barrier_address(shared.item_ready), item_parity);
      produce_item(p, smem, empty_parity);
      wgmma::barrier_wait(barrier_address(shared.item_done), item_parity);
      item_parity ^= 1u;
    }
  } else {
    wgmma::grow_registers<kConsumerRegisters>();
    // Every stage starts released: the producer's first wait on each passes.
    if (thread_index() % 32 == 0) {
#pragma unroll
      for (int s = 0; s < T::kStages; ++s) wgmma::barrier_arrive(barrier_address(shared.empty[s]));
    }
    unsigned full_parity = 0;
    while (shared.next_item < queue_entries(p)) {
      {
        const WorkItem item = queue_item(p, shared.next_item);
        const ItemGeometry g = item_geometry(p, item);
        write_item_shared(p, item, g, shared);
        if (thread_index() % 32 == 0) shared.spans[thread_index() / 32] = warp_span(p, item, g);
      }
      wgmma::barrier_arrive(barrier_address(shared.item_ready));
      math_sync();  // every consumer read next_item
      if (thread_index() == 0) shared.next_item = atomicAdd(p.next_work_item, 1);
      consume_item(p, smem, full_parity);
      math_sync();  // the next entry is visible to every consumer
      wgmma::barrier_arrive(barrier_address(shared.item_done));
    }
  }
}

}  // namespace flare::prefill::hopper
