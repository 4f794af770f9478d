// BatchPrefill: the persistent grid and workspace, plan() (the host work of
// src/api/prefill_plan.h, one async copy) and run() (validation and at most two launches). The
// config, the tile heuristic and the kernel specs: prefill_config.cpp.
#include "flare/api/batch_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "flare/core/error.h"
#include "flare/jit/cuda_sync.h"
#include "flare/jit/module.h"
#include "kernels/prefill_params.cuh"
#include "src/api/device_checks.h"
#include "src/api/device_variant.h"
#include "src/api/plan_staging.h"
#include "src/api/prefill_bulk_maps.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_nvfp4.h"
#include "src/api/prefill_plan.h"
#include "src/api/run_support.h"
#include "src/api/variant_support.h"

namespace flare {
namespace {

using api_detail::check_device_tensor;
using api_detail::check_page_strides_fit_int32;
using api_detail::kPrefillMaxCtasPerSm;
using api_detail::kPrefillMaxQueryTile;
using api_detail::prefill_bounds;
using api_detail::prefill_group_size;
using api_detail::request_table;
using api_detail::validate_prefill_config;
using enum api_detail::RequestTable;

const char* const kWhat = "BatchPrefill";
constexpr int kMergeThreads = 128;
constexpr int kMergeBlocksPerSm = 4;

// One compiled prefill kernel and the CTAs it keeps resident.
struct PrefillKernel {
  BatchPrefillKernels specs;
  cuda::Function function = nullptr;
  int ctas_per_sm = 0;
};

void check_index_array(const TensorView& t, const char* name, int device, DType dtype,
                       int64_t min_size, int64_t exact_size) {
  // An empty array may have no storage (torch's empty tensors): nothing reads it.
  FLARE_CHECK((t.data != nullptr || t.shape[0] == 0) && t.device == Device::cuda(device) &&
                  t.dtype == dtype && t.ndim == 1 &&
                  (exact_size >= 0 ? t.shape[0] == exact_size : t.shape[0] >= min_size) &&
                  (t.shape[0] <= 1 || t.strides[0] == 1),
              ErrorCode::kInvalidArgument, kWhat, ": ", name, " must be a contiguous ",
              dtype_name(dtype), " 1-D tensor on cuda:", device, " with ",
              exact_size >= 0 ? "exactly " + std::to_string(exact_size)
                              : "at least " + std::to_string(min_size),
              " entries, got ", dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str());
}

}  // namespace

struct BatchPrefill::State {
  BatchPrefillConfig config;
  cuda::DeviceProperties props;
  std::string arch;
  PrefillDeviceLimits limits;
  std::map<std::tuple<int, int, bool>, PrefillKernel> kernels;  // by (query, kv tile, family)
  cuda::Function merge = nullptr;
  int bound_ctas = 0;  // the workspace's CTA bound (and the grid under use_cuda_graph)
  // The SMs plans spread over: the device's, or fewer when the caller's scratch holds the
  // partial states of fewer CTAs (the bound is 2 per CTA, 002 D.3).
  int plan_sms = 0;
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
  // KV a captured run reads (-1 before one): page ids (paged) or K/V rows (ragged); later
  // plans must not need more. And the mask bytes it reads.
  int64_t captured_kv = -1;
  int64_t captured_mask_bytes = -1;
  int64_t last_num_pages = -1;  // of the latest paged run, quoted by check()
  VariantParams variant{};
  api_detail::Nvfp4PrefillStaging nvfp4;  // NVFP4 KV only (kv_dtype kU8)
  api_detail::Nvfp4PrefillStaging::Plan staging_plan() {
    api_detail::Nvfp4PrefillStaging::Plan p;
    p.planned_units = kv_indptr.back();
    p.kv_indptr_table =
        request_table(workspace.device(), workspace.layout(), config.max_batch, kKvIndptr);
    p.index_error = index_errors.device_record();
    return p;
  }
  // The Hopper family's ragged K/V maps, re-encoded only when a run's k or v differs from the
  // previous one's (a serving loop's buffers usually do not).
  struct BulkMaps {  // the Hopper family's maps (prefill_bulk_maps.h), kept while unchanged
    api_detail::BulkSource source;
    bool encoded = false;  // source was tried (valid: it could be encoded)
    bool valid = false;    // false: the kernel gathers
    cuda::TensorMap k_map, v_map;
  } bulk;

