"""Rotary position encoding of q and k outside attention, with FlashInfer's names and arguments
(flashinfer.rope): apply_rope, apply_rope_pos_ids, apply_llama31_rope, apply_llama31_rope_pos_ids
and their _inplace forms.

q [nnz, num_qo_heads, head_dim] and k [nnz, num_kv_heads, head_dim], float16 or bfloat16
(float32 too on the CPU), the last dimension contiguous. Positions: token t of request b
(indptr[b] <= t < indptr[b + 1]) sits at offsets[b] + t - indptr[b] (indptr int32 [batch + 1],
offsets int32 [batch]); the _pos_ids forms take every token's position (int32 or int64 [nnz]).
The first rotary_dim dims (default head_dim) rotate in pairs (i, i + rotary_dim / 2), or
(2 i, 2 i + 1) with interleave=True, pair i by position * rope_theta^(-2 i / rotary_dim) /
rope_scale radians (the llama31 forms: Llama 3.1's frequencies, rope_scale its factor); the rest
are copied. Rotations run in float32 on the GPU (float64 on the CPU) and are rounded once.

CPU tensors run flare's C++ reference (the index arrays checked entry by entry); CUDA tensors run
kernels/rope_apply.cuh on the caller's current stream, without synchronizing or allocating in
the _inplace forms (the first call per dtype and form compiles the kernel: make it before
capturing a CUDA graph). On the GPU the index arrays are read as given, not checked (a wrong
entry gives wrong positions, never an access outside the tensors), head_dim must be a multiple
of 8, rotary_dim of 16 (of 8 interleaved), rows and strides 16-byte aligned.
"""

from . import _flare
from ._tensors import device_guard, empty, tensor_dtype

__all__ = ["apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
           "apply_llama31_rope_pos_ids_inplace", "apply_rope", "apply_rope_inplace",
           "apply_rope_pos_ids", "apply_rope_pos_ids_inplace"]


def _rotary_dim(rotary_dim):
    return 0 if rotary_dim is None else int(rotary_dim)


def _apply(q, k, q_out, k_out, indptr, offsets, pos_ids, rotary_dim, interleave, rope_scale,
           rope_theta, llama31):
    with device_guard(q):
        _flare.apply_rope(q, k, q_out, k_out, indptr, offsets, pos_ids, _rotary_dim(rotary_dim),
                          bool(interleave), float(rope_theta), float(rope_scale), llama31)


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
