// BatchDecode: the persistent grid and workspace, plan() (the host work of
// src/api/decode_plan.h + one async copy) and run() (validation + one launch; split tiles are
// merged inside it). The config, the kernel spec and the plan setup: decode_config.cpp.
#include "flare/api/batch_decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flare/core/error.h"
#include "flare/jit/cuda_sync.h"
#include "flare/jit/module.h"
#include "kernels/decode_params.cuh"
#include "src/api/decode_config.h"
#include "src/api/decode_plan.h"
#include "src/api/device_checks.h"
#include "src/api/device_variant.h"
#include "src/api/plan_staging.h"
#include "src/api/run_support.h"
#include "src/api/variant_support.h"

namespace flare {
namespace {

using api_detail::check_device_tensor;
using api_detail::check_page_strides_fit_int32;
using api_detail::offsets_of;

const char* const kWhat = "BatchDecode";

void check_index_array(const TensorView& t, const char* name, int device, int64_t min_size,
                       int64_t exact_size) {
  // An empty array may have no storage (torch's empty tensors): nothing reads it.
  FLARE_CHECK((t.data != nullptr || t.shape[0] == 0) && t.device == Device::cuda(device) &&
                  t.dtype == DType::kI32 && t.ndim == 1 &&
                  (t.shape[0] == exact_size || (exact_size < 0 && t.shape[0] >= min_size)) &&
                  (t.shape[0] <= 1 || t.strides[0] == 1),
              ErrorCode::kInvalidArgument, kWhat, ": ", name, " must be a contiguous int32 1-D ",
              "tensor on cuda:", device, " with ",
              exact_size >= 0 ? "exactly " + std::to_string(exact_size)
                              : "at least " + std::to_string(min_size),
              " entries, got ", dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str());
}

// The compiled kernels and the grid of one config: what the constructor and workspace_bytes()
// share.
struct ResolvedKernels {
  BatchDecodeKernels kernels;
  cuda::Function decode = nullptr;
  int num_sms = 0;
  int cc_major = 0;
  int resident_ctas = 0;  // that run at once: num_sms x the kernel's CTAs per SM
  int waves = 1;          // of the grid, for batches whose tiles outnumber resident_ctas
  int num_ctas = 0;       // the grid: resident_ctas x waves
  // Dynamic shared memory of a launch whose plan uses half the CTAs per SM (see plan()): what
  // two CTAs per SM allow, so the fused merge stages more partial slots per pass.
  size_t half_grid_shared_bytes = 0;
  WorkspaceBounds bounds;  // at the default partial-slot bound
  api_detail::DecodePlanSetup plan_setup;
};

}  // namespace

struct BatchDecode::State {
  BatchDecodeConfig config;
  ResolvedKernels k;
  api_detail::Workspace workspace;
  // int32 [max merge items]: arrivals of split tiles' chunks, zero between runs (the kernel's
  // last arrival resets its count). Outside the workspace: the plan copy must not touch it.
  cuda::DeviceBuffer merge_counters;
  cuda::DeviceBuffer variant_tables;  // ALiBi slopes, RoPE turns (device_variant)
  IndexErrorRecordBuffer index_errors;
  bool validate_indices = false;
  bool planned = false;
  size_t launch_shared_bytes = 0;  // of the latest plan's launches
  Plan plan;
  std::vector<int32_t> kv_indptr;  // the latest plan's, for validation mode
  std::vector<int32_t> kv_len;     // the latest plan's
  // plan()'s work, swapped with plan and kv_len when it succeeds.
  api_detail::DecodeHostPlan next;
  // The page ids a captured run reads (-1 before one): later plans must not need more.
  int64_t captured_indices = -1;
  int64_t last_num_pages = -1;  // of the latest run, quoted by check()
  TensorView last_indices;      // the page ids of the latest run, searched by check()
  VariantParams variant{};

