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

// Where a work item of a split tile finds its merge (ItemRecord carries it from the plan):
// WorkItem.reserved is the merge item (BatchDecode::plan writes it), its slots are
// merge_slots[slot_begin, slot_end).
struct MergeRange {
  int merge_item;
  int slot_begin;
  int slot_end;
};

template <class Tr>
struct FusedMerge {
  static constexpr int kQuads = Tr::kHeadDim / 4;
  // (row, 4 dims) outputs of a tile; when they are fewer than threads, kSlotLanes threads share
  // a unit, each taking every kSlotLanes-th slot (loads in flight scale with the threads).
  static constexpr int kUnits = Tr::kRows * kQuads;
  static constexpr int kSlotLanes = kUnits >= Tr::kThreads ? 1 : Tr::kThreads / kUnits;
  static constexpr int kUnitThreads = Tr::kThreads / kSlotLanes;
  static constexpr int kUnitsPerThread = kUnits / kUnitThreads;
  // Slots whose partial rows one thread loads before folding them in: the merge's time is
  // about the number of these batches times the L2 latency. 32 slots per batch across the slot
  // lanes, at most 16 per thread (registers: the merge must not need more than the KV loop).
  static constexpr int kBatch = kSlotLanes >= 8 ? 2 : (kSlotLanes >= 4 ? 8 : 16);
  // Slot ids staged in shared memory per pass (a tile has at most 2 * #CTA slots; a long
  // request on few KV heads takes several passes).
  static constexpr int kStagedSlots = 256;
  // Shared memory: staged slot ids, the per-thread states of the slot-lane combine, the flag.
  static constexpr int kCombineFloats = kSlotLanes > 1 ? Tr::kThreads * 6 : 0;
  static constexpr int kSharedBytes = (kStagedSlots + kCombineFloats + 1) * 4;

  static_assert(kUnits % kUnitThreads == 0 && kSlotLanes * kUnitThreads == Tr::kThreads,
                "units tile the threads");
  static_assert(kSlotLanes == 1 || kUnitsPerThread == 1, "slot lanes only with one unit each");
  static_assert(kSharedBytes <= Tr::kSharedBytes, "merge scratch fits the pipeline's memory");
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
  // Adds a state (m2, d2, acc2); a slot is (its lse in log2 units, 1, its o).
  __device__ void add(float m2, float d2, const float (&acc2)[4]) {
    const float m_new = fmaxf(m, m2);
    // Both -inf (no visible key yet): subtracting 0 keeps both weights at 0.
    const float base = m_new == negative_infinity() ? 0.0f : m_new;
    const float w1 = fast_exp2(m - base);
    const float w2 = fast_exp2(m2 - base);
    d = d * w1 + d2 * w2;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = acc[e] * w1 + acc2[e] * w2;
    m = m_new;
  }
};

// Counts this CTA's chunk as arrived at `merge_item` (`slot_count` chunks arrive once per run);
// true in every thread of the CTA that arrived last. Called by all threads after each wrote its
// share of the partial slot. The last arrival resets the count for the next run.
__device__ __forceinline__ bool arrived_last(int* counters, int merge_item, int slot_count,
                                             int* shared_flag) {
  __threadfence();  // this thread's partial-slot stores are visible before the count moves
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(counters + merge_item, 1) + 1;
    const int last = arrived == slot_count;
    if (last) {
      counters[merge_item] = 0;
      __threadfence();  // the other chunks' slots are read after their counts
    }
    *shared_flag = last;
  }
  __syncthreads();
  return *shared_flag != 0;
}

// Merges the partial slots of `item`'s tile, merge_slots[range.slot_begin, range.slot_end), and
// hands each finished (row, 4 dims) to store(r, quad, acc, lse) (natural-log lse). All threads
// call it; `scratch` is the CTA's shared memory (FusedMerge::kSharedBytes).
template <class Tr, class Store>
__device__ __forceinline__ void merge_split_tile(const DecodeParams& p, const WorkItem& item,
                                                 const MergeRange& range, unsigned char* scratch,
                                                 Store store) {
  using M = FusedMerge<Tr>;
  int* staged = reinterpret_cast<int*>(scratch);                        // [kStagedSlots]
  float* combine = reinterpret_cast<float*>(staged + M::kStagedSlots);  // [6][kThreads]
  const int rows = item.row_end - item.row_begin;
  const int sub = threadIdx.x / M::kUnitThreads;
  const int partial_rows = p.offsets.partial_rows;
  const int* slots = reinterpret_cast<const int*>(p.workspace + p.offsets.merge_slots);
  const float* partial_o = reinterpret_cast<const float*>(p.workspace + p.offsets.partial_o);
  const float* partial_lse = reinterpret_cast<const float*>(p.workspace + p.offsets.partial_lse);

  SlotSum sums[M::kUnitsPerThread];
#pragma unroll
  for (int k = 0; k < M::kUnitsPerThread; ++k) sums[k].init();
  for (int pass = range.slot_begin; pass < range.slot_end; pass += M::kStagedSlots) {
    const int count =
        range.slot_end - pass < M::kStagedSlots ? range.slot_end - pass : M::kStagedSlots;
    __syncthreads();  // the previous pass is done with the staged ids
    for (int j = threadIdx.x; j < count; j += Tr::kThreads) staged[j] = __ldg(slots + pass + j);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < M::kUnitsPerThread; ++k) {
      const int unit = threadIdx.x % M::kUnitThreads + k * M::kUnitThreads;
      const int r = unit / M::kQuads;
      const int quad = unit % M::kQuads;
      if (r >= rows) continue;  // padding rows: no partial rows were written
      for (int j0 = sub; j0 < count; j0 += M::kBatch * M::kSlotLanes) {
        float lse[M::kBatch];
        float o[M::kBatch][4];
#pragma unroll
        for (int u = 0; u < M::kBatch; ++u) {
          const int j = j0 + u * M::kSlotLanes;
          if (j < count) {
            // int32 offsets: the partial sections hold 2 * #CTA slots of <= 8 x 256 floats.
            const int row = staged[j] * partial_rows + r;
            lse[u] = load_l2(partial_lse + row) * kLog2e;
            load_l2_x4(partial_o + row * Tr::kHeadDim + quad * 4, o[u]);
          } else {
            lse[u] = negative_infinity();
#pragma unroll
            for (int e = 0; e < 4; ++e) o[u][e] = 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < M::kBatch; ++u) sums[k].add(lse[u], 1.0f, o[u]);
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
    const float norm = empty ? 0.0f : 1.0f / s.d;
    float acc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = s.acc[e] * norm;
    store(r, unit % M::kQuads, acc, empty ? negative_infinity() : (s.m + fast_log2(s.d)) * kLn2);
  }
}

}  // namespace flare::decode
