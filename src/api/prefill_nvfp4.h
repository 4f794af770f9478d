// NVFP4 KV for BatchPrefill (BatchPrefillConfig::kv_dtype kU8): the FA2 family's NVFP4 kernels
// and the Hopper family's at 64-row tiles read the codes and scales and convert them in shared
// memory (kernels/prefill_nvfp4_load.cuh; the Hopper family's producer,
// kernels/prefill_hopper_nvfp4.cuh); for the Hopper family's other tiles, RoPE on it, and head
// dim 512 (prefill_fused_nvfp4) run() first dequantizes the plan's KV into a staged 16-bit copy
// (kernels/prefill_nvfp4_stage.cuh) the 16-bit kernels read. Paged KV is
// staged page by page in the order of the plan's page-table entries and read back through an
// identity page table; ragged rows stay where they are.
#pragma once

#include <cstdint>
#include <utility>

#include "flare/api/batch_prefill.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "kernels/prefill_nvfp4_stage.cuh"

namespace flare::api_detail {

bool is_nvfp4_prefill(const BatchPrefillConfig& c);
// The dequantization kernel (what CI compiles without a GPU).
jit::KernelSpec prefill_nvfp4_stage_kernel_spec();

class Nvfp4PrefillStaging {
 public:
  Nvfp4PrefillStaging() = default;
  // Allocates the staged copy (config.max_total_kv units) and the identity page ids, and
  // compiles the dequantization kernel. On the config's device.
  explicit Nvfp4PrefillStaging(const BatchPrefillConfig& config);

  // What a staging run needs of the plan: its KV units (kv_indptr[batch]), the request table
  // on the device (max_batch + 1 entries, padded past the batch with the total: the kernel
  // reads its count there) and the error record.
  struct Plan {
    int64_t planned_units = 0;
    const int32_t* kv_indptr_table = nullptr;
    IndexErrorRecord* index_error = nullptr;
  };

  // The caller's NVFP4 pages or rows checked (shapes, dtypes, device, alignment: throws
  // kInvalidArgument naming the tensor): their pointers, strides (in bytes; paged: page, slot,
  // head; ragged: row, 0, head) and pages, as the FA2 family's NVFP4 kernels and the staging
  // read them. Those kernels copy 16- or 8-byte pieces of code rows (8 where a code row is only
  // 8-byte aligned) and pieces of the scale row's alignment (4, 8 or 16 bytes), which the check
  // asks of pointers and strides.
  Nvfp4StageParams checked(const PagedKVPages& kv, const Plan& plan) const;
  Nvfp4StageParams checked(const Nvfp4Rows& kv, const Plan& plan) const;

  // Launches the dequantization of checked() pages on `stream` and returns the staged pages
  // (dtype, identity page ids).
  PagedKVPages stage_pages(Nvfp4StageParams checked_pages, const Plan& plan,
                           cuda::Stream stream) const;
  // Ragged rows: the staged k and v, [capacity, H_kv, D] in dtype.
  std::pair<TensorView, TensorView> stage_rows(Nvfp4StageParams checked_rows, const Plan& plan,
                                               cuda::Stream stream) const;
  int64_t capacity() const { return config_.max_total_kv; }

 private:
  void launch(Nvfp4StageParams& p, const Plan& plan, cuda::Stream stream) const;
  BatchPrefillConfig config_;
  cuda::DeviceBuffer staged_k_, staged_v_, identity_ids_;
  cuda::Function kernel_ = nullptr;
  int num_sms_ = 0;
};

}  // namespace flare::api_detail
