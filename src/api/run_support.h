// What BatchDecode and BatchPrefill share around run(): the workspace whose partial-state
// scratch may be the caller's buffer, validation mode (page ids checked on the host before a
// launch), and the environment switch FLARE_VALIDATE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "flare/api/index_errors.h"
#include "flare/core/tensor.h"
#include "flare/jit/cuda_driver.h"
#include "flare/plan/plan.h"
#include "kernels/decode_params.cuh"
#include "src/api/plan_staging.h"

namespace flare::api_detail {

// True when the environment variable FLARE_VALIDATE is set to a value other than "0".
bool validate_from_env();

// The device workspace of one object: the plan region (its own allocation) and the partial
// states' scratch (the caller's buffer when given, else part of the same allocation), sized
// for a number of partial slots that may grow between plans outside CUDA-graph mode.
class Workspace {
 public:
  Workspace() = default;
  // `what`: the owner's name for messages. `bounds.max_partial_slots` is the initial capacity
  // (0: the default 2 x num_ctas). Throws kInvalidArgument when a caller scratch cannot hold
  // it (naming `scratch_name`, e.g. "scratch").
  Workspace(const char* what, const WorkspaceBounds& bounds, void* scratch, size_t scratch_bytes);

  const WorkspaceLayout& layout() const { return layout_; }
  std::byte* plan_region() const { return static_cast<std::byte*>(own_.data()); }
  unsigned char* device() const { return static_cast<unsigned char*>(own_.data()); }
  PlanStaging& staging() { return staging_; }
  // The kernels' offsets, the partial-state pointers included.
  WorkspaceOffsets offsets() const;
  size_t own_bytes() const { return own_.bytes(); }
  // The most partial slots the scratch can ever hold (the caller's buffer's size; unbounded
  // for an own one).
  int64_t slot_capacity() const { return slot_capacity_; }
  // Reallocates for at least `slots` partial slots (doubling), keeping the caller's scratch.
  // Pointers into the workspace change: only outside CUDA-graph mode.
  void grow(int64_t slots);

 private:
  void allocate(int64_t slots);

  const char* what_ = "";
  WorkspaceBounds bounds_;
  WorkspaceLayout layout_;
  cuda::DeviceBuffer own_;
  unsigned char* scratch_ = nullptr;  // the caller's, or null
  size_t scratch_bytes_ = 0;
  int64_t slot_capacity_ = 0;
  PlanStaging staging_;
};

// An entry of a page-id array holding an id outside the cache, and that id.
struct BadPageId {
  int64_t entry = 0;
  int32_t value = 0;
};

// The first entry in [begin, end) of the int32 page ids at `device_ids` whose id lies outside
// [0, num_pages), copying the range to the host (the caller has synchronized with the ids'
// writers). nullopt when every id is in range.
std::optional<BadPageId> find_bad_page_id(const int32_t* device_ids, int64_t begin, int64_t end,
                                          int64_t num_pages);

// Validation mode: copies page ids [0, count) of `indices` (int32, on the device) to the host,
// synchronizing `stream`, and throws kIndexOutOfRange naming the first id outside
// [0, num_pages) with its request (found through kv_indptr, which holds count at its end).
void validate_page_ids(const TensorView& indices, std::span<const int32_t> kv_indptr,
                       int64_t num_pages, const IndexNames& names, cuda::Stream stream);

}  // namespace flare::api_detail
