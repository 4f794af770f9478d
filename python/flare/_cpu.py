"""The CPU backend of the wrappers: host index arrays, flare's plan() and execute_plan_cpu.

Used for numpy arrays and CPU torch tensors (the workspace buffer decides the device).
"""

import numpy as np

from . import _flare
from ._args import make_params
from ._tensors import arg, empty, host_int32, is_torch


def paged_kv_lengths(kv_indptr, kv_last_page_len, page_size):
    """Tokens per request of a page table (0 for requests without pages)."""
    pages = np.diff(kv_indptr)
    if kv_last_page_len.shape[0] != pages.shape[0]:
        raise ValueError(
            f"kv_last_page_len must have {pages.shape[0]} entries (batch), got "
            f"{kv_last_page_len.shape[0]}")
    lengths = np.where(pages > 0, (pages - 1) * page_size + kv_last_page_len, 0)
    return np.ascontiguousarray(lengths, dtype=np.int32)


def _numpy(x):
    if is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def pack_custom_mask(custom_mask, packed_custom_mask, qo_len, kv_len):
    """(packed bits uint8, mask_indptr int32) in flare's layout (FlashInfer's segment_packbits):
    request i's qo_len x kv_len row-major bits, little bit order, padded to whole bytes."""
    sizes = qo_len.astype(np.int64) * kv_len.astype(np.int64)
    byte_sizes = (sizes + 7) // 8
    mask_indptr = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(byte_sizes, out=mask_indptr[1:])
    if mask_indptr[-1] > np.iinfo(np.int32).max:
        raise ValueError("the packed custom mask exceeds 2^31 bytes")
    if packed_custom_mask is not None:
        packed = np.ascontiguousarray(_numpy(packed_custom_mask), dtype=np.uint8).reshape(-1)
        if packed.shape[0] < mask_indptr[-1]:
            raise ValueError(
                f"packed_custom_mask must have at least {mask_indptr[-1]} bytes (the requests' "
                f"qo_len x kv_len bits, padded per request), got {packed.shape[0]}")
        return packed, mask_indptr.astype(np.int32)
    bits = _numpy(custom_mask).astype(bool).reshape(-1)
    if bits.shape[0] != sizes.sum():
        raise ValueError(
            f"custom_mask must have {int(sizes.sum())} entries (sum of qo_len x kv_len), got "
            f"{bits.shape[0]}")
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    segments = [np.packbits(bits[offsets[i]:offsets[i + 1]], bitorder="little")
                for i in range(len(sizes))]
    packed = np.concatenate(segments) if segments else np.zeros(0, dtype=np.uint8)
    return np.ascontiguousarray(packed, dtype=np.uint8), mask_indptr.astype(np.int32)


class CpuBatch:
    """One planned batch: the host index arrays the run needs and flare's plan."""

    def __init__(self, *, qo_indptr, kv_len, num_qo_heads, num_kv_heads, head_dim_qk,
                 head_dim_vo, page_size, params_kwargs, custom_mask=None,
                 packed_custom_mask=None, fixed_split_size=None, disable_split_kv=False):
        self.qo_indptr = qo_indptr
        self.num_qo_heads = int(num_qo_heads)
        self.head_dim_vo = int(head_dim_vo)
        qo_len = np.ascontiguousarray(np.diff(qo_indptr), dtype=np.int32)
        self._mask = None
        if custom_mask is not None or packed_custom_mask is not None:
            self._mask = pack_custom_mask(custom_mask, packed_custom_mask, qo_len, kv_len)
        self._params_kwargs = dict(params_kwargs)
        self.params = self.make_params()
        self.plan = _flare.plan_cpu(
            arg(qo_len), arg(kv_len), int(num_qo_heads), int(num_kv_heads), int(head_dim_qk),
            int(head_dim_vo), int(page_size), bool(params_kwargs.get("causal", False)),
            int(params_kwargs.get("window_left", -1)),
            0 if fixed_split_size is None else int(fixed_split_size), bool(disable_split_kv))

    def make_params(self, **overrides):
        kwargs = dict(self._params_kwargs, **overrides)
        if self._mask is not None:
            kwargs.update(custom_mask=arg(self._mask[0]), mask_indptr=arg(self._mask[1]))
        return make_params(**kwargs)

    def outputs(self, q, out, lse, return_lse):
        total_q = int(self.qo_indptr[-1])
        if out is None:
            out = empty((total_q, self.num_qo_heads, self.head_dim_vo), q.dtype, like=q)
        if lse is None and return_lse:
            lse = empty((total_q, self.num_qo_heads), "float32", like=q)
        return out, lse


