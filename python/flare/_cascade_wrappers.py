"""Cascade attention over shared prefixes with FlashInfer's wrappers (flashinfer.cascade):
MultiLevelCascadeAttentionWrapper, BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
BatchPrefillWithSharedPrefixPagedKVCacheWrapper. Each level is a block-sparse KV format of its
own (a level-0 group's query rows read their shared prefix together, as one request of the
paged prefill).

MultiLevelCascadeAttentionWrapper on the GPU runs all levels in one prefill launch plus one
merge launch (flare/_cascade_gpu.py, BatchPrefill.plan_cascade) where it can: 16-bit K/V in
q's dtype, and for a causal cascade of several levels no pos_encoding_mode or window_left
(the shared levels' queries are placed after all their keys). Otherwise, on the CPU, with
fused_levels=False, with levels in caches of their own (page_size given per level: the levels
may differ in page size, run() takes one cache per level), or (fused_levels=None, outside CUDA
graphs) when no shared level holds any KV, the levels run one after another and their states
merge with
merge_state_in_place, as FlashInfer does; outside CUDA-graph mode plan() then picks each
level's kernel from its host-side tables: a level whose groups are all one query token (a
decode level) runs flare's tensor-core batch decode, and a level other than the last whose
groups hold no KV at all is skipped (it would add the identity state).
"""

import numpy as np

from . import _tensors
from ._cascade_gpu import GpuCascade
from ._shared_prefix_gpu import SharedPrefixRun
from ._tensors import dtype_name, is_cuda
from .cascade import merge_state_in_place
from .decode import BatchDecodeWithPagedKVCacheWrapper
from .prefill import BatchPrefillWithPagedKVCacheWrapper, single_prefill_with_kv_cache

_MULTI = "MultiLevelCascadeAttentionWrapper"


def _host_qo_indptr(indptr, name, where):
    """indptr as host int32 (converted once: plan() hands it on to the levels), checked."""
    values = _tensors.host_int32(indptr, name)
    if values.shape[0] < 2 or int(values[0]) != 0 or (values[1:] < values[:-1]).any():
        raise ValueError(f"{where}: {name} must be a 1-D array starting at 0 and never "
                         f"decreasing, with at least 2 entries")
    return values


def _check_levels_disjoint(where, qo_host, kv_indptr_arr, kv_indices_arr):
    """ValueError when a query token reads one page in two levels (its tokens would count twice:
    a prefix overlapping a suffix). Checked when every page table is on the host; device page
    tables are not read (plan() never synchronizes on them). Vectorized: a level-b group nested
    in one level-a group (the cascade's shape) checks all its pages in one sorted lookup; only a
    group straddling several level-a groups is checked group by group."""
    if any(is_cuda(x) for x in kv_indices_arr):
        return
    levels = []  # (qo indptr, kv indptr, page ids, group of each page entry)
    for i, (qo, kv, idx) in enumerate(zip(qo_host, kv_indptr_arr, kv_indices_arr)):
        kv = _tensors.host_int32(kv, f"paged_kv_indptr_arr[{i}]")
        idx = _tensors.host_int32(idx, f"paged_kv_indices_arr[{i}]").astype(np.int64)
        entries = min(int(kv[-1]), idx.shape[0])
        groups = np.repeat(np.arange(kv.shape[0] - 1), np.diff(kv).clip(min=0))[:entries]
        levels.append((qo, kv, idx[:groups.shape[0]], groups))
    pages = np.concatenate([level[2] for level in levels])
    if pages.size == 0:
        return
    low, span = int(pages.min()), int(pages.max() - pages.min()) + 1
    for a, (qa, _, ia, ga_of) in enumerate(levels[:-1]):
        if ia.size == 0:
            continue
        keys_a = np.sort(ga_of * span + (ia - low))
        for b in range(a + 1, len(levels)):
            qb, _, ib, gb_of = levels[b]
            # The level-a groups holding each level-b group's first and last token.
            first = np.searchsorted(qa, qb[:-1], side="right") - 1
            last = np.searchsorted(qa, np.maximum(qb[1:] - 1, qb[:-1]), side="right") - 1
            tokens = qb[1:] > qb[:-1]
            nested = tokens & (first == last)
            entry_nested = nested[gb_of]
            keys_b = first[gb_of] * span + (ib - low)
            at = np.searchsorted(keys_a, keys_b)
            hit = entry_nested & (at < keys_a.size) & \
                (keys_a[np.minimum(at, keys_a.size - 1)] == keys_b)
            conflicts = [(int(e), int(first[gb_of[e]])) for e in np.flatnonzero(hit)[:1]]
            for gb in np.flatnonzero(tokens & ~nested):
                for ga in range(int(first[gb]), int(last[gb]) + 1):
                    if qa[ga + 1] == qa[ga]:
                        continue  # a level-a group of no tokens shares none
                    mine = np.flatnonzero(gb_of == gb)
                    shared = np.isin(ib[mine], ia[ga_of == ga])
                    if shared.any():
                        conflicts.append((int(mine[np.argmax(shared)]), ga))
            if conflicts:
                entry, ga = min(conflicts)
                raise ValueError(
                    f"{where}: page {int(ib[entry])} is in level {a}'s group {ga} and level "
                    f"{b}'s group {int(gb_of[entry])}, which share query tokens: each token "
                    "would read it twice (levels must hold disjoint pages)")


