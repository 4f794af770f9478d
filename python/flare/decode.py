"""Decode attention with FlashInfer's interface: BatchDecodeWithPagedKVCacheWrapper and
single_decode_with_kv_cache.

CUDA tensors run flare's GPU BatchDecode (JIT-compiled per configuration, CUDA-graph safe);
numpy arrays and CPU torch tensors run the CPU backend (plan + execute_plan_cpu). The device
of the wrapper is the device of its float_workspace_buffer.

LSE convention: FlashInfer's, base 2 (log2 of the sum of 2^(scaled logit * log2 e)); run()
takes lse_base="ln" for the natural log.
"""

import functools

import numpy as np

from . import _flare, _flashinfer_jit
from ._decode_common import _GpuDecoders, _plan_dtypes, _tensor_core_loop
from ._multi_token_decode import MultiTokenDecode, check_q_len_per_req
from ._single_decode import single_decode_with_kv_cache, single_decode_with_kv_cache_with_jit_module
from ._args import (check_backend, check_kv_layout, check_lse_base, check_o_data_type,
                    check_pos_encoding_mode, make_params, scale_or_one, ResolvedConfigs)
from ._cpu import (CpuBatch, check_cpu_tensor, check_tensor, host_indptr, paged_kv_lengths,
                   to_lse_base)
from ._tensors import (arg, engine_names, host_index, host_int32, next_power_of_two,
                       StagedIndexBuffer, is_cuda, refill_buffers, scratch_of,
                       split_paged_kv_cache, tensor_dtype, torch_module, validate_default)
from .variant import check_variant, variant_arguments

# FlashInfer's flashinfer.decode names that flare has.
__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
           "fast_decode_plan", "single_decode_with_kv_cache",
           "single_decode_with_kv_cache_with_jit_module"]

