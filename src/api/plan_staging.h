// The plan region's way to the GPU shared by BatchDecode and BatchPrefill: a pinned host copy
// written per plan() and copied asynchronously, and the kernels' view of the workspace layout.
#pragma once

#include <cstddef>
#include <optional>

#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "flare/plan/plan.h"
#include "kernels/decode_params.cuh"

namespace flare::api_detail {

// The section offsets of `layout` as the kernels read them (the partial-state pointers are
// the Workspace's: run_support.h).
WorkspaceOffsets offsets_of(const WorkspaceLayout& layout);

// Pinned host memory holding one plan region, and the event of its last copy to the device.
class PlanStaging {
 public:
  PlanStaging() = default;
  // Needs a current context (the buffer is pinned and the event recorded under it).
  explicit PlanStaging(size_t plan_bytes);

  // The buffer, to write the next plan region into, once the previous copy out of it is done
  // (it may still be queued behind kernels).
  std::byte* acquire();
  // Queues the copy of the plan region, laid out as `layout` and holding `num_work_items`
  // items, to the head of `workspace` on `stream`: everything but the work-item section's
  // unused tail, which is sized for the bounds (a prefill region bounded by max_total_qo x
  // H_qo items is tens of MB; copying it whole took ~2.4 ms of copy engine per plan, H200).
  void copy_to(void* workspace, const WorkspaceLayout& layout, int64_t num_work_items,
               cuda::Stream stream);

 private:
  cuda::PinnedBuffer buffer_;
  std::optional<cuda::Event> copied_;
};

}  // namespace flare::api_detail
