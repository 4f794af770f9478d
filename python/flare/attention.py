"""Attention sinks (FlashInfer's flashinfer.attention.BatchAttentionWithAttentionSinkWrapper, as
in gpt-oss): each query head has a sink logit that takes part in the softmax's denominator and
contributes no value: o scaled by 1 / (1 + exp(sink - lse)) and lse = log(exp(lse) + exp(sink)),
the merge of the row's attention state with the sink's (v = 0, lse = sink[h]). On CUDA the
kernels apply it where each row's output becomes final (the prefill epilogue, or the merge of a
split row's pieces: RunOptions::sink), so run() is the paged prefill's one extension call (it was
a merge launch after the kernel, and before that ~12 torch operations, 237 us of host time a
run(): docs/perf.md forty-seventh and forty-eighth sessions). The CPU backend merges after.
"""

import math

import numpy as np

from ._tensors import is_torch, torch_module
from .prefill import BatchPrefillWithPagedKVCacheWrapper

_NAME = "BatchAttentionWithAttentionSinkWrapper"
_LOG2E = 1.0 / math.log(2.0)


def merge_sink(out, lse, sink):
    """In place: (out [tokens, H, D], lse [tokens, H] base 2) merged with the sink state of each
    head (sink [H], natural-log logits). Returns (out, lse)."""
    if is_torch(out):
        torch = torch_module()
        sink2 = sink.to(device=out.device, dtype=torch.float32) * _LOG2E
        # 1 / (1 + 2^(sink - lse)); a row that saw nothing (lse -inf) gets weight 0.
        weight = torch.sigmoid((lse - sink2) / _LOG2E)
        out.copy_((out.float() * weight[..., None]).to(out.dtype))
        lse.copy_(torch.logaddexp2(lse, sink2.expand_as(lse)))
        return out, lse
    sink2 = np.asarray(sink, dtype=np.float64) * _LOG2E
    with np.errstate(over="ignore"):
        weight = 1.0 / (1.0 + np.exp2(sink2[None, :] - lse.astype(np.float64)))
    out[...] = (out.astype(np.float64) * weight[..., None]).astype(out.dtype)
    lse[...] = np.logaddexp2(lse.astype(np.float64), sink2[None, :]).astype(lse.dtype)
    return out, lse


class BatchAttentionWithAttentionSinkWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """The paged prefill / decode wrapper with a sink logit per query head: plan() as
    BatchPrefillWithPagedKVCacheWrapper's (window_left and the dtypes default to the
    constructor's, as in FlashInfer), run(q, paged_kv_cache, sink [H_qo] float32, sm_scale)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                 q_data_type="bfloat16", kv_data_type="bfloat16", head_dim_qk=128,
                 head_dim_vo=128, window_left=-1):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf,
                         paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf,
                         custom_mask_buf, mask_indptr_buf, backend=backend)
        self._sink_defaults = dict(pos_encoding_mode=pos_encoding_mode,
                                   use_fp16_qk_reduction=use_fp16_qk_reduction,
                                   q_data_type=q_data_type, kv_data_type=kv_data_type,
                                   window_left=window_left)
        self._sm_scale = None

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, **kwargs):
        """As the paged prefill wrapper's plan(); unspecified window_left, pos_encoding_mode,
        use_fp16_qk_reduction and dtypes come from the constructor."""
        for key, value in self._sink_defaults.items():
            kwargs.setdefault(key, value)
        scale = kwargs.get("sm_scale")  # None: 1 / sqrt(head_dim_qk), as the kernels resolve it
        self._sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim_qk)
        super().plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                     num_qo_heads, num_kv_heads, head_dim_qk, page_size, **kwargs)

    begin_forward = plan

    def run(self, q, paged_kv_cache, sink, sm_scale=None, out=None, lse=None, return_lse=False,
            enable_pdl=None, lse_base="log2", q_scale=None, k_scale=None, v_scale=None,
            kv_cache_sf=None, **variant_kwargs):
        """o [tokens, H_qo, D_vo] (and lse [tokens, H_qo] with return_lse) with each head's sink
        in the denominator. sink: [H_qo] natural-log logits, compared with q.k * sm_scale (and
        q_scale * k_scale where given); float32 on q's device, else converted (outside a CUDA
        graph capture: a capture keeps the converted copy's address). sm_scale, when given,
        must be the plan's (the kernels were planned with it). The other keywords as the paged
        prefill wrapper's run()."""
        if self._sm_scale is None:
            raise RuntimeError(f"{_NAME}.run() needs a plan(): call plan() first")
        if sm_scale is not None and not math.isclose(float(sm_scale), self._sm_scale,
                                                     rel_tol=1e-6):
            raise ValueError(f"{_NAME}.run: sm_scale={float(sm_scale)} differs from the plan's "
                             f"{self._sm_scale}: pass sm_scale to plan()")
        gpu = self._gpu
        if gpu is not None:  # the engine checks the sink's shape and device, naming it
            torch = torch_module()
            if sink.dtype is not torch.float32 or not sink.is_cuda:
                sink = sink.to(device=q.device, dtype=torch.float32)
            return gpu.run(q, paged_kv_cache, q_scale, k_scale, v_scale, out, lse, return_lse,
                           lse_base, enable_pdl, variant_kwargs, kv_cache_sf, sink)
        if lse_base not in ("log2", "ln"):
            raise ValueError(f"{_NAME}.run: lse_base must be 'log2' or 'ln', got {lse_base!r}")
        if len(sink.shape) != 1 or sink.shape[0] != q.shape[1]:
            raise ValueError(f"{_NAME}.run: sink must be [num_qo_heads={q.shape[1]}], got "
                             f"{list(sink.shape)}")
        o, s = super().run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale,
                           v_scale=v_scale, out=out, lse=lse, return_lse=True,
                           enable_pdl=enable_pdl, kv_cache_sf=kv_cache_sf, **variant_kwargs)
        merge_sink(o, s, sink)
        if lse_base == "ln":
            s *= math.log(2.0)
        return (o, s) if return_lse else o

    forward = run
