// Shared by the decode kernel's two compute loops (kernels/decode.cuh): the compile-time
// geometry and the paged K/V gather into the cp.async pipeline stages.
//
// Compile-time defines: FLARE_HEAD_DIM (64 | 128 | 256, or 512 on the CUDA-core loop), FLARE_ROWS
// (1 | 2 | 4 | 8), FLARE_PAGE_SIZE (>= 1), FLARE_Q_DTYPE / FLARE_KV_DTYPE (DTypeCode),
// FLARE_DECODE_MMA (0: the CUDA-core loop, 1: the tensor-core loop), FLARE_ITEM_HEADS (KV heads per
// work item: 1, or 2, 4, 8 on the tensor-core loop, see Traits) and the tuning the host chose
// (src/api/batch_decode.cpp decode_geometry): FLARE_TOKENS_PER_GROUP, FLARE_STAGES,
// FLARE_MIN_CTAS_PER_SM (the register cap) and FLARE_SHARED_BYTES (the dynamic shared memory it
// launches with). `struct Variant` comes from the variant source (kernels/variant.cuh describes
// its interface).
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "mma_utils.cuh"
#include "plan_types.cuh"
#include "rotary.cuh"
#include "variant.cuh"

namespace flare::decode {

static_assert(VariantHookCheck<Variant>::ok, "the variant's hooks");

constexpr int log2_exact(int x) { return x <= 1 ? 0 : 1 + log2_exact(x / 2); }

// Compile-time geometry of both loops. The CUDA-core loop (FLARE_DECODE_MMA 0): kLanes lanes
// share one token row (kChunksPerLane chunks of 8 head dims each: one up to D 256, two at D
// 512, lane l holding chunks l and l + 32 so that a warp's 16-byte reads stay contiguous) and
// the CTA's kGroups token groups take different tokens of a tile (kernels/decode_cuda_core.cuh).
// The tensor-core loop (FLARE_DECODE_MMA 1): each warp takes kWarpTokens tokens of a tile
// (kernels/decode_mma.cuh). Either way each of kStateGroups thread groups keeps its own
// online-softmax state, combined through shared memory at the end of a work item.
//
// Whole-page items (kItemHeads > 1, tensor-core loop only): a work item covers kItemHeads
// consecutive KV heads of its tokens, one warp per head, so a CTA's copies read every head of
// a token, and in NHD pages (slot stride = H_kv x D) whole pages when kItemHeads = H_kv: the
// longest contiguous spans a shuffled page table allows (docs/perf.md "KV placement"). The host
// plans such items as H_kv / kItemHeads "super heads" of group G' = kItemHeads x G: packed row
// R of an item is query head kv_head x G' + R, i.e. row R % G of KV head kv_head x kItemHeads
// + R / G, so the planner, the output and the merge need nothing else. Each head's rows of a
// stage are a block of their own (the per-head layout the compute loop reads).
struct Traits {
  static constexpr bool kMma = FLARE_DECODE_MMA != 0;
  static constexpr int kHeadDim = FLARE_HEAD_DIM;
  static constexpr int kRows = FLARE_ROWS;  // packed query rows per work item (<= 8)
  static constexpr int kPageSize = FLARE_PAGE_SIZE;
  static constexpr int kQCode = FLARE_Q_DTYPE;
  static constexpr int kKVCode = FLARE_KV_DTYPE;
  static constexpr bool kFp8 = kKVCode == kCodeE4M3 || kKVCode == kCodeE5M2;
  // NVFP4 KV: 4-bit codes (two a byte) and an e4m3 scale a block of 16, both gathered into the
  // stage; converted in registers like fp8 (CUDA-core loop, one KV head an item).
  static constexpr bool kNvfp4 = kKVCode == kCodeE2M1;
  static constexpr bool kConvertsInRegisters = kFp8 || kNvfp4;
  static constexpr int kKVBytes = kFp8 || kNvfp4 ? 1 : 2;  // bytes a stride unit of the pages

