// The plan region's way to the GPU shared by BatchDecode and BatchPrefill: the pinned staging
// buffers (two, in turn), one async copy per plan, and the WorkspaceLayout -> WorkspaceOffsets
// conversion.
#include "src/api/plan_staging.h"

namespace flare::api_detail {

WorkspaceOffsets offsets_of(const WorkspaceLayout& layout) {
  WorkspaceOffsets o{};
  o.counts = static_cast<int64_t>(layout.counts);
  o.cta_indptr = static_cast<int64_t>(layout.cta_indptr);
  o.work_items = static_cast<int64_t>(layout.work_items);
  o.merge_indptr = static_cast<int64_t>(layout.merge_indptr);
  o.merge_items = static_cast<int64_t>(layout.merge_items);
  o.merge_slots = static_cast<int64_t>(layout.merge_slots);
  o.partial_rows = layout.max_query_tile;
  return o;
}

PlanStaging::PlanStaging(size_t plan_bytes) : plan_bytes_(plan_bytes) {
  buffers_[0].memory = cuda::PinnedBuffer(plan_bytes);
  buffers_[0].copied.emplace();
}

std::byte* PlanStaging::acquire() {
  current_ ^= 1;
  Buffer& buffer = buffers_[current_];
  if (!buffer.copied) {  // the second buffer, at the second plan
    buffer.memory = cuda::PinnedBuffer(plan_bytes_);
    buffer.copied.emplace();
  }
  buffer.copied->synchronize();
  return buffer.memory.data();
}

void PlanStaging::copy_to(void* workspace, const WorkspaceLayout& layout, int64_t num_work_items,
                          cuda::Stream stream) {
  Buffer& buffer = buffers_[current_];
  // Sections in order (workspace_layout): counts, cta_indptr, work_items, then the merge map
  // and the executor records up to plan_bytes.
  const size_t items_end =
      layout.work_items + static_cast<size_t>(num_work_items) * sizeof(WorkItem);
  const size_t skipped = layout.merge_indptr - items_end;
  // One copy unless the tail is large: a second driver call costs ~1.5 us of host time.
  constexpr size_t kSplitAbove = 256 * 1024;
  auto* dst = static_cast<std::byte*>(workspace);
  const std::byte* src = buffer.memory.data();
  if (skipped <= kSplitAbove) {
    cuda::memcpy_htod_async(dst, src, buffer.memory.bytes(), stream);
  } else {
    cuda::memcpy_htod_async(dst, src, items_end, stream);
    cuda::memcpy_htod_async(dst + layout.merge_indptr, src + layout.merge_indptr,
                            layout.plan_bytes - layout.merge_indptr, stream);
  }
  buffer.copied->record(stream);
}

}  // namespace flare::api_detail
