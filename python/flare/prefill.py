"""Prefill attention with FlashInfer's interface: BatchPrefillWithPagedKVCacheWrapper,
BatchPrefillWithRaggedKVCacheWrapper and single_prefill_with_kv_cache.

These run on flare's CPU backend (numpy arrays, CPU torch tensors). flare has no GPU prefill
kernel yet: CUDA tensors raise NotImplementedError naming it.
"""

import numpy as np

from . import _flare
from ._args import (check_backend, check_kv_layout, check_pos_encoding_mode, reject_unless_none,
                    unsupported)
from ._cpu import CpuBatch, check_cpu_tensor, host_indptr, paged_kv_lengths
from ._tensors import arg, dtype_name, host_int32, is_cuda, split_paged_kv_cache, tensor_dtype

_NO_GPU_PREFILL = ("flare has no GPU prefill kernel yet (batch prefill on CUDA tensors is a "
                   "later issue); use CPU tensors for the CPU backend, or "
                   "BatchDecodeWithPagedKVCacheWrapper for one query token per request")


def _reject_gpu(where, *tensors):
    if any(is_cuda(t) for t in tensors):
        raise NotImplementedError(f"{where}: GPU prefill is not implemented: {_NO_GPU_PREFILL}")


def _check_common_plan_args(where, pos_encoding_mode, use_fp16_qk_reduction):
    check_pos_encoding_mode(pos_encoding_mode)
    if use_fp16_qk_reduction:
        unsupported(where, "use_fp16_qk_reduction", True,
                    "flare accumulates q.k in float32")


