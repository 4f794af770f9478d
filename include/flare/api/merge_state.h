// The merge operator ⊕ on attention states for CPU and CUDA tensors: merge_state,
// merge_state_in_place and merge_states dispatched on the tensors' device.
#pragma once

#include <optional>
#include <vector>

#include "flare/api/run_options.h"
#include "flare/core/tensor.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"

namespace flare {

// The semantics are reference/merge.h's: s is the natural-log LSE, s = ln(e^{s_a} + e^{s_b}),
// v = v_a e^{s_a - s} + v_b e^{s_b - s} (with base = kBase2, every s is a log2 and the
// operator uses 2 for e: FlashInfer's convention); a state with s = -inf is the identity (its v is
// never read into the sum) and two of them give v = 0, s = -inf. Shapes and dtypes:
//   v tensors [seq, H, D] (merge_states' input [seq, num_states, H, D]) float32 | float16 |
//   bfloat16, any strides; s tensors float32 [seq, H] ([seq, num_states, H]), any strides;
//   mask uint8 [seq], any stride (nonzero: merge the row).
// These overloads take a stream and dispatch on the device of the first v tensor:
//  - CPU: the reference operator (reference/merge.h); the stream is ignored.
//  - CUDA: kernels/merge_state.cuh on `stream`, without synchronizing or allocating (CUDA-graph
//    safe). Every tensor must be on the same device and the v tensors of one dtype. Rows take
//    16-byte vectors when every v pointer, stride and row size allows it, single elements
//    otherwise (any D, any strides). On the GPU, merge_states folds all states with weights
//    relative to the largest LSE at once, where the CPU folds pairwise: results agree to
//    float32 rounding. A state whose weight e^{s_i - max s} underflows to 0 is skipped as well.
//    The first call for a dtype and vector width compiles (NVRTC, disk-cached) and loads its
//    kernel: make it before capturing a CUDA graph. No rows (seq or H of 0): nothing launched.
// Errors (kInvalidArgument, naming the argument, before anything is launched or written): rank,
// shape, dtype or device mismatches. Outputs must not overlap the inputs except in place.
// kUnsupported for 2^31 rows (seq * H) or more on the GPU; kNoCudaDevice, kCompileError,
// kCudaError from the GPU path.

// (v_out, s_out) <- (v_a, s_a) ⊕ (v_b, s_b).
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 cuda::Stream stream, LseBase base = LseBase::kNatural);

// (v, s) <- (v, s) ⊕ (v_other, s_other) for the rows whose mask is set (all rows without one);
// the other rows are not written.
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const std::optional<TensorView>& mask,
                          cuda::Stream stream, LseBase base = LseBase::kNatural);

// (v_out [seq, H, D], s_out [seq, H]) <- ⊕ over dimension 1 of v, s, in index order.
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, cuda::Stream stream, LseBase base = LseBase::kNatural);

// (v_out [seq, H, D], s_out [seq, H]) <- row r: ⊕ over the states indptr[r] .. indptr[r + 1] - 1
// of v [total_states, H, D], s [total_states, H], in index order (FlashInfer's
// variable_length_merge_states); an empty range gives v = 0, s = -inf. indptr int32 [seq + 1] on
// v's device. On the CPU indptr is checked (non-decreasing, within [0, total_states]; an error
// naming its first offending entry). On the GPU it is read by the kernel, not checked on the
// host (no synchronization): each range's ends are clamped into [0, total_states] and the end to
// at least the begin, so no state outside v and s is read whatever indptr holds.
// kUnsupported for 2^31 states or more on the GPU.
void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out, cuda::Stream stream,
                         LseBase base = LseBase::kNatural);

// The kernels the CUDA path launches for v's dtype (float32, float16, bfloat16) and a vector of
// 16 bytes or one element (entries flare_merge_state_pair and flare_merge_states): what CI
// compiles without a GPU to check for spills. Throws kInvalidArgument for other arguments.
jit::KernelSpec merge_state_kernel_spec(DType dtype, int vector_bytes);
// Every (dtype, vector width) the CUDA path can launch.
std::vector<jit::KernelSpec> shipped_merge_state_kernel_specs();

}  // namespace flare