  // Zeroed on `stream` (the counters must be 0 when a run starts).
  void allocate_merge_counters(cuda::Stream stream) {
    const size_t bytes =
        static_cast<size_t>(std::max<int64_t>(1, workspace.layout().max_merge_items)) *
        sizeof(int32_t);
    merge_counters = cuda::DeviceBuffer(bytes);
    cuda::memset_d8_async(merge_counters.data(), 0, bytes, stream);
  }
};

namespace {

// Compiles (or loads) both kernels and sizes the persistent grid and the workspace.
ResolvedKernels resolve_kernels(const BatchDecodeConfig& config) {
  ResolvedKernels r;
  api_detail::validate_decode_config(config);  // before the device is touched
  const cuda::DeviceScope scope(config.device);
  const cuda::DeviceProperties props = cuda::device_properties(config.device);
  r.kernels =
      batch_decode_kernels(config, static_cast<size_t>(props.max_shared_bytes_per_block_optin));
  r.decode = jit::get_kernel(r.kernels.decode, "flare_decode", config.device);
  FLARE_CHECK(
      static_cast<int>(r.kernels.decode_shared_bytes) <= props.max_shared_bytes_per_block_optin,
      ErrorCode::kUnsupported, kWhat, ": the decode kernel needs ", r.kernels.decode_shared_bytes,
      " bytes of shared memory, device ", config.device, " allows ",
      props.max_shared_bytes_per_block_optin);
  // Two CTAs per SM leave each about half the SM's shared memory (1 KiB per CTA is reserved).
  const size_t half_sm = static_cast<size_t>(props.max_shared_bytes_per_sm) / 2 - 2048;
  r.half_grid_shared_bytes =
      std::max(r.kernels.decode_shared_bytes,
               std::min(half_sm, static_cast<size_t>(props.max_shared_bytes_per_block_optin)));
  cuda::set_max_dynamic_shared(r.decode, static_cast<int>(r.half_grid_shared_bytes));
  r.num_sms = props.num_sms;
  r.cc_major = props.cc_major;
  const auto ctas_per_sm = static_cast<int>(api_detail::decode_ctas_per_sm(
      config, r.decode, r.kernels.threads, r.kernels.decode_shared_bytes));
  r.plan_setup = api_detail::decode_plan_setup(config, props.num_sms, ctas_per_sm);
  r.resident_ctas = props.num_sms * ctas_per_sm;
  r.waves = r.plan_setup.waves;
  r.num_ctas = r.resident_ctas * r.waves;
  r.bounds = r.plan_setup.bounds;
  return r;
}

}  // namespace

BatchDecode::BatchDecode(const BatchDecodeConfig& config) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config;
  s.k = resolve_kernels(config);
  const cuda::DeviceScope scope(config.device);
  s.workspace = api_detail::Workspace(kWhat, s.k.bounds, config.scratch, config.scratch_bytes);
  s.allocate_merge_counters(nullptr);
  s.index_errors = IndexErrorRecordBuffer(config.device);
  s.validate_indices = config.validate_indices || api_detail::validate_from_env();
  s.variant = api_detail::device_variant(config.params, config.head_dim, config.num_qo_heads,
                                         s.variant_tables);
  // The counters' memset and a pageable copy may still be in flight on the legacy stream, and
  // run() may use a non-blocking stream: finish them here, once.
  cuda::stream_synchronize(nullptr);
}

BatchDecode::~BatchDecode() = default;
BatchDecode::BatchDecode(BatchDecode&&) noexcept = default;
BatchDecode& BatchDecode::operator=(BatchDecode&&) noexcept = default;

size_t BatchDecode::workspace_bytes(const BatchDecodeConfig& config) {
  return workspace_layout(resolve_kernels(config).bounds).total_bytes;
}

size_t BatchDecode::scratch_bytes_needed(const BatchDecodeConfig& config) {
  return workspace_layout(resolve_kernels(config).bounds).scratch_bytes();
}

