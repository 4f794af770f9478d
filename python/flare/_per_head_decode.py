"""Fine-grained sparse decode (Quest, paper 002 appendix G.5): each request reads, for each KV
head, its own subset of pages (a page budget the caller picks from page scores), through the
decode kernels' page gather, no dense fallback. With the HND layout a head's part of a page is
one contiguous [page_size, D] block, so the cache viewed as [pages * H_kv, 1, page_size, D] is
a paged cache of one KV head whose page p * H_kv + h is page p's head h: every (request, KV
head) becomes a request of a one-KV-head decode over that view, its query rows the head's
query group. Views only: no copy of q, o or the cache.
"""

import numpy as np

from ._tensors import host_int32, is_cuda, is_torch, torch_module
from .decode import BatchDecodeWithPagedKVCacheWrapper

_NAME = "PerHeadSparseDecodeWrapper"


class PerHeadSparseDecodeWrapper:
    """Decode where each (request, KV head) reads its own pages: plan(indptr [batch * H_kv + 1],
    indices, last_page_len [batch * H_kv], ...) with segment r * H_kv + h listing the pages
    request r reads for KV head h (any subset of its pages, any order; page_size >= 1), then
    run(q [batch, H_qo, D], (k_cache, v_cache)) with each cache HND [pages, H_kv, page_size, D]
    -> o [batch, H_qo, D] (and lse [batch, H_qo], base 2, with return_lse). The query attends
    every selected token (decode's last position sees them all).

    use_cuda_graph=True (a decode step captured once, replayed after each new page selection):
    the three buffers are fixed for the wrapper's life, CUDA int32, sized as plan()'s arguments
    at the largest budget: paged_kv_indptr_buffer [batch * H_kv + 1],
    paged_kv_last_page_len_buffer [batch * H_kv] (fixing batch * H_kv) and
    paged_kv_indices_buffer [most pages selected in one step]; plan() writes the selection (its
    page ids remapped to the one-head view) into them, run() may then be captured."""

    def __init__(self, float_workspace_buffer, use_tensor_cores=False, use_cuda_graph=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None):
        self._decode = BatchDecodeWithPagedKVCacheWrapper(
            float_workspace_buffer, "HND", use_cuda_graph=use_cuda_graph,
            use_tensor_cores=use_tensor_cores, paged_kv_indptr_buffer=paged_kv_indptr_buffer,
            paged_kv_indices_buffer=paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
        self._heads = None  # (num_qo_heads, num_kv_heads) of the plan

    @property
    def is_cuda_graph_enabled(self):
        return self._decode.is_cuda_graph_enabled

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, q_data_type="float16", kv_data_type=None, sm_scale=None,
             logits_soft_cap=None, non_blocking=True):
        """indptr and last_page_len are read on the host; indices stays where it is (a CUDA
        tensor is remapped on the device, without synchronizing)."""
        where = f"{_NAME}.plan"
        num_qo_heads, num_kv_heads = int(num_qo_heads), int(num_kv_heads)
        if num_kv_heads < 1 or num_qo_heads % num_kv_heads != 0:
            raise ValueError(f"{where}: num_qo_heads={num_qo_heads} must be a positive multiple "
                             f"of num_kv_heads={num_kv_heads}")
        indptr_host = host_int32(indptr, "indptr")
        segments = indptr_host.shape[0] - 1
        if segments < 0 or segments % num_kv_heads != 0:
            raise ValueError(f"{where}: indptr must have batch * num_kv_heads + 1 entries "
                             f"(num_kv_heads={num_kv_heads}), got {indptr_host.shape[0]}")
        fixed = self._decode._fixed_batch if self._decode.is_cuda_graph_enabled else None
        if fixed is not None and segments != fixed:
            raise ValueError(f"{where}: indptr has {segments} segments (batch * num_kv_heads); "
                             f"this use_cuda_graph wrapper's buffers fix {fixed}")
        counts = np.diff(indptr_host)
        if indptr_host[0] != 0 or (counts < 0).any():
            raise ValueError(f"{where}: indptr must start at 0 and never decrease")
        # Page p of head h is page p * H_kv + h of the one-head view.
        heads = np.repeat(np.arange(segments, dtype=np.int64) % num_kv_heads, counts)
        if is_cuda(indices):
            torch = torch_module()
            if indices.ndim != 1 or indices.shape[0] != heads.shape[0]:
                raise ValueError(f"{where}: indices must have indptr[-1] = {heads.shape[0]} "
                                 f"entries, got {list(indices.shape)}")
            head_ids = torch.from_numpy(heads).to(indices.device, non_blocking=True)
            # int64, then clamped: an id out of range stays out of range of the view.
            view_ids = (indices.long() * num_kv_heads + head_ids).clamp(
                -1, np.iinfo(np.int32).max).to(torch.int32)
        else:
            page_ids = host_int32(indices, "indices").astype(np.int64)
            if page_ids.shape[0] != heads.shape[0]:
                raise ValueError(f"{where}: indices must have indptr[-1] = {heads.shape[0]} "
                                 f"entries, got {page_ids.shape[0]}")
            view_ids = page_ids * num_kv_heads + heads
            # Out-of-range ids stay out of range (the decode checks them against the view).
            view_ids = np.clip(view_ids, -1, np.iinfo(np.int32).max).astype(np.int32)
        self._decode.plan(indptr_host, view_ids, last_page_len, num_qo_heads // num_kv_heads, 1,
                          head_dim, page_size, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, sm_scale=sm_scale,
                          logits_soft_cap=logits_soft_cap, non_blocking=non_blocking)
        self._heads = (num_qo_heads, num_kv_heads)

    def run(self, q, paged_kv_cache, out=None, lse=None, return_lse=False, enable_pdl=None,
            lse_base="log2"):
        where = f"{_NAME}.run"
        if self._heads is None:
            raise RuntimeError(f"{where}() needs a plan(): call plan() first")
        num_qo_heads, num_kv_heads = self._heads
        if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
            raise ValueError(f"{where}: paged_kv_cache must be a (k_cache, v_cache) tuple of HND "
                             "[pages, H_kv, page_size, D] tensors (a head's part of a page must "
                             "be one block)")
        k_cache, v_cache = paged_kv_cache
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.ndim != 4 or cache.shape[1] != num_kv_heads or \
                    (is_torch(cache) and not cache.is_contiguous()):
                raise ValueError(f"{where}: {name} must be a contiguous HND tensor [pages, "
                                 f"{num_kv_heads}, page_size, D], got {list(cache.shape)}")
        if q.ndim != 3 or q.shape[1] != num_qo_heads:
            raise ValueError(f"{where}: q must be [batch, {num_qo_heads}, D], got "
                             f"{list(q.shape)}")
        pages, _, page_size, d_qk = k_cache.shape
        k_view = k_cache.reshape(pages * num_kv_heads, 1, page_size, d_qk)
        v_view = v_cache.reshape(pages * num_kv_heads, 1, page_size, v_cache.shape[3])
        group = num_qo_heads // num_kv_heads
        q_rows = q.reshape(q.shape[0] * num_kv_heads, group, q.shape[2])
        for name, x in (("out", out), ("lse", lse)):
            if x is not None and is_torch(x) and not x.is_contiguous():
                raise ValueError(f"{where}: {name} must be contiguous (it is viewed per head)")
        out_rows = None if out is None else out.reshape(q_rows.shape[0], group, out.shape[2])
        lse_rows = None if lse is None else lse.reshape(q_rows.shape[0], group)
        result = self._decode.run(q_rows, (k_view, v_view), out=out_rows, lse=lse_rows,
                                  return_lse=return_lse, enable_pdl=enable_pdl,
                                  lse_base=lse_base)
        o_rows, s_rows = result if return_lse else (result, None)
        o = o_rows.reshape(q.shape[0], num_qo_heads, o_rows.shape[2])
        return (o, s_rows.reshape(q.shape[0], num_qo_heads)) if return_lse else o

    forward = run