  const PrefillKernel& kernel(const PrefillTiles& t) {
    const auto key = std::make_tuple(t.query_tile, t.kv_tile, t.warpgroup);
    auto it = kernels.find(key);
    if (it != kernels.end()) return it->second;
    PrefillKernel k;
    k.specs = batch_prefill_kernels(config, t);
    FLARE_CHECK(static_cast<int>(k.specs.shared_bytes) <= props.max_shared_bytes_per_block_optin,
                ErrorCode::kUnsupported, kWhat, ": the prefill kernel needs ", k.specs.shared_bytes,
                " bytes of shared memory, device ", config.device, " allows ",
                props.max_shared_bytes_per_block_optin);
    k.function = jit::get_kernel(k.specs.prefill, "flare_prefill", config.device);
    cuda::set_max_dynamic_shared(k.function, static_cast<int>(k.specs.shared_bytes));
    const int fit =
        cuda::max_active_blocks_per_sm(k.function, k.specs.threads, k.specs.shared_bytes);
    FLARE_CHECK(fit >= 1, ErrorCode::kUnsupported, kWhat, ": the prefill kernel (",
                k.specs.shared_bytes, " bytes of shared memory) does not fit one SM");
    k.ctas_per_sm = std::min(fit, kPrefillMaxCtasPerSm);
    return kernels.emplace(key, k).first->second;
  }
};

BatchPrefill::BatchPrefill(const BatchPrefillConfig& config) : state_(std::make_unique<State>()) {
  validate_prefill_config(config);
  State& s = *state_;
  s.config = config;
  const cuda::DeviceScope scope(config.device);
  s.props = cuda::device_properties(config.device);
  s.arch = jit::arch_for(s.props.cc_major, s.props.cc_minor);
  s.limits = api_detail::limits_under_backend(api_detail::prefill_limits_of(s.props), config);

  s.max_query_tile = kPrefillMaxQueryTile;
  int ctas_per_sm = kPrefillMaxCtasPerSm;
  s.fixed_tiles = api_detail::fixed_prefill_tiles(config, s.limits);
  if (s.fixed_tiles) {
    s.max_query_tile = s.fixed_tiles->query_tile;
    ctas_per_sm = s.kernel(*s.fixed_tiles).ctas_per_sm;
  }
  // A caller's scratch below the whole grid's bound (FlashInfer's tests pass 32 MB; D 128 needs
  // ~35 MB): plans spread over the SMs whose CTAs' partial states it holds (the default bound
  // is 2 slots per CTA). Too small for one SM: the Workspace below names the bytes needed.
  s.plan_sms = s.props.num_sms;
  if (config.scratch != nullptr) {
    const int64_t slots = partial_slots_fitting(
        prefill_bounds(config, ctas_per_sm, s.max_query_tile), config.scratch_bytes);
    s.plan_sms = static_cast<int>(std::clamp<int64_t>(slots / (2 * ctas_per_sm), 1, s.plan_sms));
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
  return workspace_layout(
             prefill_bounds(config, props.num_sms * kPrefillMaxCtasPerSm, kPrefillMaxQueryTile))
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
  {
    // The plan's copy would be recorded into the graph instead of running now.
    const cuda::DeviceScope scope(s.config.device);
    FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
                ": plan() must not be called while its stream is being captured into a CUDA "
                "graph: plan before the capture and between replays");
  }
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
  FLARE_CHECK(!api_detail::is_nvfp4_prefill(c) || kv_indptr[batch] <= c.max_total_kv,
              ErrorCode::kInvalidArgument, kWhat, ": kv_indptr[", batch, "]=", kv_indptr[batch],
              paged ? " pages" : " tokens", " exceed max_total_kv=", c.max_total_kv,
              " (the staged copy of NVFP4 KV, sized at creation)");
  const PrefillKernel& kernel = s.kernel(next.tiles);
  api_detail::plan_prefill(c, s.plan_sms, kernel.ctas_per_sm, next);

  const cuda::DeviceScope scope(c.device);
  if (next.plan.num_partial_slots > s.workspace.layout().max_partial_slots) {
    // Only fixed_split_size plans exceed the default bound (002 D.3 holds for the others).
    FLARE_CHECK(!c.use_cuda_graph, ErrorCode::kWorkspaceTooSmall, kWhat, ": the plan needs ",
                next.plan.num_partial_slots, " partial slots, the CUDA-graph workspace holds ",
                s.workspace.layout().max_partial_slots,
                " (fixed at creation: give a larger scratch, or plan the largest batch first)");
    s.workspace.grow(next.plan.num_partial_slots);
  }
  check_fits(next.plan, s.workspace.layout());
  api_detail::stage_prefill(next, s.workspace.layout(), c.max_batch, qo_indptr, kv_indptr,
                            kv_last_page_len, s.workspace.staging().acquire());
  s.workspace.staging().copy_to(s.workspace.plan_region(), s.workspace.layout(),
                                static_cast<int64_t>(next.plan.work_items.size()), stream);
  std::swap(s.plan, next.plan);
  std::swap(s.mask_indptr, next.mask_indptr);
  s.tiles = next.tiles;
  s.batch = batch;
  s.total_qo = next.total_qo;
  s.mask_bytes = next.mask_bytes;
  s.kv_indptr.assign(kv_indptr.begin(), kv_indptr.end());
  s.planned = true;
}

// The run() arguments once the KV kind is resolved.
struct BatchPrefill::KVArgs {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_rows = 0, v_rows = 0;  // ragged: tokens of k and v
  const int32_t* indices = nullptr;
  int64_t num_indices = 0;
  int64_t num_pages = 0;
  int64_t k_page = 0, k_slot = 0, k_head = 0;
  int64_t v_page = 0, v_slot = 0, v_head = 0;
  // NVFP4 on the FA2 family: k / v are code rows (strides above in bytes), these their scales.
  const unsigned char* k_scales = nullptr;
  const unsigned char* v_scales = nullptr;
  int64_t ks_page = 0, ks_slot = 0, ks_head = 0;
  int64_t vs_page = 0, vs_slot = 0, vs_head = 0;
  bool narrow_codes = false;  // a code row only 8-byte aligned (checked: at least 8)