void BatchDecode::plan(std::span<const int32_t> kv_indptr,
                       std::span<const int32_t> kv_last_page_len, cuda::Stream stream) {
  State& s = *state_;
  {
    // The plan's copy would be recorded into the graph instead of running now.
    const cuda::DeviceScope scope(s.config.device);
    FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
                ": plan() must not be called while its stream is being captured into a CUDA "
                "graph: plan before the capture and between replays");
  }
  api_detail::validate_decode_batch(s.k.plan_setup, kv_indptr, kv_last_page_len, s.next);
  const int64_t batch = static_cast<int64_t>(s.next.kv_len.size());
  FLARE_CHECK(s.captured_indices < 0 || kv_indptr[batch] <= s.captured_indices,
              ErrorCode::kInvalidArgument, kWhat, ": kv_indptr[", batch, "]=", kv_indptr[batch],
              " pages exceed the ", s.captured_indices,
              " entries of the kv_indices tensor the captured run() reads");
  api_detail::plan_decode(s.k.plan_setup, s.next);
  const Plan& next = s.next.plan;

  const cuda::DeviceScope scope(s.config.device);
  if (next.num_partial_slots > s.workspace.layout().max_partial_slots) {
    // Only fixed_split_size plans exceed the default bound (002 D.3 holds for the others).
    FLARE_CHECK(!s.config.use_cuda_graph, ErrorCode::kWorkspaceTooSmall, kWhat, ": the plan needs ",
                next.num_partial_slots, " partial slots, the CUDA-graph workspace holds ",
                s.workspace.layout().max_partial_slots,
                " (fixed at creation: give a larger scratch, or plan the largest batch first)");
    s.workspace.grow(next.num_partial_slots);
    s.allocate_merge_counters(stream);
  }
  check_fits(next, s.workspace.layout());
  api_detail::stage_decode(s.next, s.workspace.layout(), kv_indptr,
                           s.workspace.staging().acquire());
  s.workspace.staging().copy_to(s.workspace.plan_region(), s.workspace.layout(),
                                static_cast<int64_t>(s.next.plan.work_items.size()), stream);
  std::swap(s.plan, s.next.plan);
  std::swap(s.kv_len, s.next.kv_len);
  s.kv_indptr.assign(kv_indptr.begin(), kv_indptr.end());
  s.planned = true;
  s.launch_shared_bytes =
      s.next.half_grid ? s.k.half_grid_shared_bytes : s.k.kernels.decode_shared_bytes;
}

void BatchDecode::plan(const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                       cuda::Stream stream) {
  for (const auto& [t, name] :
       {std::pair{&kv_indptr, "kv_indptr"}, std::pair{&kv_last_page_len, "kv_last_page_len"}}) {
    FLARE_CHECK(t->device.is_cpu() && t->dtype == DType::kI32 && t->ndim == 1 &&
                    (t->shape[0] <= 1 || t->strides[0] == 1),
                ErrorCode::kInvalidArgument, kWhat, ": plan() takes ", name,
                " as a contiguous int32 1-D CPU tensor, got ", dtype_name(t->dtype), " ",
                t->shape_str(), " on ", t->device.str());
  }
  plan(std::span<const int32_t>(kv_indptr.ptr<const int32_t>(),
                                static_cast<size_t>(kv_indptr.shape[0])),
       std::span<const int32_t>(kv_last_page_len.ptr<const int32_t>(),
                                static_cast<size_t>(kv_last_page_len.shape[0])),
       stream);
}

