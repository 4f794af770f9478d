// The Hopper family's synchronization (kernels/prefill_hopper.cuh): the consumer warpgroups'
// ping-pong turns, the producer's named barrier, and the phase bits of the stages' mbarriers.
#pragma once

#include "prefill.cuh"

namespace flare::prefill::hopper {

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
  if constexpr (kPingPong)
    wgmma::named_arrive<T::kThreads>(kTurnBarrier + 1 - thread_index() / 128);
}

// Named barriers (0 is __syncthreads'; 2 the producer's; 4 and 5 the turns'; 6 and 7 the
// consumer warpgroups' own). The roles meet only through mbarriers (a named barrier reached
// from both roles' code is legal PTX, but compute-sanitizer's racecheck and synccheck take it
// for divergence).
constexpr int kProducerBarrier = 2;
__device__ __forceinline__ void producer_sync() {
  wgmma::named_sync<kProducerBarrier, kPrefillProducerThreads>();
}
// A consumer warpgroup's own barrier (6 and 7): around the copy of its item record, which
// neither warpgroup waits on the other for (WarpgroupRecord).
constexpr int kWarpgroupBarrier = 6;
__device__ __forceinline__ void warpgroup_sync() {
  wgmma::named_sync<128>(kWarpgroupBarrier + consumer_warpgroup());
}

__device__ __forceinline__ unsigned barrier_address(const unsigned long long& barrier) {
  return shared_address(&barrier);
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

// The item's Q on the producer's side: gathered with the first tile's copies (issue(), then
// landed() once every producer thread's copies landed and were fenced), or already in flight as
// one bulk copy counted on q_full (issue_bulk_q, prefill_hopper_producer.cuh): then both do
// nothing.
struct ItemQ {
  bool gather;
  __device__ __forceinline__ void issue(const PrefillParams& p, const ItemHandOff& hand,
                                        unsigned char* smem) const {
    if (gather) issue_q(p, hand.record.g, hand.row_q_pos, hand.row_qo_head, smem);
  }
  __device__ __forceinline__ void landed(ItemShared& shared) const {
    if (gather && load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.q_full));
  }
};

// Publishes half `half` of stage `stage` once this producer thread's writes to it (its copies,
// landed, or its stores) are done: each thread fences them for the tensor cores, the producer
// barrier joins the threads, one thread arrives on `full`.
__device__ __forceinline__ void publish_written_half(ItemShared& shared, int half, int stage) {
  wgmma::fence_async_shared();
  producer_sync();
  if (load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.full[half][stage]));
}

}  // namespace flare::prefill::hopper