  // The FA2 family's NVFP4 kernels read the checked sources directly (prefill_load.cuh).
  void set_nvfp4_sources(const Nvfp4StageParams& src) {
    k = src.codes[0], v = src.codes[1];
    k_scales = src.scales[0], v_scales = src.scales[1];
    k_page = src.code_stride[0][0], k_slot = src.code_stride[0][1], k_head = src.code_stride[0][2];
    v_page = src.code_stride[1][0], v_slot = src.code_stride[1][1], v_head = src.code_stride[1][2];
    ks_page = src.scale_stride[0][0], ks_slot = src.scale_stride[0][1];
    ks_head = src.scale_stride[0][2];
    vs_page = src.scale_stride[1][0], vs_slot = src.scale_stride[1][1];
    vs_head = src.scale_stride[1][2];
    narrow_codes = false;
    for (int which = 0; which < 2; ++which) {
      narrow_codes = narrow_codes || reinterpret_cast<uintptr_t>(src.codes[which]) % 16 != 0;
      for (const int64_t stride : src.code_stride[which]) {
        narrow_codes = narrow_codes || stride % 16 != 0;
      }
    }
  }
};

// NVFP4 KV: the FA2 family's NVFP4 kernels read the caller's codes and scales; otherwise they
// are dequantized into the staged copy, which the 16-bit path reads (src/api/prefill_nvfp4.h).
void BatchPrefill::run(const TensorView& q, const PagedKVPages& kv, const TensorView& o,
                       const std::optional<TensorView>& lse, cuda::Stream stream,
                       const std::optional<TensorView>& mask_bits, const RunOptions& options) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  if (!api_detail::is_nvfp4_prefill(c)) {
    FLARE_CHECK(kv.k_scales.ndim == 0 && kv.v_scales.ndim == 0, ErrorCode::kInvalidArgument, kWhat,
                ": block scales (kv_cache_sf) were given for KV that is not NVFP4");
    run_16bit(q, kv, o, lse, stream, mask_bits, options);
    return;
  }
  FLARE_CHECK(s.planned, ErrorCode::kInvalidArgument, kWhat, ": run() before plan()");
  FLARE_CHECK(c.kv == PrefillKV::kPaged, ErrorCode::kInvalidArgument, kWhat,
              ": run() with paged KV on a BatchPrefill created for ragged KV");
  const api_detail::Nvfp4PrefillStaging::Plan plan = s.staging_plan();
  const Nvfp4StageParams sources = s.nvfp4.checked(kv, plan);  // throws naming the tensor
  const int64_t num_pages = sources.num_pages;
  if (s.validate_indices) {
    FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
                ": validation mode (validate_indices, FLARE_VALIDATE) cannot be captured");
    const cuda::DeviceScope scope(c.device);
    api_detail::validate_page_ids(kv.indices, s.kv_indptr, num_pages, {kWhat, "kv_indices"},
                                  stream);
  }
  if (api_detail::prefill_fused_nvfp4(c, s.tiles)) {
    KVArgs a;
    a.set_nvfp4_sources(sources);
    a.indices = kv.indices.ptr<const int32_t>();
    a.num_indices = kv.indices.shape[0];
    a.num_pages = num_pages;
    launch(q, a, o, lse, stream, mask_bits, options);
    if (c.use_cuda_graph) s.captured_kv = a.num_indices;
  } else {
    run_16bit(q, s.nvfp4.stage_pages(sources, plan, stream), o, lse, stream, mask_bits, options);
    if (c.use_cuda_graph) s.captured_kv = std::min(kv.indices.shape[0], s.nvfp4.capacity());
  }
  s.last_num_pages = num_pages;
}