  static constexpr int kItemHeads = FLARE_ITEM_HEADS;
  static constexpr int kWarpsPerHead = kItemHeads == 1 ? 4 : 1;
  static constexpr int kThreads = 32 * kWarpsPerHead * kItemHeads;
  static constexpr int kMinCtasPerSm = FLARE_MIN_CTAS_PER_SM;
  static constexpr int kDimsPerLane = kHeadDim <= 256 ? 8 : 16;
  static constexpr int kChunksPerLane = kDimsPerLane / 8;
  static constexpr int kLanes = kHeadDim / kDimsPerLane;  // 8, 16 or 32: inside one warp
  static constexpr int kGroups = kThreads / kLanes;
  // Tokens one state group (a lane group, or a warp in the mma loop) handles per tile, as the
  // host chose them: CUDA cores keep kTokensPerGroup * kRows scores in registers; the mma loop
  // takes them in slices of the M (16) of S^T = K Q^T.
  static constexpr int kTokensPerGroup = FLARE_TOKENS_PER_GROUP;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSliceTokens = 16;
  static constexpr int kWarpTokens = kTokensPerGroup;  // mma
  static constexpr int kStateGroups = kMma ? kWarps : kGroups;
  static constexpr int kTileTokens = (kMma ? kWarpsPerHead : kGroups) * kTokensPerGroup;
  // Packed query rows of an item's state: kRows (the head group, padded) per KV head.
  static constexpr int kItemRows = kItemHeads * kRows;

  static constexpr int kValues = kTokensPerGroup * kRows;  // partial scores per lane
  static constexpr int kLaneSteps = log2_exact(kLanes);
  static constexpr int kSplitSteps = log2_exact(kValues < kLanes ? kValues : kLanes);
  static constexpr int kValuesPerLane = kValues > kLanes ? kValues / kLanes : 1;
  static constexpr int kRowsPerLane =
      kValuesPerLane >= kTokensPerGroup ? kValuesPerLane / kTokensPerGroup : 1;
  // Lanes holding the same scores after the reduce-scatter (kValues < kLanes).
  static constexpr int kDuplicateLanes = kValues < kLanes ? kLanes / kValues : 1;
  static constexpr int kExchangeFloats = kMma ? 0 : kGroups * (kValues + kRows);

  // cp.async of 16-byte chunks: a thread copies the same chunk column of kCopiesPerThread rows
  // of one KV head. Copy row c is token c / kItemHeads, head c % kItemHeads of the tile, so
  // consecutive threads read consecutive bytes of NHD pages. The mma loop's ldmatrix reads 8
  // rows of one chunk column: its stages XOR the chunk index with the row (mod 8) so those 8
  // reads hit different banks.
  static constexpr int kRowBytes = kNvfp4 ? kHeadDim / 2 : kHeadDim * kKVBytes;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kCopyRowStride = kThreads / kChunksPerRow;
  static constexpr int kCopyTokenStride = kCopyRowStride / kItemHeads;
  static constexpr int kCopiesPerThread = kTileTokens / kCopyTokenStride;
  static constexpr int kHeadTileBytes = kTileTokens * kRowBytes;  // K or V of one head's tile
  static constexpr int kTileBytes = kItemHeads * kHeadTileBytes;  // K or V of one tile
  // NVFP4: the K and V scale tiles after the code tiles, D / 16 bytes a row, each row copied by
  // its codes' column-0 thread in kScaleCopies pieces of kScaleCopyBytes (4, 8 or 16).
  static constexpr int kScaleRowBytes = kNvfp4 ? kHeadDim / 16 : 0;
  static constexpr int kScaleTileBytes = kTileTokens * kScaleRowBytes;
  static constexpr int kScaleCopyBytes = kScaleRowBytes < 16 ? kScaleRowBytes : 16;
  static constexpr int kScaleCopies = kNvfp4 ? kScaleRowBytes / kScaleCopyBytes : 0;
  static constexpr int kStageBytes = 2 * kTileBytes + 2 * kScaleTileBytes;
  // (kStages - 1) stages in flight per CTA (48 KiB with 16-bit KV and 4-token groups).
  static constexpr int kStages = FLARE_STAGES;

