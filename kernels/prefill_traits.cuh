// The prefill kernel's compile-time configuration (Traits from the FLARE_* defines), the
// per-thread and per-item state it keeps, and the thread/row index helpers.
//
// Compile-time defines: FLARE_HEAD_DIM_QK, FLARE_HEAD_DIM_VO (64 | 128 | 256, 192 / 128, or
// 512 / 256: a pass of head dim 512),
// FLARE_QUERY_TILE (16 | 32 | 64 | 128), FLARE_KV_TILE (32 | 64 | 128), FLARE_Q_DTYPE (q, k, v
// and o: f16 | bf16), FLARE_KV_PAGED (0 ragged | 1 paged), FLARE_PAGE_SIZE (paged), FLARE_MASK
// (PrefillMaskCode), FLARE_WARPGROUP (1: the Hopper family, sm_90a; see PrefillShape). `struct
// Variant` comes from the variant source (kernels/variant.cuh): a
// Variant whose logits_mask excludes exactly the keys before visible_begin(request, q_pos)
// (kMaskIsWindow) lets tiles past every row's window start skip per-key masking, and one with
// logits linear in q.k (has_linear_logits) has its scale folded into the exp2 argument instead
// of every score being scaled.
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "mma_utils.cuh"
#include "plan_types.cuh"
#include "prefill_params.cuh"
#include "variant.cuh"
#include "wgmma.cuh"

#ifndef FLARE_PAGE_SIZE
#define FLARE_PAGE_SIZE 1
#endif
#ifndef FLARE_WARPGROUP
#define FLARE_WARPGROUP 0
#endif
#ifndef FLARE_KV_NVFP4
#define FLARE_KV_NVFP4 0
#endif

namespace flare::prefill {

struct Traits {
  static constexpr int kHeadDimQK = FLARE_HEAD_DIM_QK;
  static constexpr int kHeadDimVO = FLARE_HEAD_DIM_VO;
  static constexpr int kQueryTile = FLARE_QUERY_TILE;  // packed rows per CTA tile
  static constexpr int kKvTile = FLARE_KV_TILE;        // KV rows per pipeline stage
  static constexpr int kCode = FLARE_Q_DTYPE;
  static constexpr bool kPaged = FLARE_KV_PAGED != 0;
  static constexpr int kPageSize = FLARE_PAGE_SIZE;
  static constexpr int kMask = FLARE_MASK;
  static constexpr bool kWarpgroup = FLARE_WARPGROUP != 0;
  static constexpr bool kNvfp4 = FLARE_KV_NVFP4 != 0;

  static constexpr PrefillShape kShape{
      kQueryTile, kKvTile, kHeadDimQK, kHeadDimVO, kMask, kWarpgroup ? 1 : 0, kNvfp4 ? 1 : 0};
  static constexpr int kMmaQ = prefill_mma_q(kShape);  // m16 tiles per warp
  static constexpr int kWarpsQ = prefill_warps_q(kShape);
  static constexpr int kWarpsKV = prefill_warps_kv(kShape);
  static constexpr int kThreads = prefill_threads(kShape);  // the computing threads
  static constexpr int kLaunchThreads = prefill_launch_threads(kShape);
  // The threads that load (the producer warpgroup after the consumers, or all) and the first.
  static constexpr int kLoadThreads = kWarpgroup ? kPrefillProducerThreads : kThreads;
  static constexpr int kFirstLoadThread = kWarpgroup ? kThreads : 0;
  static constexpr int kRowsPerWarp = 16 * kMmaQ;
  // Rows that act together on the MMAs (and so share a tile-skipping decision): a warp's, or a
  // warpgroup's 64 in the Hopper family.
  static constexpr int kSpanRows = kWarpgroup ? 64 : kRowsPerWarp;
  static constexpr int kKvPerWarp = kKvTile / kWarpsKV;  // KV columns of S one warp owns
  static constexpr int kTilesS = kKvPerWarp / 8;         // n8 tiles of S per warp
  static constexpr int kTilesO = kHeadDimVO / 8;         // n8 tiles of O per warp
  static constexpr int kStepsQK = kHeadDimQK / 16;       // k16 steps of Q.K^T
  static constexpr int kStepsPV = kKvPerWarp / 16;       // k16 steps of P.V