void BatchDecode::run(const TensorView& q, const PagedKVPages& kv, const TensorView& o,
                      const std::optional<TensorView>& lse, cuda::Stream stream,
                      const RunOptions& options) {
  State& s = *state_;
  const BatchDecodeConfig& c = s.config;
  FLARE_CHECK(s.planned, ErrorCode::kInvalidArgument, kWhat, ": run() before plan()");
  // A captured run serves every later plan: its tensors are sized for the largest batch.
  const int64_t planned_batch = static_cast<int64_t>(s.kv_len.size());
  const int64_t batch = c.use_cuda_graph && q.ndim == 3 ? q.shape[0] : planned_batch;
  FLARE_CHECK(batch >= planned_batch && batch <= c.max_batch, ErrorCode::kInvalidArgument, kWhat,
              ": q holds ", batch, " requests, the plan has ", planned_batch, " (max_batch ",
              c.max_batch, ")");
  FLARE_CHECK(!options.sink, ErrorCode::kUnsupported, kWhat,
              ": attention sinks (RunOptions::sink) are BatchPrefill's: plan the decode step as "
              "a prefill of one query token a request");
  api_detail::check_run_options(c.params, c.variant, options, lse.has_value(),
                                {batch, c.num_qo_heads, c.num_kv_heads}, c.device, kWhat);
  const int64_t h_qo = c.num_qo_heads, h_kv = c.num_kv_heads, d = c.head_dim;
  check_device_tensor(kWhat, q, "q", c.device, c.q_dtype, {batch, h_qo, d}, true);
  check_device_tensor(kWhat, o, "o", c.device, c.q_dtype, {batch, h_qo, d}, true);
  if (lse) check_device_tensor(kWhat, *lse, "lse", c.device, DType::kF32, {batch, h_qo}, false);
  FLARE_CHECK(kv.layout == c.layout, ErrorCode::kInvalidArgument, kWhat, ": kv layout must be ",
              kv_layout_name(c.layout), ", got ", kv_layout_name(kv.layout));
  const bool nhd = c.layout == KVLayout::kNHD;
  const int64_t ps = c.page_size;
  const int64_t k_pages = kv.k.ndim == 4 ? kv.k.shape[0] : -1;
  const int64_t v_pages = kv.v.ndim == 4 ? kv.v.shape[0] : -1;
  // NVFP4 (kv_dtype uint8): D / 2 bytes of codes a row, and scale pages of D / 16 e4m3 bytes.
  const bool nvfp4 = c.kv_dtype == DType::kU8;
  const int64_t row = nvfp4 ? d / 2 : d;
  for (const auto& [t, name, pages] :
       {std::tuple{&kv.k, "k", k_pages}, std::tuple{&kv.v, "v", v_pages}}) {
    if (nhd) {
      check_device_tensor(kWhat, *t, name, c.device, c.kv_dtype, {pages, ps, h_kv, row}, true);
    } else {
      check_device_tensor(kWhat, *t, name, c.device, c.kv_dtype, {pages, h_kv, ps, row}, true);
    }
  }
  FLARE_CHECK(nvfp4 == (kv.k_scales.ndim != 0 || kv.v_scales.ndim != 0),
              ErrorCode::kInvalidArgument, kWhat,
              nvfp4 ? ": NVFP4 KV (kv_dtype uint8) needs its block scales (kv_cache_sf)"
                    : ": block scales (kv_cache_sf) were given for KV that is not NVFP4");
  if (nvfp4) {
    for (const auto& [given, name, pages] : {std::tuple{&kv.k_scales, "k scales", k_pages},
                                             std::tuple{&kv.v_scales, "v scales", v_pages}}) {
      const std::vector<int64_t> shape = nhd ? std::vector<int64_t>{pages, ps, h_kv, d / 16}
                                             : std::vector<int64_t>{pages, h_kv, ps, d / 16};
      // e4m3 bytes, typed float8_e4m3 or uint8 (FlashInfer's tests pass raw bytes).
      TensorView scale_view = *given;
      if (scale_view.dtype == DType::kU8) scale_view.dtype = DType::kE4M3;
      const TensorView* t = &scale_view;
      check_device_tensor(kWhat, *t, name, c.device, DType::kE4M3, shape, false);
      // The kernel copies a row of scales in pieces of min(16, D / 16) bytes.
      const int64_t piece = std::min<int64_t>(16, d / 16);
      const bool aligned =
          t->strides[3] == 1 && reinterpret_cast<uintptr_t>(t->data) % piece == 0 &&
          t->strides[0] % piece == 0 && t->strides[1] % piece == 0 && t->strides[2] % piece == 0;
      FLARE_CHECK(aligned, ErrorCode::kInvalidArgument, kWhat, ": ", name,
                  " rows must be contiguous and ", piece,
                  "-byte aligned (address and strides), got strides ", t->strides[0], ", ",
                  t->strides[1], ", ", t->strides[2], ", ", t->strides[3]);
    }
  }
  const int64_t planned_pages = s.kv_indptr.back();
  check_index_array(kv.indices, "kv indices", c.device, planned_pages, -1);
  FLARE_CHECK(
      !c.use_cuda_graph || s.captured_indices < 0 || kv.indices.shape[0] >= s.captured_indices,
      ErrorCode::kInvalidArgument, kWhat, ": kv indices has ", kv.indices.shape[0],
      " entries, fewer than an earlier run's ", s.captured_indices);
  const cuda::DeviceScope scope(c.device);
  const bool capturing = cuda::is_capturing(stream);
  FLARE_CHECK(c.use_cuda_graph || !capturing, ErrorCode::kInvalidArgument, kWhat,
              ": run() on a capturing stream needs a BatchDecode created with "
              "use_cuda_graph = true");
  const int64_t num_pages = std::min(k_pages, v_pages);
  // An out-of-range page id is read from the last page (kernels/decode_pipeline.cuh).
  FLARE_CHECK(planned_pages == 0 || num_pages >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": the plan reads ", planned_pages, " pages but the cache has none");
  if (s.validate_indices) {
    FLARE_CHECK(!capturing, ErrorCode::kInvalidArgument, kWhat,
                ": validation mode (validate_indices, FLARE_VALIDATE) cannot be captured");
    api_detail::validate_page_ids(kv.indices, s.kv_indptr, num_pages, {kWhat, "kv_indices"},
                                  stream);
  }

  DecodeParams p{};
  p.q = q.data;
  p.k = kv.k.data;
  p.v = kv.v.data;
  p.o = o.data;
  p.lse = lse ? lse->ptr<float>() : nullptr;
  p.kv_indices = kv.indices.ptr<const int32_t>();
  p.last_page = num_pages >= 1
                    ? static_cast<unsigned>(
                          std::min<int64_t>(num_pages, std::numeric_limits<int32_t>::max()) - 1)
                    : 0;
  p.index_error = s.index_errors.device_record();
  p.workspace = s.workspace.device();
  p.offsets = s.workspace.offsets();
  p.cta_starts =
      reinterpret_cast<const DecodeCtaStart*>(p.workspace + s.workspace.layout().executor_ctas);
  p.item_meta =
      reinterpret_cast<const DecodeItemMeta*>(p.workspace + s.workspace.layout().executor_items);
  p.merge_counters = static_cast<int32_t*>(s.merge_counters.data());
  p.q_stride_token = q.strides[0];
  p.q_stride_head = q.strides[1];
  const api_detail::KVStrides ks = api_detail::kv_strides(kv.k, c.layout);
  const api_detail::KVStrides vs = api_detail::kv_strides(kv.v, c.layout);
  p.k_stride_page = ks.unit, p.k_stride_slot = ks.slot, p.k_stride_head = ks.head;
  p.v_stride_page = vs.unit, p.v_stride_slot = vs.slot, p.v_stride_head = vs.head;
  if (nvfp4) {
    p.k_sf = static_cast<const unsigned char*>(kv.k_scales.data);
    p.v_sf = static_cast<const unsigned char*>(kv.v_scales.data);
    const api_detail::KVStrides kss = api_detail::kv_strides(kv.k_scales, c.layout);
    const api_detail::KVStrides vss = api_detail::kv_strides(kv.v_scales, c.layout);
    p.k_sf_stride_page = kss.unit, p.k_sf_stride_slot = kss.slot, p.k_sf_stride_head = kss.head;
    p.v_sf_stride_page = vss.unit, p.v_sf_stride_slot = vss.slot, p.v_sf_stride_head = vss.head;
    FLARE_CHECK(kv.k_scales.shape[0] >= std::min(k_pages, v_pages) &&
                    kv.v_scales.shape[0] >= std::min(k_pages, v_pages),
                ErrorCode::kInvalidArgument, kWhat,
                ": k scales and v scales must have the pages of k and v");
  }
  const int64_t kv_bytes = static_cast<int64_t>(dtype_bytes(c.kv_dtype));
  check_page_strides_fit_int32(kWhat, "k", p.k_stride_page, p.k_stride_slot, c.page_size, kv_bytes);
  check_page_strides_fit_int32(kWhat, "v", p.v_stride_page, p.v_stride_slot, c.page_size, kv_bytes);
  p.o_stride_token = o.strides[0];
  p.o_stride_head = o.strides[1];
  p.lse_stride_token = lse ? lse->strides[0] : 0;
  p.lse_stride_head = lse ? lse->strides[1] : 0;
  p.group_size = api_detail::decode_plan_group_size(c);
  p.k_scale = c.params.k_scale * options.k_scale * options.q_scale;
  p.v_scale = c.params.v_scale * options.v_scale;
  p.lse_scale = lse_scale(options.lse_base);
  p.variant = s.variant;
  api_detail::set_variant_arguments(options, p.variant);
  void* decode_args[] = {&p};
  // The planned CTAs (fewer than the grid for small plans outside graph mode, see plan()); a
  // graph-mode launch keeps the full grid fixed at creation (the unplanned CTAs exit at once).
  const int grid = c.use_cuda_graph ? s.k.num_ctas : std::max(s.plan.num_ctas, 1);
  cuda::launch(s.k.decode, static_cast<unsigned>(grid), 1, 1,
               static_cast<unsigned>(s.k.kernels.threads), 1, 1,
               static_cast<unsigned>(s.launch_shared_bytes), stream, decode_args,
               options.enable_pdl && s.k.cc_major >= 9);
  if (c.use_cuda_graph) s.captured_indices = kv.indices.shape[0];
  s.last_num_pages = num_pages;
  s.last_indices = kv.indices;
}

