"""single_prefill_with_kv_cache and its FlashInfer JIT-module entry (public as flare.prefill's):
numpy arrays and CPU tensors run the CPU backend; on the GPU one request is a ragged batch
prefill, planned once per shape so that later calls only run() and a CUDA graph can capture them
(FlashInfer issue #541: torch.compile(mode="reduce-overhead") captures after an eager warm-up).

Each (configuration, qo_len, kv_len) gets its own use_cuda_graph BatchPrefill, planned at its
first call: a captured graph replays that plan for the life of the process, so no other shape
may replan it. A custom mask is packed on the device at every call (device operations only,
which a capture records).
"""

import numpy as np

from . import _flare, _flashinfer_jit
from ._args import (check_backend, check_kv_layout, check_lse_base, check_prefill_plan_args,
                    mask_causal, unsupported)
from ._cpu import pack_custom_mask, refuse_cpu_nvfp4, single_cpu, to_lse_base
from ._prefill_gpu import (check_gpu_support, checked_packed_mask, config_key, launch,
                           new_batch_prefill, pack_bits_on_device)
from ._shape_cache import PlannedByShape
from ._tensors import is_cuda, tensor_dtype, torch_module
from .variant import check_variant, variant_arguments

# At most 8 shapes (flare/_shape_cache.py): each owns a workspace of partial states for two CTAs
# a resident slot (~35 MB at head_dim 128 on an H100). Calls without a mask, variant or NVFP4
# scales are remembered by their raw arguments with (H_qo, D_vo).
_prefills = PlannedByShape(8)


def _mask_bits(where, custom_mask, packed_custom_mask, qo_len, kv_len, device, capturing):
    """The request's mask bits (uint8, at least one byte, FlashInfer's packed layout, little bit
    order) on the device: packed there from a CUDA mask (capturable), else on the host (not
    inside a capture)."""
    torch = torch_module()
    num_bits = qo_len * kv_len
    num_bytes = (num_bits + 7) // 8
    source = packed_custom_mask if packed_custom_mask is not None else custom_mask
    name = "packed_custom_mask" if packed_custom_mask is not None else "custom_mask"
    if not is_cuda(source):
        if capturing:
            raise RuntimeError(f"{where}: {name} is on the host; inside a CUDA graph capture it "
                               "must be a CUDA tensor")
        bits, _ = pack_custom_mask(custom_mask, packed_custom_mask, np.array([qo_len]),
                                   np.array([kv_len]))
        packed = torch.from_numpy(bits[:num_bytes]).to(device)
    elif packed_custom_mask is not None:
        packed = checked_packed_mask(packed_custom_mask, num_bytes)[:num_bytes]
    else:
        flat = custom_mask.reshape(-1)
        if flat.shape[0] != num_bits:
            raise ValueError(f"{where}: custom_mask must have qo_len x kv_len = {num_bits} "
                             f"entries, got {flat.shape[0]} (shape {tuple(custom_mask.shape)})")
        return pack_bits_on_device(flat, num_bytes)
    # The kernel takes a non-null pointer: a mask of no bits is one zero byte.
    return packed if num_bytes > 0 else torch.zeros(1, dtype=torch.uint8, device=device)


def _run_planned(prefill, q, k, v, kv_layout, heads, head_dim_vo, bits, scales, return_lse,
                 lse_base, variant_args, kv_cache_sf):
    torch = torch_module()
    qo_len = q.shape[0]
    out = q.new_empty((qo_len, heads, head_dim_vo))
    lse = q.new_empty((qo_len, heads), dtype=torch.float32) if return_lse else None
    launch(prefill, q, (k, v), None, kv_layout == "HND", out, lse, bits, scales, lse_base, None,
           *variant_args, kv_cache_sf)
    return (out, lse) if return_lse else out


