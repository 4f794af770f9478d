// BatchPrefill::run(): the checks of what can change per call (pointers, shapes, dtypes,
// devices, O(1); index arrays' sizes against the plan), the NVFP4 paths (the FA2 family's
// fused kernels or the staged copy), the Hopper family's bulk-copy maps, and the launches of
// the prefill kernel and, when the plan splits KV, the merge.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_sync.h"
#include "flare/jit/module.h"
#include "kernels/prefill_params.cuh"
#include "src/api/batch_prefill_state.h"
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
using api_detail::prefill_group_size;
using api_detail::request_table;
using enum api_detail::RequestTable;

const char* const kWhat = api_detail::kBatchPrefillWhat;
constexpr int kMergeThreads = 128;
constexpr int kMergeBlocksPerSm = 4;

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
  s.check_runnable(PrefillKV::kPaged);
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
  s.check_runnable(PrefillKV::kRagged);
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
  s.check_runnable(PrefillKV::kPaged);
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
  s.check_runnable(PrefillKV::kRagged);
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
  if (s.rope_staged) {
    // q and the plan's k rows rotated into the copies, which the kernels read without RoPE
    // (BatchPrefillConfig::rope_staging). Under use_cuda_graph a captured run serves every later
    // plan: q's rows and the k copy's bound the rotation, which reads the plan's counts on the
    // device. q first checked as launch() checks it, so that the rotation reads inside it.
    const bool graph = c.use_cuda_graph;
    const int64_t q_rows = graph && q.ndim == 3 ? q.shape[0] : s.total_qo;
    FLARE_CHECK(q_rows >= s.total_qo && q_rows <= c.max_total_qo, ErrorCode::kInvalidArgument,
                kWhat, ": q holds ", q_rows, " tokens, the plan has ", s.total_qo,
                " (max_total_qo ", c.max_total_qo, ")");
    check_device_tensor(kWhat, q, "q", c.device, c.dtype, {q_rows, c.num_qo_heads, c.head_dim_qk},
                        true);
    const WorkspaceLayout& layout = s.workspace.layout();
    const unsigned char* tables = s.workspace.device();
    s.rope.rotate(q, k, q_rows, graph ? std::min(k_rows, s.rope.key_rows()) : rows,
                  graph ? c.max_batch : s.batch,
                  request_table(tables, layout, c.max_batch, kQoBegin),
                  request_table(tables, layout, c.max_batch, kQOffset),
                  request_table(tables, layout, c.max_batch, kKvIndptr), stream);
    a.k = s.rope.k_copy();
    a.k_rows = s.rope.key_rows();  // the copy's rows: the bulk maps stay encoded across plans
    a.k_page = int64_t{c.num_kv_heads} * c.head_dim_qk;
    a.k_head = c.head_dim_qk;
    launch(TensorView::contiguous(s.rope.q_copy(), c.dtype, {q_rows, c.num_qo_heads, c.head_dim_qk},
                                  Device::cuda(c.device)),
           a, o, lse, stream, mask_bits, options);
    if (graph) s.captured_kv = std::min(k_rows, v_rows);
    return;
  }
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
  return s.bulk.update(source, [](const api_detail::BulkSource& next, auto& maps) {
    return api_detail::encode_bulk_maps(next, maps[0], maps[1]);
  });
}

// The Hopper family's bulk-copy map of q for this run (prefill_bulk_maps.h), encoded when q
// changed. False: the kernel gathers Q.
bool BatchPrefill::bulk_q_map(State& s, const TensorView& q) {
  const BatchPrefillConfig& c = s.config;
  api_detail::BulkQSource source;
  source.bf16 = c.dtype == DType::kBF16;
  source.q = q.data;
  source.rows = q.shape[0];
  source.token = q.strides[0];
  source.head = q.strides[1];
  source.head_dim = c.head_dim_qk;
  source.num_heads = c.num_qo_heads;
  source.group = prefill_group_size(c);
  source.query_tile = s.tiles.query_tile;
  return s.bulk_q.update(source, [](const api_detail::BulkQSource& next, auto& maps) {
    return api_detail::encode_bulk_q_map(next, maps[0]);
  });
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
  const api_detail::PrefillKernel& kernel =
      s.kernels.at({s.tiles.query_tile, s.tiles.kv_tile, s.tiles.warpgroup, s.rope_staged});
  const WorkspaceLayout& layout = s.workspace.layout();

  PrefillParams p{};
  p.q = q.data;
  p.k = a.k;
  p.v = a.v;
  p.o = o.data;
  p.lse = lse ? lse->ptr<float>() : nullptr;
  p.workspace = s.workspace.device();
  p.qo_begin = request_table(p.workspace, layout, c.max_batch, kQoBegin);
  p.q_offset = request_table(p.workspace, layout, c.max_batch, kQOffset);
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
  p.sink = options.sink ? options.sink->ptr<float>() : nullptr;
  p.variant = s.variant;
  p.variant.sm_scale = s.variant.sm_scale * options.q_scale * options.k_scale;
  api_detail::set_variant_arguments(options, p.variant);
  p.next_work_item = static_cast<int32_t*>(s.next_work_item.data());
  if (s.tiles.warpgroup) {
    // NVFP4 codes are gathered and converted by the producer, never bulk-copied.
    p.bulk_kv = a.k_scales == nullptr && bulk_maps(s, a) ? 1 : 0;
    static_assert(sizeof(p.k_map) == sizeof(cuda::TensorMap), "a CUtensorMap");
    std::memcpy(&p.k_map, &s.bulk.maps[0], sizeof(p.k_map));
    std::memcpy(&p.v_map, &s.bulk.maps[1], sizeof(p.v_map));
    p.bulk_q = bulk_q_map(s, q) ? 1 : 0;
    std::memcpy(&p.q_map, &s.bulk_q.maps[0], sizeof(p.q_map));
  }
  const unsigned grid = static_cast<unsigned>(c.use_cuda_graph ? s.bound_ctas : s.plan.num_ctas);
  const bool pdl = options.enable_pdl && s.props.cc_major >= 9;
  if (c.use_cuda_graph && mask_bits) s.captured_mask_bytes = mask_bits->shape[0];
  // Eager runs skip the merge launch when nothing was split; a captured run always launches it
  // (a later plan may split) unless the config plans once.
  const bool merge = (c.use_cuda_graph && !c.single_plan) || !s.plan.merge_items.empty();
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
  m.qo_begin = p.qo_begin;
  m.sum_partials = api_detail::uses_softmax(c.params, c.variant) ? 0 : 1;
  m.sink = p.sink;
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
                 static_cast<unsigned>(kernel.launch_shared_bytes), stream, prefill_args, pdl);
    if (!merge) continue;
    m.o = p.o;
    void* merge_args[] = {&m};
    cuda::launch(s.merge, static_cast<unsigned>(s.props.num_sms * kMergeBlocksPerSm), 1, 1,
                 kMergeThreads, 1, 1, 0, stream, merge_args, pdl);
  }
}

}  // namespace flare
