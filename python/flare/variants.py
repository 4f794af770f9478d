"""Variants flare ships (include/flare/variant/library.h), as flare.AttentionVariant values for
the wrappers' plan(variant=...): the same CUDA source the C++ API compiles, in every kernel
family. Their tensors' shapes are checked against the plan at run() (batch, num_qo_heads), so
the kernels never read outside them.

    prefix = flare.variants.prefix_lm()
    wrapper.plan(qo_indptr, kv_indptr, 32, 8, 128, causal=False, variant=prefix)
    o = wrapper.run(q, k, v, prefix_len=lengths)   # int32 [batch] on the device
"""

from . import _flare
from .variant import AttentionVariant

# The engine's codes of the symbolic extents (include/flare/variant/user_variant.h).
_EXTENT_NAMES = {-1: None, -2: "batch", -3: "num_qo_heads", -4: "num_kv_heads", -5: "table"}
_CACHE = {}


def _library(name):
    variant = _CACHE.get(name)
    if variant is None:
        d = _flare.library_variant(name)
        tensors = {t_name: (dtype, tuple(_EXTENT_NAMES.get(e, e) for e in shape))
                   for t_name, dtype, shape in d["tensors"]}
        variant = _CACHE[name] = AttentionVariant(d["source"], d["name"], scalars=d["scalars"],
                                                  tensors=tensors, use_softmax=d["use_softmax"],
                                                  requires_causal=d["requires_causal"])
    return variant


def sigmoid():
    """Sigmoid attention (FlashSigmoid): o = sum_j sigmoid(q.k * sm_scale + bias) v_j over the
    visible keys, no softmax and no lse. run() takes bias=."""
    return _library("sigmoid")


def prefix_lm():
    """Prefix-LM: request r's first prefix_len[r] keys are visible to all its queries, the rest
    causally. Plan with causal=False (the variant's mask holds the causal part); run() takes
    prefix_len= (int32 [batch], CUDA)."""
    return _library("prefix_lm")


def relative_position_bias():
    """T5's relative position bias for causal models: logits += table[h][bucket(i - j)] with 32
    buckets (16 exact distances, then logarithmic up to max_distance). run() takes table=
    (float32 [num_qo_heads, 32], CUDA) and max_distance= (T5: 128). Faster: distance_bias()
    with t5_distance_bias(table, max_distance)'s table, the same bias."""
    return _library("relative_position_bias")


def distance_bias():
    """A bias by query-key distance for causal attention: logits += bias[h][min(i - j, W - 1)]
    for the query at position i and key j <= i, W = bias.shape[1] (the last entry applies to
    every key W - 1 or more positions back). Plan with causal=True (the variant requires it);
    run() takes bias= (float32 [num_qo_heads, W >= 1], CUDA, fewer than 2^31 entries). T5's
    relative position bias is this with t5_distance_bias()'s table, at one load a near key
    instead of a logarithm and a bucket (1.9x relative_position_bias() at 2048 tokens)."""
    return _library("distance_bias")


def t5_distance_bias(table, max_distance):
    """distance_bias()'s table for T5 from relative_position_bias()'s: [H, 32] -> [H,
    ceil(max_distance) + 1] float32, row h = table[h][bucket(n)] for each distance n (the C++
    library's buckets, flare::variants::t5_distance_buckets), on table's device. Build it once
    per model (the bucket table is a weight)."""
    import torch

    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[1] != 32:
        got = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table)
        raise ValueError(f"t5_distance_bias: table must be a [num_heads, 32] torch tensor, got "
                         f"{got}")
    buckets = torch.tensor(_flare.t5_distance_buckets(float(max_distance)), dtype=torch.long,
                           device=table.device)
    return table.to(torch.float32)[:, buckets].contiguous()


def document_mask():
    """Document masking for packed sequences: the query at position i sees key j when j <= i and
    both lie in one document (a run of positions of its request). Plan with causal=True (the
    variant requires it); run() takes document_start= (int32 [batch, L], CUDA: each position's
    document start, from document_starts()); positions >= L are documents of their own. The
    prefill skips the tiles of earlier documents."""
    return _library("document_mask")


def document_starts(document_id):
    """document_mask()'s tensor from per-position document ids (an integer tensor [batch, L] or
    [L], on any device, ids of one document contiguous): each position's first position of its
    run of equal ids, int32 [batch, L] ([1, L] for a [L] input), on document_id's device. Torch
    ops only, no synchronization."""
    import torch
    ids = document_id if document_id.dim() == 2 else document_id.unsqueeze(0)
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError("document_starts: document_id must be an integer tensor [batch, L] or "
                         f"[L], got {tuple(document_id.shape)} {document_id.dtype}")
    positions = torch.arange(ids.shape[1], device=ids.device, dtype=torch.int32).expand_as(ids)
    first = torch.ones_like(ids, dtype=torch.bool)
    first[:, 1:] = ids[:, 1:] != ids[:, :-1]
    starts = torch.where(first, positions, torch.zeros_like(positions)).cummax(dim=1).values
    return starts.to(torch.int32).contiguous()