void BatchPrefill::run(const TensorView& q, const Nvfp4Rows& kv, const TensorView& o,
                       const std::optional<TensorView>& lse, cuda::Stream stream,
                       const std::optional<TensorView>& mask_bits, const RunOptions& options) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  FLARE_CHECK(api_detail::is_nvfp4_prefill(c), ErrorCode::kInvalidArgument, kWhat,
              ": NVFP4 rows given to a BatchPrefill created for ", dtype_name(c.dtype), " KV");
  FLARE_CHECK(s.planned, ErrorCode::kInvalidArgument, kWhat, ": run() before plan()");
  FLARE_CHECK(c.kv == PrefillKV::kRagged, ErrorCode::kInvalidArgument, kWhat,
              ": run() with ragged K/V on a BatchPrefill created for paged KV");
  const api_detail::Nvfp4PrefillStaging::Plan plan = s.staging_plan();
  const Nvfp4StageParams sources = s.nvfp4.checked(kv, plan);  // throws naming the tensor
  const int64_t rows =
      std::min({kv.k.shape[0], kv.v.shape[0], kv.k_scales.shape[0], kv.v_scales.shape[0]});
  if (api_detail::prefill_fused_nvfp4(c, s.tiles)) {
    KVArgs a;
    a.set_nvfp4_sources(sources);
    a.k_rows = a.v_rows = rows;
    launch(q, a, o, lse, stream, mask_bits, options);
    if (c.use_cuda_graph) s.captured_kv = rows;
    return;
  }
  const auto [k, v] = s.nvfp4.stage_rows(sources, plan, stream);
  run_16bit(q, k, v, o, lse, stream, mask_bits, options);
  if (c.use_cuda_graph) s.captured_kv = std::min(rows, s.nvfp4.capacity());
}

