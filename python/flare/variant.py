"""User-defined attention variants: CUDA C++ source compiled just in time into flare's decode
and prefill kernels (include/flare/variant/user_variant.h, kernels/variant.cuh).

A variant's source defines ``struct Variant : flare::VariantBase`` and overrides the hooks it
needs; every hook has a default (plain softmax attention with sm_scale)::

    soft_cap = flare.AttentionVariant(
        name="soft_cap", scalars=("cap",), source=r'''
    struct Variant : flare::VariantBase {
      __device__ static float query_scale(const flare::VariantParams& p) {
        return p.sm_scale / Scalars::cap(p);
      }
      __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
        return Scalars::cap(p) * flare::kLog2e * flare::fast_tanh(s);
      }
    };''')
    wrapper.plan(..., variant=soft_cap)
    o = wrapper.run(q, kv_cache, cap=30.0)

Scalars are floats passed to run() by keyword (read in the source as ``Scalars::<name>(p)``);
changing them needs no new plan. Tensors (``tensors={"slopes": "float32"}``, or with the shape
run() requires, ``{"slopes": ("float32", (16,))}``, None for any extent) are contiguous CUDA
tensors passed to run() by keyword as well (an extent may be "batch", "num_qo_heads" or
"num_kv_heads": run() checks it against the plan, so a tensor indexed by the row's request or
head is never read outside; or "table": any extent of at least 1, the whole tensor under 2^31
elements, for a lookup table indexed with a 32-bit int), read through ``Tensors::<name>(p)`` (a
``const float*``; ``int`` for int32, ``long long`` for int64, ``unsigned char`` for uint8,
``unsigned short`` bits for float16 / bfloat16), their extents through
``Tensors::<name>_extent(p, d)`` (d < 4; 1 past the rank); run() checks their dtype, device,
contiguity and declared shape, and the variant must read only inside them. A CUDA graph keeps the
tensors' addresses of its capture. The hooks: ``query_scale``, ``visible_begin``,
``init(p, RowContext row)`` (row.request, row.qo_head, row.kv_head, row.q_pos, row.kv_len,
row.q_len),
``logits_transform(p, s, kv_pos)`` (s = q.k * query_scale; returns the logit in log2 units),
``logits_mask(kv_pos)`` and ``kMaskIsWindow`` (``visible_begin(p, request, q_pos)`` never
decreasing in q_pos), ``kLogitsBounded`` with ``logits_bound(p)`` (a promise that every logit
lies within +-bound, log2 units, for a bound of at most 79: soft-cap up to 54.7; the Hopper
prefill's bfloat16 softmax then subtracts a fixed offset instead of a running max, as the built-in
soft-cap does). ``requires_causal=True`` declares a mask that relies on the kernel's
causal mask for the keys after the query: plan() then refuses causal=False. A variant without softmax (sigmoid attention:
``static constexpr bool use_softmax = false;`` in the source, and ``use_softmax=False`` here,
checked against each other when the kernel compiles) has logits_transform return each key's
weight: o = sum of weight * v over the visible keys, with no normalisation and no lse (run()
raises for return_lse). Rotary q/k transforms: ``static constexpr bool kRotary = true;`` and
``rotary_frequency(p, i, head_dim)`` (radians per position of dims i and i + D/2), on every
kernel family. General query / key / output transforms are not supported: they fail to
compile, with the message, at plan(). Variants run on CUDA tensors only (the
CPU backend cannot run CUDA source).
"""

import re

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_SCALARS = 8
MAX_TENSORS = 4
_TENSOR_DTYPES = {"float32", "float16", "bfloat16", "int32", "int64", "uint8"}


def _dtype_name(dtype):
    """'float32' for "float32", torch.float32 or numpy.float32."""
    aliases = {"float": "float32", "half": "float16", "int": "int32", "long": "int64"}
    if isinstance(dtype, str):
        return aliases.get(dtype, dtype)
    text = str(dtype)
    if text.startswith("torch."):
        return aliases.get(text[len("torch."):], text[len("torch."):])
    try:
        import numpy as np
        return np.dtype(dtype).name
    except TypeError:
        return text


# Symbolic extents (include/flare/variant/user_variant.h), resolved by run().
_SYMBOLIC_EXTENTS = {None: -1, "batch": -2, "num_qo_heads": -3, "num_kv_heads": -4,
                     "table": -5}


def _tensor_declaration(variant, name, spec):
    """(name, dtype name, shape with the engine's codes for None and the symbolic extents) from
    dtype or (dtype, shape)."""
    dtype, shape = spec if isinstance(spec, tuple) else (spec, ())
    extents = []
    for e in shape:
        if isinstance(e, str) or e is None:
            if e not in _SYMBOLIC_EXTENTS:
                raise ValueError(f"AttentionVariant {variant!r}: tensor {name} declares extent "
                                 f"{e!r}; extents are ints >= 0, None for any, or "
                                 f"{[k for k in _SYMBOLIC_EXTENTS if k]}")
            extents.append(_SYMBOLIC_EXTENTS[e])
        elif int(e) < 0:
            raise ValueError(f"AttentionVariant {variant!r}: tensor {name} declares shape "
                             f"{shape}; extents are >= 0, None for any, or a symbolic extent")
        else:
            extents.append(int(e))
    return (str(name), _dtype_name(dtype), tuple(extents))


