// The merge of split tiles inside the decode launch (papers 001 §2.2, 002 D.2): the CTA whose
// chunk completes a tile's set of float32 partial slots merges them, so no second kernel runs.
//
// The merge walks the slots in the plan's KV order with a fixed assignment of slots to threads
// and a fixed combine order: the result does not depend on which CTA arrived last, and reruns
// are bitwise identical. Templated on the decode kernel's Traits (kernels/decode.cuh).
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "plan_types.cuh"

namespace flare::decode {

// Where a work item of a split tile finds its merge: WorkItem.reserved is the merge item
// (BatchDecode::plan writes it), DecodeItemMeta the tile's partial slots, which the planner
// numbers consecutively in KV order (Plan::merge_slots is the identity).
struct MergeRange {
  int merge_item;
  int slot_begin;
  int slot_count;
};

// The merge stages a pass of slots' partial rows in the CTA's shared memory with cp.async (all
// copies in flight at once, no registers held), then folds them from there: a tile costs one
// L2 round trip per pass after its arrival count, where loading partial rows into registers in
// batches of 16 cost one per batch plus one for the slot ids.
template <class Tr>
struct FusedMerge {
  static constexpr int kQuads = Tr::kHeadDim / 4;
  // (row, 4 dims) outputs of a tile; when they are fewer than threads, kSlotLanes threads share
  // a unit, each taking every kSlotLanes-th slot.
  static constexpr int kUnits = Tr::kItemRows * kQuads;
  static constexpr int kSlotLanes = kUnits >= Tr::kThreads ? 1 : Tr::kThreads / kUnits;
  static constexpr int kUnitThreads = Tr::kThreads / kSlotLanes;
  static constexpr int kUnitsPerThread = kUnits / kUnitThreads;
  // Shared memory: [slots per pass][kItemRows][D] partial rows, [slots per pass][kItemRows] lse
  // (log2 units), the slot-lane combine. A pass holds as many slots as the launch's dynamic shared
  // memory allows (run() gives two-per-SM launches more, so a tile of b1 merges in one pass),
  // less RoPE's angle table at its end (Traits::kRotaryTableBytes), which outlives the item.
  static constexpr int kCombineFloats = kSlotLanes > 1 ? Tr::kThreads * 6 : 0;
  static constexpr int kSlotBytes = Tr::kItemRows * (Tr::kHeadDim + 1) * 4;
  static constexpr int kReservedBytes = kCombineFloats * 4 + Tr::kRotaryTableBytes;
  __device__ static int slots_per_pass() {
    return (static_cast<int>(dynamic_shared_bytes()) - kReservedBytes) / kSlotBytes / kSlotLanes *
           kSlotLanes;
  }
  static constexpr int kMinSlotsPerPass =
      (Tr::kLaunchSharedBytes - kReservedBytes) / kSlotBytes / kSlotLanes * kSlotLanes;

  static_assert(kUnits % kUnitThreads == 0 && kSlotLanes * kUnitThreads == Tr::kThreads,
                "units tile the threads");
  static_assert(kSlotLanes == 1 || kUnitsPerThread == 1, "slot lanes only with one unit each");
  static_assert(kMinSlotsPerPass >= kSlotLanes && kMinSlotsPerPass >= 2, "a pass holds slots");
};

// Online softmax merge of partial states: m = max log2-sum-exp so far, d = sum of
// exp2(lse - m), acc = sum of exp2(lse - m) * o (o normalized per slot).
struct SlotSum {
  float m;
  float d;
  float acc[4];

  __device__ void init() {
    m = negative_infinity();
    d = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = 0.0f;
  }
  // Raises the running max to at least m2, rescaling d and acc; returns the base that weights
  // of new states are taken against (exp2(lse - base)).
  __device__ float raise_max(float m2) {
    const float m_new = fmaxf(m, m2);
    // Both -inf (no visible key yet): subtracting 0 keeps every weight at 0.
    const float base = m_new == negative_infinity() ? 0.0f : m_new;
    const float rescale = fast_exp2(m - base);
    d *= rescale;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= rescale;
    m = m_new;
    return base;
  }
  // Adds a state (m2, d2, acc2); a slot is (its lse in log2 units, 1, its o).
  __device__ void add(float m2, float d2, const float (&acc2)[4]) {
    const float w = fast_exp2(m2 - raise_max(m2));
    d = fmaf(d2, w, d);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = fmaf(acc2[e], w, acc[e]);
  }
};

// Counts this CTA's chunk of the tile as arrived (range.slot_count chunks arrive once per run);
// true in every thread of the CTA that arrived last. Called by all threads after each wrote its
// share of the partial slot. One thread counts after the barrier with an acquire-release atomic
// (as CUTLASS's semaphores): the barrier orders the other threads' stores before its release,
// and its acquire before their reads of the other chunks' slots (after the second barrier).
// The last arrival resets the count for the next run. `shared_flag` may be any word of the
// scratch: every reader of the scratch has passed the first barrier.
__device__ __forceinline__ bool arrived_last(int* counters, const MergeRange& range,
                                             int* shared_flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    int arrived;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;"
                 : "=r"(arrived)
                 : "l"(counters + range.merge_item)
                 : "memory");
    const int last = arrived + 1 == range.slot_count;
    if (last) counters[range.merge_item] = 0;
    *shared_flag = last;
  }
  __syncthreads();
  return *shared_flag != 0;
}

