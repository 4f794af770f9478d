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

// Pinned host memory for the plan region, two buffers used in turn, and the event of each
// one's last copy to the device. With one buffer, plan() waited for the previous plan's copy,
// which is queued behind the kernels already on the stream: planning step N + 1 while step N
// runs (a serving loop's overlap) blocked until step N's kernels ended, and back-to-back plans
// paid the copy's latency (decode batch 256, H200: 11 us of a 53 us plan). The second buffer
// is allocated at the second plan, so a BatchDecode planned once holds one.
class PlanStaging {
 public:
  PlanStaging() = default;
  // Needs a current context (the buffers are pinned and the events recorded under it).
  explicit PlanStaging(size_t plan_bytes);

  // The next buffer, to write the next plan region into, once the copy out of it two plans
  // ago is done (the previous plan's copy may still be queued). Needs a current context.
  std::byte* acquire();
  // Queues the copy of the plan region in the buffer acquire() returned, laid out as `layout`
  // and holding `num_work_items` items, to the head of `workspace` on `stream`: everything but
  // the work-item section's unused tail, which is sized for the bounds (a prefill region
  // bounded by max_total_qo x H_qo items is tens of MB; copying it whole took ~2.4 ms of copy
  // engine per plan, H200).
  void copy_to(void* workspace, const WorkspaceLayout& layout, int64_t num_work_items,
               cuda::Stream stream);

 private:
  struct Buffer {
    cuda::PinnedBuffer memory;
    std::optional<cuda::Event> copied;
  };
  size_t plan_bytes_ = 0;
  Buffer buffers_[2];
  int current_ = 1;  // the first acquire() takes buffer 0
};

}  // namespace flare::api_detail
