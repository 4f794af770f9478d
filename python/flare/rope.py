"""Rotary position encoding of q and k outside attention, with FlashInfer's names and arguments
(flashinfer.rope): apply_rope, apply_rope_pos_ids, apply_llama31_rope, apply_llama31_rope_pos_ids,
apply_rope_with_cos_sin_cache (vLLM's form: the angles from a table) and their _inplace forms.

q [nnz, num_qo_heads, head_dim] and k [nnz, num_kv_heads, head_dim], float16 or bfloat16
(float32 too on the CPU), the last dimension contiguous. Positions: token t of request b
(indptr[b] <= t < indptr[b + 1]) sits at offsets[b] + t - indptr[b] (indptr int32 [batch + 1],
offsets int32 [batch]); the _pos_ids forms take every token's position (int32 or int64 [nnz]).
The first rotary_dim dims (default head_dim) rotate in pairs (i, i + rotary_dim / 2), or
(2 i, 2 i + 1) with interleave=True, pair i by position * rope_theta^(-2 i / rotary_dim) /
rope_scale radians (the llama31 forms: Llama 3.1's frequencies, rope_scale its factor); the rest
are copied. Rotations run in float32 on the GPU (float64 on the CPU) and are rounded once.
apply_rope_with_cos_sin_cache takes query [nnz, num_qo_heads * head_size] and key
[nnz, num_kv_heads * head_size], positions (int32 or int64 [nnz]) and a float32
[max_position, rotary_dim] table holding cos of pair i at column i and its sin at
rotary_dim / 2 + i; is_neox=True pairs halves, False interleaves. A position outside the table
raises on the CPU and reads its nearest row on the GPU.

CPU tensors run flare's C++ reference (the index arrays checked entry by entry); CUDA tensors run
kernels/rope_apply.cuh on the caller's current stream, without synchronizing or allocating in
the _inplace forms (the first call per dtype and form compiles the kernel: make it before
capturing a CUDA graph). On the GPU the index arrays are read as given, not checked (a wrong
entry gives wrong positions, never an access outside the tensors), head_dim must be a multiple
of 8, rotary_dim of 16 (of 8 interleaved), rows and strides 16-byte aligned.
"""

import numpy as np

from . import _flare
from ._tensors import empty, is_torch, tensor_dtype

__all__ = ["apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
           "apply_llama31_rope_pos_ids_inplace", "apply_rope", "apply_rope_inplace",
           "apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
           "apply_rope_with_cos_sin_cache_inplace"]


def _rotary_dim(rotary_dim):
    return 0 if rotary_dim is None else int(rotary_dim)


def _apply(q, k, q_out, k_out, indptr, offsets, pos_ids, rotary_dim, interleave, rope_scale,
           rope_theta, llama31, cos_sin_cache=None):
    # The extension makes q's device current for the launch (torch's stays as it was).
    _flare.apply_rope(q, k, q_out, k_out, indptr, offsets, pos_ids, _rotary_dim(rotary_dim),
                      bool(interleave), float(rope_theta), float(rope_scale), llama31,
                      cos_sin_cache)


def _outputs(q, k):
    for name, x in (("q", q), ("k", k)):
        if tensor_dtype(x) not in ("float16", "bfloat16", "float32"):
            raise ValueError(f"{name} dtype must be float16 or bfloat16 (float32 on the CPU), "
                             f"got {x.dtype}")
    return empty(tuple(q.shape), tensor_dtype(q), like=q), empty(tuple(k.shape),
                                                                  tensor_dtype(k), like=k)


def _llama31(low_freq_factor, high_freq_factor, old_context_len):
    return (float(low_freq_factor), float(high_freq_factor), float(old_context_len))


def apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
               rope_theta=1e4):
    """Returns (q_rope, k_rope): q and k rotated at offsets[b] + t - indptr[b]."""
    q_out, k_out = _outputs(q, k)
    _apply(q, k, q_out, k_out, indptr, offsets, None, rotary_dim, interleave, rope_scale,
           rope_theta, None)
    return q_out, k_out


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
                       rope_theta=1e4):
    """apply_rope into q and k."""
    _apply(q, k, q, k, indptr, offsets, None, rotary_dim, interleave, rope_scale, rope_theta,
           None)


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
                       rope_theta=1e4):
    """Returns (q_rope, k_rope): q and k rotated at pos_ids."""
    q_out, k_out = _outputs(q, k)
    _apply(q, k, q_out, k_out, None, None, pos_ids, rotary_dim, interleave, rope_scale,
           rope_theta, None)
    return q_out, k_out


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
                               rope_theta=1e4):
    """apply_rope_pos_ids into q and k."""
    _apply(q, k, q, k, None, None, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, None)


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8,
                       rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
                       old_context_len=8192):
    """apply_rope with Llama 3.1's frequencies (rope_scale: its factor)."""
    q_out, k_out = _outputs(q, k)
    _apply(q, k, q_out, k_out, indptr, offsets, None, rotary_dim, interleave, rope_scale,
           rope_theta, _llama31(low_freq_factor, high_freq_factor, old_context_len))
    return q_out, k_out


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False,
                               rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                               high_freq_factor=4, old_context_len=8192):
    """apply_llama31_rope into q and k."""
    _apply(q, k, q, k, indptr, offsets, None, rotary_dim, interleave, rope_scale, rope_theta,
           _llama31(low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8,
                               rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
                               old_context_len=8192):
    """apply_rope_pos_ids with Llama 3.1's frequencies (rope_scale: its factor)."""
    q_out, k_out = _outputs(q, k)
    _apply(q, k, q_out, k_out, None, None, pos_ids, rotary_dim, interleave, rope_scale,
           rope_theta, _llama31(low_freq_factor, high_freq_factor, old_context_len))
    return q_out, k_out


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False,
                                       rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                                       high_freq_factor=4, old_context_len=8192):
    """apply_llama31_rope_pos_ids into q and k."""
    _apply(q, k, q, k, None, None, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
           _llama31(low_freq_factor, high_freq_factor, old_context_len))


def _heads(x, head_size, name):
    """x [nnz, heads * head_size] as a view [nnz, heads, head_size] (no copy)."""
    if x.ndim != 2 or head_size <= 0 or x.shape[1] % head_size != 0:
        raise ValueError(f"{name} must be [nnz, num_heads * head_size] with head_size "
                         f"{head_size}, got shape {tuple(x.shape)}")
    shape = (x.shape[0], x.shape[1] // head_size, head_size)
    if is_torch(x):
        return x.view(shape)  # raises where no view exists
    view = x.reshape(shape)
    if view.size and not np.shares_memory(view, x):
        raise ValueError(f"{name} cannot be viewed as {shape} without a copy")
    return view


def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache,
                                  is_neox=True):
    """Returns (query_out, key_out), of query's and key's shapes: rotated at positions by the
    table's (cos, sin) rows."""
    q, k = _heads(query, head_size, "query"), _heads(key, head_size, "key")
    q_out, k_out = _outputs(q, k)
    _apply(q, k, q_out, k_out, None, None, positions, None, not is_neox, 1, 1e4, None,
           cos_sin_cache)
    return q_out.reshape(tuple(query.shape)), k_out.reshape(tuple(key.shape))


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                          is_neox=True):
    """apply_rope_with_cos_sin_cache into query and key."""
    q, k = _heads(query, head_size, "query"), _heads(key, head_size, "key")
    _apply(q, k, q, k, None, None, positions, None, not is_neox, 1, 1e4, None, cos_sin_cache)
