// BatchPrefill: the persistent grid and workspace at creation, and plan() (the host work of
// src/api/prefill_plan.h, one async copy). run() (validation and at most two launches):
// batch_prefill_run.cpp; the config, the tile heuristic and the kernel specs:
// prefill_config.cpp.
#include "flare/api/batch_prefill.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "flare/core/error.h"
#include "flare/jit/cuda_sync.h"
#include "flare/jit/module.h"
#include "src/api/batch_prefill_state.h"
#include "src/api/device_variant.h"
#include "src/api/plan_staging.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_nvfp4.h"
#include "src/api/prefill_plan.h"
#include "src/api/run_support.h"

namespace flare {
namespace {

using api_detail::kPrefillMaxQueryTile;
using api_detail::prefill_bounds;
using api_detail::prefill_max_ctas_per_sm;
using api_detail::validate_prefill_config;

const char* const kWhat = api_detail::kBatchPrefillWhat;

}  // namespace

size_t api_detail::shared_bytes_for_occupancy(cuda::Function function, int threads,
                                              size_t shared_bytes, int ctas_per_sm,
                                              size_t sm_shared_bytes,
                                              size_t max_shared_bytes_per_block) {
  // ctas_per_sm + 1 CTAs of sm_shared_bytes / (ctas_per_sm + 1) each, with the 1 KiB the
  // hardware reserves per CTA, overflow the SM; then up in 1 KiB steps while more still fit
  // (the reserve differs between GPUs). The function's dynamic shared memory limit is the
  // device's (State::kernel), so any size up to it launches.
  constexpr size_t kStep = 1024;
  size_t padded = std::max(shared_bytes, sm_shared_bytes / static_cast<size_t>(ctas_per_sm + 1));
  padded = (padded + kStep - 1) / kStep * kStep;
  for (; padded <= max_shared_bytes_per_block; padded += kStep) {
    const int fit = cuda::max_active_blocks_per_sm(function, threads, padded);
    if (fit == ctas_per_sm) return padded;
    if (fit < ctas_per_sm) break;
  }
  return shared_bytes;
}

BatchPrefill::BatchPrefill(const BatchPrefillConfig& config) : state_(std::make_unique<State>()) {
  validate_prefill_config(config);
  State& s = *state_;
  s.config = config;
  const cuda::DeviceScope scope(config.device);
  s.props = cuda::device_properties(config.device);
  s.arch = jit::arch_for(s.props.cc_major, s.props.cc_minor);
  s.limits = api_detail::limits_under_backend(api_detail::prefill_limits_of(s.props), config);

  s.max_query_tile = kPrefillMaxQueryTile;
  s.fixed_tiles = api_detail::fixed_prefill_tiles(config, s.limits);
  if (s.fixed_tiles) s.max_query_tile = s.fixed_tiles->query_tile;
  // Partial-state slots a caller's scratch holds (the default bound is 2 per CTA).
  const auto slots_fitting = [&](int ctas_per_sm) {
    return partial_slots_fitting(prefill_bounds(config, ctas_per_sm, s.max_query_tile),
                                 config.scratch_bytes);
  };
  // NVFP4's third CTA an SM only where the scratch holds every SM's: spreading a plan over fewer
  // SMs would cost more than the third CTA gains.
  s.max_ctas_per_sm = prefill_max_ctas_per_sm(config);
  if (config.scratch != nullptr && s.max_ctas_per_sm > 2 &&
      slots_fitting(s.max_ctas_per_sm) < int64_t{2} * s.max_ctas_per_sm * s.props.num_sms) {
    s.max_ctas_per_sm = 2;
  }
  if (api_detail::may_stage_rope(config)) s.rope = api_detail::PrefillRopeStaging(config);
  // Under use_cuda_graph the grid is the fixed tiles' kernel's: the staged one where every plan
  // stages (graph_stages_rope).
  const int ctas_per_sm =
      s.fixed_tiles
          ? s.kernel(*s.fixed_tiles,
                     config.use_cuda_graph && api_detail::graph_stages_rope(config, *s.fixed_tiles))
                .ctas_per_sm
          : s.max_ctas_per_sm;
  // A caller's scratch below the whole grid's bound (FlashInfer's tests pass 32 MB; D 128 needs
  // ~35 MB): plans spread over the SMs whose CTAs' partial states it holds. Too small for one
  // SM: the Workspace below names the bytes needed.
  s.plan_sms = s.props.num_sms;
  if (config.scratch != nullptr) {
    s.plan_sms = static_cast<int>(
        std::clamp<int64_t>(slots_fitting(ctas_per_sm) / (2 * ctas_per_sm), 1, s.plan_sms));
  }
  s.bound_ctas = s.plan_sms * ctas_per_sm;

  const BatchPrefillKernels specs =
      batch_prefill_kernels(config, s.fixed_tiles.value_or(PrefillTiles{64, 64}));
  s.merge = jit::get_kernel(specs.merge, "flare_merge", config.device);

  s.workspace = api_detail::Workspace(kWhat, prefill_bounds(config, s.bound_ctas, s.max_query_tile),
                                      config.scratch, config.scratch_bytes);
  s.next_work_item = cuda::DeviceBuffer(2 * sizeof(int32_t));
  cuda::memset_d8_async(s.next_work_item.data(), 0, 2 * sizeof(int32_t), nullptr);
  cuda::stream_synchronize(nullptr);  // run() may use another stream
  s.index_errors = IndexErrorRecordBuffer(config.device);
  s.validate_indices = config.validate_indices || api_detail::validate_from_env();
  s.variant = api_detail::device_variant(config.params, config.head_dim_qk, config.num_qo_heads,
                                         s.variant_tables);
  if (api_detail::is_nvfp4_prefill(config)) s.nvfp4 = api_detail::Nvfp4PrefillStaging(config);
}

size_t BatchPrefill::scratch_bytes_needed(const BatchPrefillConfig& config) {
  validate_prefill_config(config);
  const cuda::DeviceProperties props = cuda::device_properties(config.device);
  // The largest grid and query tile any plan of this config may use.
  return workspace_layout(prefill_bounds(config, props.num_sms * prefill_max_ctas_per_sm(config),
                                         kPrefillMaxQueryTile))
      .scratch_bytes();
}

BatchPrefill::~BatchPrefill() = default;
BatchPrefill::BatchPrefill(BatchPrefill&&) noexcept = default;
BatchPrefill& BatchPrefill::operator=(BatchPrefill&&) noexcept = default;

void BatchPrefill::plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                        std::span<const int32_t> kv_last_page_len, cuda::Stream stream,
                        std::span<const int32_t> mask_indptr) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  const bool paged = c.kv == PrefillKV::kPaged;
  s.check_not_capturing(stream, "plan()");
  s.check_may_plan();
  api_detail::PrefillHostPlan& next = s.next;
  api_detail::validate_prefill_batch(c, s.fixed_tiles, s.limits, qo_indptr, kv_indptr,
                                     kv_last_page_len, mask_indptr, next);
  const int64_t batch = next.batch;
  FLARE_CHECK(s.captured_kv < 0 || kv_indptr[batch] <= s.captured_kv, ErrorCode::kInvalidArgument,
              kWhat, ": kv_indptr[", batch, "]=", kv_indptr[batch], paged ? " pages" : " tokens",
              " exceed the ", s.captured_kv,
              paged ? " entries of the kv_indices tensor" : " rows of the K/V tensors",
              " the captured run() reads");
  FLARE_CHECK(s.captured_mask_bytes < 0 || next.mask_bytes <= s.captured_mask_bytes,
              ErrorCode::kInvalidArgument, kWhat, ": the packed custom mask of this plan has ",
              next.mask_bytes, " bytes, more than the ", s.captured_mask_bytes,
              " of the mask the captured run() reads");
  next.rope_staged = api_detail::plan_stages_rope(c, qo_indptr, kv_indptr, next.tiles);
  // The KV copies sized at creation: NVFP4's, and staged RoPE's k under use_cuda_graph.
  const bool nvfp4 = api_detail::is_nvfp4_prefill(c);
  FLARE_CHECK(
      !(nvfp4 || (next.rope_staged && c.use_cuda_graph)) || kv_indptr[batch] <= c.max_total_kv,
      ErrorCode::kInvalidArgument, kWhat, ": kv_indptr[", batch, "]=", kv_indptr[batch],
      paged ? " pages" : " tokens", " exceed max_total_kv=", c.max_total_kv,
      nvfp4 ? " (the staged copy of NVFP4 KV, sized at creation)"
            : " (the rotated copy of k, staged RoPE under use_cuda_graph, sized at "
              "creation)");
  const api_detail::PrefillKernel& kernel = s.kernel(next.tiles, next.rope_staged);
  if (next.rope_staged) s.rope.reserve(next.total_qo, kv_indptr[batch]);
  api_detail::plan_prefill(c, s.plan_sms, kernel.ctas_per_sm, s.props.memory_peak_bytes_per_us,
                           next);
  commit_plan(qo_indptr, kv_indptr, kv_last_page_len, stream);
}

