"""FlashInfer's customized attention modules over flare (flashinfer.jit.gen_customize_*_module,
the wrappers' jit_args, *_with_jit_module): FlashInfer's `variant_decl` (its FA2 hook macros:
REGISTER_LOGITS_TRANSFORM, REGISTER_LOGITS_MASK, use_softmax, sm_scale_log2) is translated
into a flare.AttentionVariant (include/flare/variant/flashinfer_variant.h) that runs on every
flare kernel family; its additional tensors and scalars come positionally after the inputs,
tensors first, as in FlashInfer."""

from . import _flare
from ._tensors import dtype_name
from .variant import AttentionVariant

_KINDS = ("single_decode", "single_prefill", "batch_decode", "batch_prefill")


class CustomizedModule:
    """What build_and_load() returns: the translated variant and the module's declared dtypes
    and head dims, checked against the tensors of each call."""

    def __init__(self, kind, uri, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
                 tensor_names, tensor_dtypes, scalar_names, scalar_dtypes, variant_name,
                 variant_decl):
        self.kind = kind
        self.uri = uri
        self.dtype_q = dtype_name(dtype_q)
        self.dtype_kv = dtype_name(dtype_kv)
        self.dtype_o = dtype_name(dtype_o)
        self.head_dim_qk = int(head_dim_qk)
        self.head_dim_vo = int(head_dim_vo)
        self.tensor_names = tuple(tensor_names)
        self.scalar_names = tuple(scalar_names)
        d = _flare.flashinfer_variant(str(variant_name), str(variant_decl),
                                      list(self.tensor_names), [str(t) for t in tensor_dtypes],
                                      list(self.scalar_names), [str(t) for t in scalar_dtypes])
        tensors = {name: dtype for name, dtype, _ in d["tensors"]}
        self.variant = AttentionVariant(d["source"], d["name"], scalars=d["scalars"],
                                        tensors=tensors, use_softmax=d["use_softmax"])

    def arguments(self, where, args):
        """FlashInfer's positional extra arguments (tensors, then scalars) as the variant's
        keyword arguments; TypeError when their number differs."""
        names = self.tensor_names + self.scalar_names
        if len(args) != len(names):
            raise TypeError(f"{where}: module {self.uri!r} takes {len(names)} additional "
                            f"argument(s) {list(names)} after the inputs, got {len(args)}")
        return dict(zip(names, args))

    def check(self, where, q, k):
        """The call's q / KV dtypes and head dim against the module's declaration."""
        got = (dtype_name(q.dtype), dtype_name(k.dtype), int(q.shape[-1]))
        want = (self.dtype_q, self.dtype_kv, self.head_dim_qk)
        if got != want:
            raise ValueError(f"{where}: module {self.uri!r} was generated for q {want[0]}, kv "
                             f"{want[1]}, head_dim {want[2]}; got {got[0]}, {got[1]}, {got[2]}")

    def __repr__(self):
        return f"CustomizedModule({self.kind}, uri={self.uri!r}, variant={self.variant!r})"


class JitSpec:
    """FlashInfer's JitSpec surface: build_and_load() returns the module (flare compiles its
    kernels at plan(), or ahead of time through flare.jit.precompile([module.variant], ...))."""

    def __init__(self, module):
        self.name = module.uri
        self._module = module

    def build(self, verbose=False):
        return None

    def build_and_load(self):
        return self._module


def _check_options(where, pos_encoding_mode, use_sliding_window, use_logits_soft_cap, **more):
    """The built-in terms FlashInfer's templates add beside a variant: flare's variant replaces
    them, so each must stay off."""
    flags = dict(pos_encoding_mode=pos_encoding_mode != 0, use_sliding_window=use_sliding_window,
                 use_logits_soft_cap=use_logits_soft_cap, **more)
    on = [name for name, value in flags.items() if value]
    if on:
        raise NotImplementedError(f"{where}: {on} beside a variant_decl are not supported by "
                                  "flare: write the term in the variant's LogitsTransform")


def _check_backend(where, backend):
    if backend == "auto":
        raise ValueError(f"{where}: backend should not be auto when jit_args is provided")
    if backend != "fa2":
        raise NotImplementedError(f"{where}: backend {backend!r}: flare runs customized "
                                  "variants on its FA2-style kernels (backend='fa2')")


