// The workspace with a caller's scratch, validation mode and FLARE_VALIDATE.
#include "src/api/run_support.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "flare/core/error.h"
#include "flare/jit/cuda_sync.h"

namespace flare::api_detail {

bool validate_from_env() {
  const char* value = std::getenv("FLARE_VALIDATE");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

Workspace::Workspace(const char* what, const WorkspaceBounds& bounds, void* scratch,
                     size_t scratch_bytes)
    : what_(what),
      bounds_(bounds),
      scratch_(static_cast<unsigned char*>(scratch)),
      scratch_bytes_(scratch_bytes) {
  FLARE_CHECK(scratch != nullptr || scratch_bytes == 0, ErrorCode::kInvalidArgument, what,
              ": scratch_bytes is ", scratch_bytes, " but scratch is null");
  const WorkspaceLayout initial = workspace_layout(bounds);
  if (scratch_ != nullptr) {
    FLARE_CHECK(reinterpret_cast<uintptr_t>(scratch) % 256 == 0, ErrorCode::kInvalidArgument, what,
                ": scratch must be 256-byte aligned");
    FLARE_CHECK(initial.scratch_bytes() <= scratch_bytes, ErrorCode::kInvalidArgument, what,
                ": the scratch buffer has ", scratch_bytes, " bytes; ", initial.max_partial_slots,
                " partial slots (the bound every plan without fixed_split_size fits) need ",
                initial.scratch_bytes());
    slot_capacity_ = partial_slots_fitting(bounds, scratch_bytes);
  } else {
    slot_capacity_ = std::numeric_limits<int32_t>::max();
  }
  allocate(initial.max_partial_slots);
}

void Workspace::allocate(int64_t slots) {
  WorkspaceBounds b = bounds_;
  b.max_partial_slots = slots;
  layout_ = workspace_layout(b);
  // The plan region, plus the scratch when the caller gave none.
  own_ = cuda::DeviceBuffer(scratch_ != nullptr ? layout_.plan_bytes : layout_.total_bytes);
  staging_ = PlanStaging(layout_.plan_bytes);
}

void Workspace::grow(int64_t slots) {
  FLARE_CHECK(slots <= slot_capacity_, ErrorCode::kWorkspaceTooSmall, what_, ": the plan needs ",
              slots, " partial slots, the scratch buffer (", scratch_bytes_, " bytes) holds ",
              slot_capacity_);
  int64_t capacity = layout_.max_partial_slots;
  while (capacity < slots) capacity *= 2;
  allocate(std::min(capacity, slot_capacity_));
}

WorkspaceOffsets Workspace::offsets() const {
  WorkspaceOffsets o = offsets_of(layout_);
  unsigned char* scratch =
      scratch_ != nullptr ? scratch_ : static_cast<unsigned char*>(own_.data()) + layout_.partial_o;
  o.partial_o = reinterpret_cast<float*>(scratch);
  o.partial_lse = reinterpret_cast<float*>(scratch + (layout_.partial_lse - layout_.partial_o));
  return o;
}

std::optional<BadPageId> find_bad_page_id(const int32_t* device_ids, int64_t begin, int64_t end,
                                          int64_t num_pages) {
  if (end <= begin) return std::nullopt;
  std::vector<int32_t> ids(static_cast<size_t>(end - begin));
  cuda::memcpy_dtoh(ids.data(), device_ids + begin, ids.size() * sizeof(int32_t));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_pages) {
      return BadPageId{begin + static_cast<int64_t>(i), ids[i]};
    }
  }
  return std::nullopt;
}

void validate_page_ids(const TensorView& indices, std::span<const int32_t> kv_indptr,
                       int64_t num_pages, const IndexNames& names, cuda::Stream stream) {
  const int64_t count = kv_indptr.empty() ? 0 : kv_indptr.back();
  if (count == 0) return;
  cuda::stream_synchronize(stream);  // the ids may be written by work queued before
  const std::optional<BadPageId> bad =
      find_bad_page_id(indices.ptr<const int32_t>(), 0, count, num_pages);
  if (!bad) return;
  IndexError error;
  error.kind = kIndexErrorPageId;
  error.request =
      std::upper_bound(kv_indptr.begin(), kv_indptr.end(), bad->entry) - kv_indptr.begin() - 1;
  error.entry = bad->entry;
  error.value = bad->value;
  error.count = 1;
  fail(ErrorCode::kIndexOutOfRange,
       describe_index_error(error, names, num_pages) + " [validation mode: nothing launched]");
}

}  // namespace flare::api_detail
