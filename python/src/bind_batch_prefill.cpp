// flare::BatchPrefill for the Python prefill wrappers: created per configuration, plan() on
// host index arrays (compiling the kernel of newly chosen tiles), run() on the caller's CUDA
// stream against paged or ragged KV, with the custom mask's bits on the device.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <span>

#include "bindings.h"
#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "params_arg.h"
#include "tensor_arg.h"

namespace flare::python {

namespace {

cuda::Stream as_stream(uintptr_t handle) { return reinterpret_cast<cuda::Stream>(handle); }

// `custom_mask`: the mask bits come with every run(); `params` then carries no mask tensors.
void construct(BatchPrefill* self, int device, int max_batch, int max_total_qo, int num_qo_heads,
               int num_kv_heads, int head_dim_qk, int head_dim_vo, bool paged, int page_size,
               const std::string& kv_layout, const std::string& dtype, const ParamsArg& params,
               bool custom_mask, bool use_cuda_graph, int fixed_split_size, bool disable_split_kv) {
  BatchPrefillConfig config;
  config.device = device;
  config.max_batch = max_batch;
  config.max_total_qo = max_total_qo;
  config.num_qo_heads = num_qo_heads;
  config.num_kv_heads = num_kv_heads;
  config.head_dim_qk = head_dim_qk;
  config.head_dim_vo = head_dim_vo;
  config.kv = paged ? PrefillKV::kPaged : PrefillKV::kRagged;
  config.page_size = page_size;
  config.layout = parse_kv_layout(kv_layout.c_str());
  config.dtype = parse_dtype(dtype);
  config.params = params.resolved();
  FLARE_CHECK(!config.params.custom_mask, ErrorCode::kInvalidArgument,
              "BatchPrefill takes its custom mask in run(), not in params");
  if (custom_mask) {
    FLARE_CHECK(config.params.mask == MaskMode::kNone, ErrorCode::kInvalidArgument,
                "causal=True and a custom mask exclude each other");
    config.params.mask = MaskMode::kCustom;
  }
  config.use_cuda_graph = use_cuda_graph;
  config.fixed_split_size = fixed_split_size;
  config.disable_split_kv = disable_split_kv;
  // Creation compiles the merge kernel: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  new (self) BatchPrefill(config);
}

void plan(BatchPrefill& prefill, const TensorArg& qo_indptr, const TensorArg& kv_indptr,
          const std::optional<TensorArg>& kv_last_page_len, uintptr_t stream) {
  const std::span<const int32_t> qo = host_int32_span(qo_indptr.view(), "qo_indptr");
  const std::span<const int32_t> kv = host_int32_span(kv_indptr.view(), "kv_indptr");
  const std::span<const int32_t> last =
      kv_last_page_len ? host_int32_span(kv_last_page_len->view(), "kv_last_page_len")
                       : std::span<const int32_t>();
  // A newly chosen tile pair compiles its kernel (seconds on a cold JIT cache).
  nb::gil_scoped_release release;
  prefill.plan(qo, kv, last, as_stream(stream));
}

std::optional<PrefillCustomMask> mask_of(const std::optional<TensorArg>& bits,
                                         const std::optional<TensorArg>& indptr) {
  FLARE_CHECK(bits.has_value() == indptr.has_value(), ErrorCode::kInvalidArgument,
              "mask_bits and mask_indptr must be given together");
  if (!bits) return std::nullopt;
  return PrefillCustomMask{bits->view(), indptr->view()};
}

void run_paged(BatchPrefill& prefill, const TensorArg& q, const TensorArg& qo_indptr,
               const TensorArg& k_pages, const TensorArg& v_pages, const TensorArg& kv_indptr,
               const TensorArg& kv_indices, const TensorArg& kv_last_page_len, const TensorArg& o,
               const std::optional<TensorArg>& lse, const std::optional<TensorArg>& mask_bits,
               const std::optional<TensorArg>& mask_indptr, uintptr_t stream) {
  const PagedKV kv =
      PagedKV::from_separate(k_pages.view(), v_pages.view(), prefill.config().layout,
                             kv_indptr.view(), kv_indices.view(), kv_last_page_len.view());
  prefill.run(q.view(), qo_indptr.view(), kv, o.view(), view_of(lse), as_stream(stream),
              mask_of(mask_bits, mask_indptr));
}

void run_ragged(BatchPrefill& prefill, const TensorArg& q, const TensorArg& qo_indptr,
                const TensorArg& k, const TensorArg& v, const TensorArg& kv_indptr,
                const TensorArg& o, const std::optional<TensorArg>& lse,
                const std::optional<TensorArg>& mask_bits,
                const std::optional<TensorArg>& mask_indptr, uintptr_t stream) {
  const RaggedKV kv{k.view(), v.view(), kv_indptr.view()};
  prefill.run(q.view(), qo_indptr.view(), kv, o.view(), view_of(lse), as_stream(stream),
              mask_of(mask_bits, mask_indptr));
}

}  // namespace

void bind_batch_prefill(nb::module_& m) {
  nb::class_<BatchPrefill>(m, "BatchPrefill", "flare::BatchPrefill (internal: GPU batch prefill).")
      .def("__init__", &construct, nb::kw_only(), nb::arg("device"), nb::arg("max_batch"),
           nb::arg("max_total_qo"), nb::arg("num_qo_heads"), nb::arg("num_kv_heads"),
           nb::arg("head_dim_qk"), nb::arg("head_dim_vo"), nb::arg("paged"), nb::arg("page_size"),
           nb::arg("kv_layout"), nb::arg("dtype"), nb::arg("params"), nb::arg("custom_mask"),
           nb::arg("use_cuda_graph"), nb::arg("fixed_split_size"), nb::arg("disable_split_kv"))
      .def("plan", &plan, nb::arg("qo_indptr"), nb::arg("kv_indptr"),
           nb::arg("kv_last_page_len").none(), nb::arg("stream"))
      .def("run_paged", &run_paged, nb::arg("q"), nb::arg("qo_indptr"), nb::arg("k_pages"),
           nb::arg("v_pages"), nb::arg("kv_indptr"), nb::arg("kv_indices"),
           nb::arg("kv_last_page_len"), nb::arg("o"), nb::arg("lse").none(),
           nb::arg("mask_bits").none(), nb::arg("mask_indptr").none(), nb::arg("stream"))
      .def("run_ragged", &run_ragged, nb::arg("q"), nb::arg("qo_indptr"), nb::arg("k"),
           nb::arg("v"), nb::arg("kv_indptr"), nb::arg("o"), nb::arg("lse").none(),
           nb::arg("mask_bits").none(), nb::arg("mask_indptr").none(), nb::arg("stream"))
      .def_prop_ro("max_batch", [](const BatchPrefill& p) { return p.config().max_batch; })
      .def_prop_ro("max_total_qo", [](const BatchPrefill& p) { return p.config().max_total_qo; })
      .def_prop_ro("tiles",
                   [](const BatchPrefill& p) {
                     const PrefillTiles t = p.last_tiles();
                     return nb::make_tuple(t.query_tile, t.kv_tile);
                   })
      .def_prop_ro("num_ctas", [](const BatchPrefill& p) { return p.last_plan().num_ctas; })
      .def_prop_ro("workspace_size", &BatchPrefill::workspace_size);
}

}  // namespace flare::python
