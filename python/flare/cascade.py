"""The merge operator on attention states (FlashInfer's merge_state, merge_state_in_place,
merge_states): (v_a, s_a) merged with (v_b, s_b) gives s = ln(e^s_a + e^s_b) and
v = v_a e^(s_a - s) + v_b e^(s_b - s). s is flare's natural-log LSE; a state with s = -inf is
the identity and two of them give v = 0, s = -inf.

CPU tensors run flare's C++ operator (reference/merge.h). CUDA tensors run the same formula as
torch operations in float32 on the caller's stream (flare has no merge kernel of its own yet).
"""

from . import _flare
from ._tensors import arg, empty, is_cuda, torch_module


def _check_float32(name, s):
    if str(s.dtype) not in ("float32", "torch.float32"):
        raise ValueError(f"{name} must be float32, got {s.dtype}")


def _merge_torch(v, s, dim):
    """Merges the states along `dim` of s (and dim of v) in float32."""
    torch = torch_module()
    s_max = s.amax(dim=dim, keepdim=True)
    # All -inf: shift by 0 so the weights are exp(-inf) = 0 rather than NaN.
    shift = torch.where(torch.isneginf(s_max), torch.zeros_like(s_max), s_max)
    weights = torch.exp(s - shift)
    total = weights.sum(dim=dim, keepdim=True)
    merged_s = torch.where(total > 0, shift + torch.log(total),
                           torch.full_like(total, float("-inf")))
    scale = torch.where(total > 0, weights / total, torch.zeros_like(weights))
    merged_v = (v.float() * scale.unsqueeze(-1)).sum(dim=dim)
    return merged_v, merged_s.squeeze(dim)


def merge_state(v_a, s_a, v_b, s_b):
    """v_a, v_b [seq, H, D]; s_a, s_b float32 [seq, H]. Returns the merged (v, s)."""
    _check_float32("s_a", s_a)
    _check_float32("s_b", s_b)
    if is_cuda(v_a):
        torch = torch_module()
        v, s = _merge_torch(torch.stack([v_a, v_b], dim=1), torch.stack([s_a, s_b], dim=1), 1)
        return v.to(v_a.dtype), s
    v_out = empty(tuple(v_a.shape), v_a.dtype, like=v_a)
    s_out = empty(tuple(s_a.shape), "float32", like=s_a)
    _flare.merge_state(arg(v_a), arg(s_a), arg(v_b), arg(s_b), arg(v_out), arg(s_out))
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """(v, s) <- (v, s) merged with (v_other, s_other), for the rows where mask [seq] (bool)
    is set (all rows without a mask)."""
    _check_float32("s", s)
    _check_float32("s_other", s_other)
    if is_cuda(v):
        torch = torch_module()
        merged_v, merged_s = _merge_torch(torch.stack([v, v_other], dim=1),
                                          torch.stack([s, s_other], dim=1), 1)
        merged_v = merged_v.to(v.dtype)
        if mask is not None:
            keep = mask.to(device=v.device, dtype=torch.bool)
            merged_v = torch.where(keep[:, None, None], merged_v, v)
            merged_s = torch.where(keep[:, None], merged_s, s)
        v.copy_(merged_v)
        s.copy_(merged_s)
        return
    _flare.merge_state_in_place(arg(v), arg(s), arg(v_other), arg(s_other), arg(mask))


def merge_states(v, s):
    """v [seq, num_states, H, D], s float32 [seq, num_states, H]. Returns (v [seq, H, D],
    s [seq, H]) merged over the states."""
    _check_float32("s", s)
    if is_cuda(v):
        merged_v, merged_s = _merge_torch(v, s, 1)
        return merged_v.to(v.dtype), merged_s
    seq, _, heads, dim = v.shape
    v_out = empty((seq, heads, dim), v.dtype, like=v)
    s_out = empty((seq, heads), "float32", like=s)
    _flare.merge_states(arg(v), arg(s), arg(v_out), arg(s_out))
    return v_out, s_out
