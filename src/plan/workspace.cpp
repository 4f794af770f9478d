// The workspace: section offsets fixed by WorkspaceBounds (so CUDA-graph pointers stay valid,
// 002 D.1), the check that a plan fits them, and the serialized plan region.
#include <algorithm>
#include <cstring>
#include <limits>

#include "flare/core/error.h"
#include "flare/plan/plan.h"

namespace flare {
namespace {

constexpr size_t kSectionAlignment = 256;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Sections larger than this are a configuration error, and no offset arithmetic can overflow.
constexpr int64_t kMaxSectionBytes = int64_t{1} << 50;

size_t align_up(size_t offset) {
  return (offset + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment;
}

size_t section_bytes(int64_t count, size_t element_bytes, const char* section) {
  const auto element = static_cast<int64_t>(element_bytes);
  FLARE_CHECK(count <= kMaxSectionBytes / element, ErrorCode::kInvalidArgument,
              "workspace_layout: section ", section, " would need ", count, " x ", element,
              " bytes, more than ", kMaxSectionBytes);
  return static_cast<size_t>(count * element);
}

// Appends a section of `bytes` at the next aligned offset; returns its offset.
size_t place(size_t& end, size_t bytes) {
  const size_t offset = align_up(end);
  end = offset + bytes;
  return offset;
}

}  // namespace

WorkspaceLayout workspace_layout(const WorkspaceBounds& bounds) {
  FLARE_CHECK(bounds.max_batch >= 0 && bounds.max_total_qo >= 0 && bounds.max_total_kv_pages >= 0,
              ErrorCode::kInvalidArgument,
              "workspace_layout: max_batch, max_total_qo and max_total_kv_pages must be >= 0, got ",
              bounds.max_batch, ", ", bounds.max_total_qo, ", ", bounds.max_total_kv_pages);
  FLARE_CHECK(bounds.num_ctas >= 1 && bounds.num_ctas <= kInt32Max / 2, ErrorCode::kInvalidArgument,
              "workspace_layout: num_ctas must be in [1, ", kInt32Max / 2, "], got ",
              bounds.num_ctas);
  FLARE_CHECK(bounds.max_query_tile >= 1 && bounds.head_dim_vo >= 1, ErrorCode::kInvalidArgument,
              "workspace_layout: max_query_tile and head_dim_vo must be >= 1, got ",
              bounds.max_query_tile, " and ", bounds.head_dim_vo);
  FLARE_CHECK(bounds.num_qo_heads >= 1 && bounds.num_kv_heads >= 1 &&
                  bounds.num_qo_heads % bounds.num_kv_heads == 0,
              ErrorCode::kInvalidArgument,
              "workspace_layout: num_kv_heads must be >= 1 and divide num_qo_heads, got "
              "num_qo_heads=",
              bounds.num_qo_heads, " num_kv_heads=", bounds.num_kv_heads);

  WorkspaceLayout layout;
  layout.num_ctas = bounds.num_ctas;
  layout.max_query_tile = bounds.max_query_tile;
  layout.head_dim_vo = bounds.head_dim_vo;
  // Partial slots: a split tile of length l > L_kv >= W / #CTA has ceil(l / L_kv) < 2 l / L_kv
  // chunks, so the chunks of all split tiles number fewer than 2 W / L_kv <= 2 #CTA (002 D.3);
  // plan() keeps its fill splits and windowed tiles inside the same budget.
  FLARE_CHECK(bounds.max_partial_slots >= 0 && bounds.max_partial_slots <= kInt32Max,
              ErrorCode::kInvalidArgument, "workspace_layout: max_partial_slots must be in [0, ",
              kInt32Max, "], got ", bounds.max_partial_slots);
  layout.max_partial_slots =
      bounds.max_partial_slots > 0 ? bounds.max_partial_slots : int64_t{2} * bounds.num_ctas;
  // Merge items: one per split tile, and each split tile owns at least two slots.
  // Tiles: a tile holds at least one packed row (query tile >= 1), so there are at most
  // max_total_qo * group * num_kv_heads = max_total_qo * num_qo_heads of them (reached with
  // query_tile 1). Work items: each tile is one item, plus (chunks - 1) per split tile, which
  // sums to (split chunks) - (split tiles) <= 2 #CTA - 1. Counts are int32, so no plan has
  // more than int32 max items.
  const int64_t max_tiles = int64_t{bounds.max_total_qo} * bounds.num_qo_heads;
  layout.max_merge_items = std::min<int64_t>(
      std::max<int64_t>(bounds.num_ctas, layout.max_partial_slots / 2), max_tiles);
  FLARE_CHECK(bounds.max_merge_items >= 0 && bounds.max_merge_items <= kInt32Max &&
                  bounds.max_merge_slots >= 0 && bounds.max_merge_slots <= kInt32Max,
              ErrorCode::kInvalidArgument,
              "workspace_layout: max_merge_items and max_merge_slots must be in [0, ", kInt32Max,
              "], got ", bounds.max_merge_items, " and ", bounds.max_merge_slots);
  if (bounds.max_merge_items > 0) layout.max_merge_items = bounds.max_merge_items;
  layout.max_merge_slots =
      bounds.max_merge_slots > 0 ? bounds.max_merge_slots : layout.max_partial_slots;
  layout.max_work_items =
      max_tiles == 0 ? 0 : std::min(kInt32Max, max_tiles + layout.max_partial_slots - 1);
  FLARE_CHECK(bounds.max_work_items >= 0 && bounds.max_work_items <= kInt32Max,
              ErrorCode::kInvalidArgument, "workspace_layout: max_work_items must be in [0, ",
              kInt32Max, "], got ", bounds.max_work_items);
  if (bounds.max_work_items > 0) layout.max_work_items = bounds.max_work_items;

  size_t end = 0;
  layout.counts = place(end, sizeof(PlanCounts));
  layout.cta_indptr =
      place(end, section_bytes(int64_t{bounds.num_ctas} + 1, sizeof(int32_t), "cta_indptr"));
  layout.work_items =
      place(end, section_bytes(layout.max_work_items, sizeof(WorkItem), "work_items"));
  layout.merge_indptr =
      place(end, section_bytes(layout.max_merge_items + 1, sizeof(int32_t), "merge_indptr"));
  layout.merge_items =
      place(end, section_bytes(layout.max_merge_items, sizeof(MergeItem), "merge_items"));
  layout.merge_slots =
      place(end, section_bytes(layout.max_merge_slots, sizeof(int32_t), "merge_slots"));
  FLARE_CHECK(bounds.executor_cta_bytes <= 4096 && bounds.executor_item_bytes <= 4096 &&
                  bounds.executor_request_bytes <= 4096,
              ErrorCode::kInvalidArgument,
              "workspace_layout: executor records must be <= 4096 bytes, got executor_cta_bytes=",
              bounds.executor_cta_bytes, " executor_item_bytes=", bounds.executor_item_bytes,
              " executor_request_bytes=", bounds.executor_request_bytes);
  layout.executor_ctas =
      place(end, section_bytes(bounds.num_ctas, bounds.executor_cta_bytes, "executor_ctas"));
  layout.executor_items = place(
      end, section_bytes(layout.max_work_items, bounds.executor_item_bytes, "executor_items"));
  layout.executor_requests =
      place(end, section_bytes(int64_t{bounds.max_batch} + 1, bounds.executor_request_bytes,
                               "executor_requests"));
  layout.plan_bytes = end;
  const int64_t slot_rows = layout.max_partial_slots * bounds.max_query_tile;
  const int64_t slot_floats = slot_rows <= kMaxSectionBytes / bounds.head_dim_vo
                                  ? slot_rows * bounds.head_dim_vo
                                  : kMaxSectionBytes;  // section_bytes reports it
  layout.partial_o = place(end, section_bytes(slot_floats, sizeof(float), "partial_o"));
  layout.partial_lse = place(end, section_bytes(slot_rows, sizeof(float), "partial_lse"));
  layout.total_bytes = align_up(end);
  return layout;
}

int64_t partial_slots_fitting(const WorkspaceBounds& bounds, size_t scratch_bytes) {
  const int64_t slot_bytes =
      int64_t{bounds.max_query_tile} * (int64_t{bounds.head_dim_vo} + 1) * int64_t{sizeof(float)};
  if (slot_bytes <= 0) return 0;
  // The slots' own bytes bound the count from above; alignment gaps take at most one more.
  int64_t slots = std::min<int64_t>(kInt32Max, static_cast<int64_t>(scratch_bytes) / slot_bytes);
  WorkspaceBounds b = bounds;
  while (slots > 0) {
    b.max_partial_slots = slots;
    if (workspace_layout(b).scratch_bytes() <= scratch_bytes) return slots;
    --slots;
  }
  return 0;
}

void check_fits(const Plan& plan, const WorkspaceLayout& layout) {
  FLARE_CHECK(
      plan.num_ctas >= 1 && plan.cta_indptr.size() == static_cast<size_t>(plan.num_ctas) + 1 &&
          plan.merge_indptr.size() == plan.merge_items.size() + 1 &&
          (plan.merge_row_offsets.empty()
               ? plan.merge_slots.size() == static_cast<size_t>(plan.num_partial_slots)
               : plan.merge_row_offsets.size() == plan.merge_slots.size()),
      ErrorCode::kInvalidArgument, "check_fits: not a plan from plan(): num_ctas=", plan.num_ctas,
      " with ", plan.cta_indptr.size(), " cta_indptr entries, ", plan.merge_items.size(),
      " merge items with ", plan.merge_indptr.size(), " merge_indptr entries, ",
      plan.num_partial_slots, " partial slots with ", plan.merge_slots.size(), " merge slots and ",
      plan.merge_row_offsets.size(), " row offsets");
  FLARE_CHECK(plan.num_ctas <= layout.num_ctas, ErrorCode::kWorkspaceTooSmall, "plan needs ",
              plan.num_ctas, " CTAs, workspace has ", layout.num_ctas);
  FLARE_CHECK(plan.query_tile <= layout.max_query_tile, ErrorCode::kWorkspaceTooSmall,
              "plan needs query tiles of ", plan.query_tile, " rows, workspace partial slots hold ",
              layout.max_query_tile);
  FLARE_CHECK(plan.head_dim_vo <= layout.head_dim_vo, ErrorCode::kWorkspaceTooSmall,
              "plan needs head_dim_vo ", plan.head_dim_vo, ", workspace partial slots hold ",
              layout.head_dim_vo);
  const int64_t slot_bytes =
      int64_t{layout.max_query_tile} * (int64_t{layout.head_dim_vo} + 1) * int64_t{sizeof(float)};
  const int64_t slots = plan.num_partial_slots;
  FLARE_CHECK(slots <= layout.max_partial_slots, ErrorCode::kWorkspaceTooSmall, "plan needs ",
              slots, " partial slots (", slots * slot_bytes, " bytes), workspace has ",
              layout.max_partial_slots, " (", layout.max_partial_slots * slot_bytes, " bytes)");
  const auto work_items = static_cast<int64_t>(plan.work_items.size());
  FLARE_CHECK(work_items <= layout.max_work_items, ErrorCode::kWorkspaceTooSmall, "plan needs ",
              work_items, " work items (", work_items * int64_t{sizeof(WorkItem)},
              " bytes), workspace has ", layout.max_work_items, " (",
              layout.max_work_items * int64_t{sizeof(WorkItem)}, " bytes)");
  const auto merge_items = static_cast<int64_t>(plan.merge_items.size());
  FLARE_CHECK(merge_items <= layout.max_merge_items, ErrorCode::kWorkspaceTooSmall, "plan needs ",
              merge_items, " merge items (", merge_items * int64_t{sizeof(MergeItem)},
              " bytes), workspace has ", layout.max_merge_items, " (",
              layout.max_merge_items * int64_t{sizeof(MergeItem)}, " bytes)");
  const auto merge_slots = static_cast<int64_t>(plan.merge_slots.size());
  FLARE_CHECK(merge_slots <= layout.max_merge_slots, ErrorCode::kWorkspaceTooSmall, "plan needs ",
              merge_slots, " merge slot entries, workspace has ", layout.max_merge_slots);
}

void write_plan_region(const Plan& plan, const WorkspaceLayout& layout, std::byte* host_region) {
  check_fits(plan, layout);
  const PlanCounts counts = plan.counts();
  std::memcpy(host_region + layout.counts, &counts, sizeof(counts));
  // The grid has layout.num_ctas CTAs whatever the plan used: the extra ones get empty ranges.
  std::byte* cta_indptr = host_region + layout.cta_indptr;
  std::memcpy(cta_indptr, plan.cta_indptr.data(), plan.cta_indptr.size() * sizeof(int32_t));
  for (size_t cta = plan.cta_indptr.size(); cta <= static_cast<size_t>(layout.num_ctas); ++cta) {
    std::memcpy(cta_indptr + cta * sizeof(int32_t), &plan.cta_indptr.back(), sizeof(int32_t));
  }
  std::memcpy(host_region + layout.work_items, plan.work_items.data(),
              plan.work_items.size() * sizeof(WorkItem));
  std::memcpy(host_region + layout.merge_indptr, plan.merge_indptr.data(),
              plan.merge_indptr.size() * sizeof(int32_t));
  std::memcpy(host_region + layout.merge_items, plan.merge_items.data(),
              plan.merge_items.size() * sizeof(MergeItem));
  // Partial row bases: the merge kernel reads row base + r, so a merge item may start inside
  // a slot (Plan::merge_row_offsets). int32: the partial_lse section's rows fit it.
  FLARE_CHECK(int64_t{plan.num_partial_slots} * layout.max_query_tile <= kInt32Max,
              ErrorCode::kUnsupported, "write_plan_region: ", plan.num_partial_slots,
              " partial slots of ", layout.max_query_tile, " rows exceed int32 row indices");
  auto* rows = reinterpret_cast<int32_t*>(host_region + layout.merge_slots);
  for (size_t i = 0; i < plan.merge_slots.size(); ++i) {
    const int64_t offset = plan.merge_row_offsets.empty() ? 0 : plan.merge_row_offsets[i];
    rows[i] = static_cast<int32_t>(int64_t{plan.merge_slots[i]} * layout.max_query_tile + offset);
  }
}

}  // namespace flare