void BatchPrefill::commit_plan(std::span<const int32_t> qo_begin,
                               std::span<const int32_t> kv_indptr,
                               std::span<const int32_t> kv_last_page_len, cuda::Stream stream) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  api_detail::PrefillHostPlan& next = s.next;
  const int64_t batch = next.batch;
  const cuda::DeviceScope scope(c.device);
  if (next.plan.num_partial_slots > s.workspace.layout().max_partial_slots) {
    // Only fixed_split_size and cascade plans exceed the default bound (002 D.3 holds for
    // the others).
    FLARE_CHECK(!c.use_cuda_graph, ErrorCode::kWorkspaceTooSmall, kWhat, ": the plan needs ",
                next.plan.num_partial_slots, " partial slots, the CUDA-graph workspace holds ",
                s.workspace.layout().max_partial_slots,
                " (fixed at creation: give a larger scratch, or plan the largest batch first)");
    s.workspace.grow(next.plan.num_partial_slots);
  }
  check_fits(next.plan, s.workspace.layout());
  api_detail::stage_prefill(next, s.workspace.layout(), c.max_batch, qo_begin, kv_indptr,
                            kv_last_page_len, s.workspace.staging().acquire());
  s.workspace.staging().copy_to(s.workspace.plan_region(), s.workspace.layout(),
                                static_cast<int64_t>(next.plan.work_items.size()), stream);
  std::swap(s.plan, next.plan);
  std::swap(s.mask_indptr, next.mask_indptr);
  s.tiles = next.tiles;
  s.rope_staged = next.rope_staged;
  // Under CUDA graphs a cascade config's tiles are chosen by its first plan and kept: a
  // captured run() launches that kernel.
  if (c.use_cuda_graph && !s.fixed_tiles) s.fixed_tiles = next.tiles;
  s.batch = batch;
  s.total_qo = next.total_qo;
  s.mask_bytes = next.mask_bytes;
  s.kv_indptr.assign(kv_indptr.begin(), kv_indptr.end());
  s.planned = true;
}

void BatchPrefill::check(const IndexNames& names) const {
  state_->index_errors.check(names, state_->last_num_pages);
}

const BatchPrefillConfig& BatchPrefill::config() const { return state_->config; }
PrefillTiles BatchPrefill::last_tiles() const { return state_->tiles; }
bool BatchPrefill::last_plan_stages_rope() const { return state_->rope_staged; }
const Plan& BatchPrefill::last_plan() const { return state_->plan; }
size_t BatchPrefill::workspace_size() const { return state_->workspace.own_bytes(); }
int64_t BatchPrefill::max_partial_slots() const {
  return state_->workspace.layout().max_partial_slots;
}

}  // namespace flare
