// Rotary position encoding applied to q and k outside attention (FlashInfer's apply_rope family):
// for CPU and CUDA tensors, dispatched on the device of q.
#pragma once

#include <optional>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/variant/attention_params.h"

namespace flare {

// How the dims of a head turn. The first rotary_dim dims rotate in pairs: (i, i + rotary_dim / 2)
// (interleave false: Llama, GPT-NeoX) or (2 i, 2 i + 1) (interleave true: GPT-J), pair i by
// pos * rope_frequency(i) radians (flare/variant/attention_params.h with rotary_dim as the head
// dim: theta^(-2 i / rotary_dim) / rope_scale, or Llama 3.1's rule with llama31):
//   x_a' = x_a cos - x_b sin,   x_b' = x_b cos + x_a sin.
// Dims [rotary_dim, head_dim) are copied unchanged.
// With cos_sin_cache (vLLM's and FlashInfer's apply_rope_with_cos_sin_cache) the angles are not
// computed: row pos of the float32 [max_position, rotary_dim] table holds cos of pair i at column
// i and its sin at column rotary_dim / 2 + i; rotary_dim is the table's width (options.rotary_dim
// 0 or equal), theta, scale and llama31 are unused, positions come as pos_ids. A position outside
// [0, max_position) is an error on the CPU and reads the nearest row on the GPU (never outside
// the table).
struct RopeOptions {
  int rotary_dim = 0;  // 0: the head dim; else even, <= head_dim (the GPU: see apply_rope)
  bool interleave = false;
  float rope_theta = 1e4f;
  float rope_scale = 1.0f;  // with llama31: its `factor`
  std::optional<AttentionParams::Llama31Scaling> llama31;
  std::optional<TensorView> cos_sin_cache;  // float32 [max_position, rotary_dim], on q's device
};

// Where each token sits: token t of request b (indptr[b] <= t < indptr[b + 1]) at position
// offsets[b] + t - indptr[b] (indptr int32 [batch + 1], offsets int32 [batch]); or pos_ids
// (int32 or int64 [nnz]) holding every token's position. Exactly one of the two forms.
struct RopePositions {
  std::optional<TensorView> indptr;
  std::optional<TensorView> offsets;
  std::optional<TensorView> pos_ids;
};

// q_out <- q rotated, k_out <- k rotated, token by token at its position (RopePositions).
// q, q_out [nnz, H_qo, head_dim], k, k_out [nnz, H_kv, head_dim], float16 or bfloat16 (float32
// on the CPU too), one dtype, the last dimension contiguous, other strides free. In place when
// q_out is q and k_out is k (the same views); other overlaps are refused only where detected
// (identical pointers with different strides). Rotated values are computed in float32 (float64
// on the CPU) and rounded once to the dtype.
//  - CPU tensors: the reference (positions checked: indptr non-decreasing within [0, nnz],
//    offsets and positions >= 0; an error naming the entry); the stream is ignored.
//  - CUDA tensors: kernels/rope_apply.cuh on `stream`, no synchronization, no allocation
//    (CUDA-graph safe once its kernel is loaded: the first call for a dtype and form compiles
//    with NVRTC, disk-cached). indptr, offsets and pos_ids are read by the kernel, not checked
//    on the host: a token's request is found by binary search over indptr (clamped into the
//    batch), and every position is taken as given. Needs head_dim and rotary_dim multiples of 8
//    (16 for the non-interleaved pairs: whole 16-byte pieces of both halves), 16-byte aligned
//    rows and strides, rotary_dim / 2 pairs of at most kRopeMaxPairs, and fewer than 2^31 tokens
//    times heads.
// Errors (before anything is launched or written): kInvalidArgument naming the argument for
// ranks, shapes, dtypes, devices, strides, positions of the wrong form, options out of range
// (check_rope_params' rules for theta, scale and llama31); kUnsupported for the GPU limits
// above; kNoCudaDevice, kCompileError, kCudaError from the GPU path.
void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                const TensorView& k_out, const RopePositions& positions, const RopeOptions& options,
                cuda::Stream stream);

// The most pairs a head rotates on the GPU (rotary_dim / 2): the turns table travels with the
// launch parameters.
constexpr int kRopeMaxPairs = 256;

// The kernel of the CUDA path for a dtype, pair layout, position form (`positions`: 0 for
// indptr and offsets, 32 or 64 for pos_ids of that width) and angle source (cos_sin_cache, with
// pos_ids only): what CI compiles without a GPU; and every one of them.
jit::KernelSpec rope_kernel_spec(DType dtype, bool interleave, int positions,
                                 bool cos_sin_cache = false);
std::vector<jit::KernelSpec> shipped_rope_kernel_specs();

}  // namespace flare
