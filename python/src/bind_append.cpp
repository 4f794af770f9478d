// append_paged_kv (api/append_paged_kv.h) for CPU tensors and, on the caller's stream, CUDA
// tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>

#include "bindings.h"
#include "flare/api/append_paged_kv.h"
#include "flare/api/append_paged_kv_nvfp4.h"
#include "object_view.h"

namespace flare::python {

void bind_append(nb::module_& m) {
  m.def(
      "append_paged_kv",
      // The caller's objects read in place (object_view: no DLPack capsule), on torch's
      // current stream of k_pages' device: the serving loop appends every step.
      [](nb::handle append_key, nb::handle append_value, nb::handle batch_indices,
         nb::handle positions, nb::handle k_pages, nb::handle v_pages, const std::string& kv_layout,
         nb::handle kv_indptr, nb::handle kv_indices, nb::handle kv_last_page_len) {
        const TensorView k_view = object_view(k_pages, "k_pages");
        const PagedKV cache = PagedKV::from_separate(
            k_view, object_view(v_pages, "v_pages"), parse_kv_layout(kv_layout.c_str()),
            object_view(kv_indptr, "kv_indptr"), object_view(kv_indices, "kv_indices"),
            object_view(kv_last_page_len, "kv_last_page_len"));
        append_paged_kv(
            {object_view(append_key, "append_key"), object_view(append_value, "append_value"),
             object_view(batch_indices, "batch_indices"), object_view(positions, "positions")},
            cache, torch_stream_for(k_view));
      },
      nb::arg("append_key"), nb::arg("append_value"), nb::arg("batch_indices"),
      nb::arg("positions"), nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("kv_layout"),
      nb::arg("kv_indptr"), nb::arg("kv_indices"), nb::arg("kv_last_page_len"),
      "Writes each appended token into its page slot.");
  m.def(
      "append_paged_kv_nvfp4",
      // As append_paged_kv: the objects read in place, torch's stream of k_codes' device.
      [](nb::handle append_key, nb::handle append_value, nb::handle batch_indices,
         nb::handle positions, nb::handle k_codes, nb::handle v_codes, nb::handle k_scales,
         nb::handle v_scales, const std::string& kv_layout, nb::handle kv_indptr,
         nb::handle kv_indices, nb::handle kv_last_page_len, int64_t page_size, nb::handle k_scale,
         nb::handle v_scale) {
        const TensorView k_view = object_view(k_codes, "k_codes");
        const BlockSparseIndex table{page_size, object_view(kv_indptr, "kv_indptr"),
                                     object_view(kv_indices, "kv_indices"),
                                     object_view(kv_last_page_len, "kv_last_page_len")};
        append_paged_kv_nvfp4(
            {object_view(append_key, "append_key"), object_view(append_value, "append_value"),
             object_view(batch_indices, "batch_indices"), object_view(positions, "positions")},
            {k_view, object_view(v_codes, "v_codes"), object_view(k_scales, "k_scales"),
             object_view(v_scales, "v_scales"), parse_kv_layout(kv_layout.c_str())},
            table, {object_view(k_scale, "k_scale"), object_view(v_scale, "v_scale")},
            torch_stream_for(k_view));
      },
      nb::arg("append_key"), nb::arg("append_value"), nb::arg("batch_indices"),
      nb::arg("positions"), nb::arg("k_codes"), nb::arg("v_codes"), nb::arg("k_scales"),
      nb::arg("v_scales"), nb::arg("kv_layout"), nb::arg("kv_indptr"), nb::arg("kv_indices"),
      nb::arg("kv_last_page_len"), nb::arg("page_size"), nb::arg("k_scale"), nb::arg("v_scale"),
      "Quantizes each appended token into its NVFP4 page slot.");
  m.def(
      "append_paged_kv_nvfp4_by_slot",
      [](nb::handle append_key, nb::handle append_value, nb::handle slot_mapping,
         nb::handle k_codes, nb::handle v_codes, nb::handle k_scales, nb::handle v_scales,
         const std::string& kv_layout, nb::handle k_scale, nb::handle v_scale) {
        const TensorView k_view = object_view(k_codes, "k_codes");
        append_paged_kv_nvfp4_by_slot(
            {object_view(append_key, "append_key"), object_view(append_value, "append_value"),
             object_view(slot_mapping, "slot_mapping")},
            {k_view, object_view(v_codes, "v_codes"), object_view(k_scales, "k_scales"),
             object_view(v_scales, "v_scales"), parse_kv_layout(kv_layout.c_str())},
            {object_view(k_scale, "k_scale"), object_view(v_scale, "v_scale")},
            torch_stream_for(k_view));
      },
      nb::arg("append_key"), nb::arg("append_value"), nb::arg("slot_mapping"), nb::arg("k_codes"),
      nb::arg("v_codes"), nb::arg("k_scales"), nb::arg("v_scales"), nb::arg("kv_layout"),
      nb::arg("k_scale"), nb::arg("v_scale"),
      "Quantizes each appended token into the NVFP4 page slot slot_mapping names.");
  m.def(
      "check_append_paged_kv",
      [](int device) {
        nb::gil_scoped_release release;  // synchronizes the device
        check_append_paged_kv(device, {"append_paged_kv_cache", "kv_indices", "kv_indptr",
                                       "positions", "batch_indices"});
      },
      nb::arg("device"),
      "Raises IndexError for the first out-of-range index append_paged_kv met on the device.");
}

}  // namespace flare::python
