// The plan region's way to the GPU shared by BatchDecode and BatchPrefill: the pinned staging
// buffer, its one async copy per plan, and the WorkspaceLayout -> WorkspaceOffsets conversion.
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

PlanStaging::PlanStaging(size_t plan_bytes) : buffer_(plan_bytes) { copied_.emplace(); }

std::byte* PlanStaging::acquire() {
  copied_->synchronize();
  return buffer_.data();
}

void PlanStaging::copy_to(void* workspace, const WorkspaceLayout& layout, int64_t num_work_items,
                          cuda::Stream stream) {
  // Sections in order (workspace_layout): counts, cta_indptr, work_items, then the merge map
  // and the executor records up to plan_bytes.
  const size_t items_end =
      layout.work_items + static_cast<size_t>(num_work_items) * sizeof(WorkItem);
  const size_t skipped = layout.merge_indptr - items_end;
  // One copy unless the tail is large: a second driver call costs ~1.5 us of host time.
  constexpr size_t kSplitAbove = 256 * 1024;
  auto* dst = static_cast<std::byte*>(workspace);
  if (skipped <= kSplitAbove) {
    cuda::memcpy_htod_async(dst, buffer_.data(), buffer_.bytes(), stream);
  } else {
    cuda::memcpy_htod_async(dst, buffer_.data(), items_end, stream);
    cuda::memcpy_htod_async(dst + layout.merge_indptr, buffer_.data() + layout.merge_indptr,
                            layout.plan_bytes - layout.merge_indptr, stream);
  }
  copied_->record(stream);
}

}  // namespace flare::api_detail
