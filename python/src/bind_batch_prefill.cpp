// flare::BatchPrefill for the Python prefill wrappers: created per configuration, plan() on
// host index arrays (compiling the kernel of newly chosen tiles), run() on the caller's CUDA
// stream against paged or ragged KV, with the custom mask's bits on the device.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "object_view.h"
#include "params_arg.h"
#include "tensor_arg.h"
#include "variant_arg.h"

namespace flare::python {

namespace {

// The value of string keyword `name` among `choices` (in the order the error lists them);
// kInvalidArgument naming the keyword and the choices otherwise.
template <class T>
T keyword_choice(const char* name, const std::string& given,
                 std::initializer_list<std::pair<const char*, T>> choices) {
  std::string listed;
  size_t i = 0;
  for (const auto& [text, value] : choices) {
    if (given == text) return value;
    listed += (i == 0                    ? ""
               : i + 1 == choices.size() ? " or "
                                         : ", ") +
              ("'" + std::string(text)) + "'";
    ++i;
  }
  fail(ErrorCode::kInvalidArgument, name, " must be ", listed, ", got '", given, "'");
}

// `custom_mask`: the mask bits come with every run(); `params` then carries no mask tensors.
// PrefillConfig(...): a BatchPrefillConfig from the wrapper's keywords, for BatchPrefill and
// precompile().
void make_config(BatchPrefillConfig* self, int device, int max_batch, int max_total_qo,
                 int num_qo_heads, int num_kv_heads, int head_dim_qk, int head_dim_vo, bool paged,
                 int page_size, const std::string& kv_layout, const std::string& dtype,
                 const ParamsArg& params, bool custom_mask, bool use_cuda_graph,
                 int fixed_split_size, bool disable_split_kv, uintptr_t scratch,
                 size_t scratch_bytes, bool validate_indices, nb::handle variant,
                 const std::string& backend, const std::string& kv_dtype, int64_t max_total_kv,
                 int max_levels, const std::string& rope_staging, bool single_plan) {
  BatchPrefillConfig& config = *new (self) BatchPrefillConfig();
  config.single_plan = single_plan;
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
  // "uint8": NVFP4 K/V (codes with kv_cache_sf block scales), staged in max_total_kv units.
  if (!kv_dtype.empty() && kv_dtype != dtype) config.kv_dtype = parse_dtype(kv_dtype);
  config.max_total_kv = max_total_kv;
  config.max_levels = max_levels;
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
  config.scratch = reinterpret_cast<void*>(scratch);
  config.scratch_bytes = scratch_bytes;
  config.validate_indices = validate_indices;
  config.variant = user_variant_arg(variant);
  config.backend = keyword_choice<PrefillBackend>("backend", backend,
                                                  {{"auto", PrefillBackend::kAuto},
                                                   {"fa2", PrefillBackend::kFA2},
                                                   {"fa3", PrefillBackend::kFA3}});
  config.rope_staging = keyword_choice<RopeStaging>("rope_staging", rope_staging,
                                                    {{"auto", RopeStaging::kAuto},
                                                     {"fused", RopeStaging::kFused},
                                                     {"staged", RopeStaging::kStaged}});
}

void construct(BatchPrefill* self, const BatchPrefillConfig& config) {
  // Creation compiles the merge kernel: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  new (self) BatchPrefill(config);
}

// Host index arrays as the caller's objects (CPU torch tensors or numpy arrays, read without a
// copy and named as the engine names them).
void plan(BatchPrefill& prefill, nb::handle qo_indptr, nb::handle kv_indptr,
          nb::handle kv_last_page_len, uintptr_t stream) {
  const std::span<const int32_t> qo =
      host_int32_span(object_view(qo_indptr, "qo_indptr"), "qo_indptr");
  const std::span<const int32_t> kv =
      host_int32_span(object_view(kv_indptr, "kv_indptr"), "kv_indptr");
  const std::span<const int32_t> last =
      kv_last_page_len.is_none()
          ? std::span<const int32_t>()
          : host_int32_span(object_view(kv_last_page_len, "kv_last_page_len"), "kv_last_page_len");
  // A newly chosen tile pair compiles its kernel (seconds on a cold JIT cache).
  nb::gil_scoped_release release;
  prefill.plan(qo, kv, last, reinterpret_cast<cuda::Stream>(stream));
}

// A cascade's levels: a sequence of (qo_indptr, kv_indptr, kv_last_page_len) host arrays, the
// kv_indptr of each level absolute in the one page-id array run() gets.
void plan_cascade(BatchPrefill& prefill, nb::handle levels, uintptr_t stream) {
  FLARE_CHECK(PyTuple_Check(levels.ptr()) || PyList_Check(levels.ptr()),
              ErrorCode::kInvalidArgument,
              "plan_cascade: levels must be a list of "
              "(qo_indptr, kv_indptr, kv_last_page_len) tuples");
  const nb::sequence seq = nb::borrow<nb::sequence>(levels);
  std::vector<CascadeLevel> spans;
  for (size_t l = 0; l < nb::len(seq); ++l) {
    const nb::sequence level = nb::borrow<nb::sequence>(seq[l]);
    FLARE_CHECK(nb::len(level) == 3, ErrorCode::kInvalidArgument, "plan_cascade: level ", l,
                " must be (qo_indptr, kv_indptr, kv_last_page_len)");
    spans.push_back({host_int32_span(object_view(level[0], "qo_indptr"), "qo_indptr"),
                     host_int32_span(object_view(level[1], "paged_kv_indptr"), "paged_kv_indptr"),
                     host_int32_span(object_view(level[2], "paged_kv_last_page_len"),
                                     "paged_kv_last_page_len")});
  }
  nb::gil_scoped_release release;
  prefill.plan_cascade(spans, reinterpret_cast<cuda::Stream>(stream));
}

// The wrappers' run(): the caller's objects, on torch's current stream; sink: the attention-sink
// wrapper's logits (RunOptions::sink), else None.
void run_paged(BatchPrefill& prefill, nb::handle q, nb::handle paged_kv_cache, nb::handle indices,
               nb::handle out, nb::handle lse, nb::handle mask_bits, float q_scale, float k_scale,
               float v_scale, bool lse_base2, bool enable_pdl, nb::handle variant_scalars,
               nb::handle variant_tensors, nb::handle kv_cache_sf, nb::handle sink) {
  const BatchPrefillConfig& c = prefill.config();
  RunArguments args(q_scale, k_scale, v_scale, lse_base2, enable_pdl, variant_scalars,
                    variant_tensors);
  args.set_sink(sink);
  const PagedKVPages pages =
      paged_kv_pages(paged_kv_cache, c.layout, indices, "paged_kv_indices", kv_cache_sf);
  prefill.run(object_view(q, "q"), pages, object_view(out, "out"), optional_object_view(lse, "lse"),
              reinterpret_cast<cuda::Stream>(torch_current_stream(c.device)),
              optional_object_view(mask_bits, "custom_mask"), args.options());
}

// k, v: [tokens, H_kv, D] (NHD) or [H_kv, tokens, D] (HND, viewed as NHD without a copy);
// NVFP4: the codes, with kv_cache_sf the (k, v) block scales laid out alike.
void run_ragged(BatchPrefill& prefill, nb::handle q, nb::handle k, nb::handle v, bool hnd,
                nb::handle out, nb::handle lse, nb::handle mask_bits, float q_scale, float k_scale,
                float v_scale, bool lse_base2, bool enable_pdl, nb::handle variant_scalars,
                nb::handle variant_tensors, nb::handle kv_cache_sf, nb::handle sink) {
  const BatchPrefillConfig& c = prefill.config();
  RunArguments args(q_scale, k_scale, v_scale, lse_base2, enable_pdl, variant_scalars,
                    variant_tensors);
  args.set_sink(sink);
  Nvfp4Rows rows{object_view(k, "k"), object_view(v, "v"), {}, {}};
  if (!kv_cache_sf.is_none()) {
    FLARE_CHECK(PyTuple_Check(kv_cache_sf.ptr()) || PyList_Check(kv_cache_sf.ptr()),
                ErrorCode::kInvalidArgument,
                "kv_cache_sf for ragged K/V must be a (k_scales, v_scales) tuple");
    const nb::sequence pair = nb::borrow<nb::sequence>(kv_cache_sf);
    FLARE_CHECK(nb::len(pair) == 2, ErrorCode::kInvalidArgument,
                "kv_cache_sf must be (k_scales, v_scales), got ", nb::len(pair), " tensors");
    rows.k_scales = object_view(pair[0], "kv_cache_sf[0]");
    rows.v_scales = object_view(pair[1], "kv_cache_sf[1]");
  }
  if (hnd) {
    for (TensorView* t : {&rows.k, &rows.v, &rows.k_scales, &rows.v_scales}) {
      if (t->ndim == 3) {
        std::swap(t->shape[0], t->shape[1]);
        std::swap(t->strides[0], t->strides[1]);
      }
    }
  }
  const TensorView qv = object_view(q, "q");
  const TensorView ov = object_view(out, "out");
  const std::optional<TensorView> lv = optional_object_view(lse, "lse");
  const auto stream = reinterpret_cast<cuda::Stream>(torch_current_stream(c.device));
  const std::optional<TensorView> mask = optional_object_view(mask_bits, "custom_mask");
  if (c.kv_dtype == DType::kU8) {
    prefill.run(qv, rows, ov, lv, stream, mask, args.options());
  } else {
    FLARE_CHECK(kv_cache_sf.is_none(), ErrorCode::kInvalidArgument,
                "kv_cache_sf (NVFP4 block scales) given for ", dtype_name(c.dtype), " K/V");
    prefill.run(qv, rows.k, rows.v, ov, lv, stream, mask, args.options());
  }
}

}  // namespace

void bind_batch_prefill(nb::module_& m) {
  nb::class_<BatchPrefillConfig>(m, "PrefillConfig",
                                 "flare::BatchPrefillConfig (internal: BatchPrefill, precompile).")
      .def("__init__", &make_config, nb::kw_only(), nb::arg("device"), nb::arg("max_batch"),
           nb::arg("max_total_qo"), nb::arg("num_qo_heads"), nb::arg("num_kv_heads"),
           nb::arg("head_dim_qk"), nb::arg("head_dim_vo"), nb::arg("paged"), nb::arg("page_size"),
           nb::arg("kv_layout"), nb::arg("dtype"), nb::arg("params"), nb::arg("custom_mask"),
           nb::arg("use_cuda_graph"), nb::arg("fixed_split_size"), nb::arg("disable_split_kv"),
           nb::arg("scratch") = 0, nb::arg("scratch_bytes") = 0,
           nb::arg("validate_indices") = false, nb::arg("variant").none() = nb::none(),
           nb::arg("backend") = "auto", nb::arg("kv_dtype") = "", nb::arg("max_total_kv") = 0,
           nb::arg("max_levels") = 1, nb::arg("rope_staging") = "auto",
           nb::arg("single_plan") = false);
  nb::class_<BatchPrefill>(m, "BatchPrefill", "flare::BatchPrefill (internal: GPU batch prefill).")
      .def("__init__", &construct, nb::arg("config"))
      .def("plan", &plan, nb::arg("qo_indptr"), nb::arg("kv_indptr"),
           nb::arg("kv_last_page_len").none(), nb::arg("stream"))
      .def("plan_cascade", &plan_cascade, nb::arg("levels"), nb::arg("stream"))
      .def("run_paged", &run_paged, nb::arg("q"), nb::arg("paged_kv_cache"), nb::arg("indices"),
           nb::arg("out"), nb::arg("lse").none(), nb::arg("mask_bits").none(), nb::arg("q_scale"),
           nb::arg("k_scale"), nb::arg("v_scale"), nb::arg("lse_base2"), nb::arg("enable_pdl"),
           nb::arg("variant_scalars").none() = nb::none(),
           nb::arg("variant_tensors").none() = nb::none(),
           nb::arg("kv_cache_sf").none() = nb::none(), nb::arg("sink").none() = nb::none())
      .def("run_ragged", &run_ragged, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("hnd"),
           nb::arg("out"), nb::arg("lse").none(), nb::arg("mask_bits").none(), nb::arg("q_scale"),
           nb::arg("k_scale"), nb::arg("v_scale"), nb::arg("lse_base2"), nb::arg("enable_pdl"),
           nb::arg("variant_scalars").none() = nb::none(),
           nb::arg("variant_tensors").none() = nb::none(),
           nb::arg("kv_cache_sf").none() = nb::none(), nb::arg("sink").none() = nb::none())
      .def("check", &check_page_ids<BatchPrefill>, nb::arg("operation"), nb::arg("indices"))
      .def_prop_ro("max_batch", [](const BatchPrefill& p) { return p.config().max_batch; })
      .def_prop_ro("max_total_qo", [](const BatchPrefill& p) { return p.config().max_total_qo; })
      .def_prop_ro("max_total_kv", [](const BatchPrefill& p) { return p.config().max_total_kv; })
      .def_prop_ro("last_plan_stages_rope", &BatchPrefill::last_plan_stages_rope)
      .def_prop_ro("tiles",
                   [](const BatchPrefill& p) {
                     const PrefillTiles t = p.last_tiles();
                     return nb::make_tuple(t.query_tile, t.kv_tile);
                   })
      // The latest plan's kernel family: "fa3" (Hopper, warpgroup MMAs) or "fa2".
      .def_prop_ro("family",
                   [](const BatchPrefill& p) { return p.last_tiles().warpgroup ? "fa3" : "fa2"; })
      .def_prop_ro("num_ctas", [](const BatchPrefill& p) { return p.last_plan().num_ctas; })
      // The latest plan's size: (work items, KV heads an item covers, merge items, partial
      // slots), for inspecting what the planner chose.
      .def_prop_ro("plan_counts",
                   [](const BatchPrefill& p) {
                     const Plan& plan = p.last_plan();
                     return nb::make_tuple(plan.work_items.size(), plan.item_heads,
                                           plan.merge_items.size(), plan.num_partial_slots);
                   })
      .def_prop_ro("max_partial_slots", &BatchPrefill::max_partial_slots)
      .def_prop_ro("workspace_size", &BatchPrefill::workspace_size);
}

}  // namespace flare::python
