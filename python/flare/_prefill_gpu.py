"""The GPU side of the prefill wrappers: flare BatchPrefill objects per configuration, the
index arrays and the custom mask on the device (the fixed buffers under CUDA graphs), and the
run() call. Reached only with CUDA tensors, so the caller has imported torch.
"""

import numpy as np

from . import _flare
from ._args import check_lse_base, make_params, unsupported
from ._cpu import pack_custom_mask
from ._tensors import (StagedIndexBuffer, is_cuda, is_torch, next_power_of_two, refill_buffers,
                       scratch_of, torch_module)
from .variant import variant_arguments

_GPU_DTYPES = ("float16", "bfloat16")
_INT32_MAX = np.iinfo(np.int32).max


def check_gpu_support(where, q_dtype, kv_dtype):
    """NotImplementedError naming the argument BatchPrefill does not run. kv_dtype "uint8" is
    NVFP4 (codes with kv_cache_sf block scales: converted in shared memory by the FA2 family's
    kernels, or staged to 16 bits by run() for the Hopper family)."""
    if q_dtype not in _GPU_DTYPES:
        unsupported(where, "q_data_type", q_dtype, "the GPU prefill runs float16 and bfloat16")
    if kv_dtype != q_dtype and kv_dtype != "uint8":
        unsupported(where, "kv_data_type", kv_dtype,
                    f"the GPU prefill reads K/V in q's dtype ({q_dtype}) or NVFP4 (uint8); no "
                    "fp8 KV")


class _Prefills:
    """flare BatchPrefill objects by configuration: each compiles its kernels once and owns a
    workspace whose address never changes (what a captured CUDA graph replays against).
    Capacities grow by powers of two, so a serving loop settles on a few objects."""

    def __init__(self):
        self._by_key = {}

    def values(self):
        return self._by_key.values()

    def fitting(self, key, max_batch, max_total_qo, max_total_kv=0):
        """The prefill of `key` when it holds these capacities, else None (max_total_kv: the
        staged pages or rows of NVFP4 KV, 0 otherwise)."""
        prefill = self._by_key.get(key)
        if (prefill is None or prefill.max_batch < max_batch or
                prefill.max_total_qo < max_total_qo or prefill.max_total_kv < max_total_kv):
            return None
        return prefill

    def get(self, key, max_batch, max_total_qo, max_total_kv, make):
        prefill = self._by_key.get(key)
        if (prefill is None or prefill.max_batch < max_batch or
                prefill.max_total_qo < max_total_qo or prefill.max_total_kv < max_total_kv):
            if prefill is not None:  # keep what the old one held, grow what it lacked
                max_batch = max(max_batch, prefill.max_batch)
                max_total_qo = max(max_total_qo, prefill.max_total_qo)
                max_total_kv = max(max_total_kv, prefill.max_total_kv)
            prefill = make(max_batch, max_total_qo, max_total_kv)
            self._by_key[key] = prefill
        return prefill


def pack_bits_on_device(bits, num_bytes, positions=None):
    """uint8 [max(num_bytes, 1)] on bits' device: the nonzero entries of `bits` (a CUDA tensor)
    as set bits, little bit order, entry i at bit positions[i] (default i). Device operations
    only: a CUDA graph can capture it."""
    torch = torch_module()
    device = bits.device
    padded = torch.zeros(8 * max(num_bytes, 1), dtype=torch.uint8, device=device)
    if positions is None:
        padded[:bits.shape[0]] = bits != 0
    else:
        padded[positions] = (bits != 0).to(torch.uint8)
    shifts = torch.arange(8, dtype=torch.int32, device=device)
    return (padded.view(-1, 8).to(torch.int32) << shifts).sum(1).to(torch.uint8)