  static constexpr int kCombineFloats = kStateGroups * kRows * (kHeadDim + 2);
  // RoPE's angle table on the tensor-core loop (decode_params.cuh decode_rotary_table_bytes).
  static constexpr bool kRotaryTable = kMma && Variant::kRotary;
  static constexpr int kRotaryPairs = kHeadDim / 2;
  static constexpr int kRotaryOffsetStride = kDecodeRotaryOffsetStride;
  static constexpr int kRotaryTableBytes =
      kRotaryTable ? decode_rotary_table_bytes(kHeadDim, kWarps) : 0;
  static_assert(kItemHeads == 1 ||
                    (kMma && (kItemHeads == 2 || kItemHeads == 4 || kItemHeads == 8)),
                "whole-page items: 2, 4 or 8 KV heads, on the tensor-core loop");
  static_assert(!kNvfp4 || (!kMma && kItemHeads == 1 && kChunksPerRow >= 1),
                "NVFP4 KV: the CUDA-core loop, one KV head an item, rows of whole 16-byte chunks");
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kLoopBytes = kPipelineBytes + kExchangeFloats * 4;
  static constexpr int kSharedBytes =
      kLoopBytes > kCombineFloats * 4 ? kLoopBytes : kCombineFloats * 4;
  // What the host launches with: at least kSharedBytes, more where the fused merge needs it.
  static constexpr int kLaunchSharedBytes = FLARE_SHARED_BYTES;
  static_assert(kLaunchSharedBytes >= kSharedBytes + kRotaryTableBytes,
                "the host launches with too little smem");
  static_assert(kStages >= 2 && kTokensPerGroup >= 1, "pipeline");
  static_assert(kMinCtasPerSm >= 1 && kMinCtasPerSm <= 4, "register cap");
  static_assert((kTokensPerGroup & (kTokensPerGroup - 1)) == 0, "tokens per group");

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256 ||
                    (kHeadDim == 512 && !kMma && kRows <= 4),
                "head dim: 64, 128, 256, or 512 on the CUDA-core loop with at most 4 rows");
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "rows per item");
  static_assert(kPageSize >= 1, "page size");
  static_assert(kQCode == kCodeF16 || kQCode == kCodeBF16, "q dtype");
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a token row stays inside one warp");
  static_assert(kThreads % kChunksPerRow == 0 && kCopyRowStride % kItemHeads == 0 &&
                    kTileTokens % kCopyTokenStride == 0,
                "copies tile the stage exactly, each thread one KV head");
  static_assert(!kMma || kChunksPerRow % 4 == 0,
                "the mma loop reads K/V rows of whole 64-byte halves of lines with ldmatrix");
  static_assert(!kMma || kWarpTokens % kSliceTokens == 0, "whole 16-token slices per warp");
};

using T = Traits;

// Byte offset of 16-byte chunk `column` of K/V row `row` in a stage (see Traits): the mma loop
// uses the prefill kernel's swizzle.
__device__ __forceinline__ unsigned stage_offset(int row, int column) {
  if constexpr (T::kMma) return mma::swizzled_offset<T::kRowBytes>(row, column);
  return static_cast<unsigned>(row * T::kRowBytes + column * 16);
}

struct ItemGeometry {
  int kv_lo, kv_hi;  // KV positions this item reads
  int page_base;     // first entry of the request's page list
  int num_tiles;
  int kv_head;  // the item's first KV head
};

// This thread's copy row: its token in a tile and its KV head within the item.
__device__ __forceinline__ int copy_token() {
  return threadIdx.x / T::kChunksPerRow / T::kItemHeads;
}
__device__ __forceinline__ int copy_head() {
  return threadIdx.x / T::kChunksPerRow % T::kItemHeads;
}

// What a variant's init() learns about packed row `packed` of `item` (one query token per
// request; for whole-page items p.group_size spans the item's kItemHeads KV heads).
__device__ __forceinline__ RowContext row_context(const DecodeParams& p, const WorkItem& item,
                                                  int packed, int q_pos) {
  const int qo_head = item.kv_head * p.group_size + packed % p.group_size;
  return {item.request + packed / p.group_size,
          qo_head,
          qo_head / (p.group_size / T::kItemHeads),
          q_pos,
          q_pos + 1,
          1};  // one query per request, at its last position
}

// The page ids of this thread's copies of `tile`. An id out of range (the table is the
// caller's data, never trusted) becomes the cache's last page by an unsigned min against a
// parameter, so the copy reads nothing outside the cache; check_item_pages reports it. One
// instruction per id and no state through the loop: a branch or call in this unrolled loop,
// or a zero-fill predicate in issue_tile, changed how ptxas schedules the whole tile loop
// (10-20% slower, H200); a flag in a register through the loop spilled in a shipped
// configuration; a predicated store to a shared flag cost 14-21% (H200, decode_ab.sh).
__device__ __forceinline__ void fetch_pages(const DecodeParams& p, const ItemGeometry& g, int tile,
                                            int (&pages)[T::kCopiesPerThread]) {
  const int first_token = g.kv_lo + tile * T::kTileTokens + copy_token();
#pragma unroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int token = first_token + i * T::kCopyTokenStride;
    // Page 0 past kv_hi. The entries lie inside kv_indices: run() checks its length against the
    // plan's pages (a captured run: plan() against the captured tensor's).
    const unsigned page =
        token < g.kv_hi
            ? static_cast<unsigned>(__ldg(p.kv_indices + g.page_base + token / T::kPageSize))
            : 0u;
    pages[i] = static_cast<int>(min(page, p.last_page));
  }
}

