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
        return Scalars::cap(p) * flare::kLog2e * flare::tanh_via_exp2(s);
      }
    };''')
    wrapper.plan(..., variant=soft_cap)
    o = wrapper.run(q, kv_cache, cap=30.0)

Scalars are floats passed to run() by keyword (read in the source as ``Scalars::<name>(p)``);
changing them needs no new plan. The hooks: ``query_scale``, ``visible_begin``,
``init(p, RowContext row)`` (row.request, row.qo_head, row.kv_head, row.q_pos),
``logits_transform(p, s, kv_pos)`` (s = q.k * query_scale; returns the logit in log2 units),
``logits_mask(kv_pos)`` and ``kMaskIsWindow``. ``use_softmax = false`` and query / key /
output transforms are not supported by any kernel family yet: they fail to compile, with the
message, at plan(). Variants run on CUDA tensors only (the CPU backend cannot run CUDA source).
"""

import re

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_SCALARS = 8


class AttentionVariant:
    """A user-defined variant: its name (a C identifier), CUDA C++ source, and the names of its
    float scalars (at most 8, passed to run() as keyword arguments)."""

    __slots__ = ("name", "source", "scalars")

    def __init__(self, source, name, scalars=()):
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
        for scalar in scalars:
            if not isinstance(scalar, str) or not _IDENTIFIER.match(scalar):
                raise ValueError(f"AttentionVariant {name!r}: scalar names must be C "
                                 f"identifiers, got {scalar!r}")
        if len(set(scalars)) != len(scalars):
            raise ValueError(f"AttentionVariant {name!r}: scalar names repeat: {scalars}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "scalars", scalars)

    def __setattr__(self, key, value):
        raise AttributeError("AttentionVariant is immutable")

    def key(self):
        """What identifies the compiled kernels of this variant."""
        return (self.name, self.source, self.scalars)

    def __repr__(self):
        return f"AttentionVariant(name={self.name!r}, scalars={self.scalars!r})"

    def scalar_values(self, where, given):
        """run()'s keyword arguments -> the tuple of floats in declared order; TypeError naming
        a missing or unknown one."""
        unknown = [k for k in given if k not in self.scalars]
        if unknown:
            raise TypeError(f"{where}() got unexpected keyword argument(s) {unknown}; variant "
                            f"{self.name!r} takes {list(self.scalars) or 'no scalars'}")
        missing = [k for k in self.scalars if k not in given]
        if missing:
            raise TypeError(f"{where}() needs variant {self.name!r}'s scalar(s) {missing}")
        return tuple(float(given[k]) for k in self.scalars)


def variant_scalars(where, variant, given):
    """The scalars run() passes to the extension: None without a variant (then no extra keyword
    is accepted)."""
    if variant is None:
        if given:
            raise TypeError(f"{where}() got unexpected keyword argument(s) {sorted(given)} "
                            "(no variant was planned)")
        return None
    return variant.scalar_values(where, given)


def check_variant(where, variant, cuda):
    if variant is None:
        return None
    if not isinstance(variant, AttentionVariant):
        raise TypeError(f"{where}: variant must be a flare.AttentionVariant, got "
                        f"{type(variant).__name__}")
    if not cuda:
        raise ValueError(f"{where}: variant {variant.name!r} runs on CUDA tensors only (the "
                         "CPU backend cannot run CUDA source)")
    return variant
