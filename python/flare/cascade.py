"""The merge operator on attention states (FlashInfer's merge_state, merge_state_in_place,
merge_states, and flashinfer.triton.cascade's variable_length_merge_states): (v_a, s_a) merged
with (v_b, s_b) gives s = log2(2^s_a + 2^s_b) and v = v_a 2^(s_a - s) + v_b 2^(s_b - s). s is
FlashInfer's base-2 LSE, what the attention wrappers return (lse_base="ln": natural-log LSEs, e
for 2); a state with s = -inf is the identity and two of them give v = 0, s = -inf.

CPU tensors run flare's C++ operator (reference/merge.h); CUDA tensors run flare's merge
kernels (kernels/merge_state.cuh) on the caller's current stream, without synchronizing (the
first call per dtype compiles the kernel: make it before capturing a CUDA graph).
"""

from . import _flare
from ._args import check_lse_base
from ._tensors import (arg, empty, host_index, index_on_device, is_cuda, is_torch, tensor_dtype,
                       torch_module)


def _check_float32(name, s):
    if str(s.dtype) not in ("float32", "torch.float32"):
        raise ValueError(f"{name} must be float32, got {s.dtype}")


def _check_v_dtype(name, v):
    """The outputs take v's dtype: one of those the merge supports."""
    if tensor_dtype(v) not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"{name} dtype must be float32, float16 or bfloat16, got {v.dtype}")


def _check_states(v, s, layout):
    """s float32, v 16-bit or float32, v of the rank `layout` names (e.g. "[seq, H, D]")."""
    _check_float32("s", s)
    _check_v_dtype("v", v)
    rank = layout.count(",") + 1
    if len(v.shape) != rank:
        raise ValueError(f"v must have rank {rank} {layout}, got shape {tuple(v.shape)}")


def _mask_for(mask, v):
    """mask as the extension takes it: bool/uint8 [seq] on v's device (a host mask for CUDA v
    is copied there)."""
    if mask is None or not is_cuda(v):
        return mask
    torch = torch_module()
    if not is_torch(mask):
        mask = torch.as_tensor(mask)
    if mask.dtype not in (torch.bool, torch.uint8):
        mask = mask != 0
    return mask.to(device=v.device, non_blocking=True)


def merge_state(v_a, s_a, v_b, s_b, *, lse_base="log2"):
    """v_a, v_b [seq, H, D]; s_a, s_b float32 [seq, H]. Returns the merged (v, s)."""
    base2 = check_lse_base(lse_base)
    _check_float32("s_a", s_a)
    _check_float32("s_b", s_b)
    _check_v_dtype("v_a", v_a)
    v_out = empty(tuple(v_a.shape), v_a.dtype, like=v_a)
    s_out = empty(tuple(s_a.shape), "float32", like=v_a)
    _flare.merge_state(v_a, s_a, v_b, s_b, v_out, s_out, base2)
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, lse_base="log2"):
    """(v, s) <- (v, s) merged with (v_other, s_other), for the rows where mask [seq] (bool)
    is set (all rows without a mask). One extension call reading the tensors in place (the
    cascade wrappers merge per level and run()); it checks shapes, dtypes and devices."""
    base2 = check_lse_base(lse_base)
    # The LSE dtype first (the extension's own check reads only dtypes it can view: a float64
    # array would be refused without its name).
    for name, lse in (("s", s), ("s_other", s_other)):
        if str(lse.dtype) not in ("float32", "torch.float32"):
            raise ValueError(f"{name} dtype must be float32, got {lse.dtype}")
    _flare.merge_state_in_place(v, s, v_other, s_other, arg(_mask_for(mask, v)), base2)


def merge_states(v, s, *, lse_base="log2"):
    """v [seq, num_states, H, D], s float32 [seq, num_states, H]. Returns (v [seq, H, D],
    s [seq, H]) merged over the states."""
    base2 = check_lse_base(lse_base)
    _check_states(v, s, "[seq, num_states, num_heads, head_dim]")
    seq, _, heads, dim = v.shape
    v_out = empty((seq, heads, dim), v.dtype, like=v)
    s_out = empty((seq, heads), "float32", like=v)
    _flare.merge_states(v, s, v_out, s_out, base2)
    return v_out, s_out


def variable_length_merge_states(v, s, indptr, *, lse_base="log2"):
    """v [total_states, H, D], s float32 [total_states, H], indptr int [seq + 1]: returns (v
    [seq, H, D], s [seq, H]), row r merging the states indptr[r] .. indptr[r + 1] - 1 in index
    order (an empty range gives v = 0, s = -inf). FlashInfer's flashinfer.triton.cascade name.
    A host indptr is checked (non-decreasing within [0, total_states]); for CUDA v a host
    indptr is copied to v's device, and a device indptr is read by the kernel unchecked, each
    range clamped inside the states (no synchronization; include/flare/api/merge_state.h)."""
    base2 = check_lse_base(lse_base)
    _check_states(v, s, "[total_states, num_heads, head_dim]")
    if len(indptr.shape) != 1 or indptr.shape[0] < 1:
        raise ValueError(f"indptr must have shape [seq + 1], got {tuple(indptr.shape)}")
    seq = indptr.shape[0] - 1
    _, heads, dim = v.shape
    indptr = index_on_device(indptr, v, "indptr") if is_cuda(v) else host_index(indptr, "indptr")
    v_out = empty((seq, heads, dim), v.dtype, like=v)
    s_out = empty((seq, heads), "float32", like=v)
    _flare.merge_states_ragged(v, s, indptr, v_out, s_out, base2)
    return v_out, s_out


# FlashInfer's cascade wrappers (flare/_cascade_wrappers.py), under flashinfer.cascade's names.
from ._cascade_wrappers import (  # noqa: E402,F401
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper, BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper)
