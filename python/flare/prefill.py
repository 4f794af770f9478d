"""Prefill attention with FlashInfer's interface: BatchPrefillWithPagedKVCacheWrapper,
BatchPrefillWithRaggedKVCacheWrapper and single_prefill_with_kv_cache.

CUDA tensors run flare's GPU BatchPrefill (tensor cores, JIT-compiled per configuration,
CUDA-graph safe); numpy arrays and CPU torch tensors run the CPU backend (plan +
execute_plan_cpu). The device of a wrapper is the device of its float_workspace_buffer.
"""

import functools

import numpy as np

from . import _flare, _flashinfer_jit
from ._multi_item_mask import is_multi_item, multi_item_mask
from ._args import (check_backend, check_kv_layout, check_lse_base, check_o_data_type,
                    check_prefill_plan_args, mask_causal, scale_or_one, ResolvedConfigs)
from ._cpu import (CpuBatch, check_cpu_tensor, check_tensor, host_indptr, paged_kv_lengths,
                   refuse_cpu_nvfp4, to_lse_base)
from ._prefill_gpu import GpuPrefill, check_gpu_support, config_key
# Public here, as in FlashInfer's flashinfer.prefill; written in _single_prefill.py.
from ._single_prefill import (single_prefill_with_kv_cache,  # noqa: F401
                              single_prefill_with_kv_cache_with_jit_module)
from ._tensors import (arg, dtype_name, engine_names, host_index, host_int32, is_cuda,
                       split_paged_kv_cache, tensor_dtype, validate_default)
from .variant import check_variant, variant_arguments


