// The prefill kernel's parameter record and its tile geometry, shared bit for bit by the host
// (src/api/batch_prefill_run.cpp) and the device (kernels/prefill.cuh): plain structs, constexpr.
#pragma once

#include "decode_params.cuh"

namespace flare {

// Compile-time mask modes (FLARE_MASK). Sliding windows, soft-cap and ALiBi are the variant's.
enum PrefillMaskCode : int32_t {
  kMaskNone = 0,
  kMaskCausal = 1,  // bottom-right aligned: token i of a request sees kv j <= kv_len - q_len + i
  kMaskCustom = 2,  // packed bits per request (little bit order), q_len x kv_len row-major
};

// A CUtensorMap (sm_90 bulk tensor copies): 128 opaque bytes, encoded on the host.
struct alignas(64) BulkTensorMap {
  unsigned long long opaque[16];
};

// Strides are in elements; every pointer stays fixed across plans (CUDA graphs).
struct PrefillParams {
  const void* q;  // [total_q, H_qo, D_qk]
  const void* k;  // ragged [total_kv, H_kv, D_qk] or pages, addressed by the strides below
  const void* v;  // same with D_vo
  void* o;        // [total_q, H_qo, D_vo]
  float* lse;     // [total_q, H_qo] or null
  // The request tables are the plan's (staged in the workspace from the host's validated
  // arrays), never the caller's device arrays: only page ids are read from caller memory.
  const int32_t* qo_begin;           // [batch] first query token of each request
  const int32_t* q_offset;           // [batch] KV position of each request's query token 0
  const int32_t* kv_indptr;          // [batch + 1] tokens (ragged) or pages (paged)
  const int32_t* kv_indices;         // paged: page ids
  const int32_t* kv_last_page_len;   // paged: [batch]
  const unsigned char* custom_mask;  // kMaskCustom: packed bits
  const int32_t* mask_indptr;        // kMaskCustom: [batch + 1] byte offsets
  // Paged: bounds of the index data, kv_indices entries and cache pages (an out-of-range id
  // reads page 0, or zeros in a tile's tail rows; index_error records it).
  int32_t num_indices;
  int32_t num_pages;
  IndexErrorRecord* index_error;
  unsigned char* workspace;
  WorkspaceOffsets offsets;
  // [2]: the queue position and the CTAs finished, 0 when a launch starts (zeroed at creation,
  // then by the last CTA of each launch). CTAs take the plan's queue entries (work items under
  // each KV head they cover) in order from the position (dynamic balance; the order is chosen
  // for L2 reuse of K/V, see plan/plan.h "One-queue plans").
  int32_t* next_work_item;
  int64_t q_stride_token, q_stride_head;
  // Ragged: stride_page is the token stride and stride_slot is unused.
  int64_t k_stride_page, k_stride_slot, k_stride_head;
  int64_t v_stride_page, v_stride_slot, v_stride_head;
  int64_t o_stride_token, o_stride_head;
  int64_t lse_stride_token, lse_stride_head;
  int32_t group_size;  // H_qo / H_kv
  float v_scale;       // multiplies the output (FlashInfer's v_scale)
  float lse_scale;     // the stored lse is the natural-log lse times this (log2(e): base 2)
  int32_t bulk_kv;     // 1: k_map / v_map are valid (the Hopper family's bulk copies)
  int32_t bulk_q;      // 1: q_map is valid
  // NVFP4 K/V (PrefillShape::nvfp4): k / v are E2M1 code rows (D / 2 bytes, strides above in
  // bytes) and these their e4m3 block scales (D / 16 bytes a row, strides in bytes).
  const unsigned char* k_scales;
  const unsigned char* v_scales;
  int64_t k_scale_stride_page, k_scale_stride_slot, k_scale_stride_head;
  int64_t v_scale_stride_page, v_scale_stride_slot, v_scale_stride_head;
  int32_t nvfp4_narrow_codes;  // 1: a code row is only 8-byte aligned (8-byte copies), 0: 16
  // Attention sinks (gpt-oss; RunOptions::sink): [H_qo] float32 logits in the units of q.k *
  // sm_scale (natural log), one key of value 0 per head in every row's softmax: final rows add
  // exp(sink) to their denominator here, split rows in the merge kernel. Null: none.
  const float* sink;
  VariantParams variant;
  // The Hopper family's maps of k and v (kernels/prefill_hopper.cuh; encoded by
  // src/api/prefill_bulk_maps.cpp): ragged K/V as [tokens][H_kv][D] with boxes of one panel
  // (64 dims) x 1 head x kv_tile tokens; paged K/V (prefill_paged_box_rows > 0) as
  // [pages][page_size][H_kv][D] with boxes of 64 dims x 1 head x box rows x 1 page. The kernel
  // takes its parameters as __grid_constant__, so the copies read them where they are.
  BulkTensorMap k_map;
  BulkTensorMap v_map;
  // q as [tokens][H_qo][D_qk] in boxes of 64 dims x group heads x query_tile / group tokens: a
  // query tile's packed rows in order.
  BulkTensorMap q_map;
};

// Rows of one box of the Hopper family's bulk copies of paged K/V: a KV tile is whole boxes,
// each inside one page (min(page_size, kv_tile) rows). Boxes are whole 8-row groups of the
// 128-byte swizzle (page_size a multiple of 8) and at least 16 rows (a box of 2 KiB a 64-dim
// panel: up to 8 boxes a tile, each issued by its own producer lane). 0: pages of this size are
// gathered with cp.async (a tile must not straddle a page's end, nor a box a swizzle group).
constexpr int prefill_paged_box_rows(int page_size, int kv_tile) {
  return page_size >= 16 && page_size % 8 == 0 &&
                 (page_size % kv_tile == 0 || kv_tile % page_size == 0)
             ? (page_size < kv_tile ? page_size : kv_tile)
             : 0;
}

// One prefill kernel configuration: what the layout functions below and the kernel's Traits
// derive every warp count and shared-memory offset from.
struct PrefillShape {
  int query_tile;  // packed query rows per CTA tile: 16 | 32 | 64 | 128
  int kv_tile;     // KV rows per pipeline stage: 32 | 64 | 128
  int head_dim_qk;
  int head_dim_vo;
  int mask;  // PrefillMaskCode
  // 1: the Hopper family (sm_90a): warpgroup MMAs (kernels/wgmma.cuh) on 64-row warpgroups,
  // query and KV tiles of 64 or 128; 0: mma.sync on every GPU.
  int warpgroup = 0;
  // 1: NVFP4 K/V: code and scale rows are copied as they are into raw stages and converted to
  // 16 bits in shared memory once they land (prefill_nvfp4_load.cuh; in the Hopper family by
  // the producer warpgroup, prefill_hopper_nvfp4.cuh).
  int nvfp4 = 0;
};

// Bytes of one raw NVFP4 stage: a KV tile's K and V code rows (D / 2 bytes) and scale rows
// (D / 16 bytes), each part 16-byte aligned; 0 without NVFP4.
constexpr int prefill_nvfp4_part_bytes(int rows, int row_bytes) {
  return (rows * row_bytes + 15) / 16 * 16;
}
constexpr int prefill_nvfp4_raw_stage_bytes(const PrefillShape& s) {
  if (s.nvfp4 == 0) return 0;
  return prefill_nvfp4_part_bytes(s.kv_tile, s.head_dim_qk / 2) +
         prefill_nvfp4_part_bytes(s.kv_tile, s.head_dim_qk / 16) +
         prefill_nvfp4_part_bytes(s.kv_tile, s.head_dim_vo / 2) +
         prefill_nvfp4_part_bytes(s.kv_tile, s.head_dim_vo / 16);
}

// Warp layout. Each warp owns whole m16 tiles of query rows. 128-row tiles with head_dim_vo
// <= 128 give each of 4 warps two m16 tiles (32 rows, FA2's layout): every K/V fragment a warp
// reads from shared memory then feeds two MMAs per n8 tile, 160 instead of 272 shared bytes per
// MMA, and two 4-warp CTAs share an SM out of phase. Their 2 x head_dim_vo / 2 output
// accumulators fit 255 registers only with 64-key tiles and without the custom mask's per-key
// bit loads (measured with ptxas); wider heads, smaller tiles and custom masks keep one m16 tile
// per warp. Tiles of 16 and 32 rows add warps along the KV tile (their partial softmax states
// are combined at the end of a work item), so every CTA has at least 4 warps to issue loads
// and MMAs.
// The Hopper family gives each warp 16 rows of its warpgroup's 64 (one m16 tile: the wgmma
// accumulator fragment of a warp is the m16n8 C layout, so everything after the MMAs is shared).
constexpr int prefill_mma_q(const PrefillShape& s) {
  if (s.warpgroup != 0) return 1;
  return s.query_tile == 128 && s.head_dim_vo <= 128 && s.mask != kMaskCustom ? 2 : 1;
}
constexpr int prefill_warps_q(const PrefillShape& s) {
  return s.query_tile / (16 * prefill_mma_q(s));
}
constexpr int prefill_warps_kv(const PrefillShape& s) {
  return prefill_warps_q(s) >= 4 ? 1 : 4 / prefill_warps_q(s);
}
// The threads that compute (every thread of the mma.sync family's CTAs).
constexpr int prefill_threads(const PrefillShape& s) {
  return 32 * prefill_warps_q(s) * prefill_warps_kv(s);
}
// The Hopper family adds a producer warpgroup that loads Q and the K/V stages for the consumer
// warpgroups (warp specialization, kernels/prefill_hopper.cuh).
constexpr int kPrefillProducerThreads = 128;
constexpr int prefill_launch_threads(const PrefillShape& s) {
  return prefill_threads(s) + (s.warpgroup != 0 ? kPrefillProducerThreads : 0);
}
// Resident CTAs the Hopper family's register split is made for (setmaxnreg): one of two
// consumer warpgroups at 128 query rows, two of one at 64.
constexpr int prefill_warpgroup_ctas_per_sm(const PrefillShape& s) {
  return s.query_tile == 64 ? 2 : 1;
}

// fp32 output staging rows are padded by 8 floats (32 bytes) so the float2 stores of the four
// row groups of a half-warp land in distinct banks.
constexpr int kPrefillStagePad = 8;
constexpr int kPrefillKvStages = 2;

// NVFP4 K/V keeps kPrefillNvfp4RawStages raw stages (9 KB each at D 128, 64-row KV tiles) in a
// ring, kPrefillNvfp4RawStages - 1 tiles in flight while one is converted into a single 16-bit
// stage (a tile's 4.5 bits a value are few bytes in flight); three, not four, leave 16-row tiles
// at 68 KB, three CTAs an SM (docs/perf.md, NVFP4 prefill v4-v5). 16-bit K/V: two stages, one
// tile in flight.
constexpr int kPrefillNvfp4RawStages = 3;
// The Hopper family's producer converts NVFP4 tile t into its two 16-bit stages while the raw
// rows of tiles t + 1 and t + 2 land (kernels/prefill_hopper_nvfp4.cuh): the same ring.
constexpr int prefill_kv_stages(const PrefillShape& s) {
  return s.nvfp4 != 0 && s.warpgroup == 0 ? 1 : kPrefillKvStages;
}
constexpr int prefill_raw_stages(const PrefillShape& s) {
  return s.nvfp4 == 0 ? 0 : kPrefillNvfp4RawStages;
}
// Tiles whose copies are issued ahead of the one being computed, and how far ahead their page
// ids are (one slot each): ids land with the copy group they are committed in, which the wait
// before their tile's issue must cover, so twice the copy lead.
constexpr int prefill_tile_lead(const PrefillShape& s) {
  return s.nvfp4 != 0 ? kPrefillNvfp4RawStages - 1 : 1;
}
constexpr int prefill_page_id_slots(const PrefillShape& s) { return 2 * prefill_tile_lead(s); }

// Bytes reserved for the work item's record (item, geometry, mask scalars; see prefill.cuh),
// which the main loop and the epilogue read from shared memory instead of holding registers.
constexpr int kPrefillItemRecordBytes = 128;

// Dynamic shared memory of one CTA: the Q tile, the K/V stages and the page-id slots (and with
// NVFP4 the raw stages) while the main loop runs, the fp32 output staging (per KV warp)
// and row statistics after it; then, live throughout, the item record, two int tables per packed
// row (KV position, query head), each thread's softmax statistics (running max and sum of its rows)
// and KV loop position, and each warp's visible KV span.
constexpr int prefill_item_offset(const PrefillShape& s) {
  // Shared rows are swizzled, not padded (kernels/mma_utils.cuh).
  const int q_bytes = s.query_tile * s.head_dim_qk * 2;
  const int stage_bytes = s.kv_tile * (s.head_dim_qk * 2 + s.head_dim_vo * 2);
  const int page_id_bytes = prefill_page_id_slots(s) * s.kv_tile * 4;
  const int main_loop = q_bytes + prefill_kv_stages(s) * stage_bytes + page_id_bytes +
                        prefill_raw_stages(s) * prefill_nvfp4_raw_stage_bytes(s);
  const int warps_kv = prefill_warps_kv(s);
  const int epilogue = warps_kv * s.query_tile * (s.head_dim_vo + kPrefillStagePad) * 4 +
                       2 * warps_kv * s.query_tile * 4;
  return main_loop > epilogue ? main_loop : epilogue;
}
// One slot of the Hopper family's item hand-off (kernels/prefill_traits.cuh ItemHandOff): a record
// and the two row tables.
constexpr int prefill_hand_off_bytes(const PrefillShape& s) {
  return kPrefillItemRecordBytes + 2 * s.query_tile * 4;
}
constexpr int prefill_shared_bytes(const PrefillShape& s) {
  const int threads = prefill_threads(s);
  const int row_stats_bytes = threads * prefill_mma_q(s) * 4 * 4;
  const int loop_tile_bytes = (s.warpgroup != 0 ? 1 : threads) * 4;  // the mma.sync family's
  const int warp_span_bytes = threads / 32 * 3 * 4;
  // The Hopper family's mbarriers (full / empty per half stage, item_ready per hand-off slot,
  // q_full, q_empty), its two item hand-off slots and, with two consumer warpgroups, their item
  // records.
  const int warpgroup_records = s.warpgroup != 0 && threads > 128 ? 2 : 0;
  const int pipeline_bytes = s.warpgroup != 0
                                 ? (4 * kPrefillKvStages + 4) * 8 + 2 * prefill_hand_off_bytes(s) +
                                       warpgroup_records * kPrefillItemRecordBytes
                                 : 0;
  const int bytes = prefill_item_offset(s) + pipeline_bytes + kPrefillItemRecordBytes +
                    2 * s.query_tile * 4 + row_stats_bytes + loop_tile_bytes + warp_span_bytes;
  return (bytes + 15) / 16 * 16;
}
// What a launch asks for: the Hopper family aligns its tiles to 1024 bytes (kernels/wgmma.cuh)
// from wherever the dynamic shared memory starts, which its declaration aligns to 128 bytes
// (kernels/prefill_kernel.cuh), so at most 896 bytes on.
constexpr int kPrefillSharedBaseAlign = 128;
constexpr int kWarpgroupTileAlign = 1024;
constexpr int kWarpgroupAlignSlack = kWarpgroupTileAlign - kPrefillSharedBaseAlign;
constexpr int prefill_launch_shared_bytes(const PrefillShape& s) {
  return prefill_shared_bytes(s) + (s.warpgroup != 0 ? kWarpgroupAlignSlack : 0);
}

}  // namespace flare
