"""Decode of several query tokens per request (FlashInfer's q_len_per_req: speculative-decoding
verification) and decode on the Hopper family (backend="fa3"), for
BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True).

FlashInfer's tensor-core decode is its prefill kernel over qo_indptr = arange(batch + 1) *
q_len_per_req, causal within each request's rows when q_len_per_req > 1 (bottom-right aligned:
the request's last row sees all of its KV, row j its first kv_len - (q_len_per_req - 1 - j)
tokens). flare does the same with its paged prefill (flare.prefill), on the fa2 family for
q_len_per_req > 1 (FlashInfer's rule: fa3 raises NotImplementedError there) and on the family
the wrapper names otherwise. q is [batch * q_len_per_req, H_qo, D], a request's rows
consecutive; so is o.
"""

import numbers

import numpy as np

from ._cpu import paged_kv_lengths
from ._tensors import host_index, torch_module


def check_q_len_per_req(where, q_len_per_req, use_tensor_cores, backend):
    """q_len_per_req as an int >= 1, checked against the wrapper's options (FlashInfer's rules
    and messages: more than one token needs the tensor-core path, which fa3 lacks)."""
    if isinstance(q_len_per_req, bool) or not isinstance(q_len_per_req, numbers.Integral):
        raise TypeError(f"{where}: q_len_per_req must be an int, got "
                        f"{type(q_len_per_req).__name__}")
    q_len = int(q_len_per_req)
    if q_len < 1:
        raise ValueError(f"{where}: q_len_per_req must be an int >= 1, got {q_len}")
    if q_len > 1 and not use_tensor_cores:
        raise ValueError(f"{where}: q_len_per_req={q_len} needs use_tensor_cores=True (the "
                         "CUDA-core decode loop takes one query token per request)")
    if q_len > 1 and backend == "fa3":
        raise NotImplementedError(
            f"{where}: q_len_per_req={q_len} runs on the fa2 tensor-core path (backend='fa2' or "
            "'auto'), as in FlashInfer; backend='fa3' takes one query token per request")
    return q_len


class MultiTokenDecode:
    """The paged prefill behind one decode wrapper's tensor-core plans of this kind: created at
    its first plan() (under CUDA graphs with the decode wrapper's fixed page-table buffers and a
    qo_indptr buffer of its own), re-planned by every later one."""

    def __init__(self, workspace, kv_layout, backend, validate, graph_buffers):
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        self._where = "BatchDecodeWithPagedKVCacheWrapper"
        if graph_buffers is None:
            self._prefill = BatchPrefillWithPagedKVCacheWrapper(
                workspace, kv_layout, backend=backend, validate=validate)
        else:
            indptr_buf, indices_buf, last_page_len_buf = graph_buffers
            torch = torch_module()
            qo_indptr_buf = torch.empty(indptr_buf.shape[0], dtype=torch.int32,
                                        device=workspace.device)
            self._prefill = BatchPrefillWithPagedKVCacheWrapper(
                workspace, kv_layout, use_cuda_graph=True, qo_indptr_buf=qo_indptr_buf,
                paged_kv_indptr_buf=indptr_buf, paged_kv_indices_buf=indices_buf,
                paged_kv_last_page_len_buf=last_page_len_buf, backend=backend,
                validate=validate)
        self.batch = 0
        self.q_len = 1

    def plan(self, q_len, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, q_dtype, kv_dtype, **options):
        """Plans the batch of the decode wrapper's plan() arguments; options: the prefill
        plan's keywords (pos_encoding_mode, window_left, ..., o_data_type, variant)."""
        where = f"{self._where}.plan"
        indptr_host = host_index(indptr, "indptr")
        last_host = host_index(last_page_len, "last_page_len")
        batch = int(indptr_host.shape[0]) - 1
        if q_len > 1 and batch > 0:
            kv_len = paged_kv_lengths(np.asarray(indptr_host), np.asarray(last_host),
                                      int(page_size))
            shortest = int(kv_len.min())
            if shortest < q_len:
                request = int(np.argmin(kv_len))
                raise ValueError(
                    f"{where}: q_len_per_req={q_len} needs kv_len >= q_len_per_req for every "
                    "request (the verified tokens must already be in the KV cache), but request "
                    f"{request} has kv_len={shortest}: its first rows would attend to an empty "
                    "KV range")
        qo = np.arange(batch + 1, dtype=np.int32) * q_len
        if hasattr(indices, "is_cuda"):  # torch tensors: a CPU tensor, as plan() reads it
            qo = torch_module().from_numpy(qo)
        self._prefill.plan(qo, indptr_host, indices, last_host, num_qo_heads, num_kv_heads,
                           head_dim, page_size, causal=q_len > 1, q_data_type=q_dtype,
                           kv_data_type=kv_dtype, **options)
        self.batch, self.q_len = batch, q_len

    def run(self, q, paged_kv_cache, args, kwargs):
        rows = self.batch * self.q_len
        if getattr(q, "shape", (rows,))[0] != rows:
            raise ValueError(
                f"{self._where}.run: q must have batch * q_len_per_req = {self.batch} * "
                f"{self.q_len} = {rows} rows (plan()'s q_len_per_req={self.q_len}), got "
                f"{q.shape[0]}")
        return self._prefill.run(q, paged_kv_cache, *args, **kwargs)

    def check(self):
        self._prefill.check()