  static constexpr int kQKRowBytes = kHeadDimQK * 2;  // also the shared row pitch (swizzled)
  static constexpr int kVRowBytes = kHeadDimVO * 2;
  static constexpr int kQKChunks = kHeadDimQK / 8;  // 16-byte chunks per row
  static constexpr int kVChunks = kHeadDimVO / 8;
  static constexpr int kStages = prefill_kv_stages(kShape);  // 16-bit K/V stages
  static constexpr int kRawStages = prefill_raw_stages(kShape);
  static constexpr int kTileLead = prefill_tile_lead(kShape);
  static constexpr int kPageIdSlots = prefill_page_id_slots(kShape);
  // The stages a tile's copies land in: NVFP4's raw stages, else the 16-bit ones.
  static constexpr int kCopyStages = kNvfp4 ? kRawStages : kStages;
  static constexpr int kQBytes = kQueryTile * kQKRowBytes;
  static constexpr int kKBytes = kKvTile * kQKRowBytes;
  static constexpr int kStageBytes = kKBytes + kKvTile * kVRowBytes;
  static constexpr int kPageIdsOffset = kQBytes + kStages * kStageBytes;
  // NVFP4: raw stages after the page ids, each K codes, K scales, V codes, V scales.
  static constexpr int kRawOffset = kPageIdsOffset + kPageIdSlots * kKvTile * 4;
  static constexpr int kRawKScales = prefill_nvfp4_part_bytes(kKvTile, kHeadDimQK / 2);
  static constexpr int kRawVCodes =
      kRawKScales + prefill_nvfp4_part_bytes(kKvTile, kHeadDimQK / 16);
  static constexpr int kRawVScales = kRawVCodes + prefill_nvfp4_part_bytes(kKvTile, kHeadDimVO / 2);
  static constexpr int kRawStageBytes = prefill_nvfp4_raw_stage_bytes(kShape);
  static constexpr int kStageRowFloats = kHeadDimVO + kPrefillStagePad;
  static constexpr int kItemOffset = prefill_item_offset(kShape);
  static constexpr int kSharedBytes = prefill_shared_bytes(kShape);