def single_prefill_gpu(where, q, k, v, kv_layout, backend, config, mask, scales, return_lse,
                       lse_base, variant_args, kv_cache_sf, call=None):
    """o (and lse) of one request: q [qo_len, H_qo, D], k / v ragged rows in kv_layout.
    config: GpuPrefill.plan's configuration; mask: (custom_mask, packed_custom_mask) or None;
    scales: (q_scale, k_scale, v_scale), None meaning 1; variant_args: variant_arguments()'s
    (scalars, tensors)."""
    torch = torch_module()
    capturing = torch.cuda.is_current_stream_capturing()
    qo_len = q.shape[0]
    kv_len = k.shape[0] if kv_layout == "NHD" else k.shape[1]
    heads, head_dim_vo = config["num_qo_heads"], config["head_dim_vo"]
    if qo_len == 0:  # nothing to compute
        out = q.new_empty((0, heads, head_dim_vo))
        lse = q.new_empty((0, heads), dtype=torch.float32)
        return (out, lse) if return_lse else out
    prefill, entry = _planned(where, q, k, kv_layout, backend, config, capturing)
    # The mask bits live for the call: a capture keeps them in its pool for the replays.
    bits = None if mask is None else _mask_bits(where, *mask, qo_len, kv_len, q.device,
                                                capturing)
    result = _run_planned(prefill, q, k, v, kv_layout, heads, head_dim_vo, bits, scales,
                          return_lse, lse_base, variant_args, kv_cache_sf)
    if call is not None:  # the call succeeded: its arguments passed every check
        _prefills.remember_call(call, entry, (heads, head_dim_vo))
    return result


def _planned(where, q, k, kv_layout, backend, config, capturing):
    """(The BatchPrefill of one request of q's rows and k's, its _prefills entry): planned at the
    first call of its configuration and lengths; a single plan, never replanned."""
    qo_len = q.shape[0]
    kv_len = k.shape[0] if kv_layout == "NHD" else k.shape[1]
    device = q.device.index or 0

    def make():
        # Device memory of its own (C++), no torch tensor that outlives the call: a warm-up
        # under torch.compile allocates torch tensors from the graph's pool.
        # NVFP4's copy, or staged RoPE's k copy (the shape is fixed: the copies' room is known)
        rope = config["params_kwargs"]["pos_encoding_mode"] == "ROPE_LLAMA"
        staged_kv = max(kv_len, 1) if config["kv_dtype"] == "uint8" or rope else 0
        prefill = new_batch_prefill(device, config, kv_layout, False, True, (0, 0), False,
                                    backend, (1, qo_len, staged_kv), single_plan=True)
        prefill.plan(np.array([0, qo_len], dtype=np.int32),
                     np.array([0, kv_len], dtype=np.int32), None, _flare.current_stream(device))
        return prefill

    entry = (device, kv_layout, backend, config_key(config), qo_len, kv_len)
    return _prefills.get(where, entry, f"qo_len={qo_len}, kv_len={kv_len}", make,
                         capturing), entry


