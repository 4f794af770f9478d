// BatchPrefill's configuration: validation, the tile heuristic (paper 001 §3.2.2), the prefill
// and merge kernel specs, and the tiles a config fixes (the shipped configurations CI compiles:
// prefill_shipped_configs.cpp).
#include "src/api/prefill_config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/api/rope.h"
#include "flare/core/error.h"
#include "kernels/prefill_params.cuh"
#include "src/api/prefill_rope_staging.h"
#include "src/api/variant_support.h"

namespace flare {
namespace api_detail {
namespace {

const char* const kWhat = "BatchPrefill";
constexpr int kKvTiles[] = {128, 64, 32};  // larger first: ties keep the larger tile
static_assert(kPrefillQueryTiles[std::size(kPrefillQueryTiles) - 1] == kPrefillMaxQueryTile,
              "prefill_config.h: the largest query tile");
static_assert(kPrefillQueryTiles[0] == kPrefillMinQueryTile, "prefill_config.h: the smallest");
// fp32 accumulators (O and S fragments) per thread, by m16 tiles per warp: above the hard cap
// ptxas spills (measured: one m16 tile, 160 spills with the custom mask or the full variant on
// sm_80; two m16 tiles, 256 spill at every configuration, 192 compile to 255 registers with the
// statistics parked in shared memory); within the comfortable budget ties prefer the larger KV
// tile (measured on an H200 with one m16 tile, bf16 causal D 128: 128x128 tiles ran 6-10%
// faster than 128x64, docs/perf.md).
constexpr int kMaxAccumulatorRegisters[] = {0, 144, 192};
constexpr int kComfortableAccumulatorRegisters[] = {0, 128, 192};
// KV columns of S per warp, by m16 tiles per warp: two m16 tiles with 128 columns spill at D 64
// (sm_80 and sm_90a, 12-92 bytes) although their 192 accumulators match D 128 with 64 columns:
// the K fragments of a k-step double. Custom masks gather one mask bit per S element before
// Q.K^T: 128 columns spill 8 bytes on sm_80.
constexpr int kMaxScoreColumns[] = {0, 128, 64};
constexpr int kMaxCustomMaskColumns = 64;
// The Hopper family (one m16 tile per warp, 8 warps on 128 rows at 1 CTA per SM): S and O
// accumulators of D 128 x 128 KV columns (128) or D 256 x 64 (160) leave room for P's
// fragments and the row state under 255 registers; D 256 x 128 (192) would not.
constexpr int kMaxWarpgroupAccumulators = 160;
constexpr int kWarpgroupKvTiles[] = {128, 64};
// Registers are allocated per warp in units of 256 per thread (255 usable).
constexpr int kRegistersPerThreadAllocated = 256;
constexpr int kReservedSharedPerCta = 1024;  // the driver's per-CTA reservation

int group_size(const BatchPrefillConfig& c) { return c.num_qo_heads / c.num_kv_heads; }

bool valid_head_dims(int qk, int vo) {
  return (qk == vo && (qk == 64 || qk == 128 || qk == 256 || qk == kPrefillWideHeadDim)) ||
         (qk == 192 && vo == 128);
}

AttentionParams variant_params(const AttentionParams& p) {
  AttentionParams variant = p;
  variant.mask = MaskMode::kNone;  // masks are the prefill kernel's own (FLARE_MASK)
  return variant;
}

void validate_config(const BatchPrefillConfig& c) {
  FLARE_CHECK(c.device >= 0, ErrorCode::kInvalidArgument, kWhat, ": device must be >= 0, got ",
              c.device);
  FLARE_CHECK(c.max_batch >= 1 && c.max_total_qo >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": max_batch and max_total_qo must be >= 1, got ", c.max_batch, " and ",
              c.max_total_qo);
  FLARE_CHECK(c.max_levels >= 1 && c.max_levels <= 16, ErrorCode::kInvalidArgument, kWhat,
              ": max_levels must be in [1, 16], got ", c.max_levels);
  FLARE_CHECK(c.num_qo_heads >= 1 && c.num_kv_heads >= 1 && c.num_qo_heads % c.num_kv_heads == 0,
              ErrorCode::kInvalidArgument, kWhat,
              ": num_kv_heads must be >= 1 and divide num_qo_heads, got num_qo_heads=",
              c.num_qo_heads, " num_kv_heads=", c.num_kv_heads);
  FLARE_CHECK(valid_head_dims(c.head_dim_qk, c.head_dim_vo), ErrorCode::kUnsupported, kWhat,
              ": head dims must be 64, 128, 256 or 512 (qk == vo) or 192/128, got head_dim_qk=",
              c.head_dim_qk, " head_dim_vo=", c.head_dim_vo);
  FLARE_CHECK(c.head_dim_qk != kPrefillWideHeadDim || c.backend != PrefillBackend::kFA3,
              ErrorCode::kUnsupported, kWhat,
              ": head dim 512 runs on the FA2 family only (two passes over halves of the output); "
              "backend kFA3 was asked for");
  FLARE_CHECK(c.kv == PrefillKV::kRagged || c.page_size >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": page_size must be >= 1, got ", c.page_size);
  FLARE_CHECK(c.dtype == DType::kF16 || c.dtype == DType::kBF16, ErrorCode::kUnsupported, kWhat,
              ": dtype must be float16 or bfloat16, got ", dtype_name(c.dtype));
  FLARE_CHECK(!c.kv_dtype || *c.kv_dtype == c.dtype || *c.kv_dtype == DType::kU8,
              ErrorCode::kUnsupported, kWhat, ": kv_dtype must be dtype (", dtype_name(c.dtype),
              ") or uint8 (NVFP4), got ", c.kv_dtype ? dtype_name(*c.kv_dtype) : "");
  FLARE_CHECK(c.kv_dtype != DType::kU8 || c.max_total_kv >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": NVFP4 KV (kv_dtype uint8) needs max_total_kv >= 1 (the staged copy's ",
              c.kv == PrefillKV::kPaged ? "pages" : "rows", "), got ", c.max_total_kv);
  FLARE_CHECK(c.rope_staging != RopeStaging::kStaged || rope_staging_applies(c),
              ErrorCode::kInvalidArgument, kWhat,
              ": rope_staging kStaged needs pos_encoding kRopeLlama, ragged 16-bit K/V, no user "
              "variant, max_levels 1, head_dim_qk a multiple of 16 of at most ",
              2 * kRopeMaxPairs,
              " and under use_cuda_graph max_total_kv >= 1 (the k copy's rows), "
              "got head_dim_qk ",
              c.head_dim_qk, " and max_total_kv ", c.max_total_kv);
  FLARE_CHECK(c.query_tile == 0 || std::ranges::count(kPrefillQueryTiles, c.query_tile) == 1,
              ErrorCode::kInvalidArgument, kWhat, ": query_tile must be 0, 16, 32, 64 or 128, got ",
              c.query_tile);
  FLARE_CHECK(c.kv_tile == 0 || std::ranges::count(kKvTiles, c.kv_tile) == 1,
              ErrorCode::kInvalidArgument, kWhat, ": kv_tile must be 0, 32, 64 or 128, got ",
              c.kv_tile);
  FLARE_CHECK(
      c.backend != PrefillBackend::kFA3 ||
          (warpgroup_shape(c.query_tile == 0 ? 128 : c.query_tile, prefill_kernel_head_dim_vo(c)) &&
           c.kv_tile != 32),
      ErrorCode::kInvalidArgument, kWhat,
      ": backend kFA3 (the Hopper family) takes query_tile 0, 64 (head_dim_vo <= 128) or "
      "128, and kv_tile 0, 64 or 128; got query_tile=",
      c.query_tile, " kv_tile=", c.kv_tile, " head_dim_vo=", c.head_dim_vo);
  FLARE_CHECK(c.fixed_split_size >= 0 && c.num_sms_to_use >= 0, ErrorCode::kInvalidArgument, kWhat,
              ": fixed_split_size and num_sms_to_use must be >= 0, got ", c.fixed_split_size,
              " and ", c.num_sms_to_use);
  const AttentionParams& p = c.params;
  FLARE_CHECK(std::isfinite(p.sm_scale) && p.sm_scale >= 0.0f && std::isfinite(p.logits_soft_cap),
              ErrorCode::kInvalidArgument, kWhat,
              ": sm_scale (>= 0, 0 = 1/sqrt(D)) and logits_soft_cap must be finite, got ",
              p.sm_scale, " and ", p.logits_soft_cap);
  FLARE_CHECK(p.k_scale == 1.0f && p.v_scale == 1.0f, ErrorCode::kUnsupported, kWhat,
              ": k_scale and v_scale (fp8 KV) are not supported, got ", p.k_scale, " and ",
              p.v_scale);
  // Throws for what no kernel expresses.
  api_detail::resolve_variant(variant_params(p), c.variant, c.num_qo_heads, kWhat);
  FLARE_CHECK(!c.variant || !c.variant->requires_causal || p.mask == MaskMode::kCausal,
              ErrorCode::kInvalidArgument, kWhat, ": variant '",
              c.variant ? c.variant->name : std::string(),
              "' requires the causal mask (UserVariant::requires_causal), but params.mask is not "
              "MaskMode::kCausal");
}

int mask_code(MaskMode mask) {
  switch (mask) {
    case MaskMode::kNone:
      return kMaskNone;
    case MaskMode::kCausal:
      return kMaskCausal;
    case MaskMode::kCustom:
      return kMaskCustom;
  }
  return kMaskNone;
}

// Whether query tiles of this size run the Hopper family under these limits. NVFP4 K/V under
// kAuto keeps tiles below 64 rows on the FA2 family's NVFP4 kernels (at 16 rows: 1.07x the
// 16-bit time, the Hopper family's 64-row tile 1.37x); at 64 rows the Hopper family's producer
// converts (1.21x, the FA2 family 1.38x), at 128 it reads run()'s staged 16-bit copy (1.03x, the
// producer's conversion 1.28x): docs/perf.md, NVFP4 prefill v7.
bool uses_warpgroup(int query_tile, int head_dim_vo, const PrefillDeviceLimits& limits) {
  if (limits.nvfp4_raw_stages && !limits.warpgroup_only && query_tile < 64) return false;
  return limits.warpgroup_mma && warpgroup_shape(query_tile, head_dim_vo);
}

// Warps of `shape`'s CTAs resident on one SM: by shared memory, and by registers (255 a thread
// in the mma.sync family; the Hopper family's setmaxnreg split is made for its CTAs per SM).
int resident_warps(const PrefillShape& shape, int shared, const PrefillDeviceLimits& limits) {
  const int threads = prefill_threads(shape);
  const int by_shared = limits.shared_bytes_per_sm / (shared + kReservedSharedPerCta);
  const int by_registers = shape.warpgroup != 0
                               ? prefill_warpgroup_ctas_per_sm(shape)
                               : limits.registers_per_sm / (threads * kRegistersPerThreadAllocated);
  return std::min(by_shared, by_registers) * threads / 32;
}

// The Hopper family's KV tile: the one whose accumulators and shared memory fit with the most
// resident warps per SM, the larger on ties (64-row tiles take 64 KV rows: two CTAs per SM
// instead of one); 0 if none fits.
int fitting_warpgroup_kv_tile(int query_tile, int head_dim_qk, int head_dim_vo, MaskMode mask,
                              const PrefillDeviceLimits& limits, bool nvfp4) {
  int best_tile = 0;
  int best_warps = 0;
  for (const int kv_tile : kWarpgroupKvTiles) {
    const PrefillShape shape{query_tile,      kv_tile, head_dim_qk,  head_dim_vo,
                             mask_code(mask), 1,       nvfp4 ? 1 : 0};
    if (4 * (head_dim_vo / 8 + kv_tile / 8) > kMaxWarpgroupAccumulators) continue;
    // The custom mask's per-key bits, gathered while the previous tile's P and the scores are
    // live, spill 128 KV columns (ptxas, sm_90a).
    if (mask == MaskMode::kCustom && kv_tile > kMaxCustomMaskColumns) continue;
    // Q rows of 384 bytes (head_dim_qk 192) with 128 KV columns spill the variants' row state.
    if (head_dim_qk > 128 && kv_tile > 64) continue;
    const int shared = prefill_launch_shared_bytes(shape);
    if (shared > limits.max_shared_bytes_per_block) continue;
    const int warps = resident_warps(shape, shared, limits);
    if (warps > best_warps) {  // larger tiles come first
      best_warps = warps;
      best_tile = kv_tile;
    }
  }
  return best_tile;
}

// The KV tile rule of choose_prefill_tiles; 0 when no KV tile fits.
int fitting_kv_tile(int query_tile, int head_dim_qk, int head_dim_vo, MaskMode mask,
                    const PrefillDeviceLimits& limits) {
  if (uses_warpgroup(query_tile, head_dim_vo, limits)) {
    // NVFP4: the tiles whose raw stages fit too (the producer converts), else the staged copy's
    // (prefill_fused_nvfp4 decides by the same fit).
    const int tile =
        limits.nvfp4_raw_stages && query_tile == api_detail::kHopperNvfp4QueryTile
            ? fitting_warpgroup_kv_tile(query_tile, head_dim_qk, head_dim_vo, mask, limits, true)
            : 0;
    return tile > 0 ? tile
                    : fitting_warpgroup_kv_tile(query_tile, head_dim_qk, head_dim_vo, mask, limits,
                                                false);
  }
  int best_tile = 0;
  std::pair<int, int> best_score{0, 0};
  for (const int kv_tile : kKvTiles) {
    const PrefillShape shape{query_tile,
                             kv_tile,
                             head_dim_qk,
                             head_dim_vo,
                             mask_code(mask),
                             0,
                             limits.nvfp4_raw_stages ? 1 : 0};
    const int mma_q = prefill_mma_q(shape);
    const int kv_per_warp = kv_tile / prefill_warps_kv(shape);
    if (kv_per_warp < 16) continue;  // a KV warp owns whole k16 steps of P.V
    if (kv_per_warp > kMaxScoreColumns[mma_q]) continue;
    if (mask == MaskMode::kCustom && kv_per_warp > kMaxCustomMaskColumns) continue;
    const int accumulators = mma_q * 4 * (head_dim_vo / 8 + kv_per_warp / 8);
    if (accumulators > kMaxAccumulatorRegisters[mma_q]) continue;
    const int shared = prefill_shared_bytes(shape);
    if (shared > limits.max_shared_bytes_per_block) continue;
    const int warps = resident_warps(shape, shared, limits);
    // Most resident warps first; then the larger KV tile within the comfortable register
    // budget, else the fewer accumulators.
    const std::pair<int, int> score{
        warps, accumulators <= kComfortableAccumulatorRegisters[mma_q] ? kv_tile : -accumulators};
    if (best_tile == 0 || score > best_score) {
      best_score = score;
      best_tile = kv_tile;
    }
  }
  return best_tile;
}

}  // namespace

// The Hopper family's shapes: query tiles of 128 rows, or 64 with head_dim_vo <= 128 (two CTAs
// per SM then cap the registers at launch to 128 a thread, fewer than an m64n256 MMA needs).
// Every mask: the custom mask's bits are gathered before S = Q K^T is issued (prefill_hopper.cuh
// tile_mask_bits), outside the softmax's register peak, which spilled at head_dim_vo 256.
bool warpgroup_shape(int query_tile, int head_dim_vo) {
  if (head_dim_vo > 128) return query_tile == 128;
  return query_tile == 128 || query_tile == 64;
}

void validate_prefill_config(const BatchPrefillConfig& c) { validate_config(c); }
int prefill_kernel_head_dim_vo(const BatchPrefillConfig& c) {
  return c.head_dim_vo == kPrefillWideHeadDim ? kPrefillWideHeadDim / 2 : c.head_dim_vo;
}
int prefill_vo_passes(const BatchPrefillConfig& c) {
  return c.head_dim_vo / prefill_kernel_head_dim_vo(c);
}
int prefill_group_size(const BatchPrefillConfig& c) { return group_size(c); }

}  // namespace api_detail

using api_detail::fitting_kv_tile;
using api_detail::kKvTiles;
using api_detail::kPrefillQueryTiles;
using api_detail::kPrefillWideHeadDim;
using api_detail::kWhat;
using api_detail::mask_code;
using api_detail::prefill_kernel_head_dim_vo;
using api_detail::uses_warpgroup;
using api_detail::valid_head_dims;
using api_detail::validate_config;
using api_detail::variant_params;
using api_detail::warpgroup_shape;

int choose_prefill_kv_tile(int query_tile, int head_dim_qk, int head_dim_vo, MaskMode mask,
                           const PrefillDeviceLimits& limits) {
  const int tile = fitting_kv_tile(query_tile, head_dim_qk, head_dim_vo, mask, limits);
  FLARE_CHECK(tile > 0, ErrorCode::kUnsupported, kWhat, ": no KV tile fits query tile ", query_tile,
              " with head dims ", head_dim_qk, "/", head_dim_vo, " in ",
              limits.max_shared_bytes_per_block, " bytes of shared memory per block");
  return tile;
}

PrefillTiles choose_prefill_tiles(double average_packed_rows, int head_dim_qk, int head_dim_vo,
                                  MaskMode mask, const PrefillDeviceLimits& limits) {
  size_t index = std::size(kPrefillQueryTiles) - 1;
  for (size_t i = 0; i < std::size(kPrefillQueryTiles); ++i) {
    if (kPrefillQueryTiles[i] >= average_packed_rows &&
        (!limits.warpgroup_only || warpgroup_shape(kPrefillQueryTiles[i], head_dim_vo))) {
      index = i;
      break;
    }
  }
  // A device with little shared memory takes the largest smaller query tile that fits.
  while (index > 0 &&
         fitting_kv_tile(kPrefillQueryTiles[index], head_dim_qk, head_dim_vo, mask, limits) == 0) {
    --index;
  }
  PrefillTiles tiles;
  tiles.query_tile = kPrefillQueryTiles[index];
  tiles.kv_tile = choose_prefill_kv_tile(tiles.query_tile, head_dim_qk, head_dim_vo, mask, limits);
  tiles.warpgroup = uses_warpgroup(tiles.query_tile, head_dim_vo, limits);
  return tiles;
}

PrefillDeviceLimits h100_prefill_limits() {
  PrefillDeviceLimits limits;
  limits.max_shared_bytes_per_block = 227 * 1024;
  limits.shared_bytes_per_sm = 228 * 1024;
  limits.registers_per_sm = 65536;
  return limits;
}

BatchPrefillKernels batch_prefill_kernels(const BatchPrefillConfig& config,
                                          const PrefillTiles& tiles) {
  validate_config(config);
  const int head_dim_vo = prefill_kernel_head_dim_vo(config);
  // NVFP4 K/V: both families convert in shared memory (prefill_fused_nvfp4); head dim 512's two
  // passes and the Hopper family with RoPE read run()'s staged 16-bit copy.
  const bool nvfp4 = api_detail::prefill_fused_nvfp4(config, tiles);
  const PrefillShape shape{tiles.query_tile,
                           tiles.kv_tile,
                           config.head_dim_qk,
                           head_dim_vo,
                           mask_code(config.params.mask),
                           tiles.warpgroup ? 1 : 0,
                           nvfp4 ? 1 : 0};
  FLARE_CHECK(std::ranges::count(kPrefillQueryTiles, tiles.query_tile) == 1 &&
                  std::ranges::count(kKvTiles, tiles.kv_tile) == 1 &&
                  tiles.kv_tile / prefill_warps_kv(shape) >= 16 &&
                  (!tiles.warpgroup ||
                   (config.head_dim_qk <= 256 && warpgroup_shape(tiles.query_tile, head_dim_vo) &&
                    tiles.kv_tile >= 64)),
              ErrorCode::kInvalidArgument, kWhat, ": tiles ", tiles.query_tile, "x", tiles.kv_tile,
              tiles.warpgroup ? " (Hopper family)" : "", " are not a kernel configuration");
  const api_detail::ResolvedVariant variant = api_detail::resolve_variant(
      variant_params(config.params), config.variant, config.num_qo_heads, kWhat);
  const bool paged = config.kv == PrefillKV::kPaged;
  const std::string dtype = std::to_string(static_cast<int>(config.dtype));
  BatchPrefillKernels k;
  k.threads = prefill_launch_threads(shape);
  k.shared_bytes = static_cast<size_t>(prefill_launch_shared_bytes(shape));

  k.prefill.family_header = "prefill_kernel.cuh";
  k.prefill.entry = "flare_prefill";
  k.prefill.variant_source = variant.source;
  k.prefill.defines = {
      {"FLARE_HEAD_DIM_QK", std::to_string(config.head_dim_qk)},
      {"FLARE_HEAD_DIM_VO", std::to_string(head_dim_vo)},
      {"FLARE_QUERY_TILE", std::to_string(tiles.query_tile)},
      {"FLARE_KV_TILE", std::to_string(tiles.kv_tile)},
      {"FLARE_Q_DTYPE", dtype},
      {"FLARE_KV_PAGED", paged ? "1" : "0"},
      {"FLARE_PAGE_SIZE", std::to_string(paged ? config.page_size : 1)},
      {"FLARE_MASK", std::to_string(mask_code(config.params.mask))},
      {"FLARE_WARPGROUP", tiles.warpgroup ? "1" : "0"},
      {"FLARE_KV_NVFP4", nvfp4 ? "1" : "0"},
  };
  k.prefill.label = "prefill " + std::string(dtype_name(config.dtype)) +
                    " D=" + std::to_string(config.head_dim_qk) + "/" + std::to_string(head_dim_vo) +
                    " tile=" + std::to_string(tiles.query_tile) + "x" +
                    std::to_string(tiles.kv_tile) +
                    (paged ? " page=" + std::to_string(config.page_size) : " ragged") +
                    " mask=" + std::to_string(mask_code(config.params.mask)) + " " + variant.name +
                    (tiles.warpgroup ? " wgmma" : "") + (nvfp4 ? " nvfp4" : "");

  k.merge.family_header = "merge.cuh";
  k.merge.entry = "flare_merge";
  k.merge.defines = {{"FLARE_HEAD_DIM", std::to_string(head_dim_vo)}, {"FLARE_Q_DTYPE", dtype}};
  k.merge.label =
      "merge o=" + std::string(dtype_name(config.dtype)) + " D=" + std::to_string(head_dim_vo);
  return k;
}

PrefillDeviceLimits api_detail::prefill_limits_of(const cuda::DeviceProperties& props) {
  PrefillDeviceLimits limits;
  limits.max_shared_bytes_per_block = props.max_shared_bytes_per_block_optin;
  limits.shared_bytes_per_sm = props.max_shared_bytes_per_sm;
  limits.registers_per_sm = props.registers_per_sm;
  limits.warpgroup_mma = props.cc_major == 9 && props.cc_minor == 0;
  return limits;
}

PrefillDeviceLimits api_detail::limits_under_backend(PrefillDeviceLimits limits,
                                                     const BatchPrefillConfig& config) {
  FLARE_CHECK(config.backend != PrefillBackend::kFA3 || limits.warpgroup_mma,
              ErrorCode::kUnsupported, kWhat,
              ": backend kFA3 (the Hopper family, warpgroup MMAs) needs an sm_90 GPU, device ",
              config.device, " is not one");
  // Under kAuto the Hopper family takes K/V without RoPE, ragged (bulk tensor copies) or paged
  // (the producer's gathers in groups of rows: 1.03-1.13x the FA2 family on causal prefill at
  // page 16, 0.98x on append; H200, docs/perf.md, Hopper v14). With RoPE, whose producer
  // rotates the landed rows, ragged K/V takes the Hopper family (1.04-1.10x the FA2 family on
  // causal prefill) and paged K/V stays on FA2 unless kFA3 asks for the Hopper family (0.97-
  // 1.00x there, 0.95x on append: H200, docs/perf.md forty-first session C).
  // Head dim 512 runs the FA2 family only (prefill_kernel_head_dim_vo).
  const bool rotated_pages =
      config.params.pos_encoding == PosEncoding::kRopeLlama && config.kv == PrefillKV::kPaged;
  limits.warpgroup_mma = limits.warpgroup_mma && config.backend != PrefillBackend::kFA2 &&
                         (config.backend == PrefillBackend::kFA3 || !rotated_pages) &&
                         config.head_dim_qk != kPrefillWideHeadDim;
  limits.warpgroup_only = config.backend == PrefillBackend::kFA3;
  limits.nvfp4_raw_stages =
      config.kv_dtype == DType::kU8 && config.head_dim_qk != kPrefillWideHeadDim;
  return limits;
}

int api_detail::prefill_max_ctas_per_sm(const BatchPrefillConfig& c) {
  return c.kv_dtype == DType::kU8 ? 3 : 2;
}

// sm_90's opt-in shared memory per block (the Hopper family runs on sm_90 only).
constexpr int kHopperMaxSharedBytesPerBlock = 227 * 1024;

bool api_detail::prefill_fused_nvfp4(const BatchPrefillConfig& config, const PrefillTiles& tiles) {
  if (config.kv_dtype != DType::kU8 || config.head_dim_qk == kPrefillWideHeadDim) return false;
  if (!tiles.warpgroup) return true;
  // The Hopper family converts in its producer at 64-row tiles (uses_warpgroup says why) where
  // its raw stages fit and without RoPE (the producer rotates 16-bit rows); otherwise it reads
  // the staged copy, as head dim 512 does.
  const PrefillShape shape{tiles.query_tile,
                           tiles.kv_tile,
                           config.head_dim_qk,
                           prefill_kernel_head_dim_vo(config),
                           mask_code(config.params.mask),
                           1,
                           1};
  return tiles.query_tile == api_detail::kHopperNvfp4QueryTile &&
         config.params.pos_encoding != PosEncoding::kRopeLlama &&
         prefill_launch_shared_bytes(shape) <= kHopperMaxSharedBytesPerBlock;
}

PrefillTiles api_detail::with_config_kv_tile(PrefillTiles tiles, const BatchPrefillConfig& config) {
  if (config.kv_tile > 0) {
    tiles.kv_tile = config.kv_tile;
    // KV tiles of 32 rows exist in the FA2 family only (kFA3 refuses them at creation).
    tiles.warpgroup = tiles.warpgroup && config.kv_tile >= 64;
  }
  return tiles;
}

std::optional<PrefillTiles> api_detail::fixed_prefill_tiles(const BatchPrefillConfig& config,
                                                            const PrefillDeviceLimits& limits) {
  if (!config.use_cuda_graph && config.query_tile == 0 && config.fixed_split_size == 0) {
    return std::nullopt;
  }
  // A cascade's tile depends on its levels (plan_cascade prices each): under CUDA graphs the
  // first plan fixes it (BatchPrefill::commit_plan), before any capture.
  if (config.max_levels > 1 && config.query_tile == 0 && config.fixed_split_size == 0) {
    return std::nullopt;
  }
  PrefillTiles t;
  const int head_dim_vo = prefill_kernel_head_dim_vo(config);
  if (config.fixed_split_size > 0 && config.query_tile == 0) {
    // Batch invariance: the tiles must not follow the batch's average query length.
    t = choose_prefill_tiles(kPrefillMaxQueryTile, config.head_dim_qk, head_dim_vo,
                             config.params.mask, limits);
  } else if (config.query_tile > 0) {
    t.query_tile = config.query_tile;
    t.kv_tile = choose_prefill_kv_tile(t.query_tile, config.head_dim_qk, head_dim_vo,
                                       config.params.mask, limits);
    t.warpgroup = uses_warpgroup(t.query_tile, head_dim_vo, limits);
  } else {
    const double average =
        static_cast<double>(config.max_total_qo) * prefill_group_size(config) / config.max_batch;
    t = choose_prefill_tiles(average, config.head_dim_qk, head_dim_vo, config.params.mask, limits);
  }
  return with_config_kv_tile(t, config);
}

}  // namespace flare
