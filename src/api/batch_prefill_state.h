// BatchPrefill's state, shared by its creation and plan() (batch_prefill.cpp) and its run()
// (batch_prefill_run.cpp): the config and device, the kernels compiled so far, the workspace and
// the latest plan.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/module.h"
#include "src/api/cascade_plan.h"
#include "src/api/plan_staging.h"
#include "src/api/prefill_bulk_maps.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_nvfp4.h"
#include "src/api/prefill_plan.h"
#include "src/api/prefill_rope_staging.h"
#include "src/api/run_support.h"

namespace flare {
namespace api_detail {

inline constexpr const char* kBatchPrefillWhat = "BatchPrefill";

// One compiled prefill kernel and the CTAs it keeps resident.
struct PrefillKernel {
  BatchPrefillKernels specs;
  cuda::Function function = nullptr;
  int ctas_per_sm = 0;
  // Dynamic shared memory a launch asks for: specs.shared_bytes, padded where more than
  // ctas_per_sm CTAs would fit an SM, so that no more do. Under programmatic dependent launch
  // the next launch's CTAs become resident in whatever room the running grid leaves and wait
  // there, so with room for a third CTA an SM the next grid can start unevenly spread (three
  // CTAs on some SMs, one on others): b64 q1 kv2048 (16 x 64 tiles, 2 CTAs an SM planned, more
  // fitting) ran 166 us back to back with PDL and 131 without; padded, 130 with PDL
  // (docs/perf.md, twenty-fifth session).
  size_t launch_shared_bytes = 0;
};

// The dynamic shared memory at which `function` keeps exactly ctas_per_sm CTAs on an SM of
// sm_shared_bytes (at least `shared_bytes`; `shared_bytes` itself when no padding does it).
size_t shared_bytes_for_occupancy(cuda::Function function, int threads, size_t shared_bytes,
                                  int ctas_per_sm, size_t sm_shared_bytes,
                                  size_t max_shared_bytes_per_block);

}  // namespace api_detail

struct BatchPrefill::State {
  using PrefillKernel = api_detail::PrefillKernel;
  static constexpr const char* kWhat = api_detail::kBatchPrefillWhat;

  BatchPrefillConfig config;
  cuda::DeviceProperties props;
  std::string arch;
  PrefillDeviceLimits limits;
  // by (query tile, kv tile, family, for a staged RoPE plan)
  std::map<std::tuple<int, int, bool, bool>, PrefillKernel> kernels;
  cuda::Function merge = nullptr;
  int bound_ctas = 0;  // the workspace's CTA bound (and the grid under use_cuda_graph)
  // The SMs plans spread over: the device's, or fewer when the caller's scratch holds the
  // partial states of fewer CTAs (the bound is 2 per CTA, 002 D.3).
  int plan_sms = 0;
  // Persistent CTAs an SM a plan may use (prefill_max_ctas_per_sm, fewer where the caller's
  // scratch would otherwise spread plans over fewer SMs).
  int max_ctas_per_sm = 0;
  int max_query_tile = 0;
  std::optional<PrefillTiles> fixed_tiles;
  api_detail::Workspace workspace;
  cuda::DeviceBuffer variant_tables;  // ALiBi slopes, RoPE turns (device_variant)
  cuda::DeviceBuffer next_work_item;  // int32 [2], the kernel's queue (PrefillParams)
  IndexErrorRecordBuffer index_errors;
  bool validate_indices = false;
  bool planned = false;
  Plan plan;
  PrefillTiles tiles;
  int64_t batch = 0;
  int64_t total_qo = 0;
  int64_t mask_bytes = 0;            // packed custom-mask bytes of the plan
  std::vector<int32_t> kv_indptr;    // the latest plan's
  std::vector<int32_t> mask_indptr;  // the latest plan's custom-mask byte offsets
  // plan()'s work, swapped into the fields above when it succeeds.
  api_detail::PrefillHostPlan next;
  api_detail::CascadeHostPlan cascade;  // plan_cascade()'s levels, reused from plan to plan
  // KV a captured run reads (-1 before one): page ids (paged) or K/V rows (ragged); later
  // plans must not need more. And the mask bytes it reads.
  int64_t captured_kv = -1;
  int64_t captured_mask_bytes = -1;
  int64_t last_num_pages = -1;  // of the latest paged run, quoted by check()
  VariantParams variant{};
  api_detail::Nvfp4PrefillStaging nvfp4;  // NVFP4 KV only (kv_dtype kU8)
  // RoPE staging (where rope_staging_applies): the copies and their rotation, and whether the
  // latest committed plan stages (the plan in progress: next.rope_staged).
  api_detail::PrefillRopeStaging rope;
  bool rope_staged = false;
  api_detail::Nvfp4PrefillStaging::Plan staging_plan() {
    api_detail::Nvfp4PrefillStaging::Plan p;
    p.planned_units = kv_indptr.back();
    p.kv_indptr_table =
        api_detail::request_table(workspace.device(), workspace.layout(), config.max_batch,
                                  api_detail::RequestTable::kKvIndptr);
    p.index_error = index_errors.device_record();
    return p;
  }
  // The Hopper family's maps (prefill_bulk_maps.h): of k and v, and of q.
  api_detail::EncodedMaps<api_detail::BulkSource, 2> bulk;
  api_detail::EncodedMaps<api_detail::BulkQSource, 1> bulk_q;

