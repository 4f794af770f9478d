"""single_decode_with_kv_cache (and its FlashInfer customized-module entry): decode of one
request, on the GPU a batch decode of one request over k and v viewed as pages of one token."""

import numpy as np

from . import _flare, _flashinfer_jit
from ._args import (check_kv_layout, check_lse_base, check_pos_encoding_mode, make_params,
                    pdl_flag, scale_or_one)
from ._cpu import single_cpu, to_lse_base
from ._decode_common import _tensor_core_loop
from ._shape_cache import PlannedByShape
from ._tensors import is_cuda, tensor_dtype, torch_module
from .variant import check_variant, variant_arguments

# Decoders of single calls by (configuration, kv_len): use_cuda_graph BatchDecode objects planned
# once, when created, with their page ids (flare/_shape_cache.py); calls without a variant are
# remembered by their raw arguments with (H_qo, D).
_single_decoders = PlannedByShape(16)


def _run_planned(planned, q, k, v, kv_layout, heads, head_dim, scales, return_lse, base2,
                 enable_pdl, scalars, tensors):
    """o (and lse) of a planned (decoder, page ids 0 .. kv_len - 1): the extension views q as a
    batch of one and k and v as pages of one token (no copy, no torch view call)."""
    out = q.new_empty((heads, head_dim))
    lse = q.new_empty((heads,), dtype=torch_module().float32) if return_lse else None
    decoder, indices = planned
    decoder.run_single(q, k, v, kv_layout == "HND", indices, out, lse, *scales, base2,
                       pdl_flag(enable_pdl), scalars, tensors)
    return (out, lse) if return_lse else out


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE",
                                use_tensor_cores=False, q_scale=None, k_scale=None,
                                v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None,
                                return_lse=False, enable_pdl=None, lse_base="log2",
                                variant=None, _jit_arguments=None, **variant_kwargs):
    """Decode attention of one request: q [H_qo, D], k/v [kv_len, H_kv, D] (NHD) or
    [H_kv, kv_len, D] (HND). Returns o [H_qo, D] (and lse [H_qo], base 2 unless
    lse_base="ln", with return_lse). variant: a flare.AttentionVariant (CUDA tensors), its
    scalars and tensors as keyword arguments.

    On the GPU this is a batch decode of one request viewing k and v as pages of one token
    (no copy), planned on the host at the first call of each kv_len (and configuration): a
    CUDA graph can capture a later call (torch.compile(mode="reduce-overhead") warms up first).
    """
    where = "single_decode_with_kv_cache"
    call = None
    if variant is None and _jit_arguments is None and not variant_kwargs and is_cuda(q):
        # The checks below passed for these arguments before: run that call's plan.
        call = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
                kv_layout, pos_encoding_mode, use_tensor_cores, window_left, logits_soft_cap,
                sm_scale, rope_scale, rope_theta)
        known = _single_decoders.for_call(call, torch_module().cuda.is_current_stream_capturing())
        if known is not None:
            planned, (heads, head_dim) = known
            return _run_planned(planned, q, k, v, kv_layout, heads, head_dim,
                                (scale_or_one(q_scale), scale_or_one(k_scale),
                                 scale_or_one(v_scale)), return_lse, check_lse_base(lse_base),
                                enable_pdl, None, None)
    if _jit_arguments is not None:  # a FlashInfer module's, whose names may be ours (sm_scale)
        variant_kwargs = _jit_arguments
    check_kv_layout(kv_layout)
    check_pos_encoding_mode(pos_encoding_mode)
    base2 = check_lse_base(lse_base)
    if q.ndim != 2 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{where}: q must be [H_qo, D] and k, v 3-D, got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if v.shape[:2] != k.shape[:2]:  # the GPU decode would read only the pages both hold
        raise ValueError(f"{where}: v must have k's tokens and heads (k {tuple(k.shape)}, "
                         f"{kv_layout}), got v {tuple(v.shape)}")
    kv_len = k.shape[0] if kv_layout == "NHD" else k.shape[1]
    num_kv_heads = k.shape[1] if kv_layout == "NHD" else k.shape[0]
    num_qo_heads, head_dim = q.shape
    params_kwargs = dict(sm_scale=sm_scale, window_left=window_left,
                         logits_soft_cap=logits_soft_cap, pos_encoding_mode=pos_encoding_mode,
                         rope_scale=rope_scale, rope_theta=rope_theta)
    q_batch = q[None]
    variant = check_variant(where, variant, is_cuda(q))
    scalars, tensors = variant_arguments(where, variant, variant_kwargs)
    if not is_cuda(q):
        out, lse = single_cpu(where, q_batch, k, v, kv_layout, params_kwargs,
                               dict(k_scale=scale_or_one(q_scale) * scale_or_one(k_scale),
                                    v_scale=v_scale))
        to_lse_base(lse, base2)
        return (out[0], lse[0]) if return_lse else out[0]

    torch = torch_module()
    q_dtype, kv_dtype = tensor_dtype(q), tensor_dtype(k)
    tensor_cores = _tensor_core_loop(use_tensor_cores, q_dtype, kv_dtype, head_dim)
    key = (q.device.index, q_dtype, kv_dtype, num_qo_heads, num_kv_heads, head_dim, kv_layout,
           tuple(sorted(params_kwargs.items())), tensor_cores,
           None if variant is None else variant.key())
    device = q.device.index or 0

    def make():
        decoder = _flare.BatchDecode(_flare.DecodeConfig(
            device=device, max_batch=1, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, page_size=1, q_dtype=q_dtype, kv_dtype=kv_dtype,
            kv_layout=kv_layout, params=make_params(**params_kwargs), use_cuda_graph=True,
            fixed_split_size=0, disable_split_kv=False, use_tensor_cores=tensor_cores,
            variant=variant))
        decoder.plan(np.array([0, kv_len], dtype=np.int32),
                     np.array([1] if kv_len > 0 else [0], dtype=np.int32),
                     _flare.current_stream(device))
        # The page ids in flare's own device memory, kept with the plan (a torch tensor made
        # here could come from a CUDA graph's pool under torch.compile's warm-up).
        return decoder, _flare.identity_page_ids(device, kv_len)

    entry = (key, kv_len)
    planned = _single_decoders.get(where, entry, f"kv_len={kv_len}", make,
                                   torch.cuda.is_current_stream_capturing())
    result = _run_planned(planned, q, k, v, kv_layout, num_qo_heads, head_dim,
                          (scale_or_one(q_scale), scale_or_one(k_scale), scale_or_one(v_scale)),
                          return_lse, base2, enable_pdl, scalars, tensors)
    if call is not None:  # the call succeeded: its arguments passed every check
        _single_decoders.remember_call(call, entry, (num_qo_heads, head_dim))
    return result


def single_decode_with_kv_cache_with_jit_module(jit_module, q, k, v, *args, kv_layout="NHD",
                                                window_left=-1, return_lse=False):
    """FlashInfer's entry for a customized module (flare.jit.gen_customize_single_decode_module
    (...).build_and_load()): decode of one request with the module's variant, its tensors and
    scalars positionally after v. Returns o only, as FlashInfer does (return_lse is accepted
    and the lse dropped); window_left must stay -1 (write it in the variant)."""
    where = "single_decode_with_kv_cache_with_jit_module"
    if not isinstance(jit_module, _flashinfer_jit.CustomizedModule):
        raise TypeError(f"{where}: jit_module must come from gen_customize_single_decode_module"
                        f"(...).build_and_load(), got {type(jit_module).__name__}")
    if window_left != -1:
        raise NotImplementedError(f"{where}: window_left={window_left} beside a variant_decl: "
                                  "write the window in the variant's LogitsMask")
    jit_module.check(where, q, k)
    return single_decode_with_kv_cache(q, k, v, kv_layout=kv_layout, variant=jit_module.variant,
                                       _jit_arguments=jit_module.arguments(where, args))