def checked_packed_mask(packed_custom_mask, num_bytes):
    """packed_custom_mask (torch or numpy) as a flat uint8 tensor where it is; ValueError unless
    it holds num_bytes."""
    torch = torch_module()
    packed = packed_custom_mask if is_torch(packed_custom_mask) else torch.from_numpy(
        np.ascontiguousarray(packed_custom_mask, dtype=np.uint8))
    packed = packed.reshape(-1)
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed_custom_mask must be uint8, got {packed.dtype}")
    if packed.shape[0] < num_bytes:
        raise ValueError(
            f"packed_custom_mask must have at least {num_bytes} bytes (the requests' "
            f"qo_len x kv_len bits, padded per request), got {packed.shape[0]}")
    return packed


def mask_on_device(custom_mask, packed_custom_mask, qo_len, kv_len, like):
    """(bits uint8, mask_indptr int32) on like's device in FlashInfer's segment_packbits layout:
    request i's qo_len x kv_len row-major bits, little bit order, from byte mask_indptr[i],
    padded to whole bytes. A CUDA bool mask is packed on the device (no synchronization); a
    host one on the host, then copied."""
    torch = torch_module()
    device = like.device
    sizes = qo_len.astype(np.int64) * kv_len.astype(np.int64)
    byte_indptr = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum((sizes + 7) // 8, out=byte_indptr[1:])
    if byte_indptr[-1] > _INT32_MAX:
        raise ValueError("the packed custom mask exceeds 2^31 bytes")
    total_bytes = int(byte_indptr[-1])
    indptr = torch.from_numpy(byte_indptr.astype(np.int32)).to(device, non_blocking=True)
    if packed_custom_mask is not None:
        packed = checked_packed_mask(packed_custom_mask, total_bytes)
        if packed.shape[0] == 0:  # the kernel takes a non-null pointer
            packed = torch.zeros(1, dtype=torch.uint8)
        return packed.to(device, non_blocking=True).contiguous(), indptr
    if not is_cuda(custom_mask):
        bits, _ = pack_custom_mask(custom_mask, None, qo_len, kv_len)
        if bits.shape[0] == 0:
            bits = np.zeros(1, dtype=np.uint8)
        return torch.from_numpy(bits).to(device, non_blocking=True), indptr
    flat = custom_mask.reshape(-1)
    total_bits = int(sizes.sum())
    if flat.shape[0] != total_bits:
        raise ValueError(f"custom_mask must have {total_bits} entries (sum of qo_len x kv_len), "
                         f"got {flat.shape[0]}")
    # Bit b of request i goes to bit 8 * byte_indptr[i] + b of the packed array.
    bit_indptr = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bit_indptr[1:])
    shift = torch.from_numpy(8 * byte_indptr[:-1] - bit_indptr[:-1]).to(device)
    positions = torch.arange(total_bits, device=device) + torch.repeat_interleave(
        shift, torch.from_numpy(sizes).to(device), output_size=total_bits)
    return pack_bits_on_device(flat, total_bytes, positions), indptr


def config_key(config):
    """The identity of a BatchPrefill configuration (GpuPrefill.plan's config) as a tuple in a
    fixed order: plan() looks its prefill up by it on every call."""
    params = config["params_kwargs"]
    variant = config["variant"]
    return (config["num_qo_heads"], config["num_kv_heads"], config["head_dim_qk"],
            config["head_dim_vo"], config["page_size"], config["dtype"],
            config.get("kv_dtype", config["dtype"]), config["custom_mask"],
            config["fixed_split_size"], config["disable_split_kv"], params["sm_scale"],
            params["causal"], params["window_left"], params["logits_soft_cap"],
            params["pos_encoding_mode"], params["rope_scale"], params["rope_theta"],
            None if variant is None else variant.key(), config.get("rope_staging", "auto"))


def _check_buffer(name, buffer, workspace, dtype):
    torch = torch_module()
    if not is_cuda(buffer) or buffer.device != workspace.device:
        raise ValueError(f"{name} must be a CUDA tensor on {workspace.device}")
    if buffer.dtype != getattr(torch, dtype) or buffer.ndim != 1:
        raise ValueError(f"{name} must be a 1-D {dtype} tensor")


