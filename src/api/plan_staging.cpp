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

void PlanStaging::copy_to(void* workspace, cuda::Stream stream) {
  cuda::memcpy_htod_async(workspace, buffer_.data(), buffer_.bytes(), stream);
  copied_->record(stream);
}

}  // namespace flare::api_detail
