// BatchPrefill's configuration as the class shares it with prefill_config.cpp: validation, the
// head group, the largest query tile and CTAs per SM any plan uses, and the tiles a config fixes
// at creation.
#pragma once

#include <optional>

#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_driver.h"

namespace flare::api_detail {

// Query tiles (packed rows) of both families, smaller first.
inline constexpr int kPrefillQueryTiles[] = {16, 32, 64, 128};
inline constexpr int kPrefillMaxQueryTile = 128;
inline constexpr int kPrefillMinQueryTile = 16;  // the smallest tile choose_prefill_tiles picks
// The query tile at which the Hopper family's producer converts NVFP4 K/V (prefill_fused_nvfp4).
inline constexpr int kHopperNvfp4QueryTile = 64;
// Persistent CTAs per SM: two 4-warp CTAs already give 8 warps; more only grows the partial
// workspace (2 slots per CTA, 002 D.3). NVFP4 K/V takes up to three: its 16-row tiles fit three
// (68 KB of shared memory, 118 registers) and their conversion in shared memory is latency-bound
// at 8 warps (b64 q1 kv2048: 0.78x the time at two; docs/perf.md, NVFP4 prefill v5).
int prefill_max_ctas_per_sm(const BatchPrefillConfig& c);

// Head dim 512 (qk == vo) runs the FA2 family in two passes, one a half of the output: kernels of
// head dims 512 / 256 (the scores in full each pass, P.V over half of V's columns), since 512
// columns of O would keep 256 accumulators a thread. The kernels, tiles, plan and workspace
// follow the kernel's head_dim_vo; run() launches each pass on its half of v and o.
inline constexpr int kPrefillWideHeadDim = 512;
int prefill_kernel_head_dim_vo(const BatchPrefillConfig& c);
int prefill_vo_passes(const BatchPrefillConfig& c);  // head_dim_vo / the kernel's

// Throws kInvalidArgument / kUnsupported for a config no prefill kernel handles.
void validate_prefill_config(const BatchPrefillConfig& c);

int prefill_group_size(const BatchPrefillConfig& c);  // H_qo / H_kv

// The limits choose_prefill_tiles reads, of a device (warpgroup_mma: sm_90), and under a
// config's backend (kFA2 turns the Hopper family off, kFA3 makes it the only one and throws
// kUnsupported off sm_90; kAuto keeps it but for paged K/V with RoPE).
PrefillDeviceLimits prefill_limits_of(const cuda::DeviceProperties& props);
PrefillDeviceLimits limits_under_backend(PrefillDeviceLimits limits,
                                         const BatchPrefillConfig& config);

// The Hopper family's query tiles for this head_dim_vo: 128, and 64 at head_dim_vo <= 128.
bool warpgroup_shape(int query_tile, int head_dim_vo);

// Whether NVFP4 K/V (kv_dtype kU8) on these tiles run kernels that read the codes and scales
// and convert them in shared memory (the mma.sync family's; the Hopper family's at
// kHopperNvfp4QueryTile rows where its raw stages fit, without RoPE); otherwise (the Hopper
// family's other tiles, head dim 512's two passes) run() stages a 16-bit copy first
// (prefill_nvfp4.h).
bool prefill_fused_nvfp4(const BatchPrefillConfig& config, const PrefillTiles& tiles);

// The tiles with the config's explicit kv_tile, if any.
PrefillTiles with_config_kv_tile(PrefillTiles tiles, const BatchPrefillConfig& config);

// The tiles every plan of `config` uses (CUDA graphs, fixed query tiles, fixed_split_size), or
// none when each plan picks its own from its batch.
std::optional<PrefillTiles> fixed_prefill_tiles(const BatchPrefillConfig& config,
                                                const PrefillDeviceLimits& limits);

}  // namespace flare::api_detail
