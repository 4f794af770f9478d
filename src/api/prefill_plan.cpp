// BatchPrefill::plan()'s host work: request lengths and custom-mask offsets from the validated
// index arrays, the tiles, the one-queue plan, and the staged plan region with the request
// tables.
#include "src/api/prefill_plan.h"

#include <algorithm>
#include <limits>

#include "flare/core/error.h"
#include "kernels/decode_params.cuh"
#include "src/api/prefill_config.h"

namespace flare::api_detail {
namespace {

const char* const kWhat = "BatchPrefill";

// What a work item costs beyond its rows and KV, in the KV bytes (16-bit K and V of one KV
// head) one CTA streams meanwhile: page ids, the first KV tile and the partial state's write
// are round trips the item's own KV cannot hide. Priced at one row per packed row alone (4
// tokens for a q1 item of 32 / 8 heads), fill splits cut each chunk a few pages short and left
// the short tails to the CTAs that had one chunk: b64 q1 kv1024 ran 104.1 us against 87.6
// without any split, ~3.7 us a tail. 96 KiB fixed b64 kv8192 (518.7 -> 493.1 us, the plan
// without splits) but cost more elsewhere: b32 q8 kv2048 71.7 -> 106.7 (cut in two), b100 q1
// kv2048 206.4 -> 230.0 (docs/perf.md, twenty-fifth session). As in the decode planner
// (src/api/decode_config.cpp); 128 tokens at head_dim 128.
constexpr double kItemOverheadBytes = 64 * 1024;

// Short query tiles over 16-bit KV (decode-like batches) are memory-bound; their rates price
// the split decision (PlanOptions::queue_rates). The mma.sync family's 16-row tiles: a CTA
// streams up to ~30 GB/s while few run, all together ~0.96 of the DRAM's peak (4.6 TB/s of an
// H200's 4.8), partial states with their merge ~8 us (experiments/split_model_sim.cpp's replay
// fit to the q1 sweep of the twenty-fifth session). The Hopper family's tiles of up to 64 rows
// (q16 at GQA 4): ~25 GB/s a CTA (23.5-27 measured, less where two CTAs with items share an
// SM), ~0.76 of the peak together (q16 b8-b48 kv2048-8192 with and without splits, PDL on and
// off, twenty-sixth session; at 27 GB/s b16 q16 kv8192 went whole: 152 -> 175 us without PDL).
// Fitted on an H200; the device rate scales with the GPU's peak (an H100 chose the same way
// but at b40 q1 kv2048: docs/perf.md).
struct TileRates {
  double cta_bytes_per_us;
  double share_of_peak;
};
constexpr TileRates kSyncTileRates{30e3, 0.96};
constexpr TileRates kWarpgroupTileRates{25e3, 0.76};
constexpr double kMergeUs = 8;

}  // namespace

int32_t* request_table(std::byte* region, const WorkspaceLayout& layout, int max_batch,
                       RequestTable table) {
  return reinterpret_cast<int32_t*>(region + layout.executor_requests) +
         static_cast<size_t>(table) * (static_cast<size_t>(max_batch) + 1);
}

const int32_t* request_table(const unsigned char* workspace, const WorkspaceLayout& layout,
                             int max_batch, RequestTable table) {
  return reinterpret_cast<const int32_t*>(workspace + layout.executor_requests) +
         static_cast<size_t>(table) * (static_cast<size_t>(max_batch) + 1);
}

WorkspaceBounds prefill_bounds(const BatchPrefillConfig& config, int num_ctas, int max_query_tile) {
  WorkspaceBounds b;
  b.max_batch = config.max_batch;
  b.max_total_qo = config.max_total_qo;
  b.num_ctas = num_ctas;
  b.max_query_tile = max_query_tile;
  b.num_qo_heads = config.num_qo_heads;
  b.num_kv_heads = config.num_kv_heads;
  b.head_dim_vo = api_detail::prefill_kernel_head_dim_vo(config);  // one pass's partial rows
  b.executor_request_bytes = kRequestTables * sizeof(int32_t);
  if (config.max_levels > 1) {
    // A cascade's (tile, KV head) pairs: every level's tiles cover its tokens' packed rows in
    // tiles of at least the smallest query tile, plus one partial tile per group (max_batch
    // groups over all levels).
    const int64_t group = config.num_qo_heads / config.num_kv_heads;
    const int64_t min_tile = config.query_tile > 0 ? config.query_tile : kPrefillMinQueryTile;
    const int64_t tiles = int64_t{config.max_batch} +
                          int64_t{config.max_levels} *
                              ((int64_t{config.max_total_qo} * group + min_tile - 1) / min_tile);
    const int64_t pairs = tiles * config.num_kv_heads;
    constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
    const int64_t split_chunks = int64_t{2} * num_ctas;  // 002 D.3
    // Pieces: the common refinement of all levels' tiles has no more pieces than tiles.
    b.max_merge_items = std::min(kInt32Max, pairs);
    // Entries: a piece lists one slot per level covering it, and a split tile's extra chunks
    // appear in each of its pieces (at most one per row of the tile).
    b.max_merge_slots =
        std::min(kInt32Max, config.max_levels * pairs + split_chunks * max_query_tile);
    b.max_work_items = std::min(kInt32Max, pairs + split_chunks);
    // Every tile a level shares writes a partial state; grown on demand outside graphs.
    if (config.use_cuda_graph) b.max_partial_slots = std::min(kInt32Max, pairs + split_chunks);
  }
  return b;
}

void validate_prefill_batch(const BatchPrefillConfig& c,
                            const std::optional<PrefillTiles>& fixed_tiles,
                            const PrefillDeviceLimits& limits, std::span<const int32_t> qo_indptr,
                            std::span<const int32_t> kv_indptr,
                            std::span<const int32_t> kv_last_page_len,
                            std::span<const int32_t> mask_indptr, PrefillHostPlan& out) {
  const bool paged = c.kv == PrefillKV::kPaged;
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  FLARE_CHECK(batch >= 1 && batch <= c.max_batch, ErrorCode::kInvalidArgument, kWhat,
              ": qo_indptr must have batch + 1 entries with 1 <= batch <= max_batch = ",
              c.max_batch, ", got ", qo_indptr.size(), " entries");
  FLARE_CHECK(static_cast<int64_t>(kv_indptr.size()) == batch + 1, ErrorCode::kInvalidArgument,
              kWhat, ": kv_indptr must have ", batch + 1, " entries, got ", kv_indptr.size());
  FLARE_CHECK(static_cast<int64_t>(kv_last_page_len.size()) == (paged ? batch : 0),
              ErrorCode::kInvalidArgument, kWhat, ": kv_last_page_len must have ",
              paged ? batch : 0, " entries (", paged ? "one per request" : "none for ragged KV",
              "), got ", kv_last_page_len.size());
  FLARE_CHECK(qo_indptr[0] == 0 && kv_indptr[0] == 0, ErrorCode::kInvalidArgument, kWhat,
              ": qo_indptr[0] and kv_indptr[0] must be 0, got ", qo_indptr[0], " and ",
              kv_indptr[0]);
  out.qo_len.resize(static_cast<size_t>(batch));
  out.kv_len.resize(static_cast<size_t>(batch));
  out.q_offset.resize(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t q_len = int64_t{qo_indptr[i + 1]} - qo_indptr[i];
    const int64_t count = int64_t{kv_indptr[i + 1]} - kv_indptr[i];
    FLARE_CHECK(q_len >= 0, ErrorCode::kInvalidArgument, kWhat,
                ": qo_indptr must be non-decreasing: qo_indptr[", i + 1, "]=", qo_indptr[i + 1],
                " < qo_indptr[", i, "]=", qo_indptr[i]);
    FLARE_CHECK(count >= 0, ErrorCode::kInvalidArgument, kWhat,
                ": kv_indptr must be non-decreasing: kv_indptr[", i + 1, "]=", kv_indptr[i + 1],
                " < kv_indptr[", i, "]=", kv_indptr[i]);
    int64_t kv_len = count;
    if (paged) {
      const int64_t last = kv_last_page_len[i];
      FLARE_CHECK(count == 0 || (last >= 1 && last <= c.page_size), ErrorCode::kInvalidArgument,
                  kWhat, ": kv_last_page_len[", i, "] must be in [1, ", c.page_size, "], got ",
                  last);
      kv_len = count == 0 ? 0 : (count - 1) * c.page_size + last;
    }
    FLARE_CHECK(kv_len <= std::numeric_limits<int32_t>::max(), ErrorCode::kUnsupported, kWhat,
                ": request ", i, " has ", kv_len, " KV tokens, more than int32 holds");
    FLARE_CHECK(c.params.pos_encoding != PosEncoding::kAlibi ||
                    (kv_len <= kAlibiMaxKvLen && q_len <= kAlibiMaxKvLen),
                ErrorCode::kUnsupported, kWhat, ": request ", i, " has ", q_len, " query and ",
                kv_len, " KV tokens; ALiBi on the GPU takes at most ", kAlibiMaxKvLen,
                " of each (its distances convert to float exactly below 2^22)");
    out.qo_len[static_cast<size_t>(i)] = static_cast<int32_t>(q_len);
    out.kv_len[static_cast<size_t>(i)] = static_cast<int32_t>(kv_len);
    // Bottom-right alignment: token t at KV position kv_len - q_len + t.
    out.q_offset[static_cast<size_t>(i)] = static_cast<int32_t>(kv_len - q_len);
  }
  const int64_t total_qo = qo_indptr[static_cast<size_t>(batch)];
  FLARE_CHECK(total_qo <= c.max_total_qo, ErrorCode::kInvalidArgument, kWhat, ": the batch has ",
              total_qo, " query tokens, more than max_total_qo = ", c.max_total_qo);
  // The custom mask's byte offsets: the caller's, or FlashInfer's packed layout (whole bytes
  // per request, back to back).
  FLARE_CHECK(mask_indptr.empty() || c.params.mask == MaskMode::kCustom,
              ErrorCode::kInvalidArgument, kWhat,
              ": mask_indptr was given but params.mask is not kCustom");
  FLARE_CHECK(mask_indptr.empty() || static_cast<int64_t>(mask_indptr.size()) == batch + 1,
              ErrorCode::kInvalidArgument, kWhat, ": mask_indptr must have ", batch + 1,
              " entries, got ", mask_indptr.size());
  int64_t mask_bytes = 0;
  out.mask_indptr.clear();
  if (c.params.mask == MaskMode::kCustom) {
    out.mask_indptr.resize(static_cast<size_t>(batch) + 1, 0);
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t need =
          (int64_t{out.qo_len[static_cast<size_t>(i)]} * out.kv_len[static_cast<size_t>(i)] + 7) /
          8;
      const int64_t begin = mask_indptr.empty() ? mask_bytes : mask_indptr[i];
      FLARE_CHECK(begin >= 0 && (mask_indptr.empty() || mask_indptr[i + 1] - begin >= need),
                  ErrorCode::kInvalidArgument, kWhat, ": mask_indptr[", i, "]=", begin,
                  " and mask_indptr[", i + 1, "] must hold request ", i, "'s ", need,
                  " bytes of mask bits");
      mask_bytes = std::max(mask_bytes, begin + need);
      FLARE_CHECK(mask_bytes <= std::numeric_limits<int32_t>::max(), ErrorCode::kUnsupported, kWhat,
                  ": the packed custom mask would have ", mask_bytes,
                  " bytes, more than int32 holds");
      out.mask_indptr[static_cast<size_t>(i)] = static_cast<int32_t>(begin);
    }
    out.mask_indptr[static_cast<size_t>(batch)] = static_cast<int32_t>(mask_bytes);
  }