void BatchPrefill::run_16bit(const TensorView& q, const PagedKVPages& kv, const TensorView& o,
                             const std::optional<TensorView>& lse, cuda::Stream stream,
                             const std::optional<TensorView>& mask_bits,
                             const RunOptions& options) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  FLARE_CHECK(s.planned, ErrorCode::kInvalidArgument, kWhat, ": run() before plan()");
  FLARE_CHECK(c.kv == PrefillKV::kPaged, ErrorCode::kInvalidArgument, kWhat,
              ": run() with paged KV on a BatchPrefill created for ragged KV");
  FLARE_CHECK(kv.layout == c.layout, ErrorCode::kInvalidArgument, kWhat, ": kv layout must be ",
              kv_layout_name(c.layout), ", got ", kv_layout_name(kv.layout));
  const int64_t k_pages = kv.k.ndim == 4 ? kv.k.shape[0] : -1;
  const int64_t v_pages = kv.v.ndim == 4 ? kv.v.shape[0] : -1;
  const bool nhd = c.layout == KVLayout::kNHD;
  const int64_t ps = c.page_size, h_kv = c.num_kv_heads;
  const auto shape = [&](int64_t pages, int64_t d) {
    return nhd ? std::vector<int64_t>{pages, ps, h_kv, d}
               : std::vector<int64_t>{pages, h_kv, ps, d};
  };
  check_device_tensor(kWhat, kv.k, "k", c.device, c.dtype, shape(k_pages, c.head_dim_qk), true);
  check_device_tensor(kWhat, kv.v, "v", c.device, c.dtype, shape(v_pages, c.head_dim_vo), true);
  const int64_t planned_pages = s.kv_indptr.back();
  check_index_array(kv.indices, "kv indices", c.device, DType::kI32, planned_pages, -1);
  KVArgs a;
  a.k = kv.k.data;
  a.v = kv.v.data;
  a.indices = kv.indices.ptr<const int32_t>();
  a.num_indices = kv.indices.shape[0];
  a.num_pages = std::min(k_pages, v_pages);
  // An out-of-range page id is read from page 0 (kernels/prefill_load.cuh load_row_pages).
  FLARE_CHECK(planned_pages == 0 || a.num_pages >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": the plan reads ", planned_pages, " pages but the cache has none");
  const api_detail::KVStrides ks = api_detail::kv_strides(kv.k, c.layout);
  const api_detail::KVStrides vs = api_detail::kv_strides(kv.v, c.layout);
  a.k_page = ks.unit, a.k_slot = ks.slot, a.k_head = ks.head;
  a.v_page = vs.unit, a.v_slot = vs.slot, a.v_head = vs.head;
  check_page_strides_fit_int32(kWhat, "k", a.k_page, a.k_slot, ps, 2);
  check_page_strides_fit_int32(kWhat, "v", a.v_page, a.v_slot, ps, 2);
  if (s.validate_indices) {
    FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
                ": validation mode (validate_indices, FLARE_VALIDATE) cannot be captured");
    const cuda::DeviceScope scope(c.device);
    api_detail::validate_page_ids(kv.indices, s.kv_indptr, a.num_pages, {kWhat, "kv_indices"},
                                  stream);
  }
  launch(q, a, o, lse, stream, mask_bits, options);
  if (c.use_cuda_graph) s.captured_kv = a.num_indices;
  s.last_num_pages = a.num_pages;
}

void BatchPrefill::run(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const std::optional<TensorView>& lse,
                       cuda::Stream stream, const std::optional<TensorView>& mask_bits,
                       const RunOptions& options) {
  FLARE_CHECK(!api_detail::is_nvfp4_prefill(state_->config), ErrorCode::kInvalidArgument, kWhat,
              ": NVFP4 K/V (kv_dtype uint8) come with their block scales: run(q, Nvfp4Rows, ...)");
  run_16bit(q, k, v, o, lse, stream, mask_bits, options);
}

