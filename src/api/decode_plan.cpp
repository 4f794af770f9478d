// BatchDecode::plan()'s host work: request lengths from the validated index arrays, the plan of
// one decode step, and the staged plan region with the decode kernel's own records.
#include "src/api/decode_plan.h"

#include <limits>

#include "flare/core/error.h"
#include "kernels/decode_params.cuh"

namespace flare::api_detail {
namespace {

const char* const kWhat = "BatchDecode";

static_assert(sizeof(DecodeCtaStart) == 64 && sizeof(DecodeItemMeta) == 16 &&
                  sizeof(WorkItem) == 32,
              "kernels/decode_params.cuh records: 16-byte loads");

}  // namespace

void validate_decode_batch(const DecodePlanSetup& setup, std::span<const int32_t> kv_indptr,
                           std::span<const int32_t> kv_last_page_len, DecodeHostPlan& out) {
  const int64_t batch = static_cast<int64_t>(kv_indptr.size()) - 1;
  FLARE_CHECK(batch >= 1 && batch <= setup.max_batch, ErrorCode::kInvalidArgument, kWhat,
              ": kv_indptr must have batch + 1 entries with 1 <= batch <= max_batch = ",
              setup.max_batch, ", got ", kv_indptr.size(), " entries");
  FLARE_CHECK(static_cast<int64_t>(kv_last_page_len.size()) == batch, ErrorCode::kInvalidArgument,
              kWhat, ": kv_last_page_len must have ", batch, " entries (one per request), got ",
              kv_last_page_len.size());
  FLARE_CHECK(kv_indptr[0] == 0, ErrorCode::kInvalidArgument, kWhat,
              ": kv_indptr[0] must be 0, got ", kv_indptr[0]);
  const int64_t page_size = setup.problem.page_size;
  out.kv_len.resize(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t pages = int64_t{kv_indptr[i + 1]} - kv_indptr[i];
    FLARE_CHECK(pages >= 0, ErrorCode::kInvalidArgument, kWhat,
                ": kv_indptr must be non-decreasing: kv_indptr[", i + 1, "]=", kv_indptr[i + 1],
                " < kv_indptr[", i, "]=", kv_indptr[i]);
    const int64_t last = kv_last_page_len[i];
    FLARE_CHECK(pages == 0 || (last >= 1 && last <= page_size), ErrorCode::kInvalidArgument, kWhat,
                ": kv_last_page_len[", i, "] must be in [1, ", page_size, "], got ", last);
    const int64_t len = pages == 0 ? 0 : (pages - 1) * page_size + last;
    FLARE_CHECK(len <= std::numeric_limits<int32_t>::max(), ErrorCode::kUnsupported, kWhat,
                ": request ", i, " has ", len, " KV tokens, more than int32 holds");
    FLARE_CHECK(!setup.alibi || len <= kAlibiMaxKvLen, ErrorCode::kUnsupported, kWhat,
                ": request ", i, " has ", len, " KV tokens; ALiBi on the GPU takes at most ",
                kAlibiMaxKvLen, " (its distances convert to float exactly below 2^22)");
    out.kv_len[static_cast<size_t>(i)] = static_cast<int32_t>(len);
  }
}

void plan_decode(const DecodePlanSetup& setup, DecodeHostPlan& out) {
  const auto batch = static_cast<int64_t>(out.kv_len.size());
  if (out.ones.size() < static_cast<size_t>(batch)) out.ones.resize(static_cast<size_t>(batch), 1);

  PlanProblem problem = setup.problem;
  problem.qo_len = std::span<const int32_t>(out.ones).first(static_cast<size_t>(batch));
  problem.kv_len = out.kv_len;
  DeviceSpec device = setup.device;
  PlanOptions options = setup.options;
  // Few tiles (at most one (request, KV head, row tile) per SM) are split only to fill the
  // grid: with two of the four CTAs per SM, chunks are twice as long, with half the partial
  // states to merge and half the per-item fixed cost (H100, docs/perf.md decode v10: b1 kv32768
  // 63.2 -> 61.0 us, b1 kv4096 21.7 -> 18.0, b16 kv4096 103.6 -> 101.9). run() then launches
  // only the planned CTAs, so they land two per SM. Not under CUDA graphs: a captured launch
  // keeps the full grid, where the planned half lands unevenly (decode v9). Not with
  // fixed_split_size either: the fused merge's passes follow the launch's shared memory, and a
  // request's merge must not depend on the batch around it.
  const int64_t tiles = batch * setup.tiles_per_request;
  out.half_grid = setup.may_halve_grid && device.ctas_per_sm >= 4 && tiles <= device.num_sms;
  if (out.half_grid) device.ctas_per_sm /= 2;
  // Tiles that fill every resident CTA run in waves; fewer are cut and filled by one wave. Not
  // with an SM budget: the later waves would start on the SMs left to other work.
  const int64_t resident_ctas = int64_t{setup.device.num_sms} * setup.device.ctas_per_sm;
  options.waves = options.num_sms_to_use == 0 && tiles >= resident_ctas ? setup.waves : 1;
  plan(problem, device, options, out.plan);
}

// The decode kernel's own records in the staged plan region (kernels/decode_params.cuh): each
// split item's merge item in WorkItem.reserved (the planner leaves that field 0), each item's
// request page range, length and partial slots, and each grid CTA's queue with its first item.
void stage_decode(DecodeHostPlan& planned, const WorkspaceLayout& layout,
                  std::span<const int32_t> kv_indptr, std::byte* staging) {
  const Plan& plan = planned.plan;
  write_plan_region(plan, layout, staging);
  std::vector<int32_t>& merge_of_slot = planned.merge_of_slot;
  merge_of_slot.assign(static_cast<size_t>(plan.num_partial_slots), -1);
  for (size_t m = 0; m < plan.merge_items.size(); ++m) {
    for (int32_t i = plan.merge_indptr[m]; i < plan.merge_indptr[m + 1]; ++i) {
      // The kernel reads a tile's partial states as one range of slots.
      FLARE_CHECK(plan.merge_slots[static_cast<size_t>(i)] == i, ErrorCode::kInternal, kWhat,
                  ": merge slot ", i, " is partial slot ", plan.merge_slots[static_cast<size_t>(i)],
                  "; the decode kernel needs consecutive slots per merge item");
      merge_of_slot[static_cast<size_t>(i)] = static_cast<int32_t>(m);
    }
  }
  auto* items = reinterpret_cast<WorkItem*>(staging + layout.work_items);
  auto* meta = reinterpret_cast<DecodeItemMeta*>(staging + layout.executor_items);
  for (size_t w = 0; w < plan.work_items.size(); ++w) {
    const WorkItem& item = plan.work_items[w];
    const auto request = static_cast<size_t>(item.request);
    DecodeItemMeta record{kv_indptr[request], planned.kv_len[request], 0, 0};
    if (item.partial_slot >= 0) {
      const int32_t merge = merge_of_slot[static_cast<size_t>(item.partial_slot)];
      FLARE_CHECK(merge >= 0, ErrorCode::kInternal, kWhat, ": partial slot ", item.partial_slot,
                  " of work item ", w, " belongs to no merge item");
      items[w].reserved = merge;
      record.slot_begin = plan.merge_indptr[static_cast<size_t>(merge)];
      record.slot_count = plan.merge_indptr[static_cast<size_t>(merge) + 1] - record.slot_begin;
    }
    meta[w] = record;
  }
  auto* starts = reinterpret_cast<DecodeCtaStart*>(staging + layout.executor_ctas);
  const auto num_items = static_cast<int32_t>(plan.work_items.size());
  for (int c = 0; c < layout.num_ctas; ++c) {
    DecodeCtaStart start{};
    start.begin = c < plan.num_ctas ? plan.cta_indptr[static_cast<size_t>(c)] : num_items;
    start.end = c < plan.num_ctas ? plan.cta_indptr[static_cast<size_t>(c) + 1] : num_items;
    if (start.begin < start.end) {
      start.item = items[start.begin];
      start.meta = meta[start.begin];
    }
    starts[c] = start;
  }
}

}  // namespace flare::api_detail
