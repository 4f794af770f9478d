// The load-balanced, deterministic scheduler (papers 001 §3.3, Algorithm 1; 002 appendix D):
// a pure host function from per-request lengths to typed per-CTA work queues and a merge
// map. The same call answers "is this supported?" and "how many workspace bytes?".
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/plan_types.cuh"

namespace flare {

// The device as the planner sees it; tests use any values.
struct DeviceSpec {
  int num_sms = 132;
  int ctas_per_sm = 1;  // CTAs of the kernel in question resident at once on an SM
};

// Everything the planner needs, on the host (no device-to-host sync).
struct PlanProblem {
  std::span<const int32_t> qo_len;  // per request, >= 0
  std::span<const int32_t> kv_len;  // per request, >= 0
  int num_qo_heads = 0;
  int num_kv_heads = 0;  // divides num_qo_heads
  int head_dim_qk = 0;
  int head_dim_vo = 0;
  int page_size = 1;  // KV chunk boundaries are multiples of it
  bool causal = false;
  int window_left = -1;
  // Optional, per request: the KV position of query token 0 (what causal and window masks
  // measure from). Empty: kv_len - qo_len (bottom-right alignment). Cascade plans give a
  // causal kernel's shared levels kv_len - 1, so every key is visible (plan/cascade.h).
  std::span<const int32_t> q_offset;
};

inline constexpr int kMaxPlanWaves = 16;  // PlanOptions::waves

struct PlanOptions {
  int query_tile = 0;             // rows per tile (packed); 0 = auto from {1, 16, 32, 64, 128}
  int fixed_split_size = 0;       // > 0: every KV chunk has this many tokens, rounded up to a
                                  // multiple of page_size (batch invariance)
  bool disable_split_kv = false;  // one chunk per tile (also for variants without softmax)
  int num_sms_to_use = 0;         // 0 = all; fewer leaves SMs to overlapped work (002 appendix E)
  // Grid of `waves` x the resident CTAs (num_sms * ctas_per_sm), in [1, 16]. With more than
  // one, KV is cut into chunks as for the resident CTAs alone, the chunks are scheduled longest
  // first over all CTAs of the grid and no fill split is made: the hardware starts a CTA
  // whenever a resident one ends, in CTA order, so SMs that stream faster run more CTAs
  // (a dynamic balance a static plan cannot give when SMs differ in speed; docs/perf.md,
  // decode v14). The longest chunks are the first items of the lowest CTAs, which start
  // first. Meant for batches whose tiles outnumber the resident CTAs: fewer tiles are better
  // cut by a single wave's fill splits.
  int waves = 1;
  // Cost of a chunk: alpha * rows + beta * KV tokens + item_cost, in fixed point with 16
  // fraction bits (so loads add exactly). Each in [0, 2^20], alpha or beta >= 2^-16.
  float alpha = 1.0f;      // cost per query row of a chunk
  float beta = 1.0f;       // cost per KV token of a chunk
  float item_cost = 0.0f;  // fixed cost of every work item (queue entry), whatever its size:
                           // what a kernel pays per item in memory round trips its KV cannot
                           // hide; it keeps fill splits from piling short tails on a CTA
  // Rates of the kernel for one-queue plans' split decision; all 0 (the default) = off. A CTA
  // completes at most `cta` cost units a microsecond, all CTAs together at most `device`
  // (memory-bound kernels: the memory's bandwidth, shared by the CTAs still busy), and a plan
  // with partial slots costs `merge_us` more (the partial states and the merge launch). When
  // set and every tile has the same rows and KV length (decode-like batches, where the choice
  // pays), a one-queue plan that Algorithm 1 would cut is compared with the queue of whole
  // tiles: the CTAs' loads of each, replayed in order of their ends with the CTAs still busy
  // sharing the rates, and the faster kept; the whole queue without running Algorithm 1 when
  // it ends within merge_us of all the work at the CTAs' joint rate (docs/perf.md,
  // twenty-fifth and twenty-sixth sessions: the replay orders every split decision measured on
  // q1 batches of 40-300 on an H200).
  struct QueueRates {
    double cta = 0;
    double device = 0;
    double merge_us = 0;
  } queue_rates;
  // Plan for a kernel whose CTAs take the work items from one queue in array order (BatchPrefill)
  // instead of from per-CTA lists; see "One-queue plans" at Plan. kv_tile (>= 1): the KV rows
  // the kernel loads per step, the unit of the queue order's length classes.
  bool one_queue = false;
  int kv_tile = 0;
};

// Upper bounds fixed at wrapper creation; they fix every workspace section's offset.
struct WorkspaceBounds {
  int max_batch = 0;
  int max_total_qo = 0;        // total query tokens of one plan
  int max_total_kv_pages = 0;  // recorded for the wrapper's own page-table buffers
  int num_ctas = 0;            // DeviceSpec num_sms * ctas_per_sm * PlanOptions waves
  int max_query_tile = 0;
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim_vo = 0;
  // Records the executor keeps inside the plan region, so the same one copy moves them: one of
  // executor_cta_bytes per CTA and one of executor_item_bytes per work item (BatchDecode: each
  // CTA's queue with its first item, each item's request page range and partial slots).
  size_t executor_cta_bytes = 0;
  size_t executor_item_bytes = 0;
  // And max_batch + 1 records of executor_request_bytes (BatchPrefill: the request tables it
  // reads instead of the caller's device arrays).
  size_t executor_request_bytes = 0;
  // Partial slots for the chunks of split tiles: 0 = 2 * num_ctas, which every plan without
  // fixed_split_size fits (002 D.3). More let fixed_split_size plans of more chunks fit; see
  // partial_slots_fitting().
  int64_t max_partial_slots = 0;
  // Merge items and merge_slots entries (0 = the defaults: one item per split tile, one entry
  // per partial slot). Cascade plans (plan/cascade.h) merge pieces of rows whose slots several
  // items share: BatchPrefill sizes both for them when created with max_levels > 1.
  int64_t max_merge_items = 0;
  int64_t max_merge_slots = 0;
  int64_t max_work_items = 0;  // 0 = one per (tile, KV head) plus the partial slots
};

// Byte offsets of the sections of one workspace buffer (256-byte aligned). The plan region
// [0, plan_bytes) is what one host-to-device copy moves each plan.
struct WorkspaceLayout {
  size_t counts = 0;          // PlanCounts
  size_t cta_indptr = 0;      // int32 [num_ctas + 1]
  size_t work_items = 0;      // WorkItem [max_work_items]
  size_t merge_indptr = 0;    // int32 [max_merge_items + 1]
  size_t merge_items = 0;     // MergeItem [max_merge_items]
  size_t merge_slots = 0;     // int32 [max_merge_slots]: partial row bases (see Plan)
  size_t executor_ctas = 0;   // [num_ctas] records of executor_cta_bytes, executor-written
  size_t executor_items = 0;  // [max_work_items] records of executor_item_bytes, executor-written
  size_t executor_requests = 0;  // [max_batch + 1] records of executor_request_bytes
  size_t plan_bytes = 0;         // end of the plan region
  // The partial states, [partial_o, total_bytes): the "scratch" that may live in a separate
  // buffer of scratch_bytes() (FlashInfer's float workspace), at the same relative offsets.
  size_t partial_o = 0;    // float32 [max_partial_slots][max_query_tile][head_dim_vo]
  size_t partial_lse = 0;  // float32 [max_partial_slots][max_query_tile]
  size_t total_bytes = 0;
  size_t scratch_bytes() const { return total_bytes - partial_o; }

