// apply_rope (api/rope.h): the reference for CPU tensors, kernels/rope_apply.cuh on PyTorch's
// current stream of q's device for CUDA tensors. The tensors are read in place (object_view).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <optional>
#include <tuple>

#include "bindings.h"
#include "flare/api/rope.h"
#include "object_view.h"

namespace flare::python {

void bind_rope(nb::module_& m) {
  m.def(
      "apply_rope",
      [](nb::handle q, nb::handle k, nb::handle q_out, nb::handle k_out, nb::handle indptr,
         nb::handle offsets, nb::handle pos_ids, int rotary_dim, bool interleave, float rope_theta,
         float rope_scale, std::optional<std::tuple<float, float, float>> llama31,
         nb::handle cos_sin_cache) {
        const TensorView q_view = object_view(q, "q");
        RopeOptions options;
        options.rotary_dim = rotary_dim;
        options.interleave = interleave;
        options.rope_theta = rope_theta;
        options.rope_scale = rope_scale;
        if (llama31) {
          options.llama31 = AttentionParams::Llama31Scaling{
              std::get<0>(*llama31), std::get<1>(*llama31), std::get<2>(*llama31)};
        }
        options.cos_sin_cache = optional_object_view(cos_sin_cache, "cos_sin_cache");
        const RopePositions positions{optional_object_view(indptr, "indptr"),
                                      optional_object_view(offsets, "offsets"),
                                      optional_object_view(pos_ids, "pos_ids")};
        apply_rope(q_view, object_view(k, "k"), object_view(q_out, "q_out"),
                   object_view(k_out, "k_out"), positions, options, torch_stream_for(q_view));
      },
      nb::arg("q"), nb::arg("k"), nb::arg("q_out"), nb::arg("k_out"), nb::arg("indptr").none(),
      nb::arg("offsets").none(), nb::arg("pos_ids").none(), nb::arg("rotary_dim"),
      nb::arg("interleave"), nb::arg("rope_theta"), nb::arg("rope_scale"),
      nb::arg("llama31").none(), nb::arg("cos_sin_cache").none(),
      "(q_out, k_out) <- (q, k) rotated at the tokens' positions (indptr and offsets, or "
      "pos_ids); llama31: (low_freq_factor, high_freq_factor, old_context_len) or None; "
      "cos_sin_cache: float32 [max_position, rotary_dim] (cos, then sin) or None.");
}

}  // namespace flare::python