def check_tensor(where, name, x):
    """TypeError naming x unless it is an array: a list reaching the extension would fail far
    from the caller's mistake."""
    if not hasattr(x, "dtype"):
        raise TypeError(f"{where}: {name} must be a numpy array or a torch tensor, got "
                        f"{type(x).__name__}")


def check_cpu_tensor(where, name, x):
    if is_torch(x) and x.is_cuda:
        raise ValueError(
            f"{where}: {name} is on {x.device} but the wrapper was created with a CPU workspace "
            "buffer (the CPU backend)")


def host_indptr(x, name):
    """An indptr argument on the host, checked: starts at 0, never decreases (named in the
    error as the caller passed it)."""
    indptr = host_int32(x, name)
    if indptr.shape[0] < 1:
        raise ValueError(f"{name} must have batch + 1 >= 1 entries, got 0")
    if indptr[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {indptr[0]}")
    decreasing = indptr[1:] < indptr[:-1]
    if decreasing.any():
        i = int(np.argmax(decreasing))
        raise ValueError(f"{name} must be non-decreasing: {name}[{i + 1}]={indptr[i + 1]} < "
                         f"{name}[{i}]={indptr[i]}")
    return indptr


_LOG2E = 1.4426950408889634


def to_lse_base(lse, base2):
    """Converts the CPU backend's natural-log lse in place to base 2 when asked (FlashInfer's
    convention); -inf stays -inf."""
    if lse is not None and base2:
        lse *= _LOG2E


def single_cpu(where, q, k, v, kv_layout, params_kwargs, scales, custom_mask=None,
                packed_custom_mask=None):
    """One request on the CPU backend: q [qo_len, H_qo, D]; k, v NHD [kv_len, H_kv, D] or HND
    [H_kv, kv_len, D] (viewed as NHD, no copy). Returns (o, lse)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_cpu_tensor(where, name, x)
    if kv_layout == "HND":
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    qo_indptr = np.array([0, q.shape[0]], dtype=np.int32)
    kv_indptr = np.array([0, k.shape[0]], dtype=np.int32)
    batch = CpuBatch(
        qo_indptr=qo_indptr, kv_len=np.array([k.shape[0]], dtype=np.int32),
        num_qo_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim_qk=q.shape[2],
        head_dim_vo=v.shape[2], page_size=1, params_kwargs=params_kwargs,
        custom_mask=custom_mask, packed_custom_mask=packed_custom_mask)
    out, lse = batch.outputs(q, None, None, True)
    _flare.run_cpu_ragged(batch.plan, arg(q), arg(qo_indptr), arg(k), arg(v), arg(kv_indptr),
                          batch.make_params(**scales), arg(out), arg(lse))
    return out, lse


def refuse_cpu_nvfp4(where, dtypes, kv_cache_sf):
    """NotImplementedError for NVFP4 KV on the CPU backend (the GPU stages it to 16 bits)."""
    if kv_cache_sf is not None or (dtypes is not None and dtypes[1] == "uint8"):
        raise NotImplementedError(f"{where}: NVFP4 KV (kv_data_type uint8, kv_cache_sf) runs on "
                                  "CUDA devices only")