def single_prefill_with_kv_cache(q, k, v, custom_mask=None, packed_custom_mask=None,
                                 causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None,
                                 backend="auto", return_lse=False, lse_base="log2", variant=None,
                                 _jit_arguments=None, k_scale=None, v_scale=None,
                                 kv_cache_sf=None, **variant_kwargs):
    """Prefill attention of one request: q [qo_len, H_qo, D], k/v [kv_len, H_kv, D] (NHD) or
    [H_kv, kv_len, D] (HND). Returns o [qo_len, H_qo, D_vo] (and lse [qo_len, H_qo], base 2
    unless lse_base="ln", with return_lse). custom_mask: bool [qo_len, kv_len];
    packed_custom_mask: its bits, packed little-endian (either replaces causal, as in
    FlashInfer). backend: "auto", or on CUDA "fa2" or "fa3" (flare/_args.py check_backend).
    variant: a flare.AttentionVariant (CUDA tensors), its scalars and tensors as keyword
    arguments.

    k_scale multiplies the logits and v_scale the output (CUDA). NVFP4 K/V (CUDA): k and v
    uint8 E2M1 codes [kv_len, H_kv, D / 2], kv_cache_sf the (k, v) float8_e4m3fn (or uint8)
    block scales [kv_len, H_kv, D / 16], k_scale / v_scale the global scales.

    On the GPU this is a batch prefill of one request on ragged K/V (no copy), planned on the
    host at the first call of each (qo_len, kv_len) and configuration: a CUDA graph can capture
    a later call (torch.compile(mode="reduce-overhead") warms up first). A custom mask inside a
    capture must be a CUDA tensor (packed on the device at every call).
    """
    where = "single_prefill_with_kv_cache"
    call = None
    if variant is None and _jit_arguments is None and not variant_kwargs and \
            custom_mask is None and packed_custom_mask is None and kv_cache_sf is None and \
            is_cuda(q):
        # The checks below passed for these arguments before: run that call's plan.
        call = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, causal,
                kv_layout, pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
                logits_soft_cap, rope_scale, rope_theta, backend)
        known = _prefills.for_call(call, torch_module().cuda.is_current_stream_capturing())
        if known is not None:
            prefill, (heads, head_dim_vo) = known
            return _run_planned(prefill, q, k, v, kv_layout, heads, head_dim_vo, None,
                                (None, k_scale, v_scale), return_lse, lse_base, (None, None), None)
    if _jit_arguments is not None:  # a FlashInfer module's, whose names may be ours (sm_scale)
        variant_kwargs = _jit_arguments
    check_backend(where, backend, is_cuda(q))
    check_kv_layout(kv_layout)
    check_prefill_plan_args(where, pos_encoding_mode, use_fp16_qk_reduction)
    causal = mask_causal(causal, custom_mask, packed_custom_mask)
    base2 = check_lse_base(lse_base)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{where}: q, k, v must be 3-D, got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    params_kwargs = dict(sm_scale=sm_scale, causal=causal, window_left=window_left,
                         logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                         rope_scale=rope_scale, rope_theta=rope_theta)
    variant = check_variant(where, variant, is_cuda(q), causal)
    # Names a missing or unknown argument now (on the CPU too); the GPU run takes them.
    variant_args = variant_arguments(where, variant, variant_kwargs)
    if not is_cuda(q):
        refuse_cpu_nvfp4(where, (None, tensor_dtype(k)), kv_cache_sf)
        if k_scale is not None or v_scale is not None:
            unsupported(where, "k_scale / v_scale", (k_scale, v_scale),
                        "the CPU single prefill takes no fp8 calibration scales")
        out, lse = single_cpu(where, q, k, v, kv_layout, params_kwargs, {}, custom_mask,
                               packed_custom_mask)
        to_lse_base(lse, base2)
        return (out, lse) if return_lse else out

    q_dtype, kv_dtype = tensor_dtype(q), tensor_dtype(k)
    check_gpu_support(where, q_dtype, kv_dtype)
    nvfp4 = kv_dtype == "uint8"
    if nvfp4 != (kv_cache_sf is not None):
        raise ValueError(f"{where}: uint8 (NVFP4) k and v come with kv_cache_sf (their block "
                         "scales), and only they do")
    has_mask = custom_mask is not None or packed_custom_mask is not None
    config = _gpu_config(q, k, v, kv_layout, q_dtype, kv_dtype, has_mask, params_kwargs, variant)
    return single_prefill_gpu(
        where, q, k, v, kv_layout, backend, config,
        (custom_mask, packed_custom_mask) if has_mask else None, (None, k_scale, v_scale),
        return_lse, lse_base, variant_args, kv_cache_sf, call)


