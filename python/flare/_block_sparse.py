"""Block-sparse attention (FlashInfer's flashinfer.sparse.BlockSparseAttentionWrapper) on flare's
one KV format: a BSR mask of R x C blocks over an M x N attention matrix is a paged batch in
which each block row is a request of (up to) R query rows and each of its nonzero column
blocks a page of C tokens. K and V [N, H_kv, D] are viewed as N / C pages without a copy, the
block row's column indices are its page table, and a per-block mask becomes the request's
custom mask bits: flare's paged prefill runs it unchanged (split-KV, merge, every variant term
of the paged wrapper), on the GPU and on the CPU backend. Causal masking, as in FlashInfer,
applies to the positions of the gathered blocks (bottom-right aligned within a block row).
"""

import numpy as np

from . import _flare
from ._tensors import host_int32, is_cuda, is_torch, torch_module
from .prefill import BatchPrefillWithPagedKVCacheWrapper

_NAME = "BlockSparseAttentionWrapper"


class BlockSparseAttentionWrapper:
    """Attention with a block-sparse (BSR) mask: plan(indptr, indices, M, N, R, C, ...) then
    run(q [M, H_qo, D], k [N, H_kv, D], v [N, H_kv, D_vo]) -> o [M, H_qo, D_vo] (and lse
    [M, H_qo], base 2, with return_lse)."""

    def __init__(self, float_workspace_buffer, backend="auto"):
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, "NHD",
                                                            backend=backend)
        self._shape = None  # (M, N, R, C) of the plan

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
             packed_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             non_blocking=True, **unsupported):
        """indptr [MB + 1] and indices [nnz] (column block ids < N / C) of the BSR mask, MB =
        ceil(M / R); mask: bool [nnz, R, C] per-block masks (True: visible), or packed_mask,
        FlashInfer's packed bits of the converted layout. Index arrays are read on the host
        (CUDA tensors are copied once). ValueError naming the argument for a malformed
        structure, before anything is planned."""
        where = f"{_NAME}.plan"
        given = sorted(k for k, v in unsupported.items() if v is not None)
        if given:
            raise NotImplementedError(
                f"{where}: {given} (FlashInfer's VSA / per-head block inputs and tensor scales) "
                "are not supported by flare; pass indptr and indices")
        M, N, R, C = int(M), int(N), int(R), int(C)
        if min(M, N) < 0 or min(R, C) < 1:
            raise ValueError(f"{where}: M and N must be >= 0 and R, C >= 1, got M={M}, N={N}, "
                             f"R={R}, C={C}")
        if N % C != 0:
            raise ValueError(f"{where}: N={N} must be a multiple of C={C}")
        indptr_host = host_int32(indptr, "indptr")
        indices_host = host_int32(indices, "indices")
        row_blocks = -(-M // R)
        if indptr_host.shape[0] != row_blocks + 1:
            raise ValueError(f"{where}: indptr must have ceil(M / R) + 1 = {row_blocks + 1} "
                             f"entries, got {indptr_host.shape[0]}")
        counts = indptr_host[1:] - indptr_host[:-1]
        if indptr_host[0] != 0 or (counts < 0).any() or \
                indptr_host[-1] != indices_host.shape[0]:
            raise ValueError(f"{where}: indptr must start at 0, never decrease and end at "
                             f"len(indices) = {indices_host.shape[0]}")
        column_blocks = N // C
        if indices_host.size and (indices_host.min() < 0 or indices_host.max() >= column_blocks):
            bad = indices_host[(indices_host < 0) | (indices_host >= column_blocks)][0]
            raise ValueError(f"{where}: indices holds column block {int(bad)}; blocks are "
                             f"0..{column_blocks - 1} (N / C)")
        qo_indptr = np.minimum(np.arange(row_blocks + 1, dtype=np.int32) * R, M).astype(np.int32)
        last_page_len = np.full(row_blocks, C, dtype=np.int32)
        custom = None
        if mask is not None and packed_mask is None:
            custom = self._flat_mask(where, mask, indptr_host, qo_indptr, R, C)
        # The page table stays where the caller keeps it (the paged wrapper copies a host one).
        page_indices = indices if is_cuda(indices) else indices_host
        self._prefill.plan(qo_indptr, indptr_host, page_indices, last_page_len,
                           num_qo_heads, num_kv_heads, head_dim, C, custom_mask=custom,
                           packed_custom_mask=packed_mask, causal=causal,
                           pos_encoding_mode=pos_encoding_mode,
                           use_fp16_qk_reduction=use_fp16_qk_reduction,
                           logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                           rope_scale=rope_scale, rope_theta=rope_theta,
                           q_data_type=q_data_type, kv_data_type=kv_data_type,
                           non_blocking=non_blocking, o_data_type=o_data_type)
        self._shape = (M, N, R, C)

    begin_forward = plan

    @staticmethod
    def _flat_mask(where, mask, indptr, qo_indptr, R, C):
        """mask [nnz, R, C] -> each block row's q_len x (blocks * C) bits, rows concatenated
        (the paged wrapper's custom_mask layout); a last block row of fewer than R rows keeps
        its first rows. One scatter on mask's device, no loop over block rows."""
        nnz = int(indptr[-1])
        if tuple(mask.shape) != (nnz, R, C):
            raise ValueError(f"{where}: mask must have shape [nnz, R, C] = [{nnz}, {R}, {C}], "
                             f"got {list(mask.shape)}")
        counts = np.diff(indptr).astype(np.int64)       # blocks per block row
        rows = np.diff(qo_indptr).astype(np.int64)      # query rows per block row
        bits = rows * counts * C
        base = np.concatenate([[0], np.cumsum(bits)[:-1]]) if bits.size else bits
        row_of = np.repeat(np.arange(counts.size), counts)   # each block's block row
        j = np.arange(nnz) - indptr[:-1].astype(np.int64)[row_of]
        # offset of (block b, row r, column c): base + r * (blocks * C) + j * C + c
        r = np.arange(R)[None, :, None]
        c = np.arange(C)[None, None, :]
        offsets = (base[row_of][:, None, None] + r * (counts[row_of] * C)[:, None, None] +
                   (j * C)[:, None, None] + c)
        valid = np.broadcast_to(r < rows[row_of][:, None, None], offsets.shape)
        total = int(bits.sum())
        if is_torch(mask):
            torch = torch_module()
            flat = torch.zeros(total, dtype=torch.bool, device=mask.device)
            keep = torch.from_numpy(np.ascontiguousarray(valid)).to(mask.device)
            target = torch.from_numpy(offsets[valid]).to(mask.device)
            flat[target] = mask.to(torch.bool)[keep]
            return flat
        flat = np.zeros(total, dtype=bool)
        flat[offsets[valid]] = np.asarray(mask, dtype=bool)[valid]
        return flat

    def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, lse_base="log2"):
        """o [M, H_qo, D_vo] (and lse [M, H_qo] with return_lse) of the plan's mask."""
        where = f"{_NAME}.run"
        if self._shape is None:
            raise RuntimeError(f"{where}() needs a plan(): call plan() first")
        for name, scale in (("scale_q", scale_q), ("scale_k", scale_k), ("scale_v", scale_v)):
            if scale is not None:
                raise NotImplementedError(f"{where}: {name} (per-head fp8 scales) is not "
                                          "supported by flare")
        M, N, R, C = self._shape
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] != M or \
                k.shape[0] != N or v.shape[0] != N:
            raise ValueError(f"{where}: q must be [M={M}, H_qo, D] and k, v [N={N}, H_kv, D], "
                             f"got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
        # Pages of C tokens: views of the caller's K and V, no copy.
        k_pages = k.reshape(N // C, C, k.shape[1], k.shape[2])
        v_pages = v.reshape(N // C, C, v.shape[1], v.shape[2])
        return self._prefill.run(q, (k_pages, v_pages), out=out, lse=lse,
                                 return_lse=return_lse, enable_pdl=enable_pdl,
                                 lse_base=lse_base)

    forward = run


def _host_array(x, name, ndim):
    if is_torch(x):
        x = x.detach().cpu().numpy()
    values = np.asarray(x)
    if values.ndim != ndim:
        raise ValueError(f"VariableBlockSparseAttentionWrapper.plan: {name} must have rank "
                         f"{ndim}, got shape {list(values.shape)}")
    return values


class VariableBlockSparseAttentionWrapper:
    """Block-sparse attention with block sizes of its own per KV head (FlashInfer's
    flashinfer.sparse.VariableBlockSparseAttentionWrapper): plan(block_mask_map [H_kv, MB, NB],
    block_row_sz [H_kv, MB], block_col_sz [H_kv, NB], ...), run(q [H_qo, qo_len, D],
    k [H_kv, kv_len, D], v) -> o [H_qo, qo_len, D]. Each (KV head, block row) is a request of
    the paged prefill whose query rows are that block row of the head's query group and whose
    pages are single tokens (page size 1) of its visible column blocks: the same gather path,
    no dense fallback. q and o are regrouped by KV head (one copy each); K and V are viewed as
    pages without a copy."""

    def __init__(self, float_workspace_buffer, backend="auto"):
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, "NHD",
                                                            backend=backend)
        self._shape = None  # (num_qo_heads, num_kv_heads, qo_len, kv_len) of the plan

    def plan(self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads,
             head_dim, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, q_data_type="float16", kv_data_type=None):
        """The masks and block sizes are read on the host (CUDA tensors are copied once, which
        synchronizes, as FlashInfer's plan() does). Every KV head's row sizes must sum to one
        qo_len and its column sizes to one kv_len."""
        where = "VariableBlockSparseAttentionWrapper.plan"
        if causal:
            raise NotImplementedError(f"{where}: causal=True is not supported by flare (block "
                                      "positions are gathered); express it in the block mask")
        mask = _host_array(block_mask_map, "block_mask_map", 3)
        rows = _host_array(block_row_sz, "block_row_sz", 2)
        cols = _host_array(block_col_sz, "block_col_sz", 2)
        num_qo_heads, num_kv_heads = int(num_qo_heads), int(num_kv_heads)
        heads, row_blocks = mask.shape[0], mask.shape[1]
        if heads != num_kv_heads:
            raise ValueError(f"{where}: block_mask_map must be [num_kv_heads={num_kv_heads}, MB, "
                             f"NB], block_row_sz [num_kv_heads, MB], block_col_sz [num_kv_heads, "
                             f"NB]; got {list(mask.shape)}, {list(rows.shape)}, "
                             f"{list(cols.shape)}")
        if num_qo_heads % max(num_kv_heads, 1) != 0:
            raise ValueError(f"{where}: num_qo_heads={num_qo_heads} must be a multiple of "
                             f"num_kv_heads={num_kv_heads}")
        # Request (h, i): rows of block row i of head h; pages: the tokens of its visible column
        # blocks, as page ids h * kv_len + token (K and V viewed as [H_kv * kv_len] pages): one
        # C++ pass (flare/format/variable_blocks.h; the same in numpy array operations cost
        # ~100-250 us of host time, docs/perf.md forty-ninth session).
        mask = mask.view(np.uint8) if mask.dtype == np.bool_ else (mask != 0).view(np.uint8)
        rows, cols = (x if x.dtype in (np.int32, np.int64) else x.astype(np.int64)
                      for x in (rows, cols))
        joined, qo_len, kv_len = _flare.variable_block_batch(mask, rows, cols)
        joined = np.frombuffer(joined, dtype=np.int32).copy()  # writable: torch may read it
        requests = heads * row_blocks
        qo_indptr = joined[:requests + 1]
        kv_indptr = joined[requests + 1:2 * requests + 2]
        last_page_len = joined[2 * requests + 2:3 * requests + 2]
        indices = joined[3 * requests + 2:]
        group = num_qo_heads // max(num_kv_heads, 1)
        self._prefill.plan(qo_indptr, kv_indptr, indices, last_page_len, group, 1, head_dim, 1,
                           causal=False, pos_encoding_mode=pos_encoding_mode,
                           use_fp16_qk_reduction=use_fp16_qk_reduction,
                           logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                           rope_scale=rope_scale, rope_theta=rope_theta,
                           q_data_type=q_data_type, kv_data_type=kv_data_type,
                           non_blocking=non_blocking)
        self._shape = (num_qo_heads, num_kv_heads, qo_len, kv_len)

    begin_forward = plan

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None,
            lse_base="log2"):
        """o [H_qo, qo_len, D_vo] (and lse [H_qo, qo_len] with return_lse)."""
        where = "VariableBlockSparseAttentionWrapper.run"
        if self._shape is None:
            raise RuntimeError(f"{where}() needs a plan(): call plan() first")
        heads, kv_heads, qo_len, kv_len = self._shape
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or tuple(q.shape[:2]) != (heads, qo_len) \
                or tuple(k.shape[:2]) != (kv_heads, kv_len) or \
                tuple(v.shape[:2]) != (kv_heads, kv_len):
            raise ValueError(f"{where}: q must be [{heads}, {qo_len}, D] and k, v [{kv_heads}, "
                             f"{kv_len}, D] (HND), got {list(q.shape)}, {list(k.shape)}, "
                             f"{list(v.shape)}")
        group = heads // kv_heads
        d_qk, d_vo = q.shape[2], v.shape[2]
        for name, given, shape in (("out", out, (heads, qo_len, d_vo)),
                                   ("lse", lse, (heads, qo_len))):
            if given is not None and tuple(given.shape) != shape:
                raise ValueError(f"{where}: {name} must have shape {list(shape)}, got "
                                 f"{list(given.shape)}")
        want_lse = return_lse or lse is not None
        gpu = self._prefill._gpu
        if group == 1 and gpu is not None and _contiguous(q) and _contiguous(k) and \
                _contiguous(v):
            # One query head a KV head: the requests' rows (KV head, query row) are q's rows in
            # order and the pages k's and v's, so the extension views the caller's tensors
            # ((tensor, shape) pairs: no torch call, each of which costs ~1.5-2 us) and writes
            # a contiguous out / lse in place.
            rows, pages = heads * qo_len, kv_heads * kv_len
            o_heads = out if _contiguous(out) else q.new_empty((heads, qo_len, d_vo))
            lse_heads = None
            if want_lse:
                lse_heads = lse if _contiguous(lse) else \
                    q.new_empty((heads, qo_len), dtype=torch_module().float32)
            gpu.run((q, (rows, 1, d_qk)), ((k, (pages, 1, 1, d_qk)), (v, (pages, 1, 1, d_vo))),
                    None, None, None, (o_heads, (rows, 1, d_vo)),
                    None if lse_heads is None else (lse_heads, (rows, 1)), want_lse, lse_base,
                    enable_pdl, {})
            return self._returned(o_heads, lse_heads, out, lse, return_lse)
        k_pages = k.reshape(kv_heads * kv_len, 1, 1, d_qk)
        v_pages = v.reshape(kv_heads * kv_len, 1, 1, d_vo)
        if group == 1:  # the CPU path's views (numpy, CPU torch) or strided q, k, v
            rows = heads * qo_len
            result = self._prefill.run(q.reshape(rows, 1, d_qk), (k_pages, v_pages),
                                       return_lse=want_lse, enable_pdl=enable_pdl,
                                       lse_base=lse_base)
            o_rows, lse_rows = result if want_lse else (result, None)
            o_heads = o_rows.reshape(heads, qo_len, d_vo)
            lse_heads = None if lse_rows is None else lse_rows.reshape(heads, qo_len)
        else:
            # Rows (KV head, query row) x the group's heads: q and o regrouped (one copy each).
            q_rows = _regroup(q.reshape(kv_heads, group, qo_len, d_qk), (0, 2, 1, 3)).reshape(
                kv_heads * qo_len, group, d_qk)
            result = self._prefill.run(q_rows, (k_pages, v_pages), return_lse=want_lse,
                                       enable_pdl=enable_pdl, lse_base=lse_base)
            o_rows, lse_rows = result if want_lse else (result, None)
            o_heads = _regroup(o_rows.reshape(kv_heads, qo_len, group, d_vo),
                               (0, 2, 1, 3)).reshape(heads, qo_len, d_vo)
            lse_heads = None if lse_rows is None else _regroup(
                lse_rows.reshape(kv_heads, qo_len, group), (0, 2, 1)).reshape(heads, qo_len)
        return self._returned(o_heads, lse_heads, out, lse, return_lse)

    @staticmethod
    def _returned(o_heads, lse_heads, out, lse, return_lse):
        """o (and lse): the caller's out / lse, given the results where they were not written in
        place."""
        if out is not None and o_heads is not out:
            out[...] = o_heads
            o_heads = out
        if lse_heads is None:
            return o_heads
        if lse is not None and lse_heads is not lse:
            lse[...] = lse_heads
            lse_heads = lse
        return (o_heads, lse_heads) if return_lse else o_heads

    forward = run


def _contiguous(x):
    """x is a tensor or array whose rows can be viewed flat (None is not)."""
    if x is None:
        return False
    return x.is_contiguous() if is_torch(x) else x.flags.c_contiguous


def _regroup(x, axes):
    """x with its axes permuted, contiguous (torch or numpy)."""
    if is_torch(x):
        return x.permute(*axes).contiguous()
    return np.ascontiguousarray(x.transpose(axes))
