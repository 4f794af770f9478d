"""Decode attention with FlashInfer's interface: BatchDecodeWithPagedKVCacheWrapper and
single_decode_with_kv_cache.

CUDA tensors run flare's GPU BatchDecode (JIT-compiled per configuration, CUDA-graph safe);
numpy arrays and CPU torch tensors run the CPU backend (plan + execute_plan_cpu). The device
of the wrapper is the device of its float_workspace_buffer.

LSE convention: flare's LSE is the natural-log sum of exp of the scaled logits (FlashInfer's
kernels return base 2); flare's merge functions take flare's LSE.
"""

import numpy as np

from . import _flare
from ._args import (check_backend, check_kv_layout, check_pos_encoding_mode, make_params,
                    reject_unless_none)
from ._cpu import CpuBatch, check_cpu_tensor, host_indptr, paged_kv_lengths
from ._tensors import (arg, as_device_int32, device_guard, device_of, dtype_name, empty,
                       host_int32, is_capturing, is_cuda, is_torch, split_paged_kv_cache,
                       stream_of, tensor_dtype, torch_module)

_WRAPPER = "BatchDecodeWithPagedKVCacheWrapper"


def _next_power_of_two(n):
    return 1 << max(0, int(n) - 1).bit_length()


class _GpuDecoders:
    """flare BatchDecode objects by configuration: each compiles its kernels once and owns a
    workspace whose address never changes (what a captured CUDA graph replays against)."""

    def __init__(self):
        self._by_key = {}

    def get(self, key, max_batch, make):
        decoder = self._by_key.get(key)
        if decoder is None or decoder.max_batch < max_batch:
            decoder = make(max_batch)
            self._by_key[key] = decoder
        return decoder


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode (one query token per request) against a paged KV cache.

    plan() once per step on host-side lengths, run() per layer. With use_cuda_graph=True the
    batch size is fixed by paged_kv_last_page_len_buffer, plan() copies the page table into the
    three fixed buffers, and run() may be captured into a CUDA graph and replayed after later
    plan() calls. run() on a capturing stream of a wrapper created without use_cuda_graph
    raises RuntimeError.

    float_workspace_buffer fixes the device (CUDA: GPU kernels; CPU: the CPU backend); flare
    sizes its own device workspace from the plan's bounds, so the buffer's memory is not used.
    use_tensor_cores=True runs q and KV of one float16 / bfloat16 type, and fp8 KV with either
    q, through the tensor-core loop of the decode kernel (mma.sync; faster at large head
    groups: 15% at 8 query heads per KV head on an H100, 42% on an H200; fp8 KV is memory-bound
    there, issue-bound on CUDA cores); mixed float16 / bfloat16 pairs run on CUDA cores. Both
    loops fuse the query heads of a KV head; their results differ by rounding (the tensor-core
    loop rounds probabilities to KV's type, float16 for fp8 KV, before P.V).
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto"):
        check_backend(_WRAPPER, backend)
        self._kv_layout = check_kv_layout(kv_layout)
        self._workspace = float_workspace_buffer
        self._cuda = is_cuda(float_workspace_buffer)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._use_tensor_cores = bool(use_tensor_cores)
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
        self._decoders = _GpuDecoders()
        self._graph_key = None
        self._planned = None

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, data_type=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
             disable_split_kv=False):
        """Schedules one decode step on host-side lengths.

        indptr and last_page_len are read on the host: pass CPU tensors (as serving loops
        keep them) and plan() never synchronizes; CUDA tensors are copied to the host once,
        which synchronizes with their stream (as in FlashInfer). indices stays on the device
        (copied there asynchronously when given on the host).
        """
        check_pos_encoding_mode(pos_encoding_mode)
        if data_type is not None:  # FlashInfer's deprecated alias of q_data_type and kv_data_type
            q_data_type = data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dtype = dtype_name(q_data_type)
        kv_dtype = dtype_name(kv_data_type) if kv_data_type is not None else q_dtype
        indptr_host = host_indptr(indptr, "indptr")
        last_host = host_int32(last_page_len, "last_page_len")
        batch = indptr_host.shape[0] - 1
        params_kwargs = dict(sm_scale=sm_scale, window_left=window_left,
                             logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                             rope_scale=rope_scale, rope_theta=rope_theta)
        planned = dict(batch=batch, num_qo_heads=int(num_qo_heads),
                       num_kv_heads=int(num_kv_heads), head_dim=int(head_dim),
                       page_size=int(page_size), q_dtype=q_dtype, kv_dtype=kv_dtype,
                       params_kwargs=params_kwargs)
        if not self._cuda:
            kv_len = paged_kv_lengths(indptr_host, last_host, int(page_size))
            qo_indptr = np.arange(batch + 1, dtype=np.int32)
            planned["cpu"] = CpuBatch(
                qo_indptr=qo_indptr, kv_len=kv_len, num_qo_heads=num_qo_heads,
                num_kv_heads=num_kv_heads, head_dim_qk=head_dim, head_dim_vo=head_dim,
                page_size=page_size, params_kwargs=params_kwargs,
                fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)
            planned["tables"] = (indptr_host, host_int32(indices, "indices"), last_host)
            self._planned = planned
            return
        if is_capturing(self._workspace):
            raise RuntimeError(
                f"{_WRAPPER}.plan() must not be called while capturing a CUDA graph: call it "
                "before capture and between replays")
        with device_guard(self._workspace):
            tables = self._device_tables(indptr, indices, last_page_len, indptr_host, last_host,
                                         non_blocking)
            tensor_cores = _tensor_core_loop(self._use_tensor_cores, q_dtype, kv_dtype)
            key = (q_dtype, kv_dtype, int(num_qo_heads), int(num_kv_heads), int(head_dim),
                   int(page_size), self._kv_layout, tuple(sorted(params_kwargs.items())),
                   fixed_split_size, bool(disable_split_kv), tensor_cores)
            if self._use_cuda_graph:
                # A captured run launches one decoder's kernels on its workspace: a plan for
                # another configuration would never reach the graph.
                if self._graph_key is not None and key != self._graph_key:
                    raise ValueError(
                        f"a use_cuda_graph {_WRAPPER} keeps the heads, head_dim, page_size, "
                        "dtypes and attention options of its first plan(); create another "
                        "wrapper for a different configuration")
                self._graph_key = key
            max_batch = self._fixed_batch if self._use_cuda_graph else _next_power_of_two(
                max(batch, 1))
            device = device_of(self._workspace)[1]

            def make(capacity):
                return _flare.BatchDecode(
                    device=device, max_batch=capacity, num_qo_heads=int(num_qo_heads),
                    num_kv_heads=int(num_kv_heads), head_dim=int(head_dim),
                    page_size=int(page_size), q_dtype=q_dtype, kv_dtype=kv_dtype,
                    kv_layout=self._kv_layout, params=make_params(**params_kwargs),
                    use_cuda_graph=self._use_cuda_graph,
                    fixed_split_size=0 if fixed_split_size is None else int(fixed_split_size),
                    disable_split_kv=bool(disable_split_kv), use_tensor_cores=tensor_cores)

            decoder = self._decoders.get(key, max_batch, make)
            decoder.plan(arg(indptr_host), arg(last_host), stream_of(self._workspace))
        planned["decoder"] = decoder
        planned["tables"] = tables
        self._planned = planned

    begin_forward = plan

    def _device_tables(self, indptr, indices, last_page_len, indptr_host, last_host,
                       non_blocking):
        """The page table on the device for run(): the fixed buffers under CUDA graphs."""
        batch = indptr_host.shape[0] - 1
        if not self._use_cuda_graph:
            ws = self._workspace
            return (as_device_int32(indptr, ws), as_device_int32(indices, ws),
                    as_device_int32(last_page_len, ws))
        if batch != self._fixed_batch:
            raise ValueError(
                f"the batch size of a use_cuda_graph wrapper is fixed at {self._fixed_batch} "
                f"(paged_kv_last_page_len_buffer), got {batch}")
        torch = torch_module()
        num_indices = int(indptr_host[-1])
        if num_indices > self._indices_buf.shape[0]:
            raise ValueError(
                f"indptr[-1]={num_indices} pages exceed paged_kv_indices_buffer's "
                f"{self._indices_buf.shape[0]} entries")
        source = indices if is_torch(indices) else torch.from_numpy(
            np.ascontiguousarray(indices, dtype=np.int32))
        self._indices_buf[:num_indices].copy_(source[:num_indices], non_blocking=non_blocking)
        self._indptr_buf.copy_(torch.from_numpy(indptr_host), non_blocking=non_blocking)
        self._last_page_len_buf.copy_(torch.from_numpy(last_host), non_blocking=non_blocking)
        return (self._indptr_buf, self._indices_buf, self._last_page_len_buf)

    def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False):
        """o [batch, H_qo, D] (and lse [batch, H_qo] float32 with return_lse) for the plan.

        k_scale and v_scale (fp8 caches: stored value x scale = real value) are applied
        exactly by the kernel (GPU) or the CPU backend.
        """
        reject_unless_none(f"{_WRAPPER}.run", q_scale=q_scale)
        planned = self._planned
        if planned is None:
            raise RuntimeError(f"{_WRAPPER}.run() needs a plan(): call plan() first")
        k_cache, v_cache = split_paged_kv_cache(paged_kv_cache)
        if tensor_dtype(q) != planned["q_dtype"]:
            raise ValueError(f"q has dtype {tensor_dtype(q)} but plan() was given "
                             f"q_data_type={planned['q_dtype']}")
        if tensor_dtype(k_cache) != planned["kv_dtype"]:
            raise ValueError(f"paged_kv_cache has dtype {tensor_dtype(k_cache)} but plan() was "
                             f"given kv_data_type={planned['kv_dtype']}")
        want_lse = return_lse or lse is not None
        if not self._cuda:
            return self._run_cpu(planned, q, k_cache, v_cache, k_scale, v_scale, out, lse,
                                 return_lse)
        if is_capturing(q) and not self._use_cuda_graph:
            raise RuntimeError(
                f"{_WRAPPER} created with use_cuda_graph=False is being captured into a CUDA "
                "graph: create it with use_cuda_graph=True and fixed paged_kv_*_buffer tensors")
        if not is_cuda(q) or q.device != self._workspace.device:
            raise ValueError(f"q must be on {self._workspace.device} (the workspace's device), "
                             f"got {getattr(q, 'device', 'a numpy array')}")
        batch = planned["batch"]
        shape = (batch, planned["num_qo_heads"], planned["head_dim"])
        if out is None:
            out = empty(shape, q.dtype, like=q)
        if want_lse and lse is None:
            lse = empty(shape[:2], "float32", like=q)
        indptr, indices, last_page_len = planned["tables"]
        with device_guard(q):
            planned["decoder"].run(arg(q), arg(k_cache), arg(v_cache), arg(indptr),
                                   arg(indices), arg(last_page_len), arg(out), arg(lse),
                                   stream_of(q),
                                   k_scale=1.0 if k_scale is None else float(k_scale),
                                   v_scale=1.0 if v_scale is None else float(v_scale))
        return (out, lse) if return_lse else out

    forward = run

    def _run_cpu(self, planned, q, k_cache, v_cache, k_scale, v_scale, out, lse, return_lse):
        for name, x in (("q", q), ("paged_kv_cache", k_cache)):
            check_cpu_tensor(f"{_WRAPPER}.run", name, x)
        cpu = planned["cpu"]
        out, lse = cpu.outputs(q, out, lse, return_lse)
        indptr, indices, last_page_len = planned["tables"]
        params = cpu.make_params(k_scale=k_scale, v_scale=v_scale)
        _flare.run_cpu_paged(cpu.plan, arg(q), arg(cpu.qo_indptr), arg(k_cache), arg(v_cache),
                             self._kv_layout, arg(indptr), arg(indices), arg(last_page_len),
                             params, arg(out), arg(lse))
        return (out, lse) if return_lse else out