def _gpu_config(q, k, v, kv_layout, q_dtype, kv_dtype, has_mask, params_kwargs, variant):
    """GpuPrefill.plan's configuration of one request (checked arguments)."""
    num_kv_heads = k.shape[1] if kv_layout == "NHD" else k.shape[0]
    # NVFP4 codes hold two values a byte: the head dims are twice their last dimension.
    nvfp4 = kv_dtype == "uint8"
    dims = (q.shape[2], 2 * v.shape[2]) if nvfp4 else (q.shape[2], v.shape[2])
    return dict(num_qo_heads=q.shape[1], num_kv_heads=num_kv_heads, head_dim_qk=dims[0],
                head_dim_vo=dims[1], page_size=1, dtype=q_dtype, custom_mask=has_mask,
                fixed_split_size=0, disable_split_kv=False, params_kwargs=params_kwargs,
                variant=variant, kv_dtype=kv_dtype)


def planned_single_prefill(where, q, k, v, kv_layout, use_fp16_qk_reduction, params):
    """For wrappers whose run() includes one request's non-causal prefill over contiguous k / v
    (the shared-prefix wrappers' prefix): after single_prefill_with_kv_cache's checks of CUDA
    q, k, v of 16-bit dtypes, (the planned BatchPrefill or None without query rows,
    (H_qo, D_vo)); run it with launch(). params: sm_scale, rope_scale, rope_theta."""
    check_kv_layout(kv_layout)
    check_prefill_plan_args(where, "NONE", use_fp16_qk_reduction)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{where}: q, k_shared, v_shared must be 3-D, got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    q_dtype, kv_dtype = tensor_dtype(q), tensor_dtype(k)
    check_gpu_support(where, q_dtype, kv_dtype)
    if kv_dtype == "uint8":
        raise ValueError(f"{where}: k_shared / v_shared must be 16-bit, got uint8 (NVFP4 KV "
                         "goes through single_prefill_with_kv_cache with kv_cache_sf)")
    params_kwargs = dict(params, causal=False, window_left=-1, logits_soft_cap=None,
                         pos_encoding_mode="NONE")
    config = _gpu_config(q, k, v, kv_layout, q_dtype, kv_dtype, False, params_kwargs, None)
    dims = (config["num_qo_heads"], config["head_dim_vo"])
    if q.shape[0] == 0:
        return None, dims
    capturing = torch_module().cuda.is_current_stream_capturing()
    return _planned(where, q, k, kv_layout, "auto", config, capturing)[0], dims


def single_prefill_with_kv_cache_with_jit_module(jit_module, q, k, v, *args, kv_layout="NHD",
                                                 mask_mode=0, window_left=-1, return_lse=False):
    """FlashInfer's entry for a customized module (flare.jit.gen_customize_single_prefill_module
    (...).build_and_load()): prefill of one request with the module's variant, its tensors and
    scalars positionally after v; mask_mode FlashInfer's MaskMode value (0 non-causal, 1
    causal). Returns o, or (o, lse) with return_lse (base 2); window_left must stay -1."""
    where = "single_prefill_with_kv_cache_with_jit_module"
    if not isinstance(jit_module, _flashinfer_jit.CustomizedModule):
        raise TypeError(f"{where}: jit_module must come from gen_customize_single_prefill_"
                        f"module(...).build_and_load(), got {type(jit_module).__name__}")
    if mask_mode not in (0, 1):
        raise NotImplementedError(f"{where}: mask_mode={mask_mode}: flare takes 0 (NON_CAUSAL) "
                                  "or 1 (CAUSAL) here; a custom mask goes in the variant")
    if window_left != -1:
        raise NotImplementedError(f"{where}: window_left={window_left} beside a variant_decl: "
                                  "write the window in the variant's LogitsMask")
    jit_module.check(where, q, k)
    return single_prefill_with_kv_cache(q, k, v, causal=mask_mode == 1, kv_layout=kv_layout,
                                        return_lse=return_lse, variant=jit_module.variant,
                                        _jit_arguments=jit_module.arguments(where, args))
