// precompile(): the kernels of BatchDecode and BatchPrefill configurations into the JIT disk
// cache, in parallel (jit::precompile's threads).
#include "flare/api/precompile.h"

#include <chrono>
#include <set>
#include <string>

#include "flare/api/rope.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "src/api/decode_config.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_rope_staging.h"

namespace flare {
namespace {

constexpr int kQueryTiles[] = {16, 32, 64, 128};  // choose_prefill_tiles' choices

// Adds `spec` unless a spec of the same translation unit is there already.
void add_distinct(const jit::KernelSpec& spec, std::set<std::string>& seen,
                  std::vector<jit::KernelSpec>& specs) {
  if (seen.insert(spec.translation_unit()).second) specs.push_back(spec);
}

// Calls visit(config) for each config; an error comes back with "<what>[index]: " in front of
// its message, its code kept.
template <class Config, class Visit>
void for_each_named(std::span<const Config> configs, const char* what, Visit&& visit) {
  for (size_t i = 0; i < configs.size(); ++i) {
    try {
      visit(configs[i]);
    } catch (const Error& e) {
      throw Error(e.code(), std::string(what) + "[" + std::to_string(i) + "]: " + e.what());
    }
  }
}

}  // namespace

std::vector<jit::KernelSpec> kernels_to_precompile(std::span<const BatchDecodeConfig> decode,
                                                   std::span<const BatchPrefillConfig> prefill,
                                                   const PrefillDeviceLimits& limits) {
  std::vector<jit::KernelSpec> specs;
  std::set<std::string> seen;
  for_each_named(decode, "decode", [&](const BatchDecodeConfig& c) {
    add_distinct(
        batch_decode_kernels(c, static_cast<size_t>(limits.max_shared_bytes_per_block)).decode,
        seen, specs);
  });
  for_each_named(prefill, "prefill", [&](const BatchPrefillConfig& c) {
    api_detail::validate_prefill_config(c);  // before fixed_prefill_tiles divides by its heads
    // The kernels BatchPrefill compiles: the config's and, where RoPE may be staged, those
    // without RoPE and the rotation's (prefill_rope_staging.h).
    const PrefillDeviceLimits config_limits = api_detail::limits_under_backend(limits, c);
    std::vector<PrefillTiles> tiles;
    if (const std::optional<PrefillTiles> fixed =
            api_detail::fixed_prefill_tiles(c, config_limits)) {
      tiles.push_back(*fixed);
    } else {
      for (const int query_tile : kQueryTiles) {
        tiles.push_back(api_detail::with_config_kv_tile(
            choose_prefill_tiles(query_tile, c.head_dim_qk,
                                 api_detail::prefill_kernel_head_dim_vo(c), c.params.mask,
                                 config_limits),
            c));
      }
    }
    std::vector<BatchPrefillConfig> kernel_configs;
    if (c.rope_staging != RopeStaging::kStaged) kernel_configs.push_back(c);
    if (api_detail::may_stage_rope(c)) {
      kernel_configs.push_back(api_detail::staged_rope_kernel_config(c));
      add_distinct(rope_kernel_spec(c.dtype, false, 0), seen, specs);
    }
    for (const BatchPrefillConfig& kernel_config : kernel_configs) {
      for (const PrefillTiles& t : tiles) {
        const BatchPrefillKernels k = batch_prefill_kernels(kernel_config, t);
        add_distinct(k.prefill, seen, specs);
        add_distinct(k.merge, seen, specs);
      }
    }
  });
  return specs;
}

PrecompileReport precompile(std::span<const BatchDecodeConfig> decode,
                            std::span<const BatchPrefillConfig> prefill, int device,
                            int num_threads) {
  const auto start = std::chrono::steady_clock::now();
  // The configurations first: their errors come before the device's.
  for_each_named(decode, "decode", api_detail::validate_decode_config);
  for_each_named(prefill, "prefill", api_detail::validate_prefill_config);
  const cuda::DeviceProperties props = cuda::device_properties(device);
  const std::vector<jit::KernelSpec> specs =
      kernels_to_precompile(decode, prefill, api_detail::prefill_limits_of(props));
  const std::vector<jit::CompiledKernel> results =
      jit::precompile(specs, jit::arch_for(props.cc_major, props.cc_minor), num_threads);
  PrecompileReport report;
  report.kernels = static_cast<int>(specs.size());
  for (const jit::CompiledKernel& k : results) {
    (k.from_cache ? report.from_cache : report.compiled) += 1;
    report.compile_seconds += k.compile_seconds;
  }
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace flare