void BatchDecode::check(const IndexNames& names) const {
  const State& s = *state_;
  IndexError error = s.index_errors.read_and_clear();
  if (error.kind == kIndexErrorNone) return;
  // The kernel records the request only (kernels/decode.cuh): find the entry and the value in
  // the page ids the last run read, if they still hold them.
  const auto r = static_cast<size_t>(error.request);
  if (error.entry < 0 && s.last_indices.data != nullptr && error.request >= 0 &&
      r + 1 < s.kv_indptr.size()) {
    const cuda::DeviceScope scope(s.config.device);
    const std::optional<api_detail::BadPageId> bad = api_detail::find_bad_page_id(
        s.last_indices.ptr<const int32_t>(), s.kv_indptr[r], s.kv_indptr[r + 1], s.last_num_pages);
    if (bad) {
      error.entry = bad->entry;
      error.value = bad->value;
    }
  }
  raise_index_error(error, names, s.last_num_pages);
}

const BatchDecodeConfig& BatchDecode::config() const { return state_->config; }
int BatchDecode::num_ctas() const { return state_->k.num_ctas; }
int BatchDecode::rows_per_item() const { return state_->k.kernels.rows_per_item; }
const Plan& BatchDecode::last_plan() const { return state_->plan; }
size_t BatchDecode::workspace_size() const { return state_->workspace.own_bytes(); }
int64_t BatchDecode::max_partial_slots() const {
  return state_->workspace.layout().max_partial_slots;
}

}  // namespace flare