class _PrefillWrapper:
    """What the paged and ragged prefill wrappers share: construction checks, the planned
    CpuBatch and the output handling of run()."""

    _name = ""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                 **fixed_buffers):
        check_backend(self._name, backend)
        self._kv_layout = check_kv_layout(kv_layout)
        self._workspace = float_workspace_buffer
        if use_cuda_graph:
            unsupported(self._name, "use_cuda_graph", True, _NO_GPU_PREFILL)
        reject_unless_none(self._name, **fixed_buffers)
        self._batch = None
        self._dtypes = None

    @property
    def is_cuda_graph_enabled(self):
        return False

    def _plan_dtypes(self, q_data_type, kv_data_type):
        q_dtype = dtype_name(q_data_type)
        self._dtypes = (q_dtype, dtype_name(kv_data_type) if kv_data_type is not None else q_dtype)

    def _check_run(self, q, k, extra):
        where = f"{self._name}.run"
        if self._batch is None:
            raise RuntimeError(f"{where}() needs a plan(): call plan() first")
        _reject_gpu(where, q, k, *extra)
        check_cpu_tensor(where, "q", q)
        if tensor_dtype(q) != self._dtypes[0]:
            raise ValueError(f"q has dtype {tensor_dtype(q)} but plan() was given "
                             f"q_data_type={self._dtypes[0]}")
        if tensor_dtype(k) != self._dtypes[1]:
            raise ValueError(f"the KV cache has dtype {tensor_dtype(k)} but plan() was given "
                             f"kv_data_type={self._dtypes[1]}")


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill (ragged queries, qo_indptr) against a paged KV cache, on the CPU backend."""

    _name = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto"):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                         qo_indptr_buf=qo_indptr_buf, paged_kv_indptr_buf=paged_kv_indptr_buf,
                         paged_kv_indices_buf=paged_kv_indices_buf,
                         paged_kv_last_page_len_buf=paged_kv_last_page_len_buf,
                         custom_mask_buf=custom_mask_buf, mask_indptr_buf=mask_indptr_buf)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             non_blocking=True, fixed_split_size=None, disable_split_kv=False):
        """Plans on host copies of the index arrays (CUDA tensors are refused: no GPU prefill)."""
        _reject_gpu(f"{self._name}.plan", self._workspace, qo_indptr, paged_kv_indptr,
                    paged_kv_indices)
        _check_common_plan_args(self._name, pos_encoding_mode, use_fp16_qk_reduction)
        self._plan_dtypes(q_data_type, kv_data_type)
        qo_host = host_indptr(qo_indptr, "qo_indptr")
        kv_indptr = host_indptr(paged_kv_indptr, "paged_kv_indptr")
        last = host_int32(paged_kv_last_page_len, "paged_kv_last_page_len")
        if kv_indptr.shape[0] != qo_host.shape[0]:
            raise ValueError(f"paged_kv_indptr must have {qo_host.shape[0]} entries (batch + 1 "
                             f"of qo_indptr), got {kv_indptr.shape[0]}")
        kv_len = paged_kv_lengths(kv_indptr, last, int(page_size))
        self._tables = (kv_indptr, host_int32(paged_kv_indices, "paged_kv_indices"), last)
        self._batch = CpuBatch(
            qo_indptr=qo_host, kv_len=kv_len, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_qk if head_dim_vo is None else head_dim_vo, page_size=page_size,
            params_kwargs=dict(sm_scale=sm_scale, causal=causal, window_left=window_left,
                               logits_soft_cap=logits_soft_cap,
                               pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale,
                               rope_theta=rope_theta),
            custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False):
        """o [total_q, H_qo, D_vo] (and lse [total_q, H_qo] float32 with return_lse)."""
        k_cache, v_cache = split_paged_kv_cache(paged_kv_cache)
        self._check_run(q, k_cache, (v_cache, out, lse))
        batch = self._batch
        out, lse = batch.outputs(q, out, lse, return_lse)
        indptr, indices, last = self._tables
        _flare.run_cpu_paged(batch.plan, arg(q), arg(batch.qo_indptr), arg(k_cache),
                             arg(v_cache), self._kv_layout, arg(indptr), arg(indices), arg(last),
                             batch.make_params(k_scale=k_scale, v_scale=v_scale), arg(out),
                             arg(lse))
        return (out, lse) if return_lse else out

    forward = run


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill with ragged queries and ragged K/V (kv_indptr), on the CPU backend."""

    _name = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto"):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend,
                         qo_indptr_buf=qo_indptr_buf, kv_indptr_buf=kv_indptr_buf,
                         custom_mask_buf=custom_mask_buf, mask_indptr_buf=mask_indptr_buf)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, non_blocking=True,
             fixed_split_size=None, disable_split_kv=False):
        """Plans on host copies of qo_indptr and kv_indptr."""
        _reject_gpu(f"{self._name}.plan", self._workspace, qo_indptr, kv_indptr)
        _check_common_plan_args(self._name, pos_encoding_mode, use_fp16_qk_reduction)
        self._plan_dtypes(q_data_type, kv_data_type)
        qo_host = host_indptr(qo_indptr, "qo_indptr")
        kv_host = host_indptr(kv_indptr, "kv_indptr")
        if kv_host.shape[0] != qo_host.shape[0]:
            raise ValueError(f"kv_indptr must have {qo_host.shape[0]} entries (batch + 1 of "
                             f"qo_indptr), got {kv_host.shape[0]}")
        self._kv_indptr = kv_host
        self._batch = CpuBatch(
            qo_indptr=qo_host, kv_len=np.ascontiguousarray(np.diff(kv_host), dtype=np.int32),
            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_qk if head_dim_vo is None else head_dim_vo, page_size=1,
            params_kwargs=dict(sm_scale=sm_scale, causal=causal, window_left=window_left,
                               logits_soft_cap=logits_soft_cap,
                               pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale,
                               rope_theta=rope_theta),
            custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)

    begin_forward = plan

    def run(self, q, k, v, *, out=None, lse=None, return_lse=False):
        """k, v: [kv_indptr[-1], H_kv, D] (NHD) or [H_kv, kv_indptr[-1], D] (HND).
        Returns o [total_q, H_qo, D_vo] (and lse [total_q, H_qo] float32 with return_lse)."""
        self._check_run(q, k, (v, out, lse))
        if self._kv_layout == "HND":  # [H_kv, tokens, D] viewed as [tokens, H_kv, D]
            k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
        batch = self._batch
        out, lse = batch.outputs(q, out, lse, return_lse)
        _flare.run_cpu_ragged(batch.plan, arg(q), arg(batch.qo_indptr), arg(k), arg(v),
                              arg(self._kv_indptr), batch.params, arg(out), arg(lse))
        return (out, lse) if return_lse else out

    forward = run


def _single_cpu(where, q, k, v, kv_layout, params_kwargs, scales, custom_mask=None,
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


def single_prefill_with_kv_cache(q, k, v, custom_mask=None, packed_custom_mask=None,
                                 causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                 return_lse=False):
    """Prefill attention of one request on the CPU backend: q [qo_len, H_qo, D], k/v
    [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D] (HND). Returns o [qo_len, H_qo, D_vo] (and
    lse [qo_len, H_qo] with return_lse)."""
    where = "single_prefill_with_kv_cache"
    _reject_gpu(where, q, k, v)
    check_kv_layout(kv_layout)
    _check_common_plan_args(where, pos_encoding_mode, use_fp16_qk_reduction)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{where}: q, k, v must be 3-D, got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    params_kwargs = dict(sm_scale=sm_scale, causal=causal, window_left=window_left,
                         logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                         rope_scale=rope_scale, rope_theta=rope_theta)
    out, lse = _single_cpu(where, q, k, v, kv_layout, params_kwargs, {}, custom_mask,
                           packed_custom_mask)
    return (out, lse) if return_lse else out
