// Plan records shared bit for bit by the host planner and the device kernels: plain structs
// of int32 (no CUDA headers), copied in one block into the workspace.
#pragma once

#include "fixed_width_ints.cuh"

namespace flare {

// One unit of a CTA's queue: packed rows [row_begin, row_end) of `request` under `kv_head`,
// against KV positions [kv_begin, kv_end). Packed row r = query token r / group, query head
// kv_head * group + r % group. partial_slot < 0: write straight to the final output
// (write-through, 002 D.2); otherwise write float32 partial O/LSE into slot `partial_slot`.
struct alignas(16) WorkItem {
  int32_t request;
  int32_t kv_head;
  int32_t row_begin;
  int32_t row_end;
  int32_t kv_begin;
  int32_t kv_end;
  int32_t partial_slot;
  int32_t reserved;  // 0 from the planner (BatchDecode stores the merge item); 32-byte record
};

// One split tile (or a cascade's piece of rows) to reduce: its rows and KV head; its partial
// slots are merge_slots[merge_indptr[i] .. merge_indptr[i + 1]) in increasing KV order, which
// the workspace holds as partial row bases (slot x max_query_tile + the piece's first row in
// the slot: plan/plan.h Plan::merge_row_offsets).
struct MergeItem {
  int32_t request;
  int32_t kv_head;
  int32_t row_begin;
  int32_t row_end;
};

// Counts the kernels read from device memory, so grids stay fixed across plans.
struct PlanCounts {
  int32_t num_work_items;
  int32_t num_merge_items;
  int32_t num_partial_slots;
  int32_t num_ctas;
  // KV heads per work item (plan/plan.h Plan::item_heads): a queue of num_work_items *
  // item_heads entries, entry e being work item e / item_heads under its KV head + e % item_heads.
  int32_t item_heads;
  // The most rows of any merge item: the merge kernel's (item, row) pairs per item (a decode
  // batch's split tiles and a cascade's pieces have one or a few rows, far below the slots').
  int32_t max_merge_rows;
  // KV heads a merge item covers (plan/plan.h Plan::merge_heads): item i under its KV head + h
  // reads the partial slots of its entries + h.
  int32_t merge_heads;
  // 1: the queue's entries KV head major (plan/plan.h Plan::head_major_queue): entry e is work
  // item e % num_work_items under its KV head + e / num_work_items. 0: KV head minor, as above.
  int32_t head_major;
};

}  // namespace flare
