"""Paying the JIT up front (flare::precompile, include/flare/api/precompile.h).

flare compiles each kernel it launches with NVRTC on first use (about a second a kernel) and
keeps the cubin in a disk cache ($FLARE_CACHE_DIR, default ~/.cache/flare); later processes
load it in milliseconds. A serving process that wants no compile in its first steps calls
precompile() once at start::

    report = flare.jit.precompile([None, soft_cap, sigmoid], num_qo_heads=32, num_kv_heads=8,
                                  head_dim=128, dtype=torch.bfloat16)

which compiles, in parallel, every kernel the wrappers' plan() may need for each variant
(None: the built-in softmax attention): the decode kernel of each loop and, for prefill, the
merge kernel and the kernel of every tile pair a plan may choose, paged and ragged.

FlashInfer's customized modules: gen_customize_{single,batch}_{decode,prefill}_module take
FlashInfer's arguments (uri, dtypes, head dims, additional tensor / scalar names and dtypes,
variant_name, variant_decl) and return a spec whose build_and_load() gives the module that
flare.{decode,prefill}.single_*_with_kv_cache_with_jit_module and the wrappers' jit_args take;
its variant (module.variant) can be precompiled like any other.
"""

from . import _flare
from ._args import make_params
from ._flashinfer_jit import (gen_customize_batch_decode_module,  # noqa: F401 (FlashInfer's names)
                              gen_customize_batch_prefill_module,
                              gen_customize_single_decode_module,
                              gen_customize_single_prefill_module)
from ._tensors import dtype_name
from .variant import check_variant

KINDS = ("decode", "decode_tensor_cores", "prefill_paged", "prefill_ragged")


def precompile(variants=(None,), *, num_qo_heads, num_kv_heads, head_dim, head_dim_vo=None,
               page_size=16, dtype="bfloat16", kv_dtype=None, kv_layout="NHD", causal=True,
               kinds=KINDS, device=0, num_threads=0):
    """Compiles the kernels of `kinds` (a subset of flare.jit.KINDS) for each of `variants`
    (flare.AttentionVariant, or None for the built-in attention) into the JIT disk cache on
    num_threads threads (0: one per hardware thread), for CUDA device `device`.

    dtype: q's (and the KV cache's unless kv_dtype) dtype; head_dim_vo: prefill only (default
    head_dim); causal: the prefill mask. Returns {"kernels", "compiled", "from_cache",
    "wall_seconds", "compile_seconds"}. ValueError for an unknown kind or a configuration no
    kernel runs (naming it), RuntimeError carrying NVRTC's log for a variant that does not
    compile (after the other kernels finished).
    """
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"precompile: unknown kinds {unknown}; flare.jit.KINDS are {KINDS}")
    q_dtype = dtype_name(dtype)
    kv_dtype = dtype_name(kv_dtype) if kv_dtype is not None else q_dtype
    head_dim_vo = head_dim if head_dim_vo is None else head_dim_vo
    decode, prefill = [], []
    for variant in variants:
        variant = check_variant("flare.jit.precompile", variant, True)
        for kind in kinds:
            if kind.startswith("decode"):
                decode.append(_flare.DecodeConfig(
                    device=device, max_batch=1, num_qo_heads=num_qo_heads,
                    num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                    q_dtype=q_dtype, kv_dtype=kv_dtype, kv_layout=kv_layout,
                    params=make_params(), use_cuda_graph=False, fixed_split_size=0,
                    disable_split_kv=False, use_tensor_cores=kind == "decode_tensor_cores",
                    variant=variant))
            else:
                prefill.append(_flare.PrefillConfig(
                    device=device, max_batch=1, max_total_qo=1, num_qo_heads=num_qo_heads,
                    num_kv_heads=num_kv_heads, head_dim_qk=head_dim, head_dim_vo=head_dim_vo,
                    paged=kind == "prefill_paged", page_size=page_size if kind == "prefill_paged"
                    else 1, kv_layout=kv_layout, dtype=q_dtype, params=make_params(causal=causal),
                    custom_mask=False, use_cuda_graph=False, fixed_split_size=0,
                    disable_split_kv=False, variant=variant))
    return _flare.precompile(decode, prefill, int(device), int(num_threads))
