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
// registers. Here: the register split, the consumers' MMAs and their part of an item, and the
// CTA; the producer's part is prefill_hopper_producer.cuh, the barriers prefill_hopper_sync.cuh.
#pragma once

#include "prefill_hopper_producer.cuh"

namespace flare::prefill::hopper {

// Registers: the launch gives every thread the same count (the cap of __launch_bounds__ at the
// family's CTAs per SM); the producer gives most of its share to the consumers. The consumers
// hold O, the next tile's S and the previous tile's P at once (consume_item). A producer that
// rotates landed rows (RoPE) gets 72, 216 left to the consumers of 128-row tiles (ptxas then
// batches the rotations of 8 rows: +4-7% on causal RoPE prefill against 56 beside 224, forty-
// first session); one that converts NVFP4 rows needs 56; one that copies paged boxes 48 (its
// lanes' page ids beside the gathers of Q and the last tile: 28-140 bytes spilled at 40); the
// others 40, which leaves 232 to the consumers of 128-row tiles (224 beside 48). The producer
// then takes what the consumers' multiple of 8 leaves over: 56 beside 224 (at 48 a change
// anywhere in the kernel could tip ptxas into spilling the producer's loop state: 24 bytes in
// the D 256 paged custom-mask unit, fortieth session).
constexpr int kCtasPerSm = prefill_warpgroup_ctas_per_sm(T::kShape);
constexpr int kEntryRegisters = 65536 / (kCtasPerSm * T::kLaunchThreads) / 8 * 8;
constexpr int kProducerNeeds = Variant::kRotary ? 72 : T::kNvfp4 ? 56 : kBulkPaged ? 48 : 40;
constexpr int kConsumerRegisters =
    (kEntryRegisters * (T::kLaunchThreads / 128) - kProducerNeeds) / (T::kThreads / 128) / 8 * 8;
constexpr int kProducerRegisters =
    kEntryRegisters * (T::kLaunchThreads / 128) - kConsumerRegisters * (T::kThreads / 128);
static_assert(kProducerRegisters >= kProducerNeeds && kProducerRegisters <= 256 &&
                  kProducerRegisters % 8 == 0,
              "producer registers");
static_assert(kConsumerRegisters <= 256 && kConsumerRegisters >= kEntryRegisters, "register split");

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
__device__ __forceinline__ void issue_pv(const unsigned char* smem, int stage,
                                         const Probabilities& p, RowState& acc) {
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
// process_tile), with the key checks with_key_checks picked. item_rows: the rows' variant
// states, built once an item where kRowStatesPerItem (consume_item).
template <bool kBegin, bool kEnd>
__device__ __forceinline__ OutputRescale tile_softmax(const PrefillParams& p, ItemShared& shared,
                                                      int first_col, const TileMaskBits& bits,
                                                      const RowInfo& item_rows,
                                                      float (&s)[T::kMmaQ][T::kTilesS][4]) {
  const int thread_col = first_col + thread_index() % 4 * 2;
  RowInfo rows;
  if constexpr (kRowStatesPerItem) {
    rows = item_rows;
  } else if (T::kMask == kMaskCustom || kBegin || kEnd || !kLinearLogits) {
    rows = row_info<false>(p, shared, thread_col);
  }
  if constexpr (T::kMask == kMaskCustom) {
#pragma unroll
    for (int w = 0; w < RowInfo::kMaskWords; ++w) rows.custom_bits[w] = bits.w[w];
  }
  RowStats st = load_stats(shared);
  const OutputRescale r =
      softmax_scores<kBegin, kEnd>(p, item_record(shared).g, rows, thread_col, s, st);
  store_stats(shared, st);
  return r;
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
  const ItemGeometry& g = item_record(shared).g;
  RowState acc;
  {
    RowStats st;
    init_state(acc, st);
    store_stats(shared, st);
  }
  // The rows' variant states (what logits_transform reads) once an item where
  // kRowStatesPerItem, not once a tile (forty-fourth session).
  RowInfo item_rows;
  if constexpr (kRowStatesPerItem) item_rows = row_info<false>(p, shared, 0);
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
  // A warp with no tile of the item releases its Q at once, once the item's q_full phase
  // completed: the producer completes one per item (at once for an item without tiles), and
  // compute-sanitizer's synccheck reports an mbarrier phase that no thread waited for before
  // the next arrival as a missing wait (the empty groups of a cascade, forty-first session).
  if (computed == 0) {
    wgmma::barrier_wait(barrier_address(shared.q_full), (full_phases >> kItemCountBit) & 1u);
    release(-1, 0, true);
  }
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
                                                                        item_rows, s);
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
  write_item_registers(p, item_record(shared).item, g, shared, acc, load_stats(shared));
}

// The query rows of one consumer warpgroup (its MMAs' 64), the rows of the row tables it reads.
constexpr int kWarpgroupRows = 64;
static_assert(T::kQueryTile == kWarpgroupRows * (T::kThreads / 128), "64 rows a warpgroup");
// The rows of the row tables a consumer warp copies: warp w's are [16 w, 16 w + 16).
constexpr int kWarpRows = kWarpgroupRows / 4;

// The CTA: barriers, then each role's loop over the queue. The producer takes the entries:
// it writes entry n's hand-off slot n % 2 (-1 once the queue is empty) while item n - 1 loads,
// waits on q_empty for the consumers to be done with item n - 1's Q tile, completes the slot's
// item_ready and loads item n (q_full once per item: its Q tile landed, or it has no tiles). The
// consumer warpgroups each copy the slot into their own record, compute the item and write its
// output. A slot is rewritten two entries later, during the load of the entry between, which
// starts after the producer's q_empty wait for the item before it: both warpgroups complete
// that release only after copying the slot. For the same reason none of item_ready, q_full and
// q_empty can complete twice before its waiter's next wait.
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
    const auto prepare = [&](ItemHandOff& hand, bool first) {
      if (load_thread() == 0) {
        const int entry = first ? first_entry() : next_entry(p);  // prefill.cuh says why
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
    prepare(shared.hand[0], true);
    for (int slot = 0;; slot ^= 1) {
      ItemHandOff& hand = shared.hand[slot];
      const int entry = hand.entry;
      wgmma::barrier_wait(barrier_address(shared.q_empty), q_parity);
      q_parity ^= 1u;
      if (load_thread() == 0) wgmma::barrier_arrive(barrier_address(shared.item_ready[slot]));
      if (entry < 0) break;
      produce_item(p, hand, smem, empty_phases, [&] { prepare(shared.hand[slot ^ 1], false); });
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
      // Only lane 0 of each warp reads the slot (its entry, the record, the warp's rows): the
      // lane that arrives on q_empty, which releases the slot to the producer. (Every lane
      // reading it is as correct, the lanes' reads precede their warp's arrival, but
      // compute-sanitizer's racecheck credits an mbarrier arrival only with the arriving
      // thread's own accesses, and reported the producer's next write of the slot as a hazard:
      // experiments/racecheck_mbarrier_probe.cu; the row copies of 64 threads, forty-first
      // session.)
      if (__any_sync(0xffffffffu, thread_index() % 32 == 0 && hand.entry < 0)) break;
      // Each warpgroup copies its own record and rows (WarpgroupRecord): the first to finish an
      // item starts the next (its first S = Q K^T once the other issued its last P V) while
      // the other writes its output, instead of both waiting for the later one's epilogue.
      warpgroup_sync();  // this warpgroup is done with its previous record (its epilogue)
      if (thread_index() % 128 == 0) item_record(shared) = hand.record;
      if (thread_index() % 32 == 0) {
        // All loads before the stores (both in shared memory: in one loop each store would
        // wait for its load, SASS).
        const int first = thread_index() / 32 * kWarpRows;
        int q_pos[kWarpRows], qo_head[kWarpRows];
#pragma unroll
        for (int i = 0; i < kWarpRows; ++i) {
          q_pos[i] = hand.row_q_pos[first + i];
          qo_head[i] = hand.row_qo_head[first + i];
        }
#pragma unroll
        for (int i = 0; i < kWarpRows; ++i) {
          shared.row_q_pos[first + i] = q_pos[i];
          shared.row_qo_head[first + i] = qo_head[i];
        }
        shared.spans[thread_index() / 32] = warp_span(p, hand.record.item, hand.record.g);
      }
      warpgroup_sync();  // the record, rows and spans are visible to the warpgroup
      consume_item(p, smem, phases);
    }
  }
}

}  // namespace flare::prefill::hopper