def new_batch_prefill(device, config, kv_layout, paged, use_cuda_graph, scratch, validate,
                      backend, capacities, max_levels=1, single_plan=False):
    """A flare BatchPrefill of `config` (GpuPrefill.plan's configuration); scratch: the
    caller's (device pointer, bytes) for partial states, (0, 0) for a workspace of its own;
    capacities: (max_batch, max_total_qo, max_total_kv); max_levels > 1 for plan_cascade;
    single_plan: planned once (BatchPrefillConfig::single_plan: no merge launch where that plan
    splits nothing)."""
    max_batch, max_total_qo, max_total_kv = capacities
    return _flare.BatchPrefill(_flare.PrefillConfig(
        device=device, max_batch=max_batch, max_total_qo=max_total_qo,
        num_qo_heads=config["num_qo_heads"], num_kv_heads=config["num_kv_heads"],
        head_dim_qk=config["head_dim_qk"], head_dim_vo=config["head_dim_vo"], paged=paged,
        page_size=config["page_size"], kv_layout=kv_layout, dtype=config["dtype"],
        params=make_params(**config["params_kwargs"]), custom_mask=config["custom_mask"],
        use_cuda_graph=use_cuda_graph, fixed_split_size=config["fixed_split_size"],
        disable_split_kv=config["disable_split_kv"], scratch=scratch[0],
        scratch_bytes=scratch[1], validate_indices=validate, variant=config["variant"],
        backend=backend, kv_dtype=config.get("kv_dtype", config["dtype"]),
        max_total_kv=max_total_kv, max_levels=max_levels,
        rope_staging=config.get("rope_staging", "auto"), single_plan=single_plan))


def launch(prefill, q, kv, page_ids, hnd, out, lse, mask_bits, scales, lse_base, enable_pdl,
           scalars, tensors, kv_cache_sf, sink=None):
    """One planned BatchPrefill's run: kv the paged cache (page_ids set) or the (k, v) pair of
    ragged rows (hnd: [H_kv, rows, D]); scales (q_scale, k_scale, v_scale), None meaning 1;
    sink: float32 [H_qo] attention-sink logits on q's device, or None.
    Positional, and the defaults spelled out: each keyword or helper call costs ~0.1 us."""
    q_scale, k_scale, v_scale = scales
    q_scale = 1.0 if q_scale is None else float(q_scale)
    k_scale = 1.0 if k_scale is None else float(k_scale)
    v_scale = 1.0 if v_scale is None else float(v_scale)
    base2 = True if lse_base == "log2" else check_lse_base(lse_base)
    pdl = True if enable_pdl is None else bool(enable_pdl)
    if page_ids is not None:
        prefill.run_paged(q, kv, page_ids, out, lse, mask_bits, q_scale, k_scale, v_scale, base2,
                          pdl, scalars, tensors, kv_cache_sf, sink)
    else:
        prefill.run_ragged(q, kv[0], kv[1], hnd, out, lse, mask_bits, q_scale, k_scale, v_scale,
                           base2, pdl, scalars, tensors, kv_cache_sf, sink)


