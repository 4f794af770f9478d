// NVFP4 KV for BatchPrefill: the staged copy, the checks of the caller's codes and scales, and
// the launch of kernels/prefill_nvfp4_stage.cuh.
#include "src/api/prefill_nvfp4.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/jit/module.h"
#include "src/api/device_checks.h"

namespace flare::api_detail {
namespace {

const char* const kWhat = "BatchPrefill";
constexpr auto kInvalid = ErrorCode::kInvalidArgument;

// A code or scale tensor of `shape`: uint8 (scales: e4m3 or uint8 bytes, FlashInfer's tests
// pass raw bytes), on the device, a unit innermost stride, rows aligned as below.
void check_nvfp4_tensor(const TensorView& t, const std::string& name, int device, bool codes,
                        const std::vector<int64_t>& shape) {
  TensorView view = t;
  if (!codes && view.dtype == DType::kU8) view.dtype = DType::kE4M3;
  FLARE_CHECK(view.ndim == static_cast<int>(shape.size()) && view.ndim >= 1, kInvalid, kWhat, ": ",
              name, " must have ", shape.size(), " dimensions, got ", view.shape_str());
  FLARE_CHECK(view.strides[view.ndim - 1] == 1, kInvalid, kWhat, ": ", name,
              ": the innermost stride must be 1, got ", view.strides[view.ndim - 1]);
  check_device_tensor(kWhat, view, name.c_str(), device, codes ? DType::kU8 : DType::kE4M3, shape,
                      false);
  // The FA2 family's NVFP4 kernels copy 16- or 8-byte pieces of code rows (16 where every code
  // row is 16-byte aligned) and 16-, 8- or 4-byte pieces of scale rows (their widths'
  // alignment; kernels/prefill_load.cuh Nvfp4RowCopies); the staging reads 8-byte code words.
  const int64_t width = shape.back();
  const int64_t alignment = codes ? 8 : width % 16 == 0 ? 16 : width % 8 == 0 ? 8 : 4;
  bool aligned = reinterpret_cast<uintptr_t>(view.data) % alignment == 0;
  for (int d = 0; d + 1 < view.ndim; ++d) aligned = aligned && view.strides[d] % alignment == 0;
  FLARE_CHECK(aligned, kInvalid, kWhat, ": ", name, " rows must be ", alignment,
              "-byte aligned (data pointer and strides), got strides ", view.strides[0], ", ",
              view.strides[1], view.ndim > 3 ? ", " : "",
              view.ndim > 3 ? std::to_string(view.strides[2]) : "");
}

void set_strides(const TensorView& t, KVLayout layout, int64_t (&out)[3]) {
  const KVStrides strides = kv_strides(t, layout);
  out[0] = strides.unit, out[1] = strides.slot, out[2] = strides.head;
}

// The caller's codes and scales (k, v, k scales, v scales), each checked against shape_of(t,
// width) with D / 2 or D / 16, into the params' source fields.
template <class ShapeOf>
void check_sources(const BatchPrefillConfig& c, const TensorView* const (&t)[4], ShapeOf shape_of,
                   Nvfp4StageParams& p) {
  FLARE_CHECK(t[2]->ndim != 0 && t[3]->ndim != 0, kInvalid, kWhat,
              ": NVFP4 KV (kv_dtype uint8) needs its block scales (kv_cache_sf)");
  const char* const names[4] = {"k (NVFP4 codes)", "v (NVFP4 codes)", "k scales (kv_cache_sf)",
                                "v scales (kv_cache_sf)"};
  const int dims[2] = {c.head_dim_qk, c.head_dim_vo};
  for (int i = 0; i < 4; ++i) {
    const bool codes = i < 2;
    const int64_t width = dims[i % 2] / (codes ? 2 : 16);
    check_nvfp4_tensor(*t[i], names[i], c.device, codes, shape_of(*t[i], width));
  }
  for (int which = 0; which < 2; ++which) {
    p.codes[which] = static_cast<const unsigned char*>(t[which]->data);
    p.scales[which] = static_cast<const unsigned char*>(t[which + 2]->data);
    set_strides(*t[which], c.layout, p.code_stride[which]);
    set_strides(*t[which + 2], c.layout, p.scale_stride[which]);
  }
}

}  // namespace

bool is_nvfp4_prefill(const BatchPrefillConfig& c) { return c.kv_dtype == DType::kU8; }

jit::KernelSpec prefill_nvfp4_stage_kernel_spec() {
  jit::KernelSpec spec;
  spec.family_header = "prefill_nvfp4_stage.cuh";
  spec.entry = "flare_prefill_nvfp4_stage";
  spec.label = "prefill_nvfp4_stage";
  return spec;
}

Nvfp4PrefillStaging::Nvfp4PrefillStaging(const BatchPrefillConfig& config) : config_(config) {
  const bool paged = config.kv == PrefillKV::kPaged;
  const int64_t rows = config.max_total_kv * (paged ? config.page_size : 1) * config.num_kv_heads;
  const size_t element = dtype_bytes(config.dtype);
  staged_k_ = cuda::DeviceBuffer(static_cast<size_t>(rows * config.head_dim_qk) * element);
  staged_v_ = cuda::DeviceBuffer(static_cast<size_t>(rows * config.head_dim_vo) * element);
  // Zeroed once: rows past a plan's count may still be read (the Hopper family's bulk copies
  // of a ragged tile end at the staged tensor's bounds) and must be finite, as every value the
  // dequantization writes is (0 x NaN would poison P.V).
  cuda::memset_d8_async(staged_k_.data(), 0, staged_k_.bytes(), nullptr);
  cuda::memset_d8_async(staged_v_.data(), 0, staged_v_.bytes(), nullptr);
  cuda::stream_synchronize(nullptr);
  if (paged) {
    std::vector<int32_t> ids(static_cast<size_t>(config.max_total_kv));
    std::iota(ids.begin(), ids.end(), 0);
    identity_ids_ = cuda::DeviceBuffer(ids.size() * sizeof(int32_t));
    cuda::memcpy_htod(identity_ids_.data(), ids.data(), ids.size() * sizeof(int32_t));
  }
  const jit::KernelSpec spec = prefill_nvfp4_stage_kernel_spec();
  kernel_ = jit::get_kernel(spec, spec.entry, config.device);
  num_sms_ = cuda::device_properties(config.device).num_sms;
}

PagedKVPages Nvfp4PrefillStaging::stage_pages(Nvfp4StageParams checked_pages, const Plan& plan,
                                              cuda::Stream stream) const {
  launch(checked_pages, plan, stream);
  const BatchPrefillConfig& c = config_;
  const bool nhd = c.layout == KVLayout::kNHD;
  const int64_t ps = c.page_size, h = c.num_kv_heads;
  PagedKVPages staged;
  staged.layout = c.layout;
  const auto staged_shape = [&](int64_t d) {
    return nhd ? std::vector<int64_t>{c.max_total_kv, ps, h, d}
               : std::vector<int64_t>{c.max_total_kv, h, ps, d};
  };
  const Device device = Device::cuda(c.device);
  staged.k = TensorView::contiguous(staged_k_.data(), c.dtype, staged_shape(c.head_dim_qk), device);
  staged.v = TensorView::contiguous(staged_v_.data(), c.dtype, staged_shape(c.head_dim_vo), device);
  staged.indices =
      TensorView::contiguous(identity_ids_.data(), DType::kI32, {c.max_total_kv}, device);
  return staged;
}

Nvfp4StageParams Nvfp4PrefillStaging::checked(const PagedKVPages& kv, const Plan& plan) const {
  const BatchPrefillConfig& c = config_;
  FLARE_CHECK(kv.layout == c.layout, kInvalid, kWhat, ": kv layout must be ",
              kv_layout_name(c.layout), ", got ", kv_layout_name(kv.layout));
  const bool nhd = c.layout == KVLayout::kNHD;
  const int64_t ps = c.page_size, h = c.num_kv_heads;
  const auto shape = [&](const TensorView& t, int64_t width) {
    const int64_t pages = t.ndim == 4 ? t.shape[0] : -1;
    return nhd ? std::vector<int64_t>{pages, ps, h, width}
               : std::vector<int64_t>{pages, h, ps, width};
  };
  Nvfp4StageParams p{};
  check_sources(c, {&kv.k, &kv.v, &kv.k_scales, &kv.v_scales}, shape, p);
  const TensorView& ids = kv.indices;
  FLARE_CHECK((ids.data != nullptr || ids.shape[0] == 0) && ids.device == Device::cuda(c.device) &&
                  ids.dtype == DType::kI32 && ids.ndim == 1 && ids.shape[0] >= plan.planned_units &&
                  (ids.shape[0] <= 1 || ids.strides[0] == 1),
              kInvalid, kWhat,
              ": kv indices must be a contiguous int32 1-D tensor on cuda:", c.device,
              " with at least ", plan.planned_units, " entries, got ", dtype_name(ids.dtype), " ",
              ids.shape_str(), " on ", ids.device.str());
  p.num_pages =
      std::min({kv.k.shape[0], kv.v.shape[0], kv.k_scales.shape[0], kv.v_scales.shape[0]});
  FLARE_CHECK(plan.planned_units == 0 || p.num_pages >= 1, kInvalid, kWhat, ": the plan reads ",
              plan.planned_units, " pages but the cache has none");
  p.indices = ids.ptr<const int32_t>();
  return p;
}

std::pair<TensorView, TensorView> Nvfp4PrefillStaging::stage_rows(Nvfp4StageParams checked_rows,
                                                                  const Plan& plan,
                                                                  cuda::Stream stream) const {
  launch(checked_rows, plan, stream);
  const BatchPrefillConfig& c = config_;
  const int64_t h = c.num_kv_heads;
  const Device device = Device::cuda(c.device);
  return {
      TensorView::contiguous(staged_k_.data(), c.dtype, {c.max_total_kv, h, c.head_dim_qk}, device),
      TensorView::contiguous(staged_v_.data(), c.dtype, {c.max_total_kv, h, c.head_dim_vo},
                             device)};
}

Nvfp4StageParams Nvfp4PrefillStaging::checked(const Nvfp4Rows& kv, const Plan& plan) const {
  const BatchPrefillConfig& c = config_;
  const int64_t h = c.num_kv_heads;
  const auto shape = [&](const TensorView& t, int64_t width) {
    return std::vector<int64_t>{t.ndim == 3 ? t.shape[0] : -1, h, width};
  };
  Nvfp4StageParams p{};
  check_sources(c, {&kv.k, &kv.v, &kv.k_scales, &kv.v_scales}, shape, p);
  const int64_t rows =
      std::min({kv.k.shape[0], kv.v.shape[0], kv.k_scales.shape[0], kv.v_scales.shape[0]});
  FLARE_CHECK(rows >= plan.planned_units, kInvalid, kWhat,
              ": k, v and their scales must hold kv_indptr[batch]=", plan.planned_units,
              " tokens, got ", kv.k.shape[0], ", ", kv.v.shape[0], ", ", kv.k_scales.shape[0],
              " and ", kv.v_scales.shape[0]);
  return p;
}

void Nvfp4PrefillStaging::launch(Nvfp4StageParams& p, const Plan& plan, cuda::Stream stream) const {
  const BatchPrefillConfig& c = config_;
  const bool paged = c.kv == PrefillKV::kPaged;
  const bool nhd = !paged || c.layout == KVLayout::kNHD;
  const int64_t ps = paged ? c.page_size : 1, h = c.num_kv_heads;
  const int dims[2] = {c.head_dim_qk, c.head_dim_vo};
  for (int which = 0; which < 2; ++which) {
    const int64_t d = dims[which];
    p.staged[which] = static_cast<unsigned char*>(which == 0 ? staged_k_.data() : staged_v_.data());
    p.staged_stride[which][0] = ps * h * d;
    p.staged_stride[which][1] = nhd ? h * d : d;
    p.staged_stride[which][2] = nhd ? d : ps * d;
    p.blocks[which] = static_cast<int32_t>(d / 16);
  }
  p.kv_indptr = plan.kv_indptr_table;
  p.index_error = plan.index_error;
  p.capacity = c.max_total_kv;
  p.max_batch = c.max_batch;
  p.page_size = static_cast<int32_t>(ps);
  p.num_heads = static_cast<int32_t>(h);
  p.bf16 = c.dtype == DType::kBF16 ? 1 : 0;
  // A captured launch serves later plans of up to capacity units; an eager one this plan's.
  const int64_t units = c.use_cuda_graph ? c.max_total_kv : plan.planned_units;
  const int64_t threads = units * ps * h * (p.blocks[0] + p.blocks[1]);
  const int64_t blocks =
      std::clamp<int64_t>((threads + kNvfp4StageThreads - 1) / kNvfp4StageThreads, 1,
                          static_cast<int64_t>(num_sms_) * 16);
  void* args[] = {&p};
  cuda::launch(kernel_, static_cast<unsigned>(blocks), 1, 1, kNvfp4StageThreads, 1, 1, 0, stream,
               args, false);
}

}  // namespace flare::api_detail