class _PrefillWrapper:
    """What the paged and ragged prefill wrappers share: construction checks, the plan on the
    CPU backend or the GPU, and the dtype checks and output handling of run()."""

    _name = ""
    _paged = True

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, validate,
                 jit_args, **fixed_buffers):
        check_backend(self._name, backend, is_cuda(float_workspace_buffer))
        # FlashInfer's customized module (gen_customize_batch_prefill_module's arguments after
        # backend): its variant is what plan() compiles, its extra arguments come positionally
        # to run().
        self._jit_module = _flashinfer_jit.wrapper_module("batch_prefill", backend, jit_args)
        self._kv_layout = check_kv_layout(kv_layout)
        self._workspace = float_workspace_buffer
        self._use_cuda_graph = bool(use_cuda_graph)
        self._gpu = None
        if is_cuda(float_workspace_buffer):
            self._gpu = GpuPrefill(self._name, float_workspace_buffer, self._kv_layout,
                                   self._paged, self._use_cuda_graph, fixed_buffers,
                                   validate=validate_default(validate), backend=backend)
        elif self._use_cuda_graph:
            raise ValueError(f"{self._name}: use_cuda_graph=True needs a CUDA "
                             "float_workspace_buffer")
        elif any(b is not None for b in fixed_buffers.values()):
            raise ValueError(f"{self._name}: the *_buf arguments are for use_cuda_graph=True")
        self._batch = None  # the CPU backend's plan
        self._dtypes = None
        self._resolved = ResolvedConfigs()  # plan()'s configuration arguments -> (GPU)

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def _plan(self, *, indptrs, tables, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
              page_size, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
              use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale,
              rope_theta, q_data_type, kv_data_type, non_blocking, fixed_split_size,
              disable_split_kv, o_data_type, variant, signature, rope_staging="auto"):
        """indptrs: the caller's (qo_indptr, kv_indptr, kv_last_page_len or None for ragged);
        tables: the caller's index arrays by the name of their CUDA-graph buffer; variant: a
        flare.AttentionVariant or None; signature: plan()'s configuration arguments as a tuple
        (_signature), remembered with what they resolve to once they pass every check."""
        where = f"{self._name}.plan"
        check_prefill_plan_args(where, pos_encoding_mode, use_fp16_qk_reduction)
        if rope_staging not in ("auto", "fused", "staged"):
            raise ValueError(f"{where}: rope_staging must be 'auto', 'fused' or 'staged', got "
                             f"{rope_staging!r}")
        variant = _flashinfer_jit.plan_variant(where, self._jit_module, variant)
        causal = mask_causal(causal, custom_mask, packed_custom_mask)
        q_dtype = dtype_name(q_data_type)
        kv_dtype = dtype_name(kv_data_type) if kv_data_type is not None else q_dtype
        check_o_data_type(where, o_data_type, q_dtype)
        variant = check_variant(where, variant, self._gpu is not None, causal)
        head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
        params_kwargs = dict(sm_scale=sm_scale, causal=causal, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                             rope_scale=rope_scale, rope_theta=rope_theta)
        has_mask = custom_mask is not None or packed_custom_mask is not None
        self._dtypes = None
        names = self._names
        if self._gpu is not None:
            check_gpu_support(where, q_dtype, kv_dtype)
            # The engine reads (and checks) the host arrays without a copy.
            hosts = [host_index(x, n) if x is not None else None for x, n in zip(indptrs, names)]
            config = dict(num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
                          head_dim_qk=int(head_dim_qk), head_dim_vo=int(head_dim_vo),
                          page_size=int(page_size), dtype=q_dtype, custom_mask=has_mask,
                          fixed_split_size=0 if fixed_split_size is None else
                          int(fixed_split_size), disable_split_kv=bool(disable_split_kv),
                          params_kwargs=params_kwargs, variant=variant, kv_dtype=kv_dtype,
                          rope_staging=rope_staging)
            key = config_key(config)
            try:
                self._gpu.plan(hosts, lambda: self._kv_len(indptrs, page_size), tables,
                               (custom_mask, packed_custom_mask) if has_mask else None, config,
                               non_blocking, key)
            except ValueError as error:
                raise engine_names(error, self._engine_names) from None
            if not has_mask:
                self._resolved.put(signature, (key, config, (q_dtype, kv_dtype)))
        else:
            qo_host = host_indptr(indptrs[0], names[0])
            kv_len = self._kv_len(indptrs, page_size)
            for name, x in tables.items():
                check_cpu_tensor(where, name.removesuffix("_buf"), x)
            self._tables = {name: host_int32(x, name.removesuffix("_buf"))
                            for name, x in tables.items()}
            self._batch = CpuBatch(
                qo_indptr=qo_host, kv_len=kv_len, num_qo_heads=num_qo_heads,
                num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo,
                page_size=page_size, params_kwargs=params_kwargs, custom_mask=custom_mask,
                packed_custom_mask=packed_custom_mask, fixed_split_size=fixed_split_size,
                disable_split_kv=disable_split_kv)
        self._dtypes = (q_dtype, kv_dtype)

    def _plan_remembered(self, signature, custom_mask, packed_custom_mask, indptrs, tables,
                         non_blocking):
        """plan() of a configuration checked before, on the GPU without a custom mask: only the
        index arrays are new (the serving loop's case, every step). False when the
        configuration is new (or has a mask): _plan() then checks everything."""
        if custom_mask is not None or packed_custom_mask is not None or self._gpu is None:
            return False
        resolved = self._resolved.get(signature)
        if resolved is None:
            return False
        key, config, dtypes = resolved
        names = self._names
        self._dtypes = None
        hosts = (host_index(indptrs[0], names[0]), host_index(indptrs[1], names[1]),
                 None if indptrs[2] is None else host_index(indptrs[2], names[2]))
        try:
            self._gpu.plan(hosts, None, tables, None, config, non_blocking, key)
        except ValueError as error:
            raise engine_names(error, self._engine_names) from None
        self._dtypes = dtypes
        return True

    def _multi_item(self, indptrs, page_size, custom_mask, packed_custom_mask, prefix_len_ptr,
                    token_pos_in_items_ptr, token_pos_in_items_len):
        """(indptrs on the host, custom_mask, packed_custom_mask, causal) of the multi-item
        arguments: the index arrays come to the host once (a CUDA one is copied), then the
        mask and the plan read those copies."""
        where = f"{self._name}.plan"
        if custom_mask is not None or packed_custom_mask is not None:
            raise ValueError(f"{where}: the multi-item arguments (prefix_len_ptr, ...) describe "
                             "a mask: pass them or a custom mask, not both")
        indptrs = tuple(None if x is None else host_index(x, name)
                        for x, name in zip(indptrs, self._names))
        mask = multi_item_mask(where, host_indptr(indptrs[0], self._names[0]),
                               self._kv_len(indptrs, page_size), prefix_len_ptr,
                               token_pos_in_items_ptr, token_pos_in_items_len)
        return indptrs, mask, None, False

    def _kv_len(self, indptrs, page_size):
        """KV tokens per request, on the host (numpy), from the caller's arrays."""
        qo, kv, last = indptrs
        names = self._names
        qo_host, kv_host = host_indptr(qo, names[0]), host_indptr(kv, names[1])
        if kv_host.shape[0] != qo_host.shape[0]:
            raise ValueError(f"{names[1]} must have {qo_host.shape[0]} entries (batch + 1 of "
                             f"{names[0]}), got {kv_host.shape[0]}")
        if last is None:
            return np.ascontiguousarray(np.diff(kv_host), dtype=np.int32)
        return paged_kv_lengths(kv_host, host_int32(last, names[2]), int(page_size))

    def _check_cpu_run(self, q, k):
        where = f"{self._name}.run"
        if self._dtypes is None:
            raise RuntimeError(f"{where}() needs a plan(): call plan() first")
        check_tensor(where, "q", q)
        check_tensor(where, "k" if not self._paged else "paged_kv_cache", k)
        if tensor_dtype(q) != self._dtypes[0]:
            raise ValueError(f"q has dtype {tensor_dtype(q)} but plan() was given "
                             f"q_data_type={self._dtypes[0]}")
        if tensor_dtype(k) != self._dtypes[1]:
            raise ValueError(f"the KV cache has dtype {tensor_dtype(k)} but plan() was given "
                             f"kv_data_type={self._dtypes[1]}")

    def check(self):
        """Synchronizes the device and raises IndexError naming the first page id (request,
        paged_kv_indices entry, value) the kernels found outside the KV cache since the last
        check(); clears it. Nothing to check on the CPU backend (it validates up front)."""
        if self._gpu is not None:
            self._gpu.check()


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill (ragged queries, qo_indptr) against a paged KV cache.

    plan() once per step on host-side lengths, run() per layer. With use_cuda_graph=True
    (CUDA only) the batch size is fixed by qo_indptr_buf, the first plan() fixes the
    configuration and the largest total query length, plan() copies the page table (and a
    custom mask) into the fixed *_buf tensors, and run() may be captured into a CUDA graph and
    replayed after later plan() calls. run() on a capturing stream of a wrapper created
    without use_cuda_graph raises RuntimeError.
    """

    _name = "BatchPrefillWithPagedKVCacheWrapper"
    _paged = True
    _names = ("qo_indptr", "paged_kv_indptr", "paged_kv_last_page_len")
    _engine_names = {"kv_indptr": "paged_kv_indptr", "kv_last_page_len": "paged_kv_last_page_len"}

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, validate=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, validate,
                         jit_args,
                         qo_indptr_buf=qo_indptr_buf, paged_kv_indptr_buf=paged_kv_indptr_buf,
                         paged_kv_indices_buf=paged_kv_indices_buf,
                         paged_kv_last_page_len_buf=paged_kv_last_page_len_buf,
                         custom_mask_buf=custom_mask_buf, mask_indptr_buf=mask_indptr_buf)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             non_blocking=True, fixed_split_size=None, disable_split_kv=False,
             o_data_type=None, variant=None, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None):
        """Schedules one batch on host-side lengths.

        qo_indptr, paged_kv_indptr and paged_kv_last_page_len are read on the host: pass CPU
        tensors and plan() never synchronizes; CUDA tensors are copied to the host once, which
        synchronizes with their stream (as in FlashInfer). On the GPU, paged_kv_indices stays
        on the device (copied there asynchronously when given on the host), and a bool
        custom_mask on the device is packed there. fixed_split_size makes each request's
        output and lse bitwise identical alone or in any batch (fixed tiles and KV splits).
        variant: a flare.AttentionVariant compiled in place of the built-in terms (window_left,
        logits_soft_cap and pos_encoding_mode must then stay off; causal and custom masks
        stay); its scalars go to run() as keyword arguments. A custom mask replaces causal (as in
        FlashInfer). prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len and
        max_item_len_ptr: FlashInfer's multi-item scoring, run as the custom mask they describe
        (flare/_multi_item_mask.py; in place of causal and a custom mask).
        """
        indptrs = (qo_indptr, paged_kv_indptr, paged_kv_last_page_len)
        if is_multi_item(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr):
            indptrs, custom_mask, packed_custom_mask, causal = self._multi_item(
                indptrs, page_size, custom_mask, packed_custom_mask, prefix_len_ptr,
                token_pos_in_items_ptr, token_pos_in_items_len)
        tables = dict(qo_indptr_buf=qo_indptr, paged_kv_indptr_buf=paged_kv_indptr,
                      paged_kv_indices_buf=paged_kv_indices,
                      paged_kv_last_page_len_buf=paged_kv_last_page_len)
        signature = (num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo, causal,
                     pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
                     logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
                     fixed_split_size, disable_split_kv, o_data_type, variant)
        if self._plan_remembered(signature, custom_mask, packed_custom_mask, indptrs, tables,
                                 non_blocking):
            return
        self._plan(indptrs=indptrs, tables=tables, signature=signature,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                   head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo, page_size=page_size,
                   custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                   causal=causal, pos_encoding_mode=pos_encoding_mode,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                   window_left=window_left, logits_soft_cap=logits_soft_cap,
                   rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                   kv_data_type=kv_data_type, non_blocking=non_blocking,
                   fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                   o_data_type=o_data_type, variant=variant)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, lse_base="log2", kv_cache_sf=None,
            **variant_kwargs):
        """o [total_q, H_qo, D_vo] (and lse [total_q, H_qo] float32 with return_lse).

        q_scale and k_scale multiply the logits and v_scale the output, inside the kernels.
        NVFP4 KV (plan(kv_data_type=torch.uint8), CUDA): paged_kv_cache holds the E2M1 codes
        (uint8, D / 2 a row), kv_cache_sf their float8_e4m3fn (or uint8) block scales (D / 16
        a row; a (k, v) pair or one [pages, 2, ...] tensor), k_scale / v_scale the global
        scales; the FA2 family's kernels convert codes and scales in shared memory (query tiles
        below 128 rows under backend "auto"), for the Hopper family run() first dequantizes the
        planned pages into a staged 16-bit copy.
        lse is base 2 (FlashInfer's) unless lse_base="ln". enable_pdl as for decode. A planned
        variant's scalars come as keyword arguments; with jit_args, the module's tensors and
        scalars come positionally after paged_kv_cache, as in FlashInfer.
        """
        if args:
            variant_kwargs = _flashinfer_jit.run_keywords(f"{self._name}.run", self._jit_module,
                                                          args, variant_kwargs)
        gpu = self._gpu
        if gpu is not None:
            return gpu.run(q, paged_kv_cache, q_scale, k_scale, v_scale, out, lse, return_lse,
                           lse_base, enable_pdl, variant_kwargs, kv_cache_sf)
        refuse_cpu_nvfp4(f"{self._name}.run", self._dtypes, kv_cache_sf)
        variant_arguments(f"{self._name}.run", None, variant_kwargs)
        k_cache, v_cache = split_paged_kv_cache(paged_kv_cache)
        self._check_cpu_run(q, k_cache)
        base2 = check_lse_base(lse_base)
        for name, x in (("paged_kv_cache", k_cache), ("out", out), ("lse", lse)):
            check_cpu_tensor(f"{self._name}.run", name, x)
        batch = self._batch
        out, lse = batch.outputs(q, out, lse, return_lse or lse is not None)
        t = self._tables
        _flare.run_cpu_paged(batch.plan, arg(q), arg(batch.qo_indptr), arg(k_cache),
                             arg(v_cache), self._kv_layout, arg(t["paged_kv_indptr_buf"]),
                             arg(t["paged_kv_indices_buf"]), arg(t["paged_kv_last_page_len_buf"]),
                             batch.make_params(k_scale=scale_or_one(q_scale) *
                                               scale_or_one(k_scale), v_scale=v_scale),
                             arg(out), arg(lse))
        to_lse_base(lse, base2)
        return (out, lse) if return_lse else out

    forward = run

    # FlashInfer's alias: run(..., return_lse=True).
    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill with ragged queries and ragged K/V (kv_indptr); CUDA graphs as for the
    paged wrapper, with qo_indptr_buf and kv_indptr_buf."""

    _name = "BatchPrefillWithRaggedKVCacheWrapper"
    _paged = False
    _names = ("qo_indptr", "kv_indptr", None)
    _engine_names = {}

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, validate=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, validate,
                         jit_args,
                         qo_indptr_buf=qo_indptr_buf, kv_indptr_buf=kv_indptr_buf,
                         custom_mask_buf=custom_mask_buf, mask_indptr_buf=mask_indptr_buf)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, non_blocking=True,
             fixed_split_size=None, disable_split_kv=False, o_data_type=None, variant=None,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0,
             max_item_len_ptr=None, rope_staging="auto"):
        """Schedules one batch on host copies of qo_indptr and kv_indptr (see the paged
        wrapper's plan() for when that synchronizes, for variant, the custom mask and the
        multi-item arguments). rope_staging (flare's, GPU only; the CPU backend ignores it):
        where pos_encoding_mode="ROPE_LLAMA" turns q and k, "fused" in the kernels, "staged"
        into copies run() rotates first (allocated by plan(), grown as batches need: as large
        as q and the planned keys; under use_cuda_graph allocated by the first plan() with room
        for the next power of two of its kv_indptr[-1], which a later plan() may not exceed),
        "auto" staged where the plan's query tiles read each key 1.5 times or more
        (flare/api/batch_prefill.h) and fused under use_cuda_graph."""
        indptrs = (qo_indptr, kv_indptr, None)
        if is_multi_item(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr):
            indptrs, custom_mask, packed_custom_mask, causal = self._multi_item(
                indptrs, 1, custom_mask, packed_custom_mask, prefix_len_ptr,
                token_pos_in_items_ptr, token_pos_in_items_len)
        tables = dict(qo_indptr_buf=qo_indptr, kv_indptr_buf=kv_indptr)
        signature = (num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal,
                     pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
                     logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
                     fixed_split_size, disable_split_kv, o_data_type, variant, rope_staging)
        if self._plan_remembered(signature, custom_mask, packed_custom_mask, indptrs, tables,
                                 non_blocking):
            return
        self._plan(indptrs=indptrs, tables=tables, signature=signature,
                   rope_staging=rope_staging,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                   head_dim_qk=head_dim_qk, head_dim_vo=head_dim_vo, page_size=1,
                   custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
                   causal=causal, pos_encoding_mode=pos_encoding_mode,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                   window_left=window_left, logits_soft_cap=logits_soft_cap,
                   rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                   kv_data_type=kv_data_type, non_blocking=non_blocking,
                   fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                   o_data_type=o_data_type, variant=variant)

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, lse_base="log2", kv_cache_sf=None,
            **variant_kwargs):
        """k, v: [kv_indptr[-1], H_kv, D] (NHD) or [H_kv, kv_indptr[-1], D] (HND); at least
        kv_indptr[-1] tokens (checked). Returns o [total_q, H_qo, D_vo] (and lse [total_q, H_qo]
        float32 with return_lse). Scales, lse_base, enable_pdl, a variant's scalars and
        jit_args' positional arguments as for the paged wrapper. NVFP4 K/V (kv_data_type
        torch.uint8, CUDA): k, v the codes and kv_cache_sf the (k, v) block scales, rows like
        k / v with D / 16 a row."""
        if args:
            variant_kwargs = _flashinfer_jit.run_keywords(f"{self._name}.run", self._jit_module,
                                                          args, variant_kwargs)
        gpu = self._gpu
        if gpu is not None:
            return gpu.run(q, (k, v), q_scale, k_scale, v_scale, out, lse, return_lse, lse_base,
                           enable_pdl, variant_kwargs, kv_cache_sf)
        refuse_cpu_nvfp4(f"{self._name}.run", self._dtypes, kv_cache_sf)
        variant_arguments(f"{self._name}.run", None, variant_kwargs)
        self._check_cpu_run(q, k)
        base2 = check_lse_base(lse_base)
        if self._kv_layout == "HND":  # [H_kv, tokens, D] viewed as [tokens, H_kv, D]
            k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
        for name, x in (("k", k), ("v", v), ("out", out), ("lse", lse)):
            check_cpu_tensor(f"{self._name}.run", name, x)
        batch = self._batch
        out, lse = batch.outputs(q, out, lse, return_lse or lse is not None)
        _flare.run_cpu_ragged(batch.plan, arg(q), arg(batch.qo_indptr), arg(k), arg(v),
                              arg(self._tables["kv_indptr_buf"]),
                              batch.make_params(k_scale=scale_or_one(q_scale) *
                                                scale_or_one(k_scale), v_scale=v_scale),
                              arg(out), arg(lse))
        to_lse_base(lse, base2)
        return (out, lse) if return_lse else out

    forward = run

    # FlashInfer's alias: run(..., return_lse=True).
    run_return_lse = functools.partialmethod(run, return_lse=True)