// Records `request` in the index-error record when a page id of the item lies outside the
// cache (negative ids included). Once per item, after its loop: the CTA's threads read the
// item's entries together (a few loads each, cached by the loop's own reads) and the barrier
// that ends the loop combines them, so the tile loop carries no check. The host finds the entry
// and the value when it reads the record (BatchDecode::check).
__device__ __forceinline__ void check_item_pages(const DecodeParams& p, const ItemGeometry& g,
                                                 int request) {
  const int first = g.page_base + g.kv_lo / T::kPageSize;
  const int end = g.num_tiles > 0 ? g.page_base + (g.kv_hi - 1) / T::kPageSize + 1 : first;
  unsigned largest = 0;
#pragma unroll 4
  for (int e = first + static_cast<int>(threadIdx.x); e < end; e += T::kThreads) {
    largest = max(largest, static_cast<unsigned>(__ldg(p.kv_indices + e)));
  }
  if (__syncthreads_or(largest > p.last_page) && threadIdx.x == 0) {
    record_index_error(p.index_error, kIndexErrorPageId, request, -1, -1);
  }
}

// Gathers K and V rows of `tile` through the page table into its pipeline stage. Byte strides
// of a page and a slot fit 32 bits (BatchDecode::run checks), so a row's address is the item's
// head base plus 32-bit slot and page-id multiply-adds: 64-bit element arithmetic per copy was
// ~17% of the fp8 loop's instructions.
__device__ __forceinline__ void issue_tile(const DecodeParams& p, const ItemGeometry& g, int tile,
                                           const int (&pages)[T::kCopiesPerThread],
                                           unsigned char* smem, bool ready = true) {
  const int column = threadIdx.x % T::kChunksPerRow;
  const int first_row = copy_token();
  const int head = g.kv_head + copy_head();
  const unsigned stage =
      shared_address(smem + (tile % T::kStages) * T::kStageBytes) + copy_head() * T::kHeadTileBytes;
  const unsigned char* k =
      static_cast<const unsigned char*>(p.k) + head * p.k_stride_head * T::kKVBytes + column * 16;
  const unsigned char* v =
      static_cast<const unsigned char*>(p.v) + head * p.v_stride_head * T::kKVBytes + column * 16;
  const int k_page_bytes = static_cast<int>(p.k_stride_page) * T::kKVBytes;
  const int v_page_bytes = static_cast<int>(p.v_stride_page) * T::kKVBytes;
  const int k_slot_bytes = static_cast<int>(p.k_stride_slot) * T::kKVBytes;
  const int v_slot_bytes = static_cast<int>(p.v_stride_slot) * T::kKVBytes;
  const int first_token = g.kv_lo + tile * T::kTileTokens + first_row;
#pragma unroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int token = first_token + i * T::kCopyTokenStride;
    // Else pages[i] is 0: the address stays in page 0.
    const bool valid = token < g.kv_hi && ready;
    const int slot = static_cast<int>(static_cast<unsigned>(token) % T::kPageSize);
    const unsigned offset = stage_offset(first_row + i * T::kCopyTokenStride, column);
    cp_async_16(stage + offset,
                k + slot * k_slot_bytes + static_cast<long long>(pages[i]) * k_page_bytes, valid);
    cp_async_16(stage + T::kTileBytes + offset,
                v + slot * v_slot_bytes + static_cast<long long>(pages[i]) * v_page_bytes, valid);
    if constexpr (T::kNvfp4) {  // the row's block scales, by its column-0 thread
      if (column == 0) {
        const long long page = pages[i];
        const unsigned row = (first_row + i * T::kCopyTokenStride) * T::kScaleRowBytes;
        const unsigned char* k_sf = p.k_sf + head * p.k_sf_stride_head + slot * p.k_sf_stride_slot +
                                    page * p.k_sf_stride_page;
        const unsigned char* v_sf = p.v_sf + head * p.v_sf_stride_head + slot * p.v_sf_stride_slot +
                                    page * p.v_sf_stride_page;
        const unsigned scales = stage + 2 * T::kTileBytes;
#pragma unroll
        for (int c = 0; c < T::kScaleCopies; ++c) {
          cp_async_ca<T::kScaleCopyBytes>(scales + row + c * T::kScaleCopyBytes,
                                          k_sf + c * T::kScaleCopyBytes, valid);
          cp_async_ca<T::kScaleCopyBytes>(
              scales + T::kScaleTileBytes + row + c * T::kScaleCopyBytes,
              v_sf + c * T::kScaleCopyBytes, valid);
        }
      }
    }
  }
}

}  // namespace flare::decode