class GpuPrefill:
    """One prefill wrapper's GPU state: plan() picks (or creates) the BatchPrefill of the
    configuration, schedules it and puts the page ids and the mask bits on the device; run()
    launches through one extension call.

    Under use_cuda_graph the batch size is len(qo_indptr_buf) - 1, the first plan() fixes the
    configuration and the largest total query length (FlashInfer's rule), plan() fills the
    fixed buffers, and run() may be captured and replayed after later plan() calls.
    """

    def __init__(self, where, workspace, kv_layout, paged, use_cuda_graph, buffers,
                 validate=False, scratch=True, backend="auto"):
        self._where = where
        self._backend = backend
        self._workspace = workspace
        self._device = workspace.device.index or 0
        self._kv_layout = kv_layout
        self._paged = paged
        self._use_cuda_graph = use_cuda_graph
        self._buffers = buffers
        self._staging = _flare.IndexStaging()  # plan() refills the fixed buffers through it
        self._page_ids = StagedIndexBuffer(workspace)  # outside CUDA graphs: host page ids
        self._validate = validate
        # single_prefill_with_kv_cache has no workspace of the caller's: its prefills own one.
        self._scratch = scratch_of(workspace, where) if scratch else (0, 0)
        self._prefills = _Prefills()
        self._graph_key = None
        self._graph_max_total_qo = None
        self._graph_max_total_kv = None
        # run(): (prefill or None, page ids, mask bits, out shape, lse shape), set by plan().
        self.planned = None
        if not use_cuda_graph:
            given = [name for name, b in buffers.items() if b is not None]
            if given:
                raise ValueError(f"{where}: {', '.join(given)} are for use_cuda_graph=True")
            return
        required = ["qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                    "paged_kv_last_page_len_buf"] if paged else ["qo_indptr_buf",
                                                                 "kv_indptr_buf"]
        missing = [name for name in required if buffers[name] is None]
        if missing:
            raise ValueError(f"{where}: use_cuda_graph=True needs {', '.join(missing)} (fixed "
                             "for the wrapper's life)")
        for name, buffer in buffers.items():
            if buffer is not None:
                _check_buffer(name, buffer, workspace,
                              "uint8" if name == "custom_mask_buf" else "int32")
        if (buffers["custom_mask_buf"] is None) != (buffers["mask_indptr_buf"] is None):
            raise ValueError(f"{where}: custom_mask_buf and mask_indptr_buf go together")
        self._fixed_batch = buffers["qo_indptr_buf"].shape[0] - 1
        for name in required[1:2] + ["mask_indptr_buf"]:
            buffer = buffers[name]
            if buffer is not None and buffer.shape[0] != self._fixed_batch + 1:
                raise ValueError(f"{name} must have batch + 1 = {self._fixed_batch + 1} entries "
                                 f"like qo_indptr_buf, got {buffer.shape[0]}")
        if paged and buffers["paged_kv_last_page_len_buf"].shape[0] != self._fixed_batch:
            raise ValueError(f"paged_kv_last_page_len_buf must have batch = {self._fixed_batch} "
                             f"entries, got {buffers['paged_kv_last_page_len_buf'].shape[0]}")

    def plan(self, hosts, kv_len, sources, mask, config, non_blocking, key=None):
        """Schedules one batch.

        hosts: (qo_indptr, kv_indptr, kv_last_page_len or None for ragged KV) on the host as
        the extension reads them (host_index); kv_len(): KV tokens per request (numpy), asked
        only for a custom mask; sources: the caller's index arrays by the name of their
        CUDA-graph buffer (host or device); mask: the (custom_mask, packed_custom_mask) pair or
        None; config: the BatchPrefill keywords that are not capacities; key: config_key(config)
        when the caller keeps it.
        """
        qo_host, kv_host, last_host = hosts
        batch = qo_host.shape[0] - 1
        total_qo = int(qo_host[-1]) if batch >= 0 else 0
        if key is None:
            key = config_key(config)
        total_kv = int(kv_host[-1]) if batch >= 0 else 0
        nvfp4 = config.get("kv_dtype") == "uint8"
        # Staged RoPE under CUDA graphs rotates k into a copy whose room is fixed at creation,
        # like NVFP4's: the first plan's, so only where the caller asks for "staged" (ragged
        # graph wrappers take no bound on the KV tokens; "auto" stays fused there).
        rope_copy = (self._use_cuda_graph and not self._paged
                     and config.get("rope_staging") == "staged"
                     and config["params_kwargs"]["pos_encoding_mode"] == "ROPE_LLAMA")
        staged_copy = nvfp4 or rope_copy
        if self._use_cuda_graph:
            if batch != self._fixed_batch:
                raise ValueError(f"the batch size of a use_cuda_graph wrapper is fixed at "
                                 f"{self._fixed_batch} (qo_indptr_buf), got {batch}")
            if self._graph_key is None:
                capacity = (self._fixed_batch, max(total_qo, 1))
            elif key != self._graph_key:
                raise ValueError(
                    f"a use_cuda_graph {self._where} keeps the heads, head dims, page size, "
                    "dtype, mask kind and attention options of its first plan(); create "
                    "another wrapper for a different configuration")
            elif staged_copy and total_kv > self._graph_max_total_kv:
                what = "NVFP4 KV" if nvfp4 else "rotated k (rope_staging='staged')"
                raise ValueError(
                    f"kv_indptr[-1]={total_kv} exceeds the {self._graph_max_total_kv} "
                    f"{'pages' if self._paged else 'tokens'} of {what} the first plan() of "
                    "this use_cuda_graph wrapper staged room for (paged: the length of "
                    "paged_kv_indices_buf; ragged: plan the largest KV first)")
            elif total_qo > self._graph_max_total_qo:
                raise ValueError(
                    f"qo_indptr[-1]={total_qo} query tokens exceed the "
                    f"{self._graph_max_total_qo} of the first plan() of this use_cuda_graph "
                    "wrapper (FlashInfer's rule: plan the largest batch first)")
            else:
                capacity = (self._fixed_batch, self._graph_max_total_qo)
        else:
            capacity = (next_power_of_two(batch), next_power_of_two(total_qo))
        # NVFP4's staged KV and staged RoPE's k copy under graphs: the first graph plan's room
        # for every later one (paged: the fixed page-id buffer's pages), else powers of two.
        staged_kv = 0
        if staged_copy and self._use_cuda_graph and self._graph_key is not None:
            staged_kv = self._graph_max_total_kv
        elif nvfp4 and self._use_cuda_graph and self._paged:
            staged_kv = max(int(self._buffers["paged_kv_indices_buf"].shape[0]), total_kv, 1)
        elif staged_copy:
            staged_kv = next_power_of_two(max(total_kv, 1))
        capacity += (staged_kv,)
        mask_bits = None
        if mask is not None:
            qo_len = np.diff(np.asarray(qo_host, dtype=np.int64))
            mask_bits = mask_on_device(*mask, qo_len, kv_len(), self._workspace)
        page_ids, mask_bits = self._device_tables(sources, mask_bits, non_blocking)
        prefill = None
        if batch >= 1 and (total_qo > 0 or self._use_cuda_graph):
            prefill = self._prefills.fitting(key, *capacity)
            if prefill is None:
                prefill = self._prefill(key, config, *capacity)
            prefill.plan(qo_host, kv_host, last_host, _flare.current_stream(self._device))
        if self._use_cuda_graph and self._graph_key is None:  # the first plan() succeeded
            self._graph_key, self._graph_max_total_qo = key, capacity[1]
            self._graph_max_total_kv = capacity[2]
        # Under CUDA graphs the outputs follow q's rows (a captured q is sized for the largest
        # batch); otherwise the plan's.
        rows = None if self._use_cuda_graph else total_qo
        self.planned = (prefill, page_ids, mask_bits[0] if mask_bits is not None else None,
                        rows, (config["num_qo_heads"], config["head_dim_vo"]), config["variant"])

    def _prefill(self, key, config, max_batch, max_total_qo, max_total_kv):
        def make(capacity_batch, capacity_total_qo, capacity_total_kv):
            return new_batch_prefill(self._device, config, self._kv_layout, self._paged,
                                     self._use_cuda_graph, self._scratch, self._validate,
                                     self._backend,
                                     (capacity_batch, capacity_total_qo, capacity_total_kv))

        return self._prefills.get(key, max_batch, max_total_qo, max_total_kv, make)

    def _device_tables(self, sources, mask_bits, non_blocking):
        """The page ids (paged KV) and the mask bits on the device for run(): the fixed buffers
        under CUDA graphs, refilled in place (the other buffers get the caller's arrays, as
        FlashInfer fills them; the kernels read the plan's copies)."""
        if not self._use_cuda_graph:
            page_ids = (self._page_ids(sources["paged_kv_indices_buf"], "paged_kv_indices",
                                       self._staging, _flare.current_stream(self._device),
                                       non_blocking) if self._paged else None)
            return page_ids, mask_bits
        refill_buffers([(self._buffers[name], name, source, name.removesuffix("_buf"), -1)
                        for name, source in sources.items()], non_blocking, self._staging,
                       _flare.current_stream(self._device))
        page_ids = self._buffers["paged_kv_indices_buf"] if self._paged else None
        if mask_bits is None:
            return page_ids, None
        bits_buf, indptr_buf = self._buffers["custom_mask_buf"], self._buffers["mask_indptr_buf"]
        if bits_buf is None:
            raise ValueError(f"a custom mask under use_cuda_graph needs the custom_mask_buf and "
                             f"mask_indptr_buf of {self._where}'s constructor")
        bits, indptr = mask_bits
        if bits.shape[0] > bits_buf.shape[0]:
            raise ValueError(f"the packed custom mask has {bits.shape[0]} bytes, more than "
                             f"custom_mask_buf's {bits_buf.shape[0]}")
        bits_buf[:bits.shape[0]].copy_(bits, non_blocking=non_blocking)
        indptr_buf.copy_(indptr, non_blocking=non_blocking)
        return page_ids, (bits_buf, indptr_buf)

    def run(self, q, kv, q_scale, k_scale, v_scale, out, lse, return_lse, lse_base, enable_pdl,
            variant_kwargs, kv_cache_sf=None, sink=None):
        """o [total_q, H_qo, D_vo] (and lse) for the plan: one extension call. kv is the
        paged_kv_cache argument, or the (k, v) pair of ragged rows; variant_kwargs: run()'s
        keyword arguments beyond FlashInfer's (a planned variant's scalars). Positional, and
        the defaults spelled out: each keyword or helper call costs ~0.1 us on this path.
        kv_cache_sf: NVFP4 KV's block scales (paged: a (k, v) pair or one [pages, 2, ...]
        tensor; ragged: a (k, v) pair), None otherwise. sink: the attention-sink wrapper's
        float32 [H_qo] logits on q's device (the kernels add them to each final row), or None."""
        planned = self.planned
        if planned is None:
            raise RuntimeError(f"{self._where}.run() needs a plan(): call plan() first")
        prefill, page_ids, mask_bits, rows, (heads, head_dim_vo), variant = planned
        try:
            if rows is None:
                rows = q.shape[0]
            if out is None:
                out = q.new_empty((rows, heads, head_dim_vo))
            if lse is None and return_lse:
                lse = q.new_empty((rows, heads), dtype=torch_module().float32)
        except AttributeError:
            raise TypeError(f"{self._where}.run: q must be a torch tensor on "
                            f"{self._workspace.device}, got {type(q).__name__}") from None
        scalars, tensors = ((None, None) if variant is None and not variant_kwargs
                            else variant_arguments(f"{self._where}.run", variant, variant_kwargs))
        if prefill is None:  # no query token: nothing to compute
            return (out, lse) if return_lse else out
        launch(prefill, q, kv, page_ids, self._kv_layout == "HND", out, lse, mask_bits,
               (q_scale, k_scale, v_scale), lse_base, enable_pdl, scalars, tensors, kv_cache_sf,
               sink)
        return (out, lse) if return_lse else out

    def check(self):
        for prefill in self._prefills.values():
            prefill.check(self._where, "paged_kv_indices" if self._paged else "kv_indptr")