void BatchPrefill::run_16bit(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& o, const std::optional<TensorView>& lse,
                             cuda::Stream stream, const std::optional<TensorView>& mask_bits,
                             const RunOptions& options) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  FLARE_CHECK(s.planned, ErrorCode::kInvalidArgument, kWhat, ": run() before plan()");
  FLARE_CHECK(c.kv == PrefillKV::kRagged, ErrorCode::kInvalidArgument, kWhat,
              ": run() with ragged K/V on a BatchPrefill created for paged KV");
  const int64_t k_rows = k.ndim == 3 ? k.shape[0] : -1;
  const int64_t v_rows = v.ndim == 3 ? v.shape[0] : -1;
  check_device_tensor(kWhat, k, "k", c.device, c.dtype, {k_rows, c.num_kv_heads, c.head_dim_qk},
                      true);
  check_device_tensor(kWhat, v, "v", c.device, c.dtype, {v_rows, c.num_kv_heads, c.head_dim_vo},
                      true);
  // The kernel reads rows [0, kv_indptr[batch]) as the plan says: the tensors must hold them.
  const int64_t rows = s.kv_indptr.back();
  FLARE_CHECK(k_rows >= rows && v_rows >= rows, ErrorCode::kInvalidArgument, kWhat,
              ": k and v must hold kv_indptr[", s.batch, "]=", rows, " tokens, got ", k_rows,
              " and ", v_rows);
  KVArgs a;
  a.k = k.data;
  a.v = v.data;
  a.k_rows = k_rows;
  a.v_rows = v_rows;
  a.k_page = k.strides[0];
  a.k_head = k.strides[1];
  a.v_page = v.strides[0];
  a.v_head = v.strides[1];
  launch(q, a, o, lse, stream, mask_bits, options);
  if (c.use_cuda_graph) s.captured_kv = std::min(k_rows, v_rows);
}

// The Hopper family's bulk-copy maps of k and v for this run (prefill_bulk_maps.h), encoded
// when what they describe changed. False: the kernel gathers.
bool BatchPrefill::bulk_maps(State& s, const KVArgs& a) {
  const BatchPrefillConfig& c = s.config;
  api_detail::BulkSource source;
  source.paged = c.kv == PrefillKV::kPaged;
  source.bf16 = c.dtype == DType::kBF16;
  source.k = a.k;
  source.v = a.v;
  source.k_rows = a.k_rows;
  source.v_rows = a.v_rows;
  source.num_pages = a.num_pages;
  source.k_page = a.k_page;
  source.k_slot = a.k_slot;
  source.k_head = a.k_head;
  source.v_page = a.v_page;
  source.v_slot = a.v_slot;
  source.v_head = a.v_head;
  source.page_size = source.paged ? c.page_size : 0;
  source.kv_tile = s.tiles.kv_tile;
  source.head_dim_qk = c.head_dim_qk;
  source.head_dim_vo = c.head_dim_vo;
  source.num_kv_heads = c.num_kv_heads;
  State::BulkMaps& m = s.bulk;
  if (m.encoded && source == m.source) return m.valid;
  // Recorded once encoded: an encoding that throws is retried.
  m.encoded = false;
  m.valid = api_detail::encode_bulk_maps(source, m.k_map, m.v_map);
  m.source = source;
  m.encoded = true;
  return m.valid;
}