// Merges the partial slots of `item`'s tile, [range.slot_begin, + range.slot_count), and hands
// each finished (row, 4 dims) to store(r, quad, acc, lse) (natural-log lse). All threads call
// it; `scratch` is the CTA's shared memory (FusedMerge's layout).
template <class Tr, class Store>
__device__ __forceinline__ void merge_split_tile(const DecodeParams& p, const WorkItem& item,
                                                 const MergeRange& range, unsigned char* scratch,
                                                 Store store) {
  using M = FusedMerge<Tr>;
  const int slots_per_pass = M::slots_per_pass();
  float* staged_o = reinterpret_cast<float*>(scratch);
  float* staged_lse = staged_o + slots_per_pass * Tr::kItemRows * Tr::kHeadDim;
  float* combine = staged_lse + slots_per_pass * Tr::kItemRows;  // [6][kThreads]
  const int rows = item.row_end - item.row_begin;
  const int sub = threadIdx.x / M::kUnitThreads;
  const int partial_rows = p.offsets.partial_rows;  // rows per slot, <= kItemRows
  const float* partial_o = p.offsets.partial_o;
  const float* partial_lse = p.offsets.partial_lse;

  SlotSum sums[M::kUnitsPerThread];
#pragma unroll
  for (int k = 0; k < M::kUnitsPerThread; ++k) sums[k].init();
  for (int pass = 0; pass < range.slot_count; pass += slots_per_pass) {
    const int count =
        range.slot_count - pass < slots_per_pass ? range.slot_count - pass : slots_per_pass;
    // The pass's slots are contiguous: partial rows as 16-byte copies (a slot is partial_rows x
    // D floats, D >= 64: whole chunks), lse through L2. int32 offsets: the partial sections
    // hold 2 * #CTA slots of <= 64 x 256 floats.
    const int first_row = (range.slot_begin + pass) * partial_rows;
    const int chunks = count * partial_rows * (Tr::kHeadDim / 4);
    const float* src = partial_o + first_row * Tr::kHeadDim;
    __syncthreads();  // the previous pass (or the arrival flag's readers) are done
    const unsigned dst = shared_address(scratch);
    for (int c = threadIdx.x; c < chunks; c += Tr::kThreads) cp_async_16(dst + c * 16, src + c * 4);
    cp_async_commit();
    for (int e = threadIdx.x; e < count * partial_rows; e += Tr::kThreads) {
      staged_lse[e] = load_l2(partial_lse + first_row + e) * kLog2e;
    }
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int k = 0; k < M::kUnitsPerThread; ++k) {
      const int unit = threadIdx.x % M::kUnitThreads + k * M::kUnitThreads;
      const int r = unit / M::kQuads;
      const int quad = unit % M::kQuads;
      if (r >= rows) continue;  // padding rows: no partial rows were written
      // The pass's max first, then weights that depend only on it: the per-slot chain is an
      // add, not the online rescale's exp2 and multiplies (a pass of 33 slots folded in ~0.7 us).
      float m_pass = negative_infinity();
      for (int j = sub; j < count; j += M::kSlotLanes) {
        m_pass = fmaxf(m_pass, staged_lse[j * partial_rows + r]);
      }
      SlotSum& sum = sums[k];
      const float base = sum.raise_max(m_pass);
      for (int j = sub; j < count; j += M::kSlotLanes) {
        const float w = fast_exp2(staged_lse[j * partial_rows + r] - base);
        const float4 part = *reinterpret_cast<const float4*>(
            staged_o + (j * partial_rows + r) * Tr::kHeadDim + quad * 4);
        sum.d += w;
        sum.acc[0] = fmaf(w, part.x, sum.acc[0]);
        sum.acc[1] = fmaf(w, part.y, sum.acc[1]);
        sum.acc[2] = fmaf(w, part.z, sum.acc[2]);
        sum.acc[3] = fmaf(w, part.w, sum.acc[3]);
      }
    }
  }

  if constexpr (M::kSlotLanes > 1) {
    // Slot lane s of a unit sits kUnitThreads threads after lane s - 1; lane 0 sums in order.
    float* mine = combine + threadIdx.x;
    mine[0 * Tr::kThreads] = sums[0].m;
    mine[1 * Tr::kThreads] = sums[0].d;
#pragma unroll
    for (int e = 0; e < 4; ++e) mine[(2 + e) * Tr::kThreads] = sums[0].acc[e];
    __syncthreads();
    if (sub != 0) return;
#pragma unroll
    for (int s = 1; s < M::kSlotLanes; ++s) {
      const float* other = combine + threadIdx.x + s * M::kUnitThreads;
      float acc[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] = other[(2 + e) * Tr::kThreads];
      sums[0].add(other[0], other[Tr::kThreads], acc);
    }
  }
#pragma unroll
  for (int k = 0; k < M::kUnitsPerThread; ++k) {
    const int unit = threadIdx.x % M::kUnitThreads + k * M::kUnitThreads;
    const int r = unit / M::kQuads;
    if (r >= rows) continue;
    const SlotSum& s = sums[k];
    const bool empty = s.d == 0.0f;
    // Without softmax every slot weighs 1 (lse 0) and the slots add up (variant.cuh).
    const float norm = !Variant::use_softmax ? 1.0f : empty ? 0.0f : 1.0f / s.d;
    float acc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = s.acc[e] * norm;
    store(r, unit % M::kQuads, acc, empty ? negative_infinity() : (s.m + fast_log2(s.d)) * kLn2);
  }
}

}  // namespace flare::decode
