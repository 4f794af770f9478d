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
  // Queues the copy of the buffer to the head of `workspace` on `stream`.
  void copy_to(void* workspace, cuda::Stream stream);

 private:
  cuda::PinnedBuffer buffer_;
  std::optional<cuda::Event> copied_;
};

}  // namespace flare::api_detail