  int64_t max_work_items = 0;
  int64_t max_merge_items = 0;
  int64_t max_merge_slots = 0;
  // Each slot holds one tile (max_query_tile packed rows of one KV head). Chunks of split
  // tiles number at most 2 * num_ctas when L_kv >= total work / num_ctas (002 D.3), so
  // 2 * num_ctas slots: 2 * #CTA * T_q * (D + 1) floats, within the paper's bound.
  int64_t max_partial_slots = 0;
  int max_query_tile = 0;
  int head_dim_vo = 0;
  int num_ctas = 0;
};

WorkspaceLayout workspace_layout(const WorkspaceBounds& bounds);

// The most partial slots whose scratch (WorkspaceLayout::scratch_bytes) fits `scratch_bytes`
// under `bounds` (its max_partial_slots ignored); 0 when not even one does.
int64_t partial_slots_fitting(const WorkspaceBounds& bounds, size_t scratch_bytes);

struct Plan {
  int num_ctas = 0;
  int query_tile = 0;    // packed rows per tile
  int group_size = 0;    // num_qo_heads / num_kv_heads
  int num_kv_heads = 0;  // with head_dim_vo: what check_fits and executors verify
  int head_dim_vo = 0;
  bool split_kv = true;             // false: planned with disable_split_kv (one work item per tile)
  int64_t kv_chunk = 0;             // L_kv: the largest chunk, tokens
  std::vector<int32_t> cta_indptr;  // [num_ctas + 1] into work_items
  std::vector<WorkItem> work_items;   // grouped by CTA, in execution order
  std::vector<int32_t> merge_indptr;  // [merge_items.size() + 1] into merge_slots
  std::vector<MergeItem> merge_items;
  // Partial slots are numbered tile by tile in KV order: merge item i owns exactly the slots
  // [merge_indptr[i], merge_indptr[i + 1]), so merge_slots[s] == s (the decode kernel reads a
  // tile's partial states as one contiguous range); not with item_heads > 1, see below.
  std::vector<int32_t> merge_slots;
  // Cascade plans only (plan/cascade.h; empty otherwise, meaning all 0): the first row of
  // merge item i's rows inside each of its slots, one per merge_slots entry. A merge item there
  // is a piece of rows that a shared level's tile covers from some row on, and one slot may
  // serve several merge items. The workspace stages each entry as the partial row
  // slot * max_query_tile + offset (kernels/merge.cuh reads row bases).
  std::vector<int32_t> merge_row_offsets;
  // KV heads one merge item covers (cascade plans of all-head work items; 1 otherwise): item i
  // stands for the merges under KV heads kv_head + h, h < merge_heads, whose slots are its
  // merge_slots entries + h (slots numbered head minor, as item_heads > 1 plans number them).
  int merge_heads = 1;
  int32_t num_partial_slots = 0;
  std::vector<double> cta_cost;  // alpha * rows + beta * kv + item_cost per CTA (balance)
  // KV heads one work item covers: item i stands for the queue entries i * item_heads + h,
  // h < item_heads, each the item under KV head kv_head + h writing partial slot
  // partial_slot + h when split. 1 except in one-queue plans: num_kv_heads (the queue of
  // chunks) or a divisor of it (Algorithm 1's pieces over head groups; see plan() below).
  int item_heads = 1;
  // One-queue plans of items over every KV head (item_heads > 1) and tiles above 16 rows: the
  // queue takes every item under the first head, then every item under the next (entry e: item
  // e % items under kv_head + e / items) instead of an item's heads one after another, where
  // that order's bound on the latest end (queue_ends_near_mean's) is within Algorithm 1's fill
  // slack of the head-minor order's. The entries running at one time then read one head's K/V,
  // not every head's (block-sparse 64 x 64 at 16384 tokens, 32 heads: 256 MB of K/V against
  // 50 MB of L2; 1.23-1.47x faster, docs/perf.md thirty-third session). Decode-shaped 16-row
  // tiles read their K/V once and keep the head-minor order.
  bool head_major_queue = false;

