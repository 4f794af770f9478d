// The merge operator on attention states (api/merge_state.h): the reference operator for CPU
// tensors, kernels/merge_state.cuh on the caller's stream for CUDA tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>

#include "bindings.h"
#include "flare/api/merge_state.h"
#include "flare/core/error.h"
#include "object_view.h"

namespace flare::python {

// Every merge reads the caller's objects in place (object_view: a torch tensor through torch's
// DLPack C table or its attributes, no DLPack capsule, which cost ~25 us of host time a call on
// an H200; numpy and flare.Tensor through TensorArg), on torch's current stream of v's device
// for CUDA tensors.
void bind_merge(nb::module_& m) {
  m.def(
      "merge_state",
      [](nb::handle v_a, nb::handle s_a, nb::handle v_b, nb::handle s_b, nb::handle v_out,
         nb::handle s_out, bool lse_base2) {
        const TensorView v_a_view = object_view(v_a, "v_a");
        merge_state(v_a_view, object_view(s_a, "s_a"), object_view(v_b, "v_b"),
                    object_view(s_b, "s_b"), object_view(v_out, "v_out"),
                    object_view(s_out, "s_out"), torch_stream_for(v_a_view),
                    lse_base_of(lse_base2));
      },
      nb::arg("v_a"), nb::arg("s_a"), nb::arg("v_b"), nb::arg("s_b"), nb::arg("v_out"),
      nb::arg("s_out"), nb::arg("lse_base2"),
      "(v_out, s_out) <- (v_a, s_a) merged with (v_b, s_b).");
  m.def(
      "merge_state_in_place",
      [](nb::handle v, nb::handle s, nb::handle v_other, nb::handle s_other, nb::handle mask,
         bool lse_base2) {
        const TensorView v_view = object_view(v, "v");
        merge_state_in_place(v_view, object_view(s, "s"), object_view(v_other, "v_other"),
                             object_view(s_other, "s_other"), optional_object_view(mask, "mask"),
                             torch_stream_for(v_view), lse_base_of(lse_base2));
      },
      nb::arg("v"), nb::arg("s"), nb::arg("v_other"), nb::arg("s_other"), nb::arg("mask").none(),
      nb::arg("lse_base2"), "(v, s) <- (v, s) merged with (v_other, s_other) where mask is set.");
  m.def(
      "merge_states",
      [](nb::handle v, nb::handle s, nb::handle v_out, nb::handle s_out, bool lse_base2) {
        const TensorView v_view = object_view(v, "v");
        merge_states(v_view, object_view(s, "s"), object_view(v_out, "v_out"),
                     object_view(s_out, "s_out"), torch_stream_for(v_view), lse_base_of(lse_base2));
      },
      nb::arg("v"), nb::arg("s"), nb::arg("v_out"), nb::arg("s_out"), nb::arg("lse_base2"),
      "Merges the states of dimension 1 of v [seq, states, H, D], s [seq, states, H].");
  m.def(
      "merge_states_ragged",
      [](nb::handle v, nb::handle s, nb::handle indptr, nb::handle v_out, nb::handle s_out,
         bool lse_base2) {
        const TensorView v_view = object_view(v, "v");
        merge_states_ragged(v_view, object_view(s, "s"), object_view(indptr, "indptr"),
                            object_view(v_out, "v_out"), object_view(s_out, "s_out"),
                            torch_stream_for(v_view), lse_base_of(lse_base2));
      },
      nb::arg("v"), nb::arg("s"), nb::arg("indptr"), nb::arg("v_out"), nb::arg("s_out"),
      nb::arg("lse_base2"),
      "Row r of v_out, s_out merges the states indptr[r] .. indptr[r + 1] - 1 of v [total, H, D], "
      "s [total, H].");
}

}  // namespace flare::python