  // plan() and plan_cascade() (`what`) copy the plan region on `stream`: a capture would
  // record the copy instead of running it now.
  void check_not_capturing(cuda::Stream stream, const char* what) const {
    const cuda::DeviceScope scope(config.device);
    FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat, ": ", what,
                " must not be called while its stream is being captured into a CUDA graph: "
                "plan before the capture and between replays");
  }

  // BatchPrefillConfig::single_plan: one plan in the object's life.
  void check_may_plan() const {
    FLARE_CHECK(!(config.single_plan && planned), ErrorCode::kInvalidArgument, kWhat,
                ": single_plan is set and this object was planned already: create another for "
                "another batch");
  }

  // run()'s first checks: a plan exists, and the KV kind given is the one created for.
  void check_runnable(PrefillKV given) const {
    FLARE_CHECK(planned, ErrorCode::kInvalidArgument, kWhat, ": run() before plan()");
    FLARE_CHECK(config.kv == given, ErrorCode::kInvalidArgument, kWhat,
                given == PrefillKV::kPaged
                    ? ": run() with paged KV on a BatchPrefill created for ragged KV"
                    : ": run() with ragged K/V on a BatchPrefill created for paged KV");
  }

  // The kernel of these tiles, for a plan that stages RoPE (staged_rope_kernel_config) or not.
  const PrefillKernel& kernel(const PrefillTiles& t, bool rope_staged = false) {
    const auto key = std::make_tuple(t.query_tile, t.kv_tile, t.warpgroup, rope_staged);
    auto it = kernels.find(key);
    if (it != kernels.end()) return it->second;
    PrefillKernel k;
    k.specs = batch_prefill_kernels(
        rope_staged ? api_detail::staged_rope_kernel_config(config) : config, t);
    FLARE_CHECK(static_cast<int>(k.specs.shared_bytes) <= props.max_shared_bytes_per_block_optin,
                ErrorCode::kUnsupported, kWhat, ": the prefill kernel needs ", k.specs.shared_bytes,
                " bytes of shared memory, device ", config.device, " allows ",
                props.max_shared_bytes_per_block_optin);
    k.function = jit::get_kernel(k.specs.prefill, "flare_prefill", config.device);
    // The device's limit, not the kernel's size: the function is shared by every BatchPrefill
    // of its spec, and a launch may pad its shared memory (launch_shared_bytes).
    cuda::set_max_dynamic_shared(k.function, props.max_shared_bytes_per_block_optin);
    const int fit =
        cuda::max_active_blocks_per_sm(k.function, k.specs.threads, k.specs.shared_bytes);
    FLARE_CHECK(fit >= 1, ErrorCode::kUnsupported, kWhat, ": the prefill kernel (",
                k.specs.shared_bytes, " bytes of shared memory) does not fit one SM");
    k.ctas_per_sm = std::min(fit, max_ctas_per_sm);
    k.launch_shared_bytes = k.specs.shared_bytes;
    if (fit > k.ctas_per_sm) {
      k.launch_shared_bytes = api_detail::shared_bytes_for_occupancy(
          k.function, k.specs.threads, k.specs.shared_bytes, k.ctas_per_sm,
          static_cast<size_t>(props.max_shared_bytes_per_sm),
          static_cast<size_t>(props.max_shared_bytes_per_block_optin));
    }
    return kernels.emplace(key, k).first->second;
  }
};

}  // namespace flare