  PlanCounts counts() const;
};

// One-queue plans (PlanOptions::one_queue). The kernel's CTAs take queue entries in order (CTA c
// entry c first, then each the next entry when it ends the last), so a static assignment is
// moot: the work items are in queue order, cta_indptr splits them into num_ctas near-equal
// ranges (for executors that run CTAs) and cta_cost is empty. The queue order makes the entries
// running at one time share K/V in L2:
// length classes (powers of two of kv_tile), longest class first so the launch ends on its
// shortest entries, then request, KV head, later rows first (the longer ones, causal) and KV
// order. An LRU model of a 50 MB L2 (scripts/prefill_l2_model.py) hits on 50 / 83 / 96% of K/V
// tile reads at causal b16 H16 seq 1024 / 4096 / 16384, against 10 / 3 / 3% in longest-first
// order, with the same makespan (docs/perf.md, prefill v2).
// When the longest chunk costs at most 1/8 of a CTA's mean load, the dynamic queue alone
// balances (no CTA ends more than one entry after the mean) and Algorithm 1 is skipped: chunks
// are cut at the multiples of L_kv and every item covers all KV heads (item_heads =
// num_kv_heads, KV head minor in the queue: the model's hits become 50 / 83 / 83%), so a
// batch of many tiles plans and copies num_kv_heads times fewer items. Where the longest entry
// is short enough that any order ends near the mean, the queue is KV head major instead
// (head_major_queue; experiments/queue_order_l2_model.py: block-sparse 64 x 64 at 16384 tokens,
// 32 heads, density 0.9: 35 -> 99.6% hits). Split chunks then number
// their slots head minor (merge_slots is no longer the identity). Otherwise (few or skewed
// tiles) the queue is still taken when, under the cost model, its own order ends within
// Algorithm 1's fill target (2% above the mean load plus one item's rows and item_cost): each
// entry starts no later than the cost before it spread over the CTAs, one pass bounds the
// latest end (a long causal request, b1 q4096 on 132 CTAs: 17 -> 1.5 us). Else Algorithm 1
// runs over groups of g KV heads on num_ctas / g CTAs, g the largest divisor of num_kv_heads
// that divides num_ctas (an item's heads are consecutive entries, so they start together on g
// CTAs: the per-head schedule's g-fold symmetric form, the same pieces where both were compared,
// g times fewer to assign): where it makes fill splits, its pieces (item_heads = g, each
// writing g consecutive partial slots when split) in the queue order (NVFP4 b64 q1 kv2048, 8
// heads on 396 CTAs: 227 items of 4 heads, plan 18.5 -> 6.3 us); where it makes none, the queue
// of its chunks as above (b64 q1 kv2048 on 264 CTAs: 64 items).
//
// Throws kUnsupported / kInvalidArgument with a message for problems no kernel handles.
Plan plan(const PlanProblem& problem, const DeviceSpec& device, const PlanOptions& options = {});
// The same into `out`, reusing its vectors' storage (plan() once per decode step allocates
// nothing in steady state).
void plan(const PlanProblem& problem, const DeviceSpec& device, const PlanOptions& options,
          Plan& out);

// Throws kWorkspaceTooSmall ("plan needs N bytes of section X, workspace has M") when the
// plan does not fit the sections of `layout`.
void check_fits(const Plan& plan, const WorkspaceLayout& layout);

// Writes the plan region of the workspace (counts, cta_indptr, work items, merge map) into
// `host_region`, which is at least layout.plan_bytes long (a pinned buffer in GPU use).
void write_plan_region(const Plan& plan, const WorkspaceLayout& layout, std::byte* host_region);

}  // namespace flare
