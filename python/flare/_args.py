"""Checks and translations of FlashInfer's keyword arguments shared by the wrappers.

An argument flare does not support yet raises NotImplementedError naming it; none is ignored.
"""

from . import _flare

KV_LAYOUTS = ("NHD", "HND")
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")


def unsupported(where, name, value, why=""):
    detail = f": {why}" if why else ""
    raise NotImplementedError(
        f"{where}: argument {name}={value!r} is not supported by flare yet{detail}")


def reject_unless_none(where, **arguments):
    """NotImplementedError for the first argument that is not None."""
    for name, value in arguments.items():
        if value is not None:
            unsupported(where, name, _short(value))


def check_kv_layout(kv_layout):
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout


# FlashInfer's attention backends: "fa2" and "fa3" are flare's two prefill kernel families; the
# others name kernel families flare does not have.
_OTHER_BACKENDS = ("cudnn", "trtllm-gen", "cutlass", "cute-dsl", "cutile")


def check_backend(where, backend, cuda=True, families=("fa2", "fa3")):
    """"auto", or on CUDA one of `families`: "fa2" (flare's mma.sync kernels, every GPU) or, for
    prefill, "fa3" (its Hopper kernels, warpgroup MMAs: sm_90 only, query tiles of 64 or 128
    rows); "auto" takes fa3 on sm_90 at query tiles of 64 rows and more, ragged or paged, except
    for paged K/V with RoPE (which runs faster on fa2 there: docs/perf.md), fa2 elsewhere. A
    backend flare does not have raises NotImplementedError naming it, an unknown name
    ValueError."""
    if backend == "auto" or (backend in families and cuda):
        return
    if backend in families:
        unsupported(where, "backend", backend,
                    f"{backend} names GPU kernels; CPU tensors run the CPU backend ('auto')")
    if backend in ("fa2", "fa3") or backend in _OTHER_BACKENDS:
        unsupported(where, "backend", backend,
                    f"flare's GPU kernels here are {' and '.join(map(repr, families))} ('auto')")
    raise ValueError(f"{where}: backend must be one of 'auto', 'fa2', 'fa3', "
                     f"{', '.join(repr(b) for b in _OTHER_BACKENDS)}; got {backend!r}")


def check_pos_encoding_mode(pos_encoding_mode):
    if pos_encoding_mode not in POS_ENCODING_MODES:
        raise ValueError(
            f"pos_encoding_mode must be one of {POS_ENCODING_MODES}, got {pos_encoding_mode!r}")
    return pos_encoding_mode


def make_params(*, sm_scale=None, causal=False, window_left=-1, logits_soft_cap=None,
                pos_encoding_mode="NONE", rope_scale=None, rope_theta=None, k_scale=None,
                v_scale=None, custom_mask=None, mask_indptr=None):
    """flare's AttentionParams from FlashInfer's conventions (None means the default)."""
    window_left = -1 if window_left is None else int(window_left)
    if window_left < -1:
        raise ValueError(f"window_left must be -1 (no window) or >= 0, got {window_left}")
    cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
    if cap < 0:
        raise ValueError(f"logits_soft_cap must be positive (or None/0 for off), got {cap}")
    scale = 0.0 if sm_scale is None else float(sm_scale)
    if sm_scale is not None and scale <= 0:
        raise ValueError(f"sm_scale must be positive, got {sm_scale}")
    return _flare.AttentionParams(
        sm_scale=scale,
        causal=bool(causal),
        window_left=window_left,
        logits_soft_cap=cap,
        pos_encoding_mode=check_pos_encoding_mode(pos_encoding_mode),
        rope_theta=1e4 if rope_theta is None else float(rope_theta),
        rope_scale=1.0 if rope_scale is None else float(rope_scale),
        k_scale=1.0 if k_scale is None else float(k_scale),
        v_scale=1.0 if v_scale is None else float(v_scale),
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
    )


def _short(value):
    """A printable stand-in for a tensor argument."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<tensor of shape {tuple(shape)}>"
    return value


LSE_BASES = ("log2", "ln")


def check_lse_base(lse_base):
    """True for FlashInfer's base-2 LSE ("log2", the default), False for the natural log."""
    if lse_base == "log2":
        return True
    if lse_base == "ln":
        return False
    raise ValueError(f"lse_base must be 'log2' (FlashInfer's) or 'ln', got {lse_base!r}")


def check_o_data_type(where, o_data_type, q_dtype):
    """flare's kernels write o in q's dtype: o_data_type may name it, nothing else."""
    from ._tensors import dtype_name

    if o_data_type is not None and dtype_name(o_data_type) != q_dtype:
        unsupported(where, "o_data_type", o_data_type,
                    f"the output takes q's dtype ({q_dtype}); another output dtype needs a "
                    "kernel build per output type, not shipped yet")


def scale_or_one(scale):
    """A q_scale / k_scale / v_scale argument as a float (None: 1)."""
    return 1.0 if scale is None else float(scale)


def pdl_flag(enable_pdl):
    """enable_pdl as the extension takes it: None means on, as FlashInfer's default on GPUs
    that have programmatic dependent launch (the engine ignores it before sm_90)."""
    return True if enable_pdl is None else bool(enable_pdl)


class ResolvedConfigs:
    """What a wrapper's plan() configuration arguments (a tuple, the signature) resolved to once
    they passed every check, so that a serving loop's plan() of a known configuration checks only
    its index arrays. A signature with an unhashable argument is never remembered (that
    configuration is checked every time); past MAX signatures all are forgotten (a caller
    cycling through more is not a serving loop)."""

    MAX = 32

    def __init__(self):
        self._by_signature = {}

    def get(self, signature):
        try:
            return self._by_signature.get(signature)
        except TypeError:
            return None

    def put(self, signature, resolved):
        try:
            hash(signature)
        except TypeError:
            return
        if len(self._by_signature) >= self.MAX:
            self._by_signature.clear()
        self._by_signature[signature] = resolved


def check_prefill_plan_args(where, pos_encoding_mode, use_fp16_qk_reduction):
    check_pos_encoding_mode(pos_encoding_mode)
    if use_fp16_qk_reduction:
        unsupported(where, "use_fp16_qk_reduction", True,
                    "flare accumulates q.k in float32")


def mask_causal(causal, custom_mask, packed_custom_mask):
    """Whether the causal mask applies: FlashInfer's convention, a custom mask replaces it
    (`causal` is read only without one)."""
    return bool(causal) and custom_mask is None and packed_custom_mask is None
