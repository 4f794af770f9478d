// BatchDecode's configuration: validation, the decode kernel's geometry and spec, the shipped
// configurations CI compiles, and the planner setup every plan of a BatchDecode shares.
#include "src/api/decode_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/core/error.h"
#include "kernels/decode_params.cuh"
#include "src/api/decode_plan.h"
#include "src/api/variant_support.h"

namespace flare {
namespace api_detail {
namespace {

static_assert(static_cast<int>(DType::kF16) == kCodeF16 &&
                  static_cast<int>(DType::kBF16) == kCodeBF16 &&
                  static_cast<int>(DType::kE4M3) == kCodeE4M3 &&
                  static_cast<int>(DType::kE5M2) == kCodeE5M2 &&
                  static_cast<int>(DType::kU8) == kCodeE2M1,
              "kernels/decode_params.cuh DTypeCode must equal flare::DType (kU8 KV: NVFP4)");

// Decode kernel geometry (kernels/decode.cuh Traits reads these defines and checks them).
constexpr int kDecodeThreads = 128;
// A CUDA-core lane holds 8 dims of a row, 16 at D 512 (two chunks: kernels/decode_pipeline.cuh).
constexpr int kDimsPerLane = 8;
constexpr int kDimsPerLaneWide = 16;
constexpr int kWideHeadDim = 512;
constexpr int kMaxRowsPerItem = 8;
// At D 512 a lane keeps 16 dims of q and o per row: 4 rows (128 registers of them) a work item,
// larger head groups split into items of 4 rows.
constexpr int kMaxRowsPerItemWide = 4;
// Shared memory the K/V pipeline aims at per CTA ((stages - 1) / stages of it in flight). Tiles
// of up to 4 rows with 16-bit KV fit 128 registers: 4 CTAs per SM of 48 KiB (128 KiB in flight
// per SM on an H100, 16 warps to hide the latency of a loop at ~55% of issue; decode v7).
// 8-row tiles and fp8's 8-token groups need more registers (2-3 CTAs per SM): 64 KiB each.
constexpr int kPipelineTargetBytes = 64 * 1024;
constexpr int kPipelineTargetBytesFourCtas = 48 * 1024;
constexpr int kFourCtas = 4;
// What a work item costs beyond its KV bytes, in KV bytes one CTA streams meanwhile: the
// planner's per-row cost alpha charges it, so no CTA is handed many short chunks. With 16-bit
// KV an item waits on ~4 memory round trips its KV cannot hide (page ids, first tile, the
// partial write's fence and arrival count, the merge), ~10-15 us with DRAM saturated: at 40 KiB
// the fill split piled 32 short tails on each idle CTA (b64 kv8192 on 528 CTAs: 768 us, 717 at
// 80 KiB). fp8 KV is instruction-bound, the round trips overlap other CTAs' issue, and a large
// alpha only skews the KV balance (b64 kv8192: 408 us at 40 KiB, 420 at 80; docs/perf.md v7).
// The tensor-core loop is memory-bound with either KV type: 16-bit KV's overhead.
// The tensor-core loop (kernels/decode_mma.cuh): 4 warps of 16 tokens per tile, and ~192 KiB of
// pipeline per SM. At D = 128 (2 CTAs per SM), 3 stages of 32 KiB beat 2 stages on the H100 and
// H200, and 4 stages on the H100 (docs/perf.md decode experiment 4). At D = 256 (1 CTA per SM),
// 3 stages of 64 KiB beat 2 on the H200 (b64 kv4096: 513.7 -> 480.3 us, decode v14) where the
// GPU's shared memory per block holds them. fp8 KV up to D = 128 takes 32 tokens a warp (tiles
// of 128), the same bytes per stage: at D = 128, 3 stages of 32 KiB against 6 of 16 KiB took
// b64 kv8192 from 268.7 to 259.7 us on the H200, b1 kv32768 from 29.8 to 28.0 (decode v15); 3
// CTAs per SM of 4 stages of 16 KiB were slower (291 us). At D = 256 16 tokens already make
// 32 KiB stages, and 32 spill on sm_80.
constexpr int kMmaWarpTokens = 16;
constexpr int kMmaWarpTokensFp8 = 32;
constexpr int kPipelineTargetBytesMmaPerSm = 192 * 1024;
// Two stages of this fit every sm_80-family GPU's shared memory per block (A100: 163 KiB).
constexpr int kMaxMmaStageBytes = 64 * 1024;
constexpr double kItemOverheadBytes16Bit = 80 * 1024;
constexpr double kItemOverheadBytesFp8 = 40 * 1024;
constexpr int kMinStages = 2;
constexpr int kMaxStages = 8;
// Grid waves (PlanOptions::waves) when a batch's tiles outnumber the resident CTAs. Two on the
// tensor-core loop (2 CTAs per SM): the hardware hands the second wave to the SMs that stream
// faster, and whole requests need no merge (b64 kv8192: H100 712.7 -> 706.6 us, H200 483 ->
// 477; a Zipf batch unchanged; three waves gain nothing more). One on the CUDA-core loop,
// whose 4 CTAs per SM already balance finer (two waves: b128 kv4096 +0.2%, b256 kv2048
// -0.5%). docs/perf.md decode v14.
constexpr int kTensorCoreWaves = 2;
constexpr int kCudaCoreWaves = 1;

const char* const kWhat = "BatchDecode";

int next_power_of_two(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

int group_size(const BatchDecodeConfig& c) { return c.num_qo_heads / c.num_kv_heads; }

bool is_nvfp4(const BatchDecodeConfig& c) { return c.kv_dtype == DType::kU8; }

// Bytes of one token's K (or V) row of one head in a pipeline stage: NVFP4 codes and scales.
int kv_row_bytes(const BatchDecodeConfig& c) {
  return is_nvfp4(c) ? c.head_dim / 2 + c.head_dim / 16
                     : c.head_dim * static_cast<int>(dtype_bytes(c.kv_dtype));
}

// Packed rows of one KV head in a work item: the whole head group up to 8 rows (padded to a
// power of two in the kernel, whose register tiles are compiled per row count).
int head_rows(const BatchDecodeConfig& c) {
  // NVFP4 rows are half an fp8 row's bytes: with 8 rows' 2 tokens a group a tile would hold
  // fewer rows than one pass of the copies covers, so its items take 4 rows (8 tokens a group).
  const bool four_rows = c.head_dim == kWideHeadDim || c.kv_dtype == DType::kU8;
  return std::min(group_size(c), four_rows ? kMaxRowsPerItemWide : kMaxRowsPerItem);
}
int kernel_rows(const BatchDecodeConfig& c) { return next_power_of_two(head_rows(c)); }

// Whole-page items (kv_heads_per_item > 1) are planned as num_kv_heads / kv_heads_per_item
// "super heads" of kv_heads_per_item x group query heads each (kernels/decode_pipeline.cuh
// Traits): packed row R of a super head s is query head s x G' + R, as for any KV head.
int plan_kv_heads(const BatchDecodeConfig& c) { return c.num_kv_heads / c.kv_heads_per_item; }
int plan_group_size(const BatchDecodeConfig& c) { return group_size(c) * c.kv_heads_per_item; }
// Packed rows per work item (the plan's query tile): one head's rows, or every row of a super
// head.
int query_tile(const BatchDecodeConfig& c) {
  return c.kv_heads_per_item == 1 ? head_rows(c) : plan_group_size(c);
}

void validate_config(const BatchDecodeConfig& c) {
  FLARE_CHECK(c.device >= 0, ErrorCode::kInvalidArgument, kWhat, ": device must be >= 0, got ",
              c.device);
  FLARE_CHECK(c.max_batch >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": max_batch must be >= 1, got ", c.max_batch);
  FLARE_CHECK(c.num_qo_heads >= 1 && c.num_kv_heads >= 1 && c.num_qo_heads % c.num_kv_heads == 0,
              ErrorCode::kInvalidArgument, kWhat,
              ": num_kv_heads must be >= 1 and divide num_qo_heads, got num_qo_heads=",
              c.num_qo_heads, " num_kv_heads=", c.num_kv_heads);
  FLARE_CHECK(
      c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256 || c.head_dim == kWideHeadDim,
      ErrorCode::kUnsupported, kWhat, ": head_dim must be 64, 128, 256 or 512, got ", c.head_dim);
  FLARE_CHECK(c.head_dim != kWideHeadDim || !c.use_tensor_cores, ErrorCode::kUnsupported, kWhat,
              ": head_dim 512 runs on the CUDA-core loop only (its tensor-core loop would keep "
              "128 accumulators of o a thread): pass use_tensor_cores = false");
  FLARE_CHECK(c.page_size >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": page_size must be >= 1, got ", c.page_size);
  FLARE_CHECK(c.q_dtype == DType::kF16 || c.q_dtype == DType::kBF16, ErrorCode::kUnsupported, kWhat,
              ": q_dtype must be float16 or bfloat16, got ", dtype_name(c.q_dtype));
  FLARE_CHECK(c.kv_dtype == DType::kF16 || c.kv_dtype == DType::kBF16 ||
                  c.kv_dtype == DType::kE4M3 || c.kv_dtype == DType::kE5M2 || is_nvfp4(c),
              ErrorCode::kUnsupported, kWhat,
              ": kv_dtype must be float16, bfloat16, float8_e4m3, float8_e5m2 or uint8 (NVFP4), "
              "got ",
              dtype_name(c.kv_dtype));
  FLARE_CHECK(!is_nvfp4(c) || (!c.use_tensor_cores && c.kv_heads_per_item == 1),
              ErrorCode::kUnsupported, kWhat,
              ": NVFP4 KV (kv_dtype uint8) runs on the CUDA-core loop, one KV head an item: pass "
              "use_tensor_cores = false and kv_heads_per_item = 1");
  FLARE_CHECK(c.fixed_split_size >= 0 && c.num_sms_to_use >= 0 && c.ctas_per_sm >= 0,
              ErrorCode::kInvalidArgument, kWhat,
              ": fixed_split_size, num_sms_to_use and ctas_per_sm must be >= 0, got ",
              c.fixed_split_size, ", ", c.num_sms_to_use, ", ", c.ctas_per_sm);
  FLARE_CHECK(c.waves >= 0 && c.waves <= kMaxPlanWaves, ErrorCode::kInvalidArgument, kWhat,
              ": waves must be in [0, ", kMaxPlanWaves, "] (0 = the loop's default), got ",
              c.waves);
  const AttentionParams& p = c.params;
  FLARE_CHECK(std::isfinite(p.sm_scale) && p.sm_scale >= 0.0f && std::isfinite(p.k_scale) &&
                  std::isfinite(p.v_scale) && std::isfinite(p.logits_soft_cap),
              ErrorCode::kInvalidArgument, kWhat,
              ": sm_scale (>= 0, 0 = 1/sqrt(D)), k_scale, v_scale and logits_soft_cap must be "
              "finite, got ",
              p.sm_scale, ", ", p.k_scale, ", ", p.v_scale, ", ", p.logits_soft_cap);
  // Throws for what no kernel expresses.
  api_detail::resolve_variant(p, c.variant, c.num_qo_heads, kWhat);
  const int heads = c.kv_heads_per_item;
  FLARE_CHECK(heads == 1 || heads == 2 || heads == 4 || heads == 8, ErrorCode::kInvalidArgument,
              kWhat, ": kv_heads_per_item must be 1, 2, 4 or 8, got ", heads);
  FLARE_CHECK(
      heads == 1 ||
          (c.use_tensor_cores && c.num_kv_heads % heads == 0 && group_size(c) <= kMaxRowsPerItem),
      ErrorCode::kUnsupported, kWhat, ": kv_heads_per_item = ", heads,
      " needs use_tensor_cores, num_kv_heads divisible by it and at most ", kMaxRowsPerItem,
      " query heads per KV head, got use_tensor_cores = ", c.use_tensor_cores ? "true" : "false",
      ", num_kv_heads = ", c.num_kv_heads, ", num_qo_heads = ", c.num_qo_heads);
  // The mma operands share one type. 16-bit KV: q would be rounded to KV's (f16 q to bf16
  // loses 3 bits of every score's inputs, lse errors above 1e-3), so q and KV must already
  // agree. fp8 KV runs in f16, which holds fp8 and (scaled by a power of two) bf16 q exactly.
  FLARE_CHECK(!c.use_tensor_cores || c.q_dtype == c.kv_dtype || is_fp8(c.kv_dtype),
              ErrorCode::kUnsupported, kWhat,
              ": use_tensor_cores needs q and KV of the same float16 or bfloat16 type, or fp8 "
              "KV, got q ",
              dtype_name(c.q_dtype), " and KV ", dtype_name(c.kv_dtype),
              " (mixed 16-bit pairs run on CUDA cores: use_tensor_cores = false)");
}

struct Geometry {
  bool mma = false;  // the tensor-core loop (kernels/decode_mma.cuh)
  int threads = kDecodeThreads;
  int item_heads = 1;  // KV heads per work item
  int rows = 0;        // per KV head
  int tokens_per_group = 0;
  int stages = 0;
  int min_ctas_per_sm = 1;  // __launch_bounds__ minimum: caps registers at 65536 / (128 x it)
  size_t shared_bytes = 0;
};

// Mirrors kernels/decode.cuh Traits (which static_asserts that FLARE_SHARED_BYTES covers it).
Geometry decode_geometry(const BatchDecodeConfig& c, size_t max_shared_bytes_per_block) {
  Geometry g;
  g.rows = kernel_rows(c);
  const int row_bytes = c.head_dim * static_cast<int>(dtype_bytes(c.kv_dtype));
  if (c.use_tensor_cores) {
    g.mma = true;
    // A warp is the loop's state group: tokens per group are tokens per warp.
    g.tokens_per_group =
        is_fp8(c.kv_dtype) && c.head_dim <= 128 ? kMmaWarpTokensFp8 : kMmaWarpTokens;
    g.item_heads = c.kv_heads_per_item;
    // One KV head: 4 warps take its tile's tokens. Whole-page items: a warp per head.
    const int warps_per_head = g.item_heads == 1 ? kDecodeThreads / 32 : 1;
    g.threads = 32 * warps_per_head * g.item_heads;
    const int stage_bytes = 2 * g.item_heads * warps_per_head * g.tokens_per_group * row_bytes;
    FLARE_CHECK(stage_bytes <= kMaxMmaStageBytes, ErrorCode::kUnsupported, kWhat,
                ": kv_heads_per_item = ", g.item_heads, " at head_dim ", c.head_dim, " with ",
                dtype_name(c.kv_dtype), " KV needs ", stage_bytes,
                "-byte pipeline stages; at most ", kMaxMmaStageBytes,
                " fit (use fewer KV heads per item)");
    // Whole-page items of 32 KiB stages run 2 CTAs per SM, like the one-head loop at D 128;
    // larger stages one.
    g.min_ctas_per_sm = g.item_heads == 1 ? (c.head_dim >= 256 ? 1 : 2)
                                          : (stage_bytes <= kMaxMmaStageBytes / 2 ? 2 : 1);
    // RoPE's angle table (kernels/decode_pipeline.cuh kRotaryTableBytes) after everything else.
    // A user variant may be rotary (its source's kRotary, which the host does not read): its
    // launches keep room for the table too.
    const bool rotary_table =
        c.variant.has_value() || c.params.pos_encoding == PosEncoding::kRopeLlama;
    const size_t table_bytes =
        rotary_table ? static_cast<size_t>(decode_rotary_table_bytes(c.head_dim, g.threads / 32))
                     : 0;
    const int target =
        static_cast<int>(std::min<size_t>(kPipelineTargetBytesMmaPerSm / g.min_ctas_per_sm,
                                          max_shared_bytes_per_block - table_bytes));
    g.stages = std::clamp(target / stage_bytes, kMinStages, kMaxStages);
    const size_t combine =
        static_cast<size_t>(g.threads / 32) * g.rows * (c.head_dim + 2) * sizeof(float);
    // The fused merge stages at least two partial slots of the item's rows a pass, and its
    // slot-lane combine (kernels/decode_merge.cuh FusedMerge): more than two stages hold for
    // fp8 items of 8 heads x 8 rows at D 256 on the A100 (2 stages of 64 KiB).
    const size_t merge = (2 * static_cast<size_t>(g.rows) * g.item_heads * (c.head_dim + 1) +
                          6 * static_cast<size_t>(g.threads)) *
                         sizeof(float);
    g.shared_bytes =
        std::max({static_cast<size_t>(g.stages) * stage_bytes, combine, merge}) + table_bytes;
    return g;
  }
  // Scores of one tile live in registers (tokens x rows): 8-row tiles take 2 tokens a group.
  // fp8 KV is instruction-bound rather than memory-bound: 8 tokens a group halve the per-tile
  // fixed work (barrier, copies, probability exchange) per token, within 168 registers.
  // At D 512 (16 dims a lane, up to 4 rows: 128 registers of q and o) 2 tokens a group and one
  // CTA's register cap (255).
  // NVFP4 converts in registers like fp8, with more work an element: fp8's groups.
  const bool fp8 = is_fp8(c.kv_dtype) || is_nvfp4(c);
  const bool wide = c.head_dim == kWideHeadDim;
  g.tokens_per_group = wide || g.rows >= 8 ? 2 : (fp8 && g.rows >= 4 ? 8 : 4);
  const int lanes = c.head_dim / (wide ? kDimsPerLaneWide : kDimsPerLane);
  const int groups = kDecodeThreads / lanes;
  const int stage_bytes = 2 * groups * g.tokens_per_group * kv_row_bytes(c);
  g.min_ctas_per_sm = g.rows <= 4 && !fp8 && !wide ? kFourCtas : 1;
  const int target =
      g.min_ctas_per_sm == kFourCtas ? kPipelineTargetBytesFourCtas : kPipelineTargetBytes;
  g.stages = std::clamp(target / stage_bytes, kMinStages, kMaxStages);
  // The pipeline plus the per-group exchange of probabilities and row rescale factors.
  const size_t pipeline =
      static_cast<size_t>(g.stages) * stage_bytes +
      static_cast<size_t>(groups) * (g.tokens_per_group + 1) * g.rows * sizeof(float);
  const size_t combine = static_cast<size_t>(groups) * g.rows * (c.head_dim + 2) * sizeof(float);
  g.shared_bytes = std::max(pipeline, combine);
  return g;
}

std::string dtype_code(DType t) { return std::to_string(static_cast<int>(t)); }

size_t resolved_ctas_per_sm(const BatchDecodeConfig& c, cuda::Function decode, int threads,
                            size_t shared) {
  const int fit = cuda::max_active_blocks_per_sm(decode, threads, shared);
  FLARE_CHECK(fit >= 1, ErrorCode::kUnsupported, kWhat, ": the decode kernel (", shared,
              " bytes of shared memory) does not fit one SM of device ", c.device);
  return static_cast<size_t>(c.ctas_per_sm > 0 ? std::min(c.ctas_per_sm, fit) : fit);
}

WorkspaceBounds bounds_of(const BatchDecodeConfig& c, int num_ctas) {
  WorkspaceBounds b;
  b.max_batch = c.max_batch;
  b.max_total_qo = c.max_batch;
  b.num_ctas = num_ctas;
  b.max_query_tile = query_tile(c);
  b.num_qo_heads = c.num_qo_heads;
  b.num_kv_heads = plan_kv_heads(c);
  b.head_dim_vo = c.head_dim;
  b.executor_cta_bytes = sizeof(DecodeCtaStart);
  b.executor_item_bytes = sizeof(DecodeItemMeta);
  return b;
}

}  // namespace

int decode_plan_group_size(const BatchDecodeConfig& c) { return plan_group_size(c); }
void validate_decode_config(const BatchDecodeConfig& c) { validate_config(c); }
size_t decode_ctas_per_sm(const BatchDecodeConfig& c, cuda::Function decode, int threads,
                          size_t shared) {
  return resolved_ctas_per_sm(c, decode, threads, shared);
}

DecodePlanSetup decode_plan_setup(const BatchDecodeConfig& config, int num_sms, int ctas_per_sm) {
  validate_config(config);
  DecodePlanSetup setup;
  setup.problem.num_qo_heads = config.num_qo_heads;
  setup.problem.num_kv_heads = plan_kv_heads(config);
  setup.problem.head_dim_qk = config.head_dim;
  setup.problem.head_dim_vo = config.head_dim;
  setup.problem.page_size = config.page_size;
  setup.problem.window_left = config.params.window_left;
  setup.device = {num_sms, ctas_per_sm};
  PlanOptions& options = setup.options;
  options.query_tile = query_tile(config);
  // K and V bytes of one token of an item (every KV head of a whole-page item).
  const double token_bytes = 2.0 * kv_row_bytes(config) * config.kv_heads_per_item;
  // An item's fixed cost is time (round trips): in bytes it grows with the CTA's share of its
  // SM's bandwidth, one CTA per SM for whole-page items of 8 warps against the loop's
  // 128-thread CTAs.
  const int threads = decode_geometry(config, kSm80SharedBytesPerBlock).threads;
  const double overhead = ((is_fp8(config.kv_dtype) || is_nvfp4(config)) && !config.use_tensor_cores
                               ? kItemOverheadBytesFp8
                               : kItemOverheadBytes16Bit) *
                          threads / kDecodeThreads;
  options.alpha = static_cast<float>(overhead / token_bytes / options.query_tile);
  options.fixed_split_size = config.fixed_split_size;
  options.disable_split_kv = config.disable_split_kv;
  options.num_sms_to_use = config.num_sms_to_use;
  setup.waves = config.waves > 0 ? config.waves
                                 : (config.use_tensor_cores ? kTensorCoreWaves : kCudaCoreWaves);
  const int64_t group = plan_group_size(config);
  setup.tiles_per_request =
      plan_kv_heads(config) * ((group + options.query_tile - 1) / options.query_tile);
  setup.max_batch = config.max_batch;
  setup.may_halve_grid = !config.use_cuda_graph && config.fixed_split_size == 0;
  setup.alibi = config.params.pos_encoding == PosEncoding::kAlibi;
  setup.bounds = bounds_of(config, num_sms * ctas_per_sm * setup.waves);
  return setup;
}

}  // namespace api_detail

using api_detail::decode_geometry;
using api_detail::dtype_code;
using api_detail::Geometry;
using api_detail::kernel_rows;
using api_detail::kWhat;
using api_detail::kWideHeadDim;
using api_detail::validate_config;

BatchDecodeKernels batch_decode_kernels(const BatchDecodeConfig& config,
                                        size_t max_shared_bytes_per_block) {
  validate_config(config);
  const Geometry g = decode_geometry(config, max_shared_bytes_per_block);
  const api_detail::ResolvedVariant variant =
      api_detail::resolve_variant(config.params, config.variant, config.num_qo_heads, kWhat);
  BatchDecodeKernels k;
  k.rows_per_item = g.rows * g.item_heads;
  k.threads = g.threads;
  k.decode_shared_bytes = g.shared_bytes;

  k.decode.family_header = "decode.cuh";
  k.decode.entry = "flare_decode";
  k.decode.variant_source = variant.source;
  k.decode.defines = {
      {"FLARE_HEAD_DIM", std::to_string(config.head_dim)},
      {"FLARE_ROWS", std::to_string(g.rows)},
      {"FLARE_PAGE_SIZE", std::to_string(config.page_size)},
      {"FLARE_Q_DTYPE", dtype_code(config.q_dtype)},
      {"FLARE_KV_DTYPE", dtype_code(config.kv_dtype)},
      {"FLARE_TOKENS_PER_GROUP", std::to_string(g.tokens_per_group)},
      {"FLARE_STAGES", std::to_string(g.stages)},
      {"FLARE_MIN_CTAS_PER_SM", std::to_string(g.min_ctas_per_sm)},
      {"FLARE_SHARED_BYTES", std::to_string(g.shared_bytes)},
      {"FLARE_DECODE_MMA", g.mma ? "1" : "0"},
      {"FLARE_ITEM_HEADS", std::to_string(g.item_heads)},
  };
  k.decode.label =
      std::string(g.mma ? "decode-mma" : "decode") +
      " q=" + std::string(dtype_name(config.q_dtype)) +
      " kv=" + std::string(dtype_name(config.kv_dtype)) + " D=" + std::to_string(config.head_dim) +
      " rows=" + std::to_string(g.rows) + " page=" + std::to_string(config.page_size) +
      (g.item_heads > 1 ? " heads=" + std::to_string(g.item_heads) : "") + " " + variant.name;
  return k;
}

std::vector<BatchDecodeConfig> shipped_decode_configs() {
  std::vector<BatchDecodeConfig> configs;
  const auto add = [&configs](int head_dim, int group, DType q, DType kv, int page_size,
                              const AttentionParams& params) {
    BatchDecodeConfig c;
    c.max_batch = 1;
    c.num_kv_heads = 1;
    c.num_qo_heads = group;
    c.head_dim = head_dim;
    c.page_size = page_size;
    c.q_dtype = q;
    c.kv_dtype = kv;
    c.params = params;
    configs.push_back(c);
  };
  const AttentionParams plain;
  AttentionParams soft_cap;
  soft_cap.logits_soft_cap = 30.0f;
  AttentionParams window;
  window.window_left = 127;
  AttentionParams alibi;
  alibi.pos_encoding = PosEncoding::kAlibi;
  AttentionParams all = alibi;
  all.logits_soft_cap = 30.0f;
  all.window_left = 127;
  for (int head_dim : {64, 128, 256}) {
    // Every row tile on the bf16 path; the other element types at the widest tiles, where
    // registers run out first.
    for (int group : {1, 2, 4, 8}) add(head_dim, group, DType::kBF16, DType::kBF16, 16, plain);
    for (int group : {4, 8}) add(head_dim, group, DType::kBF16, DType::kE4M3, 16, plain);
    add(head_dim, 8, DType::kF16, DType::kF16, 16, plain);
    add(head_dim, 8, DType::kBF16, DType::kE5M2, 16, plain);
    // Every variant flag at once, on both KV paths, and under the 4-CTAs-per-SM register cap.
    add(head_dim, 8, DType::kBF16, DType::kBF16, 16, all);
    add(head_dim, 8, DType::kF16, DType::kE4M3, 16, all);
    add(head_dim, 4, DType::kF16, DType::kF16, 16, all);
  }
  AttentionParams rope;
  rope.pos_encoding = PosEncoding::kRopeLlama;
  for (const AttentionParams* params : {&soft_cap, &window, &alibi}) {
    add(128, 8, DType::kBF16, DType::kBF16, 16, *params);
  }
  for (int head_dim : {64, 128, 256}) {
    add(head_dim, 4, DType::kBF16, DType::kBF16, 16, rope);
    add(head_dim, 4, DType::kF16, DType::kE4M3, 16, rope);  // fp8 K rotated in registers
  }
  for (int page_size : {1, 3, 64}) add(128, 4, DType::kBF16, DType::kBF16, page_size, plain);
  // D 512 (CUDA cores only): every row tile, fp8 KV, every variant flag, RoPE on both KV types.
  for (int group : {1, 2, 4}) add(kWideHeadDim, group, DType::kBF16, DType::kBF16, 16, plain);
  add(kWideHeadDim, 8, DType::kF16, DType::kF16, 16, plain);
  add(kWideHeadDim, 4, DType::kBF16, DType::kE4M3, 16, plain);
  add(kWideHeadDim, 4, DType::kF16, DType::kF16, 16, all);
  add(kWideHeadDim, 4, DType::kF16, DType::kF16, 16, rope);
  add(kWideHeadDim, 4, DType::kF16, DType::kE5M2, 16, rope);
  // NVFP4 KV (uint8 codes + e4m3 scales), CUDA cores: every head dim, the widest row tiles,
  // every flag and RoPE.
  for (int head_dim : {64, 128, 256, kWideHeadDim}) {
    for (int group : {1, 4, 8}) add(head_dim, group, DType::kF16, DType::kU8, 16, plain);
    add(head_dim, 8, DType::kBF16, DType::kU8, 16, all);
    add(head_dim, 4, DType::kF16, DType::kU8, 16, rope);
  }
  // The tensor-core loop: every row tile and head dim on bf16, f16, fp8 KV with either q, and
  // every variant flag.
  const size_t cuda_core_configs = configs.size();
  for (int head_dim : {64, 128, 256}) {
    for (int group : {1, 2, 4, 8}) add(head_dim, group, DType::kBF16, DType::kBF16, 16, plain);
    add(head_dim, 8, DType::kF16, DType::kF16, 16, plain);
    add(head_dim, 4, DType::kF16, DType::kF16, 16, all);
    add(head_dim, 8, DType::kBF16, DType::kBF16, 16, all);
    for (int group : {1, 4, 8}) add(head_dim, group, DType::kBF16, DType::kE4M3, 16, plain);
    add(head_dim, 8, DType::kF16, DType::kE5M2, 16, plain);
    add(head_dim, 8, DType::kF16, DType::kE4M3, 16, all);
    add(head_dim, 4, DType::kBF16, DType::kE5M2, 16, all);
    add(head_dim, 4, DType::kBF16, DType::kBF16, 16, rope);
    add(head_dim, 8, DType::kF16, DType::kF16, 16, rope);
    add(head_dim, 8, DType::kBF16, DType::kE4M3, 16, rope);
  }
  // Whole-page items (kv_heads_per_item > 1): the same dtype pairs and variants at the widest
  // items each head dim allows (8 heads up to D 128 and for fp8, 4 at D 256 16-bit), and the
  // narrower items at D 128.
  const auto add_heads = [&](int heads, int head_dim, int group, DType q, DType kv,
                             const AttentionParams& params) {
    add(head_dim, group, q, kv, 16, params);
    configs.back().num_kv_heads = heads;
    configs.back().num_qo_heads = heads * group;
    configs.back().kv_heads_per_item = heads;
  };
  for (int head_dim : {64, 128, 256}) {
    const int heads = head_dim == 256 ? 4 : 8;
    for (int group : {1, 4, 8})
      add_heads(heads, head_dim, group, DType::kBF16, DType::kBF16, plain);
    add_heads(heads, head_dim, 8, DType::kBF16, DType::kBF16, all);
    add_heads(heads, head_dim, 4, DType::kF16, DType::kF16, all);
    add_heads(8, head_dim, 4, DType::kBF16, DType::kE4M3, plain);
    add_heads(8, head_dim, 8, DType::kF16, DType::kE4M3, all);
    add_heads(8, head_dim, 4, DType::kBF16, DType::kE5M2, all);
  }
  for (int heads : {2, 4}) add_heads(heads, 128, 4, DType::kBF16, DType::kBF16, plain);
  add_heads(8, 128, 4, DType::kBF16, DType::kBF16, rope);
  add_heads(8, 128, 4, DType::kF16, DType::kE5M2, rope);
  for (size_t i = cuda_core_configs; i < configs.size(); ++i) configs[i].use_tensor_cores = true;
  return configs;
}

}  // namespace flare