class AttentionVariant:
    """A user-defined variant: its name (a C identifier), CUDA C++ source, the names of its
    float scalars (at most 8) and its tensors ({name: dtype}, at most 4), both passed to run()
    as keyword arguments."""

    __slots__ = ("name", "source", "scalars", "tensors", "use_softmax", "requires_causal",
                 "_tensor_names", "_argument_names")

    def __init__(self, source, name, scalars=(), tensors=None, use_softmax=True,
                 requires_causal=False):
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise ValueError(f"AttentionVariant: name must be a C identifier, got {name!r}")
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"AttentionVariant {name!r}: source must be non-empty CUDA C++ "
                             "defining struct Variant")
        if isinstance(scalars, str):
            scalars = (scalars,)
        scalars = tuple(scalars)
        if len(scalars) > MAX_SCALARS:
            raise ValueError(f"AttentionVariant {name!r}: {len(scalars)} scalars; at most "
                             f"{MAX_SCALARS}")
        tensors = tuple(_tensor_declaration(name, n, d) for n, d in dict(tensors or {}).items())
        if len(tensors) > MAX_TENSORS:
            raise ValueError(f"AttentionVariant {name!r}: {len(tensors)} tensors; at most "
                             f"{MAX_TENSORS}")
        names = scalars + tuple(t[0] for t in tensors)
        for entry in names:
            if not isinstance(entry, str) or not _IDENTIFIER.match(entry):
                raise ValueError(f"AttentionVariant {name!r}: scalar and tensor names must be C "
                                 f"identifiers, got {entry!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"AttentionVariant {name!r}: scalar and tensor names repeat: "
                             f"{names}")
        for tensor, dtype, _ in tensors:
            if dtype not in _TENSOR_DTYPES:
                raise ValueError(f"AttentionVariant {name!r}: tensor {tensor} has dtype {dtype}; "
                                 f"variant tensors are {sorted(_TENSOR_DTYPES)}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "scalars", scalars)
        object.__setattr__(self, "tensors", tensors)
        object.__setattr__(self, "use_softmax", bool(use_softmax))
        object.__setattr__(self, "requires_causal", bool(requires_causal))
        # run()'s keyword names, computed once: arguments() runs every call.
        object.__setattr__(self, "_tensor_names", tuple(t[0] for t in tensors))
        object.__setattr__(self, "_argument_names", frozenset(names))

    def __setattr__(self, key, value):
        raise AttributeError("AttentionVariant is immutable")

    def key(self):
        """What identifies the compiled kernels of this variant."""
        return (self.name, self.source, self.scalars, self.tensors, self.use_softmax,
                self.requires_causal)

    def __repr__(self):
        softmax = "" if self.use_softmax else ", use_softmax=False"
        if self.requires_causal:
            softmax += ", requires_causal=True"
        return (f"AttentionVariant(name={self.name!r}, scalars={self.scalars!r}, "
                f"tensors={ {n: d for n, d, _ in self.tensors}!r}{softmax})")

    def arguments(self, where, given):
        """run()'s keyword arguments -> (scalars as floats, tensors) in declared order;
        TypeError naming a missing or unknown one."""
        if len(given) != len(self._argument_names) or \
                not self._argument_names.issuperset(given):
            names = self.scalars + self._tensor_names
            unknown = [k for k in given if k not in names]
            if unknown:
                raise TypeError(f"{where}() got unexpected keyword argument(s) {unknown}; "
                                f"variant {self.name!r} takes {list(names) or 'none'}")
            missing = [k for k in names if k not in given]
            raise TypeError(f"{where}() needs variant {self.name!r}'s argument(s) {missing}")
        return (tuple([float(given[k]) for k in self.scalars]),
                tuple([given[k] for k in self._tensor_names]))


def variant_arguments(where, variant, given):
    """The (scalars, tensors) run() passes to the extension: (None, None) without a variant
    (then no extra keyword is accepted)."""
    if variant is None:
        if given:
            raise TypeError(f"{where}() got unexpected keyword argument(s) {sorted(given)} "
                            "(no variant was planned)")
        return None, None
    return variant.arguments(where, given)


def check_variant(where, variant, cuda, causal_mask=True):
    """variant (None or a flare.AttentionVariant) for CUDA tensors; causal_mask: whether the
    call applies the causal mask (prefill: causal=True and no custom mask), which a variant with
    requires_causal needs."""
    if variant is None:
        return None
    if not isinstance(variant, AttentionVariant):
        raise TypeError(f"{where}: variant must be a flare.AttentionVariant, got "
                        f"{type(variant).__name__}")
    if not cuda:
        raise ValueError(f"{where}: variant {variant.name!r} runs on CUDA tensors only (the "
                         "CPU backend cannot run CUDA source)")
    if variant.requires_causal and not causal_mask:
        raise ValueError(f"{where}: variant {variant.name!r} requires the causal mask "
                         "(causal=True, no custom mask): its mask relies on it for the keys "
                         "after each query")
    return variant