_WRAPPER = "BatchDecodeWithPagedKVCacheWrapper"
# The engine's names of plan()'s arguments -> FlashInfer's.
_ENGINE_NAMES = {"kv_indptr": "indptr", "kv_last_page_len": "last_page_len"}


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode (one query token per request) against a paged KV cache.

    plan() once per step on host-side lengths, run() per layer. With use_cuda_graph=True the
    batch size is fixed by paged_kv_last_page_len_buffer, plan() puts the page table into the
    fixed buffers, and run() may be captured into a CUDA graph and replayed after later plan()
    calls. run() on a capturing stream of a wrapper created without use_cuda_graph raises.

    float_workspace_buffer fixes the device (CUDA: GPU kernels; CPU: the CPU backend); on CUDA
    it holds the split-KV partial states during run() (4.4 MB at head dim 128 and 8 query heads
    per KV head on an H100 for the default schedule; fixed_split_size plans need one slot per
    chunk: FlashInfer's 128 MB hold tens of thousands). use_tensor_cores=True runs q and KV of one
    float16 / bfloat16 type, and fp8 KV with either q, through the tensor-core loop of the
    decode kernel (mma.sync; faster at large head groups); mixed float16 / bfloat16 pairs run
    on CUDA cores. Both loops fuse the query heads of a KV head; their results differ by
    rounding. With pos_encoding_mode="ROPE_LLAMA" the tensor-core loop costs 1-8% over plain
    decode and the CUDA-core loop 38-46% (it is issue-bound without RoPE; docs/perf.md, fortieth
    session F): pass use_tensor_cores=True for fused RoPE. With use_tensor_cores=True,
    plan(q_len_per_req=n > 1) takes n query tokens per request (speculative-decoding
    verification: q [batch * n, H_qo, D], causal within a request's rows) and backend="fa3" runs
    on the Hopper family: both, as in FlashInfer, through the paged prefill kernels
    (flare/_multi_token_decode.py). validate=True (or
    FLARE_VALIDATE=1) checks every page id on the host before each run() (a synchronizing debug
    mode); otherwise out-of-range ids are skipped by the kernel and check() raises for them.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, validate=None):
        self._cuda = is_cuda(float_workspace_buffer)
        # fa3: FlashInfer's tensor-core decode on its Hopper prefill kernels (flare's likewise).
        check_backend(_WRAPPER, backend, self._cuda,
                      families=("fa2", "fa3") if use_tensor_cores else ("fa2",))
        self._backend = backend
        # FlashInfer's customized module (gen_customize_batch_decode_module's arguments): its
        # variant is what plan() compiles, its extra arguments come positionally to run().
        self._jit_module = _flashinfer_jit.wrapper_module("batch_decode", backend, jit_args)
        self._kv_layout = check_kv_layout(kv_layout)
        self._workspace = float_workspace_buffer
        self._use_cuda_graph = bool(use_cuda_graph)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._validate = validate_default(validate)
        buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer,
                   paged_kv_last_page_len_buffer)
        if self._use_cuda_graph:
            if not self._cuda:
                raise ValueError("use_cuda_graph=True needs a CUDA float_workspace_buffer")
            if any(b is None for b in buffers):
                raise ValueError(
                    "use_cuda_graph=True needs paged_kv_indptr_buffer, paged_kv_indices_buffer "
                    "and paged_kv_last_page_len_buffer (fixed for the wrapper's life)")
            for name, buffer in zip(("paged_kv_indptr_buffer", "paged_kv_indices_buffer",
                                     "paged_kv_last_page_len_buffer"), buffers):
                if not is_cuda(buffer) or buffer.device != float_workspace_buffer.device:
                    raise ValueError(f"{name} must be a CUDA tensor on "
                                     f"{float_workspace_buffer.device}")
                if buffer.dtype != torch_module().int32 or buffer.ndim != 1:
                    raise ValueError(f"{name} must be a 1-D int32 tensor")
            self._fixed_batch = paged_kv_last_page_len_buffer.shape[0]
            if paged_kv_indptr_buffer.shape[0] != self._fixed_batch + 1:
                raise ValueError(
                    f"paged_kv_indptr_buffer must have batch + 1 = {self._fixed_batch + 1} "
                    f"entries, got {paged_kv_indptr_buffer.shape[0]}")
        elif any(b is not None for b in buffers):
            raise ValueError("the paged_kv_*_buffer arguments are for use_cuda_graph=True")
        self._indptr_buf, self._indices_buf, self._last_page_len_buf = buffers
        self._staging = _flare.IndexStaging()  # plan() refills the fixed buffers through it
        self._page_ids = StagedIndexBuffer(float_workspace_buffer)  # non-graph host page ids
        self._scratch = scratch_of(float_workspace_buffer, _WRAPPER) if self._cuda else None
        self._decoders = _GpuDecoders()
        self._resolved = ResolvedConfigs()  # plan()'s configuration arguments -> _resolve()
        self._graph_key = None
        self._planned = None
        # The paged prefill behind q_len_per_req > 1 and backend="fa3" plans (MultiTokenDecode),
        # created at the first of them; set while the last plan() was one of them.
        self._multi = None
        self._multi_planned = None
        self._graph_q_len = None  # a use_cuda_graph wrapper's q_len_per_req, fixed by plan()
        self._planned_once = False  # a plan() succeeded (fast_decode_plan's prior plan)
        # GPU run(): (decoder, page ids on the device, out shape, lse shape), set by plan().
        self._gpu = None

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
             disable_split_kv=False, o_data_type=None, variant=None, q_len_per_req=1):
        """Schedules one decode step on host-side lengths.

        indptr and last_page_len are read on the host: pass CPU tensors (as serving loops
        keep them) and plan() never synchronizes; CUDA tensors are copied to the host once,
        which synchronizes with their stream (as in FlashInfer). indices stays on the device
        (copied there asynchronously when given on the host). fixed_split_size cuts every
        request's KV at the same token positions whatever the batch: each request's output and
        lse are then bitwise identical alone or in any batch (batch invariance). variant: a
        flare.AttentionVariant compiled in place of the built-in terms (pos_encoding_mode,
        window_left and logits_soft_cap must then stay off); its scalars go to run().
        q_len_per_req > 1 (use_tensor_cores=True, not fa3): that many query tokens per request,
        every request's KV holding at least that many; a use_cuda_graph wrapper keeps the value
        of its first plan().
        """
        q_len = check_q_len_per_req(f"{_WRAPPER}.plan", q_len_per_req, self._use_tensor_cores,
                                    self._backend)
        if self._use_cuda_graph:
            if self._graph_q_len is not None and q_len != self._graph_q_len:
                raise ValueError(
                    f"{_WRAPPER}.plan: q_len_per_req is part of the frozen CUDA-graph shape: "
                    f"this wrapper was planned with {self._graph_q_len}, got {q_len}; use a "
                    "separate wrapper per q_len_per_req")
        variant = _flashinfer_jit.plan_variant(f"{_WRAPPER}.plan", self._jit_module, variant)
        if q_len > 1 or self._backend == "fa3":
            self._plan_multi_token(q_len, indptr, indices, last_page_len, num_qo_heads,
                                   num_kv_heads, head_dim, page_size, q_data_type, kv_data_type,
                                   data_type, non_blocking, variant,
                                   dict(pos_encoding_mode=pos_encoding_mode,
                                        window_left=window_left, logits_soft_cap=logits_soft_cap,
                                        sm_scale=sm_scale, rope_scale=rope_scale,
                                        rope_theta=rope_theta, fixed_split_size=fixed_split_size,
                                        disable_split_kv=disable_split_kv,
                                        o_data_type=o_data_type))
            return
        self._multi_planned = None
        signature = (num_qo_heads, num_kv_heads, head_dim, page_size, pos_encoding_mode,
                     window_left, logits_soft_cap, q_data_type, kv_data_type, data_type,
                     sm_scale, rope_scale, rope_theta, fixed_split_size, disable_split_kv,
                     o_data_type, variant)
        if self._cuda:
            resolved = self._resolved.get(signature)
            if resolved is None:
                resolved = self._resolve(signature, num_qo_heads, num_kv_heads, head_dim,
                                         page_size, pos_encoding_mode, window_left,
                                         logits_soft_cap, q_data_type, kv_data_type, data_type,
                                         sm_scale, rope_scale, rope_theta, fixed_split_size,
                                         disable_split_kv, o_data_type, variant)
            return self._plan_gpu(resolved, indptr, indices, last_page_len, non_blocking)
        check_pos_encoding_mode(pos_encoding_mode)
        q_dtype, kv_dtype = _plan_dtypes(q_data_type, kv_data_type, data_type)
        check_o_data_type(f"{_WRAPPER}.plan", o_data_type, q_dtype)
        check_variant(f"{_WRAPPER}.plan", variant, self._cuda)
        self._gpu = None
        indptr_host = host_indptr(indptr, "indptr")
        last_host = host_int32(last_page_len, "last_page_len")
        batch = indptr_host.shape[0] - 1
        kv_len = paged_kv_lengths(indptr_host, last_host, int(page_size))
        qo_indptr = np.arange(batch + 1, dtype=np.int32)
        params_kwargs = dict(sm_scale=sm_scale, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                             rope_scale=rope_scale, rope_theta=rope_theta)
        self._planned = dict(
            batch=batch, q_dtype=q_dtype, kv_dtype=kv_dtype,
            cpu=CpuBatch(qo_indptr=qo_indptr, kv_len=kv_len, num_qo_heads=int(num_qo_heads),
                         num_kv_heads=int(num_kv_heads), head_dim_qk=int(head_dim),
                         head_dim_vo=int(head_dim), page_size=int(page_size),
                         params_kwargs=params_kwargs, fixed_split_size=fixed_split_size,
                         disable_split_kv=disable_split_kv),
            tables=(indptr_host, host_int32(indices, "indices"), last_host))
        self._planned_once = True

    def _resolve(self, signature, num_qo_heads, num_kv_heads, head_dim, page_size,
                 pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type,
                 data_type, sm_scale, rope_scale, rope_theta, fixed_split_size, disable_split_kv,
                 o_data_type, variant):
        """Checks plan()'s configuration arguments and resolves them to (key, dtypes, heads and
        head_dim, make(capacity) -> BatchDecode); kept by `signature`, so that the next plan() of
        the configuration (every step of a serving loop) checks nothing but the index arrays."""
        where = f"{_WRAPPER}.plan"
        check_pos_encoding_mode(pos_encoding_mode)
        q_dtype, kv_dtype = _plan_dtypes(q_data_type, kv_data_type, data_type)
        check_o_data_type(where, o_data_type, q_dtype)
        variant = check_variant(where, variant, self._cuda)
        num_qo_heads, num_kv_heads = int(num_qo_heads), int(num_kv_heads)
        head_dim, page_size = int(head_dim), int(page_size)
        params = make_params(sm_scale=sm_scale, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                             rope_scale=rope_scale, rope_theta=rope_theta)
        fixed_split_size = 0 if fixed_split_size is None else int(fixed_split_size)
        tensor_cores = _tensor_core_loop(self._use_tensor_cores, q_dtype, kv_dtype, head_dim)
        key = (q_dtype, kv_dtype, num_qo_heads, num_kv_heads, head_dim, page_size,
               sm_scale, window_left, logits_soft_cap, pos_encoding_mode, rope_scale, rope_theta,
               fixed_split_size, bool(disable_split_kv), tensor_cores,
               None if variant is None else variant.key())
        device = self._workspace.device.index or 0
        scratch, scratch_bytes = self._scratch

        def make(capacity):
            return _flare.BatchDecode(_flare.DecodeConfig(
                device=device, max_batch=capacity, num_qo_heads=num_qo_heads,
                num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                q_dtype=q_dtype, kv_dtype=kv_dtype, kv_layout=self._kv_layout,
                params=params, use_cuda_graph=self._use_cuda_graph,
                fixed_split_size=fixed_split_size, disable_split_kv=bool(disable_split_kv),
                use_tensor_cores=tensor_cores, scratch=scratch, scratch_bytes=scratch_bytes,
                validate_indices=self._validate, variant=variant))

        resolved = (key, q_dtype, kv_dtype, (num_qo_heads, head_dim), variant, make, device)
        self._resolved.put(signature, resolved)
        return resolved

    def _plan_gpu(self, resolved, indptr, indices, last_page_len, non_blocking):
        key, q_dtype, kv_dtype, (num_qo_heads, head_dim), variant, make, device = resolved
        self._gpu = None
        # The engine reads (and checks) the host arrays without a copy.
        indptr_host = host_index(indptr, "indptr")
        last_host = host_index(last_page_len, "last_page_len")
        batch = indptr_host.shape[0] - 1
        if self._use_cuda_graph:
            # A captured run launches one decoder's kernels: a plan for another configuration
            # would never reach the graph.
            if self._graph_key is not None and key != self._graph_key:
                raise ValueError(
                    f"a use_cuda_graph {_WRAPPER} keeps the heads, head_dim, page_size, "
                    "dtypes and attention options of its first plan(); create another "
                    "wrapper for a different configuration")
            if batch != self._fixed_batch:
                raise ValueError(
                    f"the batch size of a use_cuda_graph wrapper is fixed at {self._fixed_batch} "
                    f"(paged_kv_last_page_len_buffer), got {batch}")
            max_batch = self._fixed_batch
        else:
            max_batch = next_power_of_two(batch)
        decoder = self._decoders.get(key, max_batch, make)
        stream = _flare.current_stream(device)
        try:
            decoder.plan(indptr_host, last_host, stream)
        except ValueError as error:
            raise engine_names(error, _ENGINE_NAMES) from None
        page_ids = self._device_indices(indices, indptr_host, last_host, non_blocking, stream)
        if self._use_cuda_graph:
            self._graph_key = key
            self._graph_q_len = 1
        self._planned = dict(batch=batch, q_dtype=q_dtype, kv_dtype=kv_dtype)
        self._gpu = (decoder, page_ids, (batch, num_qo_heads, head_dim), (batch, num_qo_heads),
                     variant)
        self._planned_once = True

    begin_forward = plan

    def _plan_multi_token(self, q_len, indptr, indices, last_page_len, num_qo_heads,
                          num_kv_heads, head_dim, page_size, q_data_type, kv_data_type,
                          data_type, non_blocking, variant, options):
        self._gpu = None
        self._planned = None
        self._multi_planned = None
        q_dtype, kv_dtype = _plan_dtypes(q_data_type, kv_data_type, data_type)
        if self._multi is None:
            graph_buffers = ((self._indptr_buf, self._indices_buf, self._last_page_len_buf)
                             if self._use_cuda_graph else None)
            # FlashInfer's tensor-core decode runs its fa2 prefill unless fa3 is named.
            backend = self._backend if self._backend == "fa3" else "fa2" if self._cuda else "auto"
            self._multi = MultiTokenDecode(self._workspace, self._kv_layout, backend,
                                           self._validate, graph_buffers)
        self._multi.plan(q_len, indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                         head_dim, page_size, q_dtype=q_dtype, kv_dtype=kv_dtype,
                         non_blocking=non_blocking, variant=variant, **options)
        self._multi_planned = self._multi
        self._planned_once = True
        if self._use_cuda_graph:
            self._graph_q_len = q_len

    def _device_indices(self, indices, indptr_host, last_host, non_blocking, stream):
        """The page ids run() reads, on the device: the fixed buffer under CUDA graphs (the
        other two buffers get the host arrays, as FlashInfer fills them; the kernel takes page
        ranges and lengths from the plan). Nothing is copied that is already in place; the
        three copies are one extension call (refill_buffers)."""
        if not self._use_cuda_graph:
            return self._page_ids(indices, "indices", self._staging, stream, non_blocking)
        num_indices = int(indptr_host[-1])
        if num_indices > self._indices_buf.shape[0]:
            raise ValueError(
                f"indptr[-1]={num_indices} pages exceed paged_kv_indices_buffer's "
                f"{self._indices_buf.shape[0]} entries")
        refill_buffers((
            (self._indices_buf, "paged_kv_indices_buffer", indices, "indices", num_indices),
            (self._indptr_buf, "paged_kv_indptr_buffer", indptr_host, "indptr", -1),
            (self._last_page_len_buf, "paged_kv_last_page_len_buffer", last_host,
             "last_page_len", -1)), non_blocking, self._staging, stream)
        return self._indices_buf

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, lse_base="log2", q_len_per_req=None,
            kv_cache_sf=None, **variant_kwargs):
        """o [batch, H_qo, D] (and lse [batch, H_qo] float32 with return_lse) for the plan
        ([batch * q_len_per_req, ...] for a plan of several tokens per request; q_len_per_req
        given here must be the plan's, FlashInfer's deprecated spelling).

        q_scale and k_scale multiply the logits, v_scale the output (fp8 calibration scales),
        inside the kernel. lse is base 2 (FlashInfer's) unless lse_base="ln". enable_pdl: the
        kernel may start while the previous kernel on the stream ends (sm_90+; None: on
        where the GPU has it, as FlashInfer). A planned variant's scalars come as keyword
        arguments (cap=30.0); with jit_args, the module's tensors and scalars come positionally
        after paged_kv_cache, as in FlashInfer. NVFP4 KV (plan(kv_data_type=torch.uint8)):
        paged_kv_cache holds the E2M1 codes (uint8, D / 2 a row), kv_cache_sf their
        float8_e4m3fn block scales (D / 16 a row; a (k, v) pair or one [pages, 2, ...] tensor),
        k_scale / v_scale the global decode scales; it runs on the CUDA-core loop whatever
        use_tensor_cores says (a hint in FlashInfer too: the results agree).
        """
        if args:
            variant_kwargs = _flashinfer_jit.run_keywords(f"{_WRAPPER}.run", self._jit_module,
                                                          args, variant_kwargs)
        if q_len_per_req is not None:  # FlashInfer's deprecated spelling: must be the plan's
            planned_q_len = 1 if self._multi_planned is None else self._multi_planned.q_len
            if q_len_per_req != planned_q_len:
                raise ValueError(f"{_WRAPPER}.run: q_len_per_req={q_len_per_req} but plan() used "
                                 f"{planned_q_len}; re-plan with the matching q_len_per_req")
        gpu = self._gpu
        if gpu is not None:  # the hot path: one extension call, every check O(1)
            decoder, page_ids, out_shape, lse_shape, variant = gpu
            try:
                if out is None:
                    out = q.new_empty(out_shape)
                if lse is None and return_lse:
                    lse = q.new_empty(lse_shape, dtype=torch_module().float32)
            except AttributeError:
                raise TypeError(f"{_WRAPPER}.run: q must be a torch tensor on "
                                f"{self._workspace.device}, got {type(q).__name__}") from None
            scalars, tensors = (
                (None, None) if variant is None and not variant_kwargs
                else variant_arguments(f"{_WRAPPER}.run", variant, variant_kwargs))
            # Defaults spelled out: each helper call would cost ~0.1 us on this path.
            decoder.run(q, paged_kv_cache, page_ids, out, lse,
                        1.0 if q_scale is None else float(q_scale),
                        1.0 if k_scale is None else float(k_scale),
                        1.0 if v_scale is None else float(v_scale),
                        True if lse_base == "log2" else check_lse_base(lse_base),
                        True if enable_pdl is None else bool(enable_pdl), scalars, tensors,
                        kv_cache_sf)
            return (out, lse) if return_lse else out
        multi = self._multi_planned
        if multi is not None:
            if kv_cache_sf is not None:
                raise NotImplementedError(f"{_WRAPPER}.run: kv_cache_sf (NVFP4 KV) with several "
                                          "query tokens per request (q_len_per_req > 1)")
            return multi.run(q, paged_kv_cache, args, dict(
                q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out, lse=lse,
                return_lse=return_lse, enable_pdl=enable_pdl, lse_base=lse_base,
                **variant_kwargs))
        if variant_kwargs:
            variant_arguments(f"{_WRAPPER}.run", None, variant_kwargs)  # raises
        planned = self._planned
        if planned is None:
            raise RuntimeError(f"{_WRAPPER}.run() needs a plan(): call plan() first")
        if self._cuda:
            raise RuntimeError(f"{_WRAPPER}.run(): the plan has no GPU schedule")
        k_cache, v_cache = split_paged_kv_cache(paged_kv_cache)
        for name, x in (("q", q), ("paged_kv_cache", k_cache)):
            check_tensor(f"{_WRAPPER}.run", name, x)
            check_cpu_tensor(f"{_WRAPPER}.run", name, x)
        if tensor_dtype(q) != planned["q_dtype"]:
            raise ValueError(f"q has dtype {tensor_dtype(q)} but plan() was given "
                             f"q_data_type={planned['q_dtype']}")
        if planned["kv_dtype"] == "uint8" or kv_cache_sf is not None:
            raise NotImplementedError(f"{_WRAPPER}.run: NVFP4 KV (kv_data_type uint8, "
                                      "kv_cache_sf) runs on CUDA devices only")
        if tensor_dtype(k_cache) != planned["kv_dtype"]:
            raise ValueError(f"paged_kv_cache has dtype {tensor_dtype(k_cache)} but plan() was "
                             f"given kv_data_type={planned['kv_dtype']}")
        base2 = check_lse_base(lse_base)
        cpu = planned["cpu"]
        want_lse = return_lse or lse is not None
        out, lse = cpu.outputs(q, out, lse, want_lse)
        indptr, indices, last_page_len = planned["tables"]
        params = cpu.make_params(k_scale=scale_or_one(q_scale) * scale_or_one(k_scale),
                                 v_scale=v_scale)
        _flare.run_cpu_paged(cpu.plan, arg(q), arg(cpu.qo_indptr), arg(k_cache), arg(v_cache),
                             self._kv_layout, arg(indptr), arg(indices), arg(last_page_len),
                             params, arg(out), arg(lse))
        if lse is not None:
            to_lse_base(lse, base2)
        return (out, lse) if return_lse else out

    forward = run

    # FlashInfer's alias: run(..., return_lse=True).
    run_return_lse = functools.partialmethod(run, return_lse=True)

    def check(self):
        """Synchronizes the device and raises IndexError naming the first page id (request,
        indices entry, value) that the kernels found outside the KV cache since the last
        check(); clears it. Nothing to check on the CPU backend (it validates up front)."""
        for decoder in self._decoders.values():
            decoder.check(_WRAPPER, "indices")
        if self._multi is not None:
            self._multi.check()


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: BatchDecodeWithPagedKVCacheWrapper with
    use_cuda_graph=True and its three fixed index buffers given positionally."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer,
                 kv_layout="NHD", use_tensor_cores=False):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores, paged_kv_indptr_buffer=indptr_buffer,
                         paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                     q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
                     disable_split_kv=False, q_len_per_req=1, global_override_indptr_cpu=None):
    """FlashInfer's fast_decode_plan(wrapper, ...) (`wrapper.plan = partial(fast_decode_plan,
    wrapper)`): wrapper.plan() with the same arguments. FlashInfer's version skips copies its
    plan() makes; flare's plan() makes none of them (it reads the host lengths in place and puts
    only the page ids on the device), so the two are one. global_override_indptr_cpu, when
    given, is the host copy of indptr that plan() reads. q_len_per_req > 1 needs a prior plan()
    of the wrapper (FlashInfer's rule: that plan resolves the backend)."""
    if q_len_per_req != 1 and not self._planned_once:
        raise ValueError("fast_decode_plan with q_len_per_req > 1 needs a prior plan() of the "
                         "wrapper (it resolves the backend, as in FlashInfer)")
    if global_override_indptr_cpu is not None:
        indptr = global_override_indptr_cpu
    # The class's plan(), not self.plan: FlashInfer's idiom `wrapper.plan =
    # partial(fast_decode_plan, wrapper)` replaces the instance's attribute with this function.
    type(self).plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                    page_size, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                    logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                    kv_data_type=kv_data_type,
                    data_type=data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                    rope_theta=rope_theta, non_blocking=non_blocking,
                    fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                    q_len_per_req=q_len_per_req)
