// BatchPrefill::plan()'s host work, which needs no GPU: the index arrays' validation, the
// one-queue plan, and the plan region with the request tables written into a host buffer.
// BatchPrefill::plan() and `flare plan-latency` run the same functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/plan/plan.h"

namespace flare::api_detail {

// The request tables the kernels read instead of the caller's device arrays, staged with the
// plan (WorkspaceLayout::executor_requests): int32 arrays of max_batch + 1 entries each.
//   kQoBegin     request r's first query token (qo_indptr[r]; the merge's output rows too)
//   kQOffset     KV position of r's query token 0: kv_len - q_len (bottom-right alignment), or
//                what a cascade level sets (plan/cascade.h: kv_len - 1 makes a causal kernel
//                see all of a shared prefix)
//   kKvIndptr    pages (paged) or tokens (ragged): an indptr over the requests
//   kLastPageLen paged: [batch]
//   kMaskIndptr  custom masks: byte offsets [batch + 1]
enum RequestTable : int {
  kQoBegin,
  kQOffset,
  kKvIndptr,
  kLastPageLen,
  kMaskIndptr,
  kRequestTables
};

int32_t* request_table(std::byte* region, const WorkspaceLayout& layout, int max_batch,
                       RequestTable table);
const int32_t* request_table(const unsigned char* workspace, const WorkspaceLayout& layout,
                             int max_batch, RequestTable table);

// The workspace bounds of `config` on a grid of num_ctas CTAs with query tiles up to
// max_query_tile.
WorkspaceBounds prefill_bounds(const BatchPrefillConfig& config, int num_ctas, int max_query_tile);

// One plan's host results, and buffers reused from one plan to the next.
struct PrefillHostPlan {
  Plan plan;
  PrefillTiles tiles;
  int64_t batch = 0;
  int64_t total_qo = 0;
  int64_t mask_bytes = 0;  // packed custom-mask bytes
  std::vector<int32_t> qo_len, kv_len;
  std::vector<int32_t> q_offset;     // KV position of each request's token 0 (kQOffset)
  std::vector<int32_t> mask_indptr;  // custom-mask byte offsets [batch + 1]; empty without
  bool rope_staged = false;          // run() rotates q and k into copies first (plan_stages_rope)
};

// Validates the index arrays (BatchPrefill::plan()'s kInvalidArgument and kUnsupported errors)
// into out's lengths, mask offsets and tiles: `fixed_tiles`, or choose_prefill_tiles under
// `limits` for the batch's average query length.
void validate_prefill_batch(const BatchPrefillConfig& config,
                            const std::optional<PrefillTiles>& fixed_tiles,
                            const PrefillDeviceLimits& limits, std::span<const int32_t> qo_indptr,
                            std::span<const int32_t> kv_indptr,
                            std::span<const int32_t> kv_last_page_len,
                            std::span<const int32_t> mask_indptr, PrefillHostPlan& out);

// Plans out's batch at out.tiles for one queue (PlanOptions::one_queue) on num_sms SMs that
// hold ctas_per_sm prefill CTAs each; memory_peak_bytes_per_us (DeviceProperties'; 0 = not
// known) prices the memory-bound tiles' split decision (PlanOptions::queue_rates).
void plan_prefill(const BatchPrefillConfig& config, int num_sms, int ctas_per_sm,
                  double memory_peak_bytes_per_us, PrefillHostPlan& out);

// Writes the plan region of planned.plan with the request tables into `staging`
// (layout.plan_bytes long): qo_begin (each request's first token: qo_indptr, or a cascade's
// virtual requests'), planned.q_offset, kv_indptr, kv_last_page_len and the mask offsets.
// Throws kWorkspaceTooSmall when the plan does not fit `layout`.
void stage_prefill(const PrefillHostPlan& planned, const WorkspaceLayout& layout, int max_batch,
                   std::span<const int32_t> qo_begin, std::span<const int32_t> kv_indptr,
                   std::span<const int32_t> kv_last_page_len, std::byte* staging);

}  // namespace flare::api_detail
