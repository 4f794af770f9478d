// Kernel parameter records of the decode and merge kernels, shared bit for bit by the host
// (src/api/batch_decode.cpp fills them) and the device: plain structs, no CUDA headers.
#pragma once

#include "fixed_width_ints.cuh"
#include "index_check.cuh"
#include "plan_types.cuh"

namespace flare {

// Element type codes of the compile-time defines FLARE_Q_DTYPE / FLARE_KV_DTYPE; equal to the
// host's flare::DType values (checked there).
enum DTypeCode : int32_t {
  kCodeF16 = 1,
  kCodeBF16 = 2,
  kCodeE4M3 = 3,
  kCodeE5M2 = 4,
  // NVFP4 KV (the host's DType::kU8 KV: include/flare/format/nvfp4.h): E2M1 pairs, D / 2 bytes
  // a row, with one e4m3 scale a block of 16 in the DecodeParams' scale pages.
  kCodeE2M1 = 7,
};

// A user variant's named float parameters and tensors (include/flare/variant/user_variant.h).
constexpr int kMaxVariantScalars = 8;
constexpr int kMaxVariantTensors = 4;
constexpr int kMaxVariantTensorDims = 4;  // extents a variant can read (Tensors::<name>_extent)

// The built-in ALiBi converts KV positions to float exactly on the FMA pipe (kernels/variant.cuh,
// StandardVariant), exact for distances below 2^22: the hosts refuse ALiBi for requests of more
// query or KV tokens at plan().
constexpr int kAlibiMaxKvLen = 1 << 22;

// RoPE on the tensor-core decode loop (decode_mma.cuh SliceAngles): a table at the end of the
// launch's shared memory, kept across items, of the (cos, sin) of offsets 0..15 from a slice's
// first token for every pair ([pairs][kDecodeRotaryOffsetStride] float2: 16 used, the padding
// spreads a warp's reads of pairs 2t or 4t apart over the banks), then each warp's (cos, sin) at
// its slice's first token ([warps][pairs]). The host reserves it (src/api/decode_config.cpp).
constexpr int kDecodeRotaryOffsetStride = 18;
constexpr int decode_rotary_table_bytes(int head_dim, int warps) {
  return (head_dim / 2 * kDecodeRotaryOffsetStride + warps * (head_dim / 2)) * 8;
}

// Runtime parameters of the variants (kernels/variant.cuh): the built-ins' resolved from
// AttentionParams once per BatchDecode / BatchPrefill, a user variant's scalars per run().
struct VariantParams {
  float sm_scale;             // resolved softmax scale
  float logits_soft_cap;      // > 0: logits = cap * tanh(logits / cap)
  int32_t window_left;        // >= 0: query at q_pos sees kv j >= q_pos - window_left
  float sigmoid_bias;         // sigmoid attention (use_softmax = false): weight sigmoid(s + bias)
  const float* alibi_slopes;  // float32 [H_qo] on the device, natural-log units
  const float* rope_turns;    // RoPE: [D_qk / 2][2] turns per position of each pair, as hi + lo
  float scalars[kMaxVariantScalars];        // a user variant's, in its declared order (Scalars::)
  const void* tensors[kMaxVariantTensors];  // its tensors' data, likewise (Tensors::)
  // Their extents (1 past a tensor's rank), so a source can bound an index that comes from its
  // data; a graph replay keeps the extents of its capture, like the addresses.
  int32_t tensor_extents[kMaxVariantTensors][kMaxVariantTensorDims];
};

// Byte offsets of the plan sections inside the workspace (plan/plan.h WorkspaceLayout), and the
// partial states' scratch, which may live in a buffer of the caller's (BatchDecodeConfig /
// BatchPrefillConfig scratch).
struct WorkspaceOffsets {
  int64_t counts;
  int64_t cta_indptr;
  int64_t work_items;
  int64_t merge_indptr;
  int64_t merge_items;
  int64_t merge_slots;
  float* partial_o;      // [partial slots][partial_rows][D_vo]
  float* partial_lse;    // [partial slots][partial_rows], natural log
  int32_t partial_rows;  // rows of one partial slot (max_query_tile)
  int32_t reserved;
};

// What a decode work item would otherwise look up through its request (kv_indptr,
// kv_last_page_len, merge_indptr: a chain of dependent loads); BatchDecode::plan stages one per
// work item from the host's arrays, in the workspace's executor_items section.
struct alignas(16) DecodeItemMeta {
  int32_t page_begin;  // the request's first entry of kv_indices
  int32_t kv_len;      // the request's KV tokens
  int32_t slot_begin;  // split items: the tile's partial slots [slot_begin, slot_begin + count)
  int32_t slot_count;  // 0 for write-through items
};

// A CTA's queue and its first item in one record (the executor_ctas section), so the first K/V
// page ids are one dependent load after the CTA starts. CTAs beyond the plan get begin == end.
struct alignas(16) DecodeCtaStart {
  WorkItem item;        // work_items[begin] (WorkItem.reserved: its merge item, if split)
  DecodeItemMeta meta;  // its DecodeItemMeta
  int32_t begin;        // the CTA's work items [begin, end)
  int32_t end;
  int32_t reserved[2];
};

// Strides are in elements; every pointer below stays fixed across plans (CUDA graphs).
struct DecodeParams {
  const void* q;  // [batch, H_qo, D]
  const void* k;  // pages, addressed through the strides below
  const void* v;
  void* o;                    // [batch, H_qo, D]
  float* lse;                 // [batch, H_qo] or null
  const int32_t* kv_indices;  // page ids (page ranges and lengths come from the plan)
  // The cache's last page id (pages: K's and V's fewer, at least one when the plan reads any;
  // run() checks kv_indices holds every entry the plan reads). A page id outside
  // [0, last_page] is replaced by the last page for the read (nothing outside the cache), and
  // index_error records the request (entry -1: the host finds the entry when it reads the
  // record). The last id, not the count: the clamp's operand comes from the parameter bank
  // instead of a register through the tile loop (a register spilled at the 128 cap).
  unsigned last_page;
  IndexErrorRecord* index_error;
  unsigned char* workspace;
  WorkspaceOffsets offsets;
  const DecodeCtaStart* cta_starts;  // [grid] in the workspace
  const DecodeItemMeta* item_meta;   // [work items] in the workspace
  // [merge items] arrival counts of split tiles' chunks, 0 between runs (kernels/decode_merge.cuh).
  int32_t* merge_counters;
  int64_t q_stride_token, q_stride_head;
  int64_t k_stride_page, k_stride_slot, k_stride_head;
  int64_t v_stride_page, v_stride_slot, v_stride_head;
  int64_t o_stride_token, o_stride_head;
  int64_t lse_stride_token, lse_stride_head;
  int32_t group_size;  // H_qo / H_kv
  float k_scale;       // real K = stored K * k_scale (1 unless fp8), times run()'s q_scale
  float v_scale;       // real V = stored V * v_scale
  float lse_scale;     // the stored lse is the natural-log lse times this (log2(e): base 2)
  VariantParams variant;
  // NVFP4 KV only: the e4m3 block scales, pages like k / v with D / 16 bytes a row; strides in
  // bytes (k_scale / v_scale above are then the global decode scales).
  const unsigned char* k_sf;
  const unsigned char* v_sf;
  int64_t k_sf_stride_page, k_sf_stride_slot, k_sf_stride_head;
  int64_t v_sf_stride_page, v_sf_stride_slot, v_sf_stride_head;
};

// The standalone merge kernel's (kernels/merge.cuh; batch prefill launches it, batch decode
// merges inside its own launch).
struct MergeParams {
  void* o;     // [batch, H_qo, D]
  float* lse;  // [batch, H_qo] or null
  unsigned char* workspace;
  WorkspaceOffsets offsets;
  int64_t o_stride_token, o_stride_head;
  int64_t lse_stride_token, lse_stride_head;
  int32_t group_size;
  float lse_scale;  // as DecodeParams::lse_scale
  // Prefill: [batch] first query token of each request (MergeItem.request indexes it); null
  // for decode, where request i is query token i.
  const int32_t* qo_begin;
  // Non-zero for a variant without softmax (use_softmax = false): the slots hold unnormalized
  // sums and add up; there is no lse (kernels/variant.cuh).
  int32_t sum_partials;
  // Prefill's attention sinks (PrefillParams::sink), added once to each merged row; null: none.
  const float* sink;
};

}  // namespace flare
