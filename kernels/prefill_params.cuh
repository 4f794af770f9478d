// The prefill kernel's parameter record and its tile geometry, shared bit for bit by the host
// (src/api/batch_prefill.cpp) and the device (kernels/prefill.cuh): plain structs, constexpr.
#pragma once

#include "decode_params.cuh"

namespace flare {

// Compile-time mask modes (FLARE_MASK). Sliding windows, soft-cap and ALiBi are the variant's.
enum PrefillMaskCode : int32_t {
  kMaskNone = 0,
  kMaskCausal = 1,  // bottom-right aligned: token i of a request sees kv j <= kv_len - q_len + i
  kMaskCustom = 2,  // packed bits per request (little bit order), q_len x kv_len row-major
};

// Strides are in elements; every pointer stays fixed across plans (CUDA graphs).
struct PrefillParams {
  const void* q;  // [total_q, H_qo, D_qk]
  const void* k;  // ragged [total_kv, H_kv, D_qk] or pages, addressed by the strides below
  const void* v;  // same with D_vo
  void* o;        // [total_q, H_qo, D_vo]
  float* lse;     // [total_q, H_qo] or null
  const int32_t* qo_indptr;         // [batch + 1] query tokens
  const int32_t* kv_indptr;         // [batch + 1] tokens (ragged) or pages (paged)
  const int32_t* kv_indices;        // paged: page ids
  const int32_t* kv_last_page_len;  // paged: [batch]
  const unsigned char* custom_mask; // kMaskCustom: packed bits
  const int32_t* mask_indptr;       // kMaskCustom: [batch + 1] byte offsets
  unsigned char* workspace;
  WorkspaceOffsets offsets;
  int64_t q_stride_token, q_stride_head;
  // Ragged: stride_page is the token stride and stride_slot is unused.
  int64_t k_stride_page, k_stride_slot, k_stride_head;
  int64_t v_stride_page, v_stride_slot, v_stride_head;
  int64_t o_stride_token, o_stride_head;
  int64_t lse_stride_token, lse_stride_head;
  int32_t group_size;  // H_qo / H_kv
  int32_t reserved;
  VariantParams variant;
};

// Warp layout of a (query tile, head_dim_vo) pair. Warps split the query rows, 16 rows (one
// m16 tile) each: two m16 tiles per warp would halve the shared-memory reads of K and V per MMA,
// but their 2 x head_dim_vo / 2 output accumulators spill on sm_80 and sm_90a at every KV tile
// (measured with ptxas), so the kernel's kMmaQ stays generic and this returns 1. Tiles of 16 and
// 32 rows add warps along the KV tile (their partial softmax states are combined at the end of a
// work item), so every CTA has at least 4 warps to issue loads and MMAs.
constexpr int prefill_mma_q(int /*query_tile*/, int /*head_dim_vo*/) { return 1; }
constexpr int prefill_warps_q(int query_tile, int head_dim_vo) {
  return query_tile / (16 * prefill_mma_q(query_tile, head_dim_vo));
}
constexpr int prefill_warps_kv(int query_tile, int head_dim_vo) {
  return prefill_warps_q(query_tile, head_dim_vo) >= 4 ? 1
                                                       : 4 / prefill_warps_q(query_tile, head_dim_vo);
}
constexpr int prefill_threads(int query_tile, int head_dim_vo) {
  return 32 * prefill_warps_q(query_tile, head_dim_vo) * prefill_warps_kv(query_tile, head_dim_vo);
}

// fp32 output staging rows are padded by 8 floats (32 bytes) so the float2 stores of the four
// row groups of a half-warp land in distinct banks.
constexpr int kPrefillStagePad = 8;
constexpr int kPrefillKvStages = 2;

// Dynamic shared memory of one CTA: the Q tile, kPrefillKvStages K/V stages and their page ids
// while the main loop runs; the fp32 output staging (per KV warp) and row statistics after it.
constexpr int prefill_shared_bytes(int query_tile, int kv_tile, int head_dim_qk, int head_dim_vo) {
  const int q_bytes = query_tile * head_dim_qk * 2;
  const int stage_bytes = kv_tile * (head_dim_qk + head_dim_vo) * 2;
  const int page_id_bytes = kPrefillKvStages * kv_tile * 4;
  const int main_loop = q_bytes + kPrefillKvStages * stage_bytes + page_id_bytes;
  const int warps_kv = prefill_warps_kv(query_tile, head_dim_vo);
  const int epilogue = warps_kv * query_tile * (head_dim_vo + kPrefillStagePad) * 4 +
                       2 * warps_kv * query_tile * 4;
  return main_loop > epilogue ? main_loop : epilogue;
}

}  // namespace flare