  if (fixed_tiles) {
    out.tiles = *fixed_tiles;
  } else {
    int64_t with_queries = 0;
    for (const int32_t q : out.qo_len) with_queries += q > 0;
    const double group = c.num_qo_heads / c.num_kv_heads;
    const double average = with_queries == 0 ? 1.0
                                             : static_cast<double>(total_qo) * group /
                                                   static_cast<double>(with_queries);
    out.tiles = api_detail::with_config_kv_tile(
        choose_prefill_tiles(average, c.head_dim_qk, api_detail::prefill_kernel_head_dim_vo(c),
                             c.params.mask, limits),
        c);
  }
  out.batch = batch;
  out.total_qo = total_qo;
  out.mask_bytes = mask_bytes;
}

void plan_prefill(const BatchPrefillConfig& c, int num_sms, int ctas_per_sm,
                  double memory_peak_bytes_per_us, PrefillHostPlan& out) {
  PlanProblem problem;
  problem.qo_len = out.qo_len;
  problem.kv_len = out.kv_len;
  problem.q_offset = out.q_offset;
  problem.num_qo_heads = c.num_qo_heads;
  problem.num_kv_heads = c.num_kv_heads;
  problem.head_dim_qk = c.head_dim_qk;
  problem.head_dim_vo = api_detail::prefill_kernel_head_dim_vo(c);  // each pass's
  problem.page_size = c.kv == PrefillKV::kPaged ? c.page_size : 1;
  problem.causal = c.params.mask == MaskMode::kCausal;
  problem.window_left = c.params.window_left;
  PlanOptions options;
  options.query_tile = out.tiles.query_tile;
  options.fixed_split_size = c.fixed_split_size;
  options.disable_split_kv = c.disable_split_kv;
  options.num_sms_to_use = std::min(c.num_sms_to_use, num_sms);  // num_sms: the plans' SMs
  // The kernel's CTAs take the work items from one queue (kernels/prefill.cuh).
  options.one_queue = true;
  options.kv_tile = out.tiles.kv_tile;
  const double token_bytes = 2.0 * (c.head_dim_qk + problem.head_dim_vo);    // 16-bit K and V
  options.item_cost = static_cast<float>(kItemOverheadBytes / token_bytes);  // beta = 1 a token
  const bool memory_bound =
      out.tiles.warpgroup ? out.tiles.query_tile <= 64 : out.tiles.query_tile <= 16;
  if (memory_bound && c.kv_dtype != DType::kU8 && memory_peak_bytes_per_us > 0) {
    const TileRates& rates = out.tiles.warpgroup ? kWarpgroupTileRates : kSyncTileRates;
    options.queue_rates = {rates.cta_bytes_per_us / token_bytes,
                           rates.share_of_peak * memory_peak_bytes_per_us / token_bytes, kMergeUs};
  }
  plan(problem, {num_sms, ctas_per_sm}, options, out.plan);
}