def _level_kernel(qo_host, kv_host, last):
    """A level's kernel outside CUDA-graph mode: "skip" for a level before the last whose
    groups hold no page (kv_host: its host-side kv indptr, None where the caller's is on the
    device, which is not read: no synchronization in plan()), "decode" when every group is one
    query token, else "prefill"."""
    if not last and kv_host is not None and kv_host.shape[0] > 0 and \
            int(kv_host[-1]) == int(kv_host[0]):
        return "skip"
    groups = qo_host.shape[0] - 1
    if groups > 0 and int(qo_host[-1]) == groups and bool(
            (qo_host[1:] - qo_host[:-1] == 1).all()):
        return "decode"
    return "prefill"


def _level_page_sizes(page_size, num_levels, where):
    """(page size of each level, whether each level has a cache of its own): an int is every
    level's page size in one cache; a sequence gives each level its page size and its own
    cache."""
    if isinstance(page_size, (list, tuple)):
        sizes = [int(x) for x in page_size]
        if len(sizes) != num_levels or min(sizes) < 1:
            raise ValueError(f"{where}: page_size must be one positive int or num_levels = "
                             f"{num_levels} of them (a cache per level), got {list(page_size)}")
        return sizes, True
    if int(page_size) < 1:
        raise ValueError(f"{where}: page_size must be positive, got {page_size}")
    return [int(page_size)] * num_levels, False


def _why_not_fused(workspace, q_dtype, kv_dtype, causal, num_levels, pos_encoding_mode,
                   window_left, own_caches=False):
    """Why the one-launch cascade cannot run this plan (None when it can)."""
    if own_caches:
        return ("the levels have caches of their own (page_size given per level), and the one "
                "launch reads one cache of one page size")
    if not is_cuda(workspace):
        return "the float workspace buffer is not a CUDA tensor (the CPU backend runs levels)"
    if q_dtype not in ("float16", "bfloat16") or kv_dtype != q_dtype:
        return (f"it reads 16-bit K/V in q's dtype, got q_data_type {q_dtype} and kv_data_type "
                f"{kv_dtype}")
    positional = pos_encoding_mode != "NONE" or (window_left is not None and window_left >= 0)
    if causal and num_levels > 1 and positional:
        return ("a causal cascade's shared levels place their queries after all their keys, so "
                "pos_encoding_mode and window_left are not available there")
    return None


