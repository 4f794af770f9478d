// BatchPrefill's staged RoPE (BatchPrefillConfig::rope_staging): which configs and plans stage,
// the rotated copies of q and k, and the rotation run() launches before the prefill kernels
// (apply_rope's kernel, kernels/rope_apply.cuh, loaded and parameterized once).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_driver.h"

namespace flare {
struct RopeApplyParams;

namespace api_detail {

// Staging applies to the config: kRopeLlama on ragged 16-bit K/V, no user variant, one level,
// a head dim the rotation kernel takes whole (a multiple of 16, at most 2 x kRopeMaxPairs),
// and under use_cuda_graph max_total_kv >= 1 (the k copy's rows, allocated at creation).
bool rope_staging_applies(const BatchPrefillConfig& c);

// Some plan of `c` may stage: rope_staging is not kFused and staging applies. BatchPrefill then
// keeps a PrefillRopeStaging, and precompile() lists the staged kernels.
bool may_stage_rope(const BatchPrefillConfig& c);

// The config the prefill kernels of a staged plan are compiled for: `c` without RoPE.
BatchPrefillConfig staged_rope_kernel_config(const BatchPrefillConfig& c);

// Whether the plan of these (validated) host arrays on `tiles` stages: kStaged always (throws
// kUnsupported where the batch is past the rotation kernel's 2^31 pieces), kAuto where the
// config allows it, the batch fits the kernel and fused_rope_key_reads reaches
// kStageRopeMinKeyReads. Under use_cuda_graph every plan as graph_stages_rope says.
bool plan_stages_rope(const BatchPrefillConfig& c, std::span<const int32_t> qo_indptr,
                      std::span<const int32_t> kv_indptr, const PrefillTiles& tiles);

// Under use_cuda_graph the captured run() serves every plan, so the choice is the config's, on
// its fixed tiles: kStaged; kAuto where staging applies and a batch of max_batch prefills of
// max_total_qo / max_batch tokens each (q_len = kv_len) would read each key
// kStageRopeMinKeyReads times; kFused never.
bool graph_stages_rope(const BatchPrefillConfig& c, const PrefillTiles& tiles);

// The rotated copies and their rotation, for one BatchPrefill (a config where staging
// applies). Eager: created empty, plan() reserves, run() rotates the plan's tokens. Under
// use_cuda_graph: max_total_qo and max_total_kv rows allocated at creation, and each launch
// reads its token count on the device (the request table's entry max_batch, padded with the
// total), so that a captured rotation serves every later plan.
class PrefillRopeStaging {
 public:
  PrefillRopeStaging();
  // Loads the rotation kernel for c.dtype (JIT, disk-cached) and computes its turns.
  explicit PrefillRopeStaging(const BatchPrefillConfig& c);
  ~PrefillRopeStaging();
  PrefillRopeStaging(PrefillRopeStaging&&) noexcept;
  PrefillRopeStaging& operator=(PrefillRopeStaging&&) noexcept;

  // Room for total_qo query and total_kv key rows: the copies grown to it where smaller (the
  // device synchronized first: a run() still in flight may read the smaller ones). Under
  // use_cuda_graph the copies never grow: plan() refuses more keys first.
  void reserve(int64_t total_qo, int64_t total_kv);
  int64_t key_rows() const { return key_rows_; }  // the k copy's capacity
  void* q_copy() const { return q_.data(); }      // [total_qo, H_qo, D_qk], contiguous
  void* k_copy() const { return k_.data(); }      // [key_rows(), H_kv, D_qk], contiguous

  // Rotates q [total_qo, H_qo, D_qk] and k's rows [0, total_kv) (unit innermost strides,
  // 16-byte aligned rows and strides: run() checks them) into the copies. Query token t of
  // request b turns at q_offset[b] + t - qo_begin[b], key row j at j - kv_indptr[b]: the
  // plan's request tables on the device (batch + 1 and batch entries). Under use_cuda_graph
  // total_qo and total_kv bound the tokens, which are qo_begin[batch] and kv_indptr[batch] on
  // the device (batch = max_batch). Two launches on `stream`; no checks beyond what the
  // caller vouches for.
  void rotate(const TensorView& q, const TensorView& k, int64_t total_qo, int64_t total_kv,
              int64_t batch, const int32_t* qo_begin, const int32_t* q_offset,
              const int32_t* kv_indptr, cuda::Stream stream) const;

 private:
  void launch(const void* in, int64_t token_stride, int64_t head_stride, void* out, int64_t tokens,
              int heads, const int32_t* indptr, const int32_t* offsets, int64_t batch,
              cuda::Stream stream) const;

  int device_ = 0, q_heads_ = 0, k_heads_ = 0, head_dim_ = 0;
  bool graph_ = false;
  cuda::Function function_ = nullptr;
  std::unique_ptr<RopeApplyParams> base_;    // the turns and the fixed fields
  cuda::DeviceBuffer q_, k_, zero_offsets_;  // zero_offsets_: int32 [max_batch] of 0
  int64_t query_rows_ = 0, key_rows_ = 0;
};

}  // namespace api_detail
}  // namespace flare
