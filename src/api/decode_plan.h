// BatchDecode::plan()'s host work, which needs no GPU: the index arrays' validation, the planner
// with the decode kernel's options, and the plan region with the kernel's own records written
// into a host buffer. BatchDecode::plan() and `flare plan-latency` run the same functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/plan/plan.h"

namespace flare::api_detail {

// What every plan of one BatchDecode shares, fixed at creation from its config, its kernel and
// the kernel's occupancy.
struct DecodePlanSetup {
  PlanProblem problem;            // heads, head dims, page size, window (the lengths are per plan)
  PlanOptions options;            // query tile, alpha and the split knobs (the waves are per plan)
  DeviceSpec device;              // the SMs and the resident CTAs per SM
  int waves = 1;                  // of the grid, for batches whose tiles fill the resident CTAs
  int64_t tiles_per_request = 0;  // (request, KV head, row tile) tiles of one request
  int max_batch = 0;
  bool may_halve_grid = false;  // few tiles may be planned on half the CTAs per SM
  bool alibi = false;           // requests longer than kAlibiMaxKvLen are refused
  WorkspaceBounds bounds;       // of the grid, at the default partial-slot bound
};

// The setup of `config` on a GPU of num_sms SMs that hold ctas_per_sm of its kernel's CTAs each
// (defined beside the kernel geometry, in decode_config.cpp). Throws like BatchDecode's
// constructor.
DecodePlanSetup decode_plan_setup(const BatchDecodeConfig& config, int num_sms, int ctas_per_sm);

// One plan's host results, and buffers reused from one plan to the next.
struct DecodeHostPlan {
  Plan plan;
  std::vector<int32_t> kv_len;  // per request
  bool half_grid = false;       // planned on half the resident CTAs per SM
  std::vector<int32_t> ones;    // qo_len: one query token per request
  std::vector<int32_t> merge_of_slot;
};

// Validates kv_indptr and kv_last_page_len (BatchDecode::plan()'s kInvalidArgument and
// kUnsupported errors) into out.kv_len.
void validate_decode_batch(const DecodePlanSetup& setup, std::span<const int32_t> kv_indptr,
                           std::span<const int32_t> kv_last_page_len, DecodeHostPlan& out);

// Plans the batch of out.kv_len into out.plan.
void plan_decode(const DecodePlanSetup& setup, DecodeHostPlan& out);

// Writes the plan region of planned.plan, with the decode kernel's records, into `staging`
// (layout.plan_bytes long). Throws kWorkspaceTooSmall when the plan does not fit `layout`.
void stage_decode(DecodeHostPlan& planned, const WorkspaceLayout& layout,
                  std::span<const int32_t> kv_indptr, std::byte* staging);

}  // namespace flare::api_detail
