// The merge operator on attention states (api/merge_state.h): the reference operator for CPU
// tensors, kernels/merge_state.cuh on the caller's stream for CUDA tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>

#include "bindings.h"
#include "flare/api/merge_state.h"
#include "flare/core/error.h"
#include "object_view.h"
#include "tensor_arg.h"

namespace flare::python {

void bind_merge(nb::module_& m) {
  m.def(
      "merge_state",
      [](const TensorArg& v_a, const TensorArg& s_a, const TensorArg& v_b, const TensorArg& s_b,
         const TensorArg& v_out, const TensorArg& s_out, uintptr_t stream, bool lse_base2) {
        merge_state(v_a.view(), s_a.view(), v_b.view(), s_b.view(), v_out.view(), s_out.view(),
                    reinterpret_cast<cuda::Stream>(stream), lse_base_of(lse_base2));
      },
      nb::arg("v_a"), nb::arg("s_a"), nb::arg("v_b"), nb::arg("s_b"), nb::arg("v_out"),
      nb::arg("s_out"), nb::arg("stream"), nb::arg("lse_base2"),
      "(v_out, s_out) <- (v_a, s_a) merged with (v_b, s_b).");
  // Reads the caller's objects in place (object_view: a torch tensor's attributes, no DLPack
  // capsule, which cost ~25 us of host time a call on an H200; numpy and flare.Tensor through
  // TensorArg), on torch's current stream of v's device for CUDA tensors: the cascade wrappers
  // merge once per level and run().
  m.def(
      "merge_state_in_place",
      [](nb::handle v, nb::handle s, nb::handle v_other, nb::handle s_other, nb::handle mask,
         bool lse_base2) {
        const TensorView v_view = object_view(v, "v");
        const cuda::Stream stream =
            v_view.device.is_cuda()
                ? reinterpret_cast<cuda::Stream>(torch_current_stream(v_view.device.index))
                : nullptr;
        merge_state_in_place(v_view, object_view(s, "s"), object_view(v_other, "v_other"),
                             object_view(s_other, "s_other"), optional_object_view(mask, "mask"),
                             stream, lse_base_of(lse_base2));
      },
      nb::arg("v"), nb::arg("s"), nb::arg("v_other"), nb::arg("s_other"), nb::arg("mask").none(),
      nb::arg("lse_base2"), "(v, s) <- (v, s) merged with (v_other, s_other) where mask is set.");
  m.def(
      "merge_states",
      [](const TensorArg& v, const TensorArg& s, const TensorArg& v_out, const TensorArg& s_out,
         uintptr_t stream, bool lse_base2) {
        merge_states(v.view(), s.view(), v_out.view(), s_out.view(),
                     reinterpret_cast<cuda::Stream>(stream), lse_base_of(lse_base2));
      },
      nb::arg("v"), nb::arg("s"), nb::arg("v_out"), nb::arg("s_out"), nb::arg("stream"),
      nb::arg("lse_base2"),
      "Merges the states of dimension 1 of v [seq, states, H, D], s [seq, states, H].");
  m.def(
      "merge_states_ragged",
      [](const TensorArg& v, const TensorArg& s, const TensorArg& indptr, const TensorArg& v_out,
         const TensorArg& s_out, uintptr_t stream, bool lse_base2) {
        merge_states_ragged(v.view(), s.view(), indptr.view(), v_out.view(), s_out.view(),
                            reinterpret_cast<cuda::Stream>(stream), lse_base_of(lse_base2));
      },
      nb::arg("v"), nb::arg("s"), nb::arg("indptr"), nb::arg("v_out"), nb::arg("s_out"),
      nb::arg("stream"), nb::arg("lse_base2"),
      "Row r of v_out, s_out merges the states indptr[r] .. indptr[r + 1] - 1 of v [total, H, D], "
      "s [total, H].");
}

}  // namespace flare::python