void BatchPrefill::launch(const TensorView& q, const KVArgs& a, const TensorView& o,
                          const std::optional<TensorView>& lse, cuda::Stream stream,
                          const std::optional<TensorView>& mask_bits, const RunOptions& options) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  // A captured run serves every later plan, of up to max_batch requests.
  api_detail::check_run_options(
      c.params, c.variant, options, lse.has_value(),
      {c.use_cuda_graph ? c.max_batch : s.batch, c.num_qo_heads, c.num_kv_heads}, c.device, kWhat);
  // A captured run serves every later plan: its tensors may be sized for larger batches.
  const int64_t total_qo = c.use_cuda_graph && q.ndim == 3 ? q.shape[0] : s.total_qo;
  FLARE_CHECK(total_qo >= s.total_qo && total_qo <= c.max_total_qo, ErrorCode::kInvalidArgument,
              kWhat, ": q holds ", total_qo, " tokens, the plan has ", s.total_qo,
              " (max_total_qo ", c.max_total_qo, ")");
  const int64_t h_qo = c.num_qo_heads;
  check_device_tensor(kWhat, q, "q", c.device, c.dtype, {total_qo, h_qo, c.head_dim_qk}, true);
  check_device_tensor(kWhat, o, "o", c.device, c.dtype, {total_qo, h_qo, c.head_dim_vo}, true);
  if (lse) check_device_tensor(kWhat, *lse, "lse", c.device, DType::kF32, {total_qo, h_qo}, false);
  const bool custom = c.params.mask == MaskMode::kCustom;
  FLARE_CHECK(custom == mask_bits.has_value(), ErrorCode::kInvalidArgument, kWhat,
              custom ? ": params.mask is kCustom: run() needs the custom mask bits"
                     : ": custom mask bits were given but params.mask is not kCustom");
  if (mask_bits) {
    check_index_array(*mask_bits, "custom mask bits", c.device, DType::kU8,
                      std::max<int64_t>(s.mask_bytes, 1), -1);
  }
  const cuda::DeviceScope scope(c.device);
  FLARE_CHECK(c.use_cuda_graph || !cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
              ": run() on a capturing stream needs a BatchPrefill created with "
              "use_cuda_graph = true");
  const PrefillKernel& kernel =
      s.kernels.at({s.tiles.query_tile, s.tiles.kv_tile, s.tiles.warpgroup});
  const WorkspaceLayout& layout = s.workspace.layout();

  PrefillParams p{};
  p.q = q.data;
  p.k = a.k;
  p.v = a.v;
  p.o = o.data;
  p.lse = lse ? lse->ptr<float>() : nullptr;
  p.workspace = s.workspace.device();
  p.qo_indptr = request_table(p.workspace, layout, c.max_batch, kQoIndptr);
  p.kv_indptr = request_table(p.workspace, layout, c.max_batch, kKvIndptr);
  p.kv_last_page_len = request_table(p.workspace, layout, c.max_batch, kLastPageLen);
  p.kv_indices = a.indices;
  p.num_indices =
      static_cast<int32_t>(std::min<int64_t>(a.num_indices, std::numeric_limits<int32_t>::max()));
  p.num_pages =
      static_cast<int32_t>(std::min<int64_t>(a.num_pages, std::numeric_limits<int32_t>::max()));
  p.index_error = s.index_errors.device_record();
  p.custom_mask = mask_bits ? static_cast<const unsigned char*>(mask_bits->data) : nullptr;
  p.mask_indptr = request_table(p.workspace, layout, c.max_batch, kMaskIndptr);
  p.offsets = s.workspace.offsets();
  p.q_stride_token = q.strides[0];
  p.q_stride_head = q.strides[1];
  p.k_stride_page = a.k_page;
  p.k_stride_slot = a.k_slot;
  p.k_stride_head = a.k_head;
  p.v_stride_page = a.v_page;
  p.v_stride_slot = a.v_slot;
  p.v_stride_head = a.v_head;
  p.k_scales = a.k_scales;
  p.v_scales = a.v_scales;
  p.k_scale_stride_page = a.ks_page;
  p.k_scale_stride_slot = a.ks_slot;
  p.k_scale_stride_head = a.ks_head;
  p.v_scale_stride_page = a.vs_page;
  p.v_scale_stride_slot = a.vs_slot;
  p.v_scale_stride_head = a.vs_head;
  p.nvfp4_narrow_codes = a.narrow_codes ? 1 : 0;
  p.o_stride_token = o.strides[0];
  p.o_stride_head = o.strides[1];
  p.lse_stride_token = lse ? lse->strides[0] : 0;
  p.lse_stride_head = lse ? lse->strides[1] : 0;
  p.group_size = prefill_group_size(c);
  p.v_scale = options.v_scale;
  p.lse_scale = lse_scale(options.lse_base);
  p.variant = s.variant;
  p.variant.sm_scale = s.variant.sm_scale * options.q_scale * options.k_scale;
  api_detail::set_variant_arguments(options, p.variant);
  p.next_work_item = static_cast<int32_t*>(s.next_work_item.data());
  if (s.tiles.warpgroup) {
    p.bulk_kv = bulk_maps(s, a) ? 1 : 0;
    static_assert(sizeof(p.k_map) == sizeof(cuda::TensorMap), "a CUtensorMap");
    std::memcpy(&p.k_map, &s.bulk.k_map, sizeof(p.k_map));
    std::memcpy(&p.v_map, &s.bulk.v_map, sizeof(p.v_map));
  }
  const unsigned grid = static_cast<unsigned>(c.use_cuda_graph ? s.bound_ctas : s.plan.num_ctas);
  const bool pdl = options.enable_pdl && s.props.cc_major >= 9;
  if (c.use_cuda_graph && mask_bits) s.captured_mask_bytes = mask_bits->shape[0];
  // Eager runs skip the merge launch when nothing was split; a captured run always launches it
  // (a later plan may split).
  const bool merge = c.use_cuda_graph || !s.plan.merge_items.empty();
  MergeParams m{};
  m.lse = p.lse;
  m.workspace = p.workspace;
  m.offsets = p.offsets;
  m.o_stride_token = p.o_stride_token;
  m.o_stride_head = p.o_stride_head;
  m.lse_stride_token = p.lse_stride_token;
  m.lse_stride_head = p.lse_stride_head;
  m.group_size = p.group_size;
  m.lse_scale = p.lse_scale;
  m.qo_indptr = p.qo_indptr;
  m.sum_partials = api_detail::uses_softmax(c.params, c.variant) ? 0 : 1;
  // Head dim 512: one pass per half of v and o (prefill_config.h prefill_kernel_head_dim_vo),
  // each writing the same lse; a pass's merge reads the workspace before the next pass writes
  // it (stream order; under PDL each kernel waits for its predecessor before touching it).
  const int passes = api_detail::prefill_vo_passes(c);
  const size_t pass_bytes = static_cast<size_t>(c.head_dim_vo / passes) * dtype_bytes(c.dtype);
  for (int pass = 0; pass < passes; ++pass) {
    p.v = static_cast<const unsigned char*>(a.v) + pass * pass_bytes;
    p.o = static_cast<unsigned char*>(o.data) + pass * pass_bytes;
    void* prefill_args[] = {&p};
    cuda::launch(kernel.function, grid, 1, 1, static_cast<unsigned>(kernel.specs.threads), 1, 1,
                 static_cast<unsigned>(kernel.specs.shared_bytes), stream, prefill_args, pdl);
    if (!merge) continue;
    m.o = p.o;
    void* merge_args[] = {&m};
    cuda::launch(s.merge, static_cast<unsigned>(s.props.num_sms * kMergeBlocksPerSm), 1, 1,
                 kMergeThreads, 1, 1, 0, stream, merge_args, pdl);
  }
}

void BatchPrefill::check(const IndexNames& names) const {
  state_->index_errors.check(names, state_->last_num_pages);
}

const BatchPrefillConfig& BatchPrefill::config() const { return state_->config; }
PrefillTiles BatchPrefill::last_tiles() const { return state_->tiles; }
const Plan& BatchPrefill::last_plan() const { return state_->plan; }
size_t BatchPrefill::workspace_size() const { return state_->workspace.own_bytes(); }
int64_t BatchPrefill::max_partial_slots() const {
  return state_->workspace.layout().max_partial_slots;
}

}  // namespace flare