_single_decoders = _GpuDecoders()


def _tensor_core_loop(use_tensor_cores, q_dtype, kv_dtype):
    """Whether the use_tensor_cores hint selects the tensor-core loop: it takes q and KV of one
    float16 / bfloat16 type, and fp8 KV with either q; mixed 16-bit pairs run on CUDA cores."""
    sixteen_bit = ("float16", "bfloat16")
    fp8 = kv_dtype in ("e4m3", "e5m2") and q_dtype in sixteen_bit
    return bool(use_tensor_cores) and ((q_dtype == kv_dtype and kv_dtype in sixteen_bit) or fp8)


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE",
                                use_tensor_cores=False, q_scale=None, k_scale=None,
                                v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None,
                                return_lse=False):
    """Decode attention of one request: q [H_qo, D], k/v [kv_len, H_kv, D] (NHD) or
    [H_kv, kv_len, D] (HND). Returns o [H_qo, D] (and lse [H_qo] with return_lse).

    On the GPU this is a batch decode of one request viewing k and v as pages of one token
    (no copy); it plans on the host, so it cannot be captured into a CUDA graph.
    """
    where = "single_decode_with_kv_cache"
    reject_unless_none(where, q_scale=q_scale)
    check_kv_layout(kv_layout)
    check_pos_encoding_mode(pos_encoding_mode)
    if q.ndim != 2 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{where}: q must be [H_qo, D] and k, v 3-D, got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    kv_len = k.shape[0] if kv_layout == "NHD" else k.shape[1]
    num_kv_heads = k.shape[1] if kv_layout == "NHD" else k.shape[0]
    num_qo_heads, head_dim = q.shape
    params_kwargs = dict(sm_scale=sm_scale, window_left=window_left,
                         logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                         rope_scale=rope_scale, rope_theta=rope_theta)
    q_batch = q[None]
    if not is_cuda(q):
        from .prefill import _single_cpu

        out, lse = _single_cpu(where, q_batch, k, v, kv_layout, params_kwargs,
                               dict(k_scale=k_scale, v_scale=v_scale))
        return (out[0], lse[0]) if return_lse else out[0]

    if is_capturing(q):
        raise RuntimeError(f"{where} plans on the host and cannot be captured into a CUDA "
                           "graph: use BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)")
    torch = torch_module()
    # Pages of one token: NHD [kv_len, 1, H_kv, D], HND [kv_len, H_kv, 1, D]; views, no copy.
    if kv_layout == "NHD":
        k_pages, v_pages = k.unsqueeze(1), v.unsqueeze(1)
    else:
        k_pages, v_pages = k.transpose(0, 1).unsqueeze(2), v.transpose(0, 1).unsqueeze(2)
    indptr_host = np.array([0, kv_len], dtype=np.int32)
    last_host = np.array([1] if kv_len > 0 else [0], dtype=np.int32)
    q_dtype, kv_dtype = tensor_dtype(q), tensor_dtype(k)
    tensor_cores = _tensor_core_loop(use_tensor_cores, q_dtype, kv_dtype)
    key = (q.device.index, q_dtype, kv_dtype, num_qo_heads, num_kv_heads, head_dim, kv_layout,
           tuple(sorted(params_kwargs.items())), tensor_cores)
    device = device_of(q)[1]
    with device_guard(q):
        decoder = _single_decoders.get(key, 1, lambda capacity: _flare.BatchDecode(
            device=device, max_batch=capacity, num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=1, q_dtype=q_dtype,
            kv_dtype=kv_dtype, kv_layout=kv_layout, params=make_params(**params_kwargs),
            use_cuda_graph=False, fixed_split_size=0, disable_split_kv=False,
            use_tensor_cores=tensor_cores))
        stream = stream_of(q)
        decoder.plan(arg(indptr_host), arg(last_host), stream)
        indices = torch.arange(kv_len, dtype=torch.int32, device=q.device)
        indptr = torch.from_numpy(indptr_host).to(q.device, non_blocking=True)
        last = torch.from_numpy(last_host).to(q.device, non_blocking=True)
        out = empty((1, num_qo_heads, head_dim), q.dtype, like=q)
        lse = empty((1, num_qo_heads), "float32", like=q) if return_lse else None
        decoder.run(arg(q_batch), arg(k_pages), arg(v_pages), arg(indptr), arg(indices),
                    arg(last), arg(out), arg(lse), stream,
                    k_scale=1.0 if k_scale is None else float(k_scale),
                    v_scale=1.0 if v_scale is None else float(v_scale))
    return (out[0], lse[0]) if return_lse else out[0]