void stage_prefill(const PrefillHostPlan& planned, const WorkspaceLayout& layout, int max_batch,
                   std::span<const int32_t> qo_begin, std::span<const int32_t> kv_indptr,
                   std::span<const int32_t> kv_last_page_len, std::byte* staging) {
  write_plan_region(planned.plan, layout, staging);
  // Padded past the batch with the total, as kv_indptr below: a captured rotation of staged
  // RoPE reads its query count at entry max_batch (prefill_rope_staging.h).
  int32_t* qo_table = request_table(staging, layout, max_batch, kQoBegin);
  std::copy(qo_begin.begin(), qo_begin.end(), qo_table);
  std::fill(qo_table + qo_begin.size(), qo_table + max_batch + 1,
            qo_begin.empty() ? 0 : qo_begin.back());
  std::copy(planned.q_offset.begin(), planned.q_offset.end(),
            request_table(staging, layout, max_batch, kQOffset));
  // Padded past the batch with the total: a captured NVFP4 staging launch (and staged RoPE's
  // rotation) reads its count at entry max_batch (kernels/prefill_nvfp4_stage.cuh).
  int32_t* kv_table = request_table(staging, layout, max_batch, kKvIndptr);
  std::copy(kv_indptr.begin(), kv_indptr.end(), kv_table);
  std::fill(kv_table + kv_indptr.size(), kv_table + max_batch + 1,
            kv_indptr.empty() ? 0 : kv_indptr.back());
  std::copy(kv_last_page_len.begin(), kv_last_page_len.end(),
            request_table(staging, layout, max_batch, kLastPageLen));
  std::copy(planned.mask_indptr.begin(), planned.mask_indptr.end(),
            request_table(staging, layout, max_batch, kMaskIndptr));
}

}  // namespace flare::api_detail