def gen_customize_single_decode_module(uri, dtype_q, dtype_kv, dtype_o, head_dim_qk,
                                       head_dim_vo, additional_tensor_names,
                                       additional_tensor_dtypes, additional_scalar_names,
                                       additional_scalar_dtypes, variant_name, variant_decl,
                                       pos_encoding_mode=0, use_sliding_window=False,
                                       use_logits_soft_cap=False):
    _check_options("gen_customize_single_decode_module", pos_encoding_mode, use_sliding_window,
                   use_logits_soft_cap)
    return JitSpec(CustomizedModule(
        "single_decode", uri, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
        additional_tensor_names, additional_tensor_dtypes, additional_scalar_names,
        additional_scalar_dtypes, variant_name, variant_decl))


def gen_customize_batch_decode_module(uri, dtype_q, dtype_kv, dtype_o, idtype, head_dim_qk,
                                      head_dim_vo, additional_tensor_names,
                                      additional_tensor_dtypes, additional_scalar_names,
                                      additional_scalar_dtypes, variant_name, variant_decl,
                                      pos_encoding_mode=0, use_sliding_window=False,
                                      use_logits_soft_cap=False):
    _check_options("gen_customize_batch_decode_module", pos_encoding_mode, use_sliding_window,
                   use_logits_soft_cap)
    _check_idtype("gen_customize_batch_decode_module", idtype)
    return JitSpec(CustomizedModule(
        "batch_decode", uri, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
        additional_tensor_names, additional_tensor_dtypes, additional_scalar_names,
        additional_scalar_dtypes, variant_name, variant_decl))


def gen_customize_single_prefill_module(backend, uri, dtype_q, dtype_kv, dtype_o, head_dim_qk,
                                        head_dim_vo, additional_tensor_names,
                                        additional_tensor_dtypes, additional_scalar_names,
                                        additional_scalar_dtypes, variant_name, variant_decl,
                                        pos_encoding_mode=0, use_sliding_window=False,
                                        use_logits_soft_cap=False, use_fp16_qk_reduction=False,
                                        fp8_enabled=False):
    where = "gen_customize_single_prefill_module"
    _check_backend(where, backend)
    _check_options(where, pos_encoding_mode, use_sliding_window, use_logits_soft_cap,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, fp8_enabled=fp8_enabled)
    return JitSpec(CustomizedModule(
        "single_prefill", uri, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
        additional_tensor_names, additional_tensor_dtypes, additional_scalar_names,
        additional_scalar_dtypes, variant_name, variant_decl))


def gen_customize_batch_prefill_module(backend, uri, dtype_q, dtype_kv, dtype_o, idtype,
                                       head_dim_qk, head_dim_vo, additional_tensor_names,
                                       additional_tensor_dtypes, additional_scalar_names,
                                       additional_scalar_dtypes, variant_name, variant_decl,
                                       pos_encoding_mode=0, use_sliding_window=False,
                                       use_logits_soft_cap=False, use_fp16_qk_reduction=False,
                                       fp8_enabled=False, **unused_surface):
    where = "gen_customize_batch_prefill_module"
    _check_backend(where, backend)
    _check_options(where, pos_encoding_mode, use_sliding_window, use_logits_soft_cap,
                   use_fp16_qk_reduction=use_fp16_qk_reduction, fp8_enabled=fp8_enabled)
    _check_idtype(where, idtype)
    return JitSpec(CustomizedModule(
        "batch_prefill", uri, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
        additional_tensor_names, additional_tensor_dtypes, additional_scalar_names,
        additional_scalar_dtypes, variant_name, variant_decl))


def _check_idtype(where, idtype):
    name = str(idtype).replace("torch.", "")
    if name != "int32":
        raise NotImplementedError(f"{where}: idtype {name}: flare's index arrays are int32")


def wrapper_module(kind, backend, jit_args):
    """The module of a wrapper's jit_args (FlashInfer's tuple for gen_customize_batch_*), or
    None."""
    if jit_args is None:
        return None
    if kind == "batch_prefill":
        spec = gen_customize_batch_prefill_module(backend, *jit_args)
    else:
        spec = gen_customize_batch_decode_module(*jit_args)
    return spec.build_and_load()


def plan_variant(where, module, variant):
    """The variant a plan() compiles: the jit_args module's, or the caller's; not both."""
    if module is None:
        return variant
    if variant is not None:
        raise ValueError(f"{where}: variant= and the wrapper's jit_args both name a variant")
    return module.variant


def run_keywords(where, module, args, variant_kwargs):
    """run()'s variant keywords with FlashInfer's positional extras folded in."""
    if not args:
        return variant_kwargs
    if module is None:
        raise TypeError(f"{where}() takes positional arguments after the inputs only with a "
                        f"wrapper built with jit_args; got {len(args)}")
    if variant_kwargs:
        raise TypeError(f"{where}(): pass the module's arguments positionally or by keyword, "
                        "not both")
    return module.arguments(where, args)
