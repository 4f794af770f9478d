// The (config, tiles) pairs flare ships (include/flare/api/batch_prefill.h
// shipped_prefill_configs): what CI compiles for sm_80 and sm_90a with zero spills.
#include <utility>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "src/api/prefill_config.h"

namespace flare {

using api_detail::kPrefillQueryTiles;
using api_detail::kPrefillWideHeadDim;
using api_detail::prefill_kernel_head_dim_vo;
using api_detail::warpgroup_shape;

std::vector<ShippedPrefillConfig> shipped_prefill_configs() {
  const PrefillDeviceLimits h100 = h100_prefill_limits();
  std::vector<ShippedPrefillConfig> shipped;
  const auto add = [&](int qk, int vo, int query_tile, PrefillKV kv, DType dtype,
                       const AttentionParams& params) {
    ShippedPrefillConfig s;
    s.config.max_batch = 1;
    s.config.max_total_qo = 1;
    s.config.num_qo_heads = 1;
    s.config.num_kv_heads = 1;
    s.config.head_dim_qk = qk;
    s.config.head_dim_vo = vo;
    s.config.kv = kv;
    s.config.dtype = dtype;
    s.config.params = params;
    s.tiles = {query_tile,
               choose_prefill_kv_tile(query_tile, qk, prefill_kernel_head_dim_vo(s.config),
                                      params.mask, h100)};
    shipped.push_back(s);
  };
  AttentionParams causal;
  causal.mask = MaskMode::kCausal;
  AttentionParams custom;
  custom.mask = MaskMode::kCustom;
  AttentionParams all = causal;
  all.logits_soft_cap = 30.0f;
  all.window_left = 127;
  all.pos_encoding = PosEncoding::kAlibi;
  const std::pair<int, int> dims[] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  for (const auto& [qk, vo] : dims) {
    for (const int tile : kPrefillQueryTiles)
      add(qk, vo, tile, PrefillKV::kPaged, DType::kBF16, causal);
    add(qk, vo, 128, PrefillKV::kRagged, DType::kBF16, causal);
    add(qk, vo, 128, PrefillKV::kPaged, DType::kF16, all);
    add(qk, vo, 16, PrefillKV::kPaged, DType::kBF16, custom);
  }
  add(128, 128, 128, PrefillKV::kRagged, DType::kBF16, AttentionParams{});
  // A causal window alone and with soft-cap, at the tiles of long prefills: at 255 registers
  // these spilled while every flag together did not (docs/perf.md, issue 18).
  AttentionParams window = causal;
  window.window_left = 1024;
  AttentionParams capped_window = window;
  capped_window.logits_soft_cap = 30.0f;
  for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPaged}) {
    add(128, 128, 128, kv, DType::kBF16, window);
    add(128, 128, 128, kv, DType::kBF16, capped_window);
  }
  // Fused RoPE: every head dim, both KV paths, and at the long prefills' tiles with a window.
  AttentionParams rope = causal;
  rope.pos_encoding = PosEncoding::kRopeLlama;
  for (const auto& [qk, vo] : dims) add(qk, vo, 128, PrefillKV::kPaged, DType::kBF16, rope);
  add(128, 128, 128, PrefillKV::kRagged, DType::kF16, rope);
  add(128, 128, 64, PrefillKV::kPaged, DType::kBF16, rope);
  AttentionParams rope_window = rope;
  rope_window.window_left = 1024;
  add(128, 128, 128, PrefillKV::kRagged, DType::kBF16, rope_window);
  add(128, 128, 64, PrefillKV::kRagged, DType::kF16, custom);
  add(128, 128, 128, PrefillKV::kPaged, DType::kBF16, custom);  // one m16 tile per warp
  add(256, 256, 128, PrefillKV::kRagged, DType::kF16, custom);
  add(256, 256, 64, PrefillKV::kRagged, DType::kF16, custom);
  // NVFP4 K/V on the mma.sync family (codes and scales converted in shared memory): every head
  // dim below 512, both KV paths, the short query tiles that read long KV, and 128 rows.
  const auto add_nvfp4 = [&](int qk, int vo, int query_tile, PrefillKV kv, DType dtype,
                             const AttentionParams& params) {
    add(qk, vo, query_tile, kv, dtype, params);
    PrefillDeviceLimits limits = h100;
    limits.nvfp4_raw_stages = true;
    shipped.back().config.kv_dtype = DType::kU8;
    shipped.back().config.max_total_kv = 1;
    shipped.back().tiles.kv_tile = choose_prefill_kv_tile(query_tile, qk, vo, params.mask, limits);
  };
  for (const auto& [qk, vo] : dims) {
    add_nvfp4(qk, vo, 16, PrefillKV::kPaged, DType::kBF16, causal);
    add_nvfp4(qk, vo, 64, PrefillKV::kRagged, DType::kF16, all);
  }
  add_nvfp4(128, 128, 128, PrefillKV::kPaged, DType::kF16, causal);
  add_nvfp4(128, 128, 32, PrefillKV::kPaged, DType::kBF16, rope);
  add_nvfp4(128, 128, 16, PrefillKV::kRagged, DType::kBF16, custom);
  // Head dim 512 (two passes of kernels 512 / 256, the FA2 family): every query tile that fits
  // (128 rows of 1 KiB Q rows leave no room for K/V stages), both KV paths, every flag, the
  // custom mask, RoPE and a capped window.
  for (const int tile : {16, 32, 64}) {
    add(kPrefillWideHeadDim, kPrefillWideHeadDim, tile, PrefillKV::kPaged, DType::kBF16, causal);
  }
  add(kPrefillWideHeadDim, kPrefillWideHeadDim, 64, PrefillKV::kRagged, DType::kF16, all);
  add(kPrefillWideHeadDim, kPrefillWideHeadDim, 16, PrefillKV::kPaged, DType::kBF16, custom);
  add(kPrefillWideHeadDim, kPrefillWideHeadDim, 64, PrefillKV::kRagged, DType::kBF16, rope);
  add(kPrefillWideHeadDim, kPrefillWideHeadDim, 64, PrefillKV::kPaged, DType::kF16, capped_window);

  // The Hopper family (sm_90a only): every head-dim pair and query tile, both KV paths, every
  // mask, and the register-heaviest variants (every flag, RoPE, the capped window) at 128 rows.
  PrefillDeviceLimits hopper = h100;
  hopper.warpgroup_mma = true;
  const auto add_hopper = [&](int qk, int vo, int query_tile, PrefillKV kv, DType dtype,
                              const AttentionParams& params) {
    add(qk, vo, query_tile, kv, dtype, params);
    shipped.back().tiles = {query_tile,
                            choose_prefill_kv_tile(query_tile, qk, vo, params.mask, hopper), true};
  };
  for (const auto& [qk, vo] : dims) {
    for (const int tile : {64, 128}) {
      if (warpgroup_shape(tile, vo)) {
        add_hopper(qk, vo, tile, PrefillKV::kPaged, DType::kBF16, causal);
      }
    }
    add_hopper(qk, vo, 128, PrefillKV::kRagged, DType::kBF16, causal);
    add_hopper(qk, vo, 128, PrefillKV::kPaged, DType::kF16, all);
    add_hopper(qk, vo, 128, PrefillKV::kPaged, DType::kBF16, rope);
    add_hopper(qk, vo, 128, PrefillKV::kPaged, DType::kBF16, custom);
  }
  add_hopper(128, 128, 128, PrefillKV::kRagged, DType::kF16, rope);  // auto's ragged RoPE
  add_hopper(256, 256, 128, PrefillKV::kRagged, DType::kF16, custom);
  add_hopper(128, 128, 128, PrefillKV::kRagged, DType::kBF16, AttentionParams{});
  add_hopper(128, 128, 128, PrefillKV::kRagged, DType::kBF16, capped_window);
  add_hopper(128, 128, 128, PrefillKV::kRagged, DType::kBF16, rope_window);
  // ALiBi alone: the affine-logits softmax (kernels/variant.cuh has_affine_logits), which the
  // flags together do not take; both KV paths at D 128, and D 256's registers.
  AttentionParams alibi = causal;
  alibi.pos_encoding = PosEncoding::kAlibi;
  add_hopper(128, 128, 128, PrefillKV::kRagged, DType::kBF16, alibi);
  add_hopper(128, 128, 128, PrefillKV::kPaged, DType::kBF16, alibi);
  add_hopper(256, 256, 128, PrefillKV::kPaged, DType::kBF16, alibi);
  // NVFP4 K/V converted by the Hopper family's producer (64-row tiles, head_dim_vo <= 128): both
  // KV paths, every flag.
  PrefillDeviceLimits hopper_nvfp4 = hopper;
  hopper_nvfp4.nvfp4_raw_stages = true;
  const auto add_hopper_nvfp4 = [&](int qk, int vo, int query_tile, PrefillKV kv, DType dtype,
                                    const AttentionParams& params) {
    add(qk, vo, query_tile, kv, dtype, params);
    shipped.back().config.kv_dtype = DType::kU8;
    shipped.back().config.max_total_kv = 1;
    shipped.back().tiles = {
        query_tile, choose_prefill_kv_tile(query_tile, qk, vo, params.mask, hopper_nvfp4), true};
  };
  for (const auto& [qk, vo] : dims) {
    if (!warpgroup_shape(api_detail::kHopperNvfp4QueryTile, vo)) continue;
    add_hopper_nvfp4(qk, vo, api_detail::kHopperNvfp4QueryTile, PrefillKV::kPaged, DType::kBF16,
                     causal);
    add_hopper_nvfp4(qk, vo, api_detail::kHopperNvfp4QueryTile, PrefillKV::kRagged, DType::kF16,
                     all);
  }
  return shipped;
}

}  // namespace flare