  static_assert(kQueryTile == 16 || kQueryTile == 32 || kQueryTile == 64 || kQueryTile == 128,
                "query tile");
  static_assert(kKvTile == 32 || kKvTile == 64 || kKvTile == 128, "kv tile");
  // Head dim 512 runs as two passes of qk 512 / vo 256 (src/api/prefill_config.h).
  static_assert(kHeadDimVO % 64 == 0 && kHeadDimVO <= 256 && kHeadDimQK % 64 == 0 &&
                    (kHeadDimQK <= 256 || (kHeadDimQK == 512 && !kWarpgroup)),
                "head dims: multiples of 64 up to 256, or qk 512 on the FA2 family");
  static_assert(kCode == kCodeF16 || kCode == kCodeBF16, "dtype");
  static_assert(kPageSize >= 1, "page size");
  static_assert(kMask == kMaskNone || kMask == kMaskCausal || kMask == kMaskCustom, "mask");
  static_assert(kMmaQ == 1 || kMmaQ == 2, "one or two m16 tiles per warp");
  static_assert(kWarpsQ * kRowsPerWarp == kQueryTile, "warps cover the query tile");
  static_assert(kKvPerWarp % 16 == 0, "each KV warp owns whole k16 steps of P.V");
  static_assert(kTilesO % 2 == 0 && kTilesS % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
  static_assert(kLoadThreads >= kKvTile, "one loading thread per page id of a tile");
  static_assert(!kWarpgroup || ((kQueryTile == 64 || kQueryTile == 128) &&
                                (kKvTile == 64 || kKvTile == 128) && kWarpsKV == 1),
                "the Hopper family: 64-row warpgroups, KV tiles of 64 or 128");
  static_assert(kPageIdsOffset % 16 == 0 && kItemOffset % 16 == 0 && kSharedBytes % 16 == 0,
                "16-byte alignment");
  static_assert(!kNvfp4 || kRawOffset % 16 == 0, "NVFP4 raw stages: 16-byte aligned");
};

using T = Traits;

// Lazy rescaling (log2 units): a row's running max moves only when a tile's max exceeds it by
// more than this, so probabilities stay <= 2^8 (exact enough in bf16/f16 and fp32 sums) and the
// O accumulators are rescaled on a handful of tiles per item instead of every tile; the final
// o / d and lse use the same stale max, so the result is unchanged.
constexpr float kRescaleThreshold = 8.0f;

static_assert(VariantHookCheck<Variant>::ok, "the variant's hooks");

// Logits linear in q.k (kernels/variant.cuh has_linear_logits): the scale then folds into the
// exp2 argument; any other Variant takes the general logits_transform path.
constexpr bool kLinearLogits = has_linear_logits<Variant>;
// Logits affine in the KV position (has_affine_logits: ALiBi): two FMAs a logit in the Hopper
// family's softmax. The mma.sync family keeps logits_transform per logit: at its 128-row tiles
// the row's base beside the variant's state spilled 8-16 bytes on sm_90a (CI's compile test).
constexpr bool kAffineLogits = T::kWarpgroup && !kLinearLogits && has_affine_logits<Variant>;
// Affine on the key ranges the variant names (has_affine_logits_on_some_keys: T5's far keys): the
// same two FMAs there, logits_transform per logit elsewhere; the Hopper family only, as above.
constexpr bool kAffineLogitsOnSomeKeys =
    T::kWarpgroup && !kLinearLogits && !kAffineLogits && has_affine_logits_on_some_keys<Variant>;
// Of those, a constant per row (has_offset_logits_on_some_keys: slope 0): the tiles' max is
// taken over q.k and the constant folds into the exp2 offset (prefill_softmax.cuh).
constexpr bool kOffsetLogitsOnSomeKeys =
    kAffineLogitsOnSomeKeys && has_offset_logits_on_some_keys<Variant>;
// The rows' variant states built once an item and held across its tiles (prefill_hopper.cuh
// consume_item), not rebuilt for every tile's softmax: user variants, whose init may load their
// tensors (T5's table entry, whose latency sat in every tile's softmax); the built-in
// StandardVariant's init reads parameters only, and its combined units (soft-cap, window and
// ALiBi at 128 x 128) spill 8-76 bytes holding them, as does T5 at paged 128 x 128 tiles (208
// bytes: the page-table walk's registers beside them). +4-5% for T5 at 2048-16384 (ragged).
constexpr bool kRowStatesPerItem = T::kWarpgroup && !kLinearLogits &&
                                   !__is_base_of(StandardVariant, Variant) &&
                                   !(T::kPaged && T::kQueryTile * T::kKvTile >= 128 * 128);
// Logits by the query-key distance (has_logits_by_distance: T5's table per distance), softmax
// only: where logits_transform runs, a thread's two rows 8 tokens apart share their bias loads
// (prefill_softmax.cuh distance_logits). Not in the Hopper family's units that rebuild the row
// states every tile (paged 128 x 128): there it spilled 208 bytes.
constexpr bool kLogitsByDistance = !kLinearLogits && Variant::use_softmax &&
                                   has_logits_by_distance<Variant> &&
                                   (!T::kWarpgroup || kRowStatesPerItem);
// Bounded logits (has_logits_bound: soft-cap) with bfloat16 probabilities in the Hopper family:
// the softmax subtracts a fixed offset instead of a running max (kernels/variant.cuh). float16
// probabilities overflow past 2^16: no fixed offset there.
constexpr bool kFixedOffsetSoftmax = T::kWarpgroup && Variant::use_softmax && !kLinearLogits &&
                                     has_logits_bound<Variant> && T::kCode == kCodeBF16;

// The factor of q.k in the logits: the variant's query_scale, times 2^8 where the NVFP4 kernels'
// K holds 2^-8 of its values (prefill_nvfp4_load.cuh convert_nvfp4_rows). Exact (a power of two),
// and it costs nothing per score: every use already multiplies by the scale.
__device__ __forceinline__ float score_scale(const PrefillParams& p) {
  const float q_scale = Variant::query_scale(p.variant);
  return T::kNvfp4 ? q_scale * kNvfp4ConvertedInverse : q_scale;
}

// Per-thread softmax state: kMmaQ m16 tiles, each with two rows (g and g + 8) per thread. With
// linear logits m is in raw q.k units (the scale applies inside exp2), else in log2 units. The
// statistics are read and written once per tile and wait in shared memory between tiles: at 255
// registers the O and S accumulators and the fragments in flight leave no room to carry them.
struct RowStats {
  float m[T::kMmaQ][2];  // running max, -inf before any visible key
  float d[T::kMmaQ][2];  // this thread's part of the running sum of exp2(x - m)
};
struct RowState {
  float o[T::kMmaQ][T::kTilesO][4];  // unnormalized output accumulators
};

// What one thread needs about each of its rows to mask or transform its logits, rebuilt per
// tile from the item's row tables (registers are the scarce resource across the KV loop).
struct RowInfo {
  static constexpr int kMaskBits = T::kMmaQ * 2 * T::kTilesS * 2;  // one per S element
  static constexpr int kMaskWords = (kMaskBits + 31) / 32;
  int q_pos[T::kMmaQ][2];  // KV position of the row's token (causal)
  Variant variant[T::kMmaQ][2];
  // Custom mask: bit ((mi * 2 + h) * kTilesS + nj) * 2 + e for element (mi, nj, 2 h + e).
  unsigned custom_bits[kMaskWords];
};
// The KV positions this warp's rows can see, warp-uniform: columns at or past kv_end are
// invisible to every row of the warp (the tile is skipped), columns in [full_begin, full_end)
// are visible to all of them (no per-key mask).
struct WarpSpan {
  int kv_end;
  int full_begin, full_end;
};

struct ItemGeometry {
  int kv_head;
  int rows;          // packed rows of the item
  int qo_begin;      // first query token of the request
  int kv_lo, kv_hi;  // KV positions this item reads
  int num_tiles;
  int request;        // for the index error record
  long long kv_base;  // ragged: first KV token of the request; paged: first page-table entry
  int q_pos_first, q_pos_last;  // KV positions of the item's first and last token
  int q_offset;                 // kv_len - q_len: KV position of the request's token 0
  int kv_len;                   // custom mask: bits per query row
  long long mask_base;          // custom mask: first bit of the request
};

// Shared memory written once per work item (prefill_item_offset): the item, its geometry and
// the per-row tables. The KV loop reads them here instead of holding ~30 registers.
struct ItemRecord {
  WorkItem item;
  ItemGeometry g;
};
static_assert(sizeof(ItemRecord) + sizeof(int) <= kPrefillItemRecordBytes, "item record");
// The Hopper family's pipeline (kernels/prefill_hopper.cuh): per half of a stage (kHalfK, kHalfV)
// `full` completes when the producer's copies of it landed, `empty` when every consumer warp is
// done reading it (K after S = Q K^T, V after O += P V, a turn later). Work items travel the other
// way one item ahead: the producer takes an entry from the queue, writes its record and row
// tables into hand-off slot n % 2 and completes item_ready[n % 2] once q_empty says the consumers
// are done with the previous item's Q tile (their last S = Q K^T), then loads the item (q_full
// once its Q tile landed); the consumer warpgroups copy the slot into their records, so the
// next item's loads overlap this item's last tile and its epilogue (which writes from registers
// and touches no tile).
constexpr int kHalfK = 0, kHalfV = 1;
struct ItemHandOff {
  ItemRecord record;
  int entry;  // the queue entry, or -1: the queue is empty
  unsigned char pad[kPrefillItemRecordBytes - sizeof(ItemRecord) - sizeof(int)];
  int row_q_pos[T::kQueryTile];  // as ItemShared's
  int row_qo_head[T::kQueryTile];
};
template <bool kPipelined>
struct PipelineBarriers {
  unsigned long long full[2][T::kStages];
  unsigned long long empty[2][T::kStages];
  unsigned long long item_ready[2];
  unsigned long long q_full;  // the item's Q tile landed (and is rotated)
  unsigned long long q_empty;
  ItemHandOff hand[2];
};
template <>
struct PipelineBarriers<false> {};
static_assert(sizeof(ItemHandOff) == prefill_hand_off_bytes(T::kShape), "hand-off slot size");

// Two consumer warpgroups (128-row tiles) each copy the hand-off slot into a record of their own
// (with their own rows of the row tables, which only they read), so that the one ahead starts
// the next item while the other still computes its last tile and writes its output; one
// consumer warpgroup keeps ItemShared::record.
struct WarpgroupRecord {
  ItemRecord record;
  unsigned char pad[kPrefillItemRecordBytes - sizeof(ItemRecord)];
};
constexpr bool kWarpgroupRecords = T::kWarpgroup && T::kThreads > 128;
template <bool kRecords>
struct ItemSharedBase : PipelineBarriers<T::kWarpgroup> {};
template <>
struct ItemSharedBase<true> : PipelineBarriers<true> {
  WarpgroupRecord warpgroup_record[2];  // by consumer warpgroup
};
struct ItemShared : ItemSharedBase<kWarpgroupRecords> {
  ItemRecord record;
  int next_item;  // the work item after this one, taken from the queue during this one
  unsigned char pad[kPrefillItemRecordBytes - sizeof(ItemRecord) - sizeof(int)];
  int row_q_pos[T::kQueryTile];  // KV position of each packed row's token (rows past the item
                                 // repeat the last row)
  int row_qo_head[T::kQueryTile];
  // Each thread's softmax statistics, one float of all threads per row after another
  // (consecutive threads, consecutive banks): see load_stats / store_stats.
  float stats[T::kMmaQ * 4][T::kThreads];
  // The mma.sync family's: each thread's next KV tile (see run_item); none in the Hopper family.
  int loop_tile[T::kWarpgroup ? 1 : T::kThreads];
  WarpSpan spans[T::kThreads / 32];
};
static_assert(sizeof(ItemShared) == T::kSharedBytes - T::kItemOffset, "item region size");

__device__ __forceinline__ ItemShared& item_shared(unsigned char* smem) {
  return *reinterpret_cast<ItemShared*>(smem + T::kItemOffset);
}

// threadIdx.x read where it is used: values derived from it are recomputed inside the KV loop
// (a few integer ops per tile) instead of being hoisted into registers that live across the
// QK^T peak, where the O and S accumulators and the fragments in flight fill all 255.
__device__ __forceinline__ int thread_index() {
  int index;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(index));
  __builtin_assume(index >= 0 && index < T::kLaunchThreads);  // unsigned arithmetic from here on
  return index;
}
// This thread's index among the loading threads (kernels/prefill_load.cuh).
__device__ __forceinline__ int load_thread() { return thread_index() - T::kFirstLoadThread; }
// The mma.sync family's barrier of its computing threads, the CTA's (the Hopper family's
// consumer warpgroups meet only through their own barriers: prefill_hopper_sync.cuh).
__device__ __forceinline__ void math_sync() { __syncthreads(); }
// The consumer warpgroup of this thread (the Hopper family; 0 where one warpgroup computes).
__device__ __forceinline__ int consumer_warpgroup() {
  return T::kThreads > 128 ? thread_index() / 128 : 0;
}
// The record of the item this thread computes: the CTA's, or with two consumer warpgroups its
// warpgroup's (WarpgroupRecord).
template <class Shared>
__device__ __forceinline__ auto& item_record(Shared& shared) {
  if constexpr (kWarpgroupRecords) {
    return shared.warpgroup_record[consumer_warpgroup()].record;
  } else {
    return shared.record;
  }
}
__device__ __forceinline__ int warp_q() { return (thread_index() / 32) % T::kWarpsQ; }
__device__ __forceinline__ int warp_kv() { return (thread_index() / 32) / T::kWarpsQ; }
// This thread's statistics in shared memory (ItemShared::stats): structure of arrays, so a
// warp's loads and stores of one field hit 32 distinct banks (an array of RowStats made every
// access an 8-way conflict).
__device__ __forceinline__ RowStats load_stats(const ItemShared& shared) {
  RowStats st;
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.m[mi][h] = shared.stats[mi * 4 + h][thread_index()];
      st.d[mi][h] = shared.stats[mi * 4 + 2 + h][thread_index()];
    }
  }
  return st;
}
__device__ __forceinline__ void store_stats(ItemShared& shared, const RowStats& st) {
#pragma unroll
  for (int mi = 0; mi < T::kMmaQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      shared.stats[mi * 4 + h][thread_index()] = st.m[mi][h];
      shared.stats[mi * 4 + 2 + h][thread_index()] = st.d[mi][h];
    }
  }
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared tile of kRows rows of kRowBytes:
// the mma.sync family's swizzled rows (ldmatrix), or the Hopper family's 128-byte swizzled
// panels (wgmma descriptors).
template <int kRowBytes, int kRows>
__device__ __forceinline__ unsigned tile_offset(int row, int chunk) {
  if constexpr (T::kWarpgroup) {
    return wgmma::tile_offset<kRows>(row, chunk);
  } else {
    return mma::swizzled_offset<kRowBytes>(row, chunk);
  }
}

// Tile-local packed row of this thread's row h (0: g, 1: g + 8) of m16 tile mi.
__device__ __forceinline__ int local_row(int mi, int h) {
  return warp_q() * T::kRowsPerWarp + mi * 16 + h * 8 + (thread_index() % 32) / 4;
}

}  // namespace flare::prefill