class MultiLevelCascadeAttentionWrapper:
    """Attention over num_levels paged KV levels per query token (level 0 e.g. a prefix shared
    by a group of requests, the last level each request's own pages): plan() per level with its
    qo_indptr grouping the query tokens, run(q, paged_kv_cache) -> o, the levels' states
    merged. fused_levels (flare's): None runs the levels in one launch where the module doc
    says it can, True insists (NotImplementedError naming why not), False runs them one after
    another. page_size (flare's extension) may list one page size per level: each level then
    reads a cache of its own, run(q, paged_kv_cache_arr=[cache of level 0, ...]). The one
    launch keeps the levels' partial states in memory of its own outside CUDA graphs (as
    FlashInfer allocates each level's output), in float_workspace_buffer under them."""

    def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None,
                 paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None,
                 fused_levels=None):
        if not any(fused_levels is x for x in (None, True, False)):  # 1 == True: identity
            raise ValueError(f"{_MULTI}: fused_levels must be None, True or False, got "
                             f"{fused_levels!r}")
        self._fused_levels = fused_levels
        self._fused = False  # the latest plan's path
        self._own_caches = False  # the latest plan's levels each read a cache of their own
        num_levels = int(num_levels)
        if num_levels < 1:
            raise ValueError(f"{_MULTI}: num_levels must be >= 1, got {num_levels}")
        buffers = dict(qo_indptr_buf=qo_indptr_buf_arr,
                       paged_kv_indptr_buf=paged_kv_indptr_buf_arr,
                       paged_kv_indices_buf=paged_kv_indices_buf_arr,
                       paged_kv_last_page_len_buf=paged_kv_last_page_len_buf_arr)
        for name, arr in buffers.items():
            if arr is not None and len(arr) != num_levels:
                raise ValueError(f"{_MULTI}: {name}_arr must hold num_levels = {num_levels} "
                                 f"buffers, got {len(arr)}")
        self._num_levels = num_levels
        self._workspace, self._kv_layout = float_workspace_buffer, kv_layout
        # Per level: "prefill", "decode" or "skip" (plan()); decode wrappers made on first use.
        self._kernels = ["prefill"] * num_levels
        self._decoders = [None] * num_levels
        # The levels share the caller's workspace: it holds only partial states during a run,
        # and run() runs the levels one after another on one stream.
        self._wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(
                float_workspace_buffer, kv_layout, use_cuda_graph,
                **{name: None if arr is None else arr[i] for name, arr in buffers.items()})
            for i in range(num_levels)]
        self._cascade = None
        if is_cuda(float_workspace_buffer) and fused_levels is not False:
            self._cascade = GpuCascade(_MULTI, float_workspace_buffer, kv_layout, num_levels,
                                       use_cuda_graph, paged_kv_indices_buf_arr)

    @property
    def is_cuda_graph_enabled(self):
        return self._wrappers[0].is_cuda_graph_enabled

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
             paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, non_blocking=True):
        """One list entry per level. Every level's qo_indptr must start at 0 and end at the same
        number of query tokens (each token in one group of each level); causal applies to the
        last level only (the earlier levels precede every query). With host page tables, a
        page that two levels of one cache give one query token is a ValueError (nothing is
        planned). page_size: one int (every level in run()'s one cache) or one per level (each
        level's pages index a cache of its own, run()'s paged_kv_cache_arr)."""
        where = f"{_MULTI}.plan"
        arrays = dict(qo_indptr_arr=qo_indptr_arr, paged_kv_indptr_arr=paged_kv_indptr_arr,
                      paged_kv_indices_arr=paged_kv_indices_arr,
                      paged_kv_last_page_len=paged_kv_last_page_len)
        for name, arr in arrays.items():
            if len(arr) != self._num_levels:
                raise ValueError(f"{where}: {name} must hold num_levels = {self._num_levels} "
                                 f"entries, got {len(arr)}")
        qo_host = [_host_qo_indptr(x, f"qo_indptr_arr[{i}]", where)
                   for i, x in enumerate(qo_indptr_arr)]
        totals = [int(x[-1]) for x in qo_host]
        if len(set(totals)) != 1:
            raise ValueError(f"{where}: every level's qo_indptr must end at the same number of "
                             f"query tokens (each token in one group per level), got {totals}")
        page_sizes, own_caches = _level_page_sizes(page_size, self._num_levels, where)
        if not own_caches:  # pages of different caches are different pages
            _check_levels_disjoint(where, qo_host, paged_kv_indptr_arr, paged_kv_indices_arr)
        q_dtype = dtype_name(q_data_type)
        kv_dtype = dtype_name(kv_data_type) if kv_data_type is not None else q_dtype
        why_not = _why_not_fused(self._workspace, q_dtype, kv_dtype, causal, self._num_levels,
                                 pos_encoding_mode, window_left, own_caches)
        if self._fused_levels is True and why_not is not None:
            raise NotImplementedError(f"{where}: fused_levels=True, but {why_not}")
        last = self._num_levels - 1
        graph = self.is_cuda_graph_enabled
        # Each level's host-side kv indptr, converted once (None where it is on the device).
        kv_host = [None if is_cuda(x) else _tensors.host_int32(x, f"paged_kv_indptr_arr[{i}]")
                   for i, x in enumerate(paged_kv_indptr_arr)]
        # Each level's kernel outside CUDA graphs (a captured run keeps the prefill's).
        kinds = ["prefill"] * self._num_levels if graph else [
            _level_kernel(qo_host[i], kv_host[i], i == last) for i in range(self._num_levels)]
        # Outside CUDA graphs, shared levels without any KV leave the last level alone: its
        # own kernel (the batch decode for one-token groups) beats the cascade's launch there
        # (decode b64, empty prefix: 40.2 against 51.0 us; docs/perf.md, thirtieth session).
        alone = not graph and self._fused_levels is None and all(
            kind == "skip" for kind in kinds[:last])
        self._fused = self._cascade is not None and why_not is None and not alone
        self._own_caches = own_caches
        if self._fused:
            params_kwargs = dict(sm_scale=sm_scale, causal=causal, window_left=window_left,
                                 logits_soft_cap=logits_soft_cap,
                                 pos_encoding_mode=pos_encoding_mode, rope_scale=rope_scale,
                                 rope_theta=rope_theta)
            config = dict(num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
                          head_dim_qk=int(head_dim), head_dim_vo=int(head_dim),
                          page_size=page_sizes[0], dtype=q_dtype, custom_mask=False,
                          fixed_split_size=0, disable_split_kv=False,
                          params_kwargs=params_kwargs, variant=None, kv_dtype=kv_dtype)
            kv_host = [_tensors.host_int32(x, f"paged_kv_indptr_arr[{i}]") if k is None else k
                       for i, (x, k) in enumerate(zip(paged_kv_indptr_arr, kv_host))]
            last_host = [_tensors.host_int32(x, f"paged_kv_last_page_len[{i}]")
                         for i, x in enumerate(paged_kv_last_page_len)]
            self._cascade.plan(qo_host, kv_host, last_host, paged_kv_indices_arr, config)
            return
        for i, wrapper in enumerate(self._wrappers):
            self._kernels[i] = kinds[i]
            if self._kernels[i] == "skip":
                continue
            if self._kernels[i] == "decode":
                if self._decoders[i] is None:
                    self._decoders[i] = BatchDecodeWithPagedKVCacheWrapper(
                        self._workspace, self._kv_layout, use_tensor_cores=True)
                self._decoders[i].plan(
                    paged_kv_indptr_arr[i], paged_kv_indices_arr[i], paged_kv_last_page_len[i],
                    num_qo_heads, num_kv_heads, head_dim, page_sizes[i],
                    pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                    logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                    kv_data_type=kv_data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                    rope_theta=rope_theta, non_blocking=non_blocking)
                continue
            wrapper.plan(qo_host[i], paged_kv_indptr_arr[i], paged_kv_indices_arr[i],
                         paged_kv_last_page_len[i], num_qo_heads, num_kv_heads, head_dim,
                         page_sizes[i], causal=causal if i == last else False,
                         pos_encoding_mode=pos_encoding_mode,
                         use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                         window_left=window_left, logits_soft_cap=logits_soft_cap,
                         rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=kv_data_type, non_blocking=non_blocking)

    begin_forward = plan

    def run(self, q, paged_kv_cache=None, return_lse=False, paged_kv_cache_arr=None):
        """o [tokens, H_qo, D] of q [tokens, H_qo, D] over every level (and the merged base-2
        lse with return_lse). paged_kv_cache: the levels' one cache; paged_kv_cache_arr (a plan
        with a page size per level): each level's cache, in level order."""
        where = f"{_MULTI}.run"
        if self._own_caches:
            if paged_kv_cache is not None or paged_kv_cache_arr is None or \
                    len(paged_kv_cache_arr) != self._num_levels:
                raise ValueError(
                    f"{where}: the plan gave each level a page size, so each level has a cache "
                    f"of its own: pass paged_kv_cache_arr with num_levels = {self._num_levels} "
                    "caches and no paged_kv_cache")
            caches = list(paged_kv_cache_arr)
        else:
            if paged_kv_cache is None or paged_kv_cache_arr is not None:
                raise ValueError(f"{where}: the plan gave one page size, so the levels share one "
                                 "cache: pass paged_kv_cache (paged_kv_cache_arr goes with a "
                                 "page size per level)")
            caches = [paged_kv_cache] * self._num_levels
        if self._fused:
            return self._cascade.run(q, paged_kv_cache, return_lse)
        last = self._num_levels - 1
        out, lse = self._run_level(last, q, caches[last])
        for i in range(last):
            if self._kernels[i] != "skip":
                out_i, lse_i = self._run_level(i, q, caches[i])
                merge_state_in_place(out, lse, out_i, lse_i)
        return (out, lse) if return_lse else out

    def _run_level(self, i, q, paged_kv_cache):
        wrapper = self._decoders[i] if self._kernels[i] == "decode" else self._wrappers[i]
        return wrapper.run(q, paged_kv_cache, return_lse=True)

    forward = run


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    """Decode with a prefix shared by the whole batch (k_shared / v_shared, contiguous) and each
    request's own paged suffix: the prefix as one prefill of all queries, the suffixes as a
    batch decode, merged."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        self._kv_layout = kv_layout
        self._decode = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._params = {}
        self._gpu = SharedPrefixRun("BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward",
                                    kv_layout)

    def begin_forward(self, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                      num_qo_heads, num_kv_heads, head_dim, page_size, data_type="float16",
                      q_data_type=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._params = dict(sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        self._decode.plan(unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                          num_qo_heads, num_kv_heads, head_dim, page_size,
                          q_data_type=q_data_type or data_type, kv_data_type=data_type,
                          **self._params)

    plan = begin_forward

    def forward(self, q, k_shared, v_shared, unique_kv_cache, return_lse=False):
        """o [batch, H_qo, D] (and the merged base-2 lse with return_lse)."""
        # q [batch, H_qo, D]: the batch's queries are the shared prefix's query tokens.
        if is_cuda(q):
            def run_own(out, lse):
                self._decode.run(q, unique_kv_cache, out=out, lse=lse, return_lse=True)

            return self._gpu.forward(q, k_shared, v_shared, run_own, False,
                                     tuple(self._params.items()), return_lse)
        v_s, s_s = single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
                                                kv_layout=self._kv_layout, return_lse=True,
                                                **self._params)
        v_u, s_u = self._decode.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(v_s, s_s, v_u, s_u)
        return (v_s, s_s) if return_lse else v_s

    run = forward


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    """Prefill / append with a prefix shared by the whole batch (contiguous k_shared /
    v_shared) and each request's own paged KV: the prefix non-causally for every query, the
    requests' pages (causal if asked) as a paged prefill, merged."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        self._kv_layout = kv_layout
        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._planned = None
        self._causal = None  # the (causal, reduction, params) key of the suffix plan
        self._gpu = SharedPrefixRun("BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward",
                                    kv_layout)

    def begin_forward(self, qo_indptr, paged_kv_indptr, paged_kv_indices,
                      paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                      q_data_type="float16", kv_data_type=None):
        self._planned = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                         num_qo_heads, num_kv_heads, head_dim, page_size, q_data_type,
                         kv_data_type)
        self._causal = None

    plan = begin_forward

    def forward(self, q, k_shared, v_shared, unique_kv_cache, causal=False,
                use_fp16_qk_reduction=False, sm_scale=None, rope_scale=None, rope_theta=None,
                return_lse=False):
        """o [tokens, H_qo, D] (and the merged base-2 lse with return_lse). The suffix plan is
        made on the first forward() of each causal setting (FlashInfer passes causal here)."""
        if self._planned is None:
            raise RuntimeError("BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward() needs "
                               "begin_forward() first")
        (qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
         page_size, q_data_type, kv_data_type) = self._planned
        params = dict(sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        key = (bool(causal), bool(use_fp16_qk_reduction), tuple(params.items()))
        if self._causal != key:
            self._prefill.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads,
                               num_kv_heads, head_dim, page_size, causal=causal,
                               use_fp16_qk_reduction=use_fp16_qk_reduction,
                               q_data_type=q_data_type, kv_data_type=kv_data_type, **params)
            self._causal = key
        if is_cuda(q):
            def run_own(out, lse):
                self._prefill.run(q, unique_kv_cache, out=out, lse=lse, return_lse=True)

            return self._gpu.forward(q, k_shared, v_shared, run_own, use_fp16_qk_reduction,
                                     key[2], return_lse)
        v_s, s_s = single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
                                                kv_layout=self._kv_layout, return_lse=True,
                                                use_fp16_qk_reduction=use_fp16_qk_reduction,
                                                **params)
        v_u, s_u = self._prefill.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(v_s, s_s, v_u, s_u)
        return (v_s, s_s) if return_lse else v_s

    run = forward

