"""Test oracles in numpy float64 (written independently of flare) and random paged KV caches.

reference_attention follows flare's definitions (DESIGN.md): natural-log LSE, causal masks
aligned bottom-right, empty or fully masked rows give o = 0 and lse = -inf.
"""

import numpy as np


def rope(x, positions, theta, scale):
    """Rotate-half RoPE of x [tokens, heads, D] at positions [tokens] (float64)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    angle = (positions[:, None] / scale) * inv_freq[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def alibi_slopes_power_of_two(num_heads):
    """The ALiBi paper's slopes for a power-of-two head count: 2^(-8 (h + 1) / H)."""
    return 2.0 ** (-8.0 * (np.arange(num_heads) + 1) / num_heads)


def reference_attention(q, k, v, qo_indptr, kv_indptr, *, causal=False, sm_scale=None,
                        window_left=-1, logits_soft_cap=0.0, custom_mask=None, alibi=False,
                        rope_theta=None, rope_scale=1.0, k_scale=1.0, v_scale=1.0,
                        lse_base="log2"):
    """o [total_q, H_qo, D_vo] and lse [total_q, H_qo] in float64 (base 2, FlashInfer's, or
    the natural log with lse_base="ln").

    q [total_q, H_qo, D]; k, v ragged [total_kv, H_kv, D]; custom_mask: per request a bool
    [q_len, kv_len] array (list); rope_theta set means RoPE on q and k at their positions.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    k, v = k * k_scale, v * v_scale
    total_q, num_qo_heads, head_dim = q.shape
    group = num_qo_heads // k.shape[1]
    scale = 1.0 / np.sqrt(head_dim) if sm_scale is None else sm_scale
    out = np.zeros((total_q, num_qo_heads, v.shape[2]))
    lse = np.full((total_q, num_qo_heads), -np.inf)
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        q_len, kv_len = q1 - q0, k1 - k0
        if q_len == 0 or kv_len == 0:
            continue
        qb, kb, vb = q[q0:q1], k[k0:k1], v[k0:k1]
        q_pos = np.arange(q_len) + kv_len - q_len
        kv_pos = np.arange(kv_len)
        if rope_theta is not None:
            qb = rope(qb, q_pos.astype(np.float64), rope_theta, rope_scale)
            kb = rope(kb, kv_pos.astype(np.float64), rope_theta, rope_scale)
        kb = np.repeat(kb, group, axis=1)
        vb = np.repeat(vb, group, axis=1)
        logits = np.einsum("qhd,khd->hqk", qb, kb) * scale
        if alibi:
            slopes = alibi_slopes_power_of_two(num_qo_heads)
            logits = logits + slopes[:, None, None] * (kv_pos[None, None, :] -
                                                        q_pos[None, :, None])
        if logits_soft_cap:
            logits = logits_soft_cap * np.tanh(logits / logits_soft_cap)
        visible = np.ones((q_len, kv_len), dtype=bool)
        if causal:
            visible &= kv_pos[None, :] <= q_pos[:, None]
        if window_left >= 0:
            visible &= kv_pos[None, :] >= q_pos[:, None] - window_left
        if custom_mask is not None:
            visible &= np.asarray(custom_mask[b], dtype=bool).reshape(q_len, kv_len)
        logits = np.where(visible[None], logits, -np.inf)
        row_max = logits.max(axis=-1, keepdims=True)
        seen = np.isfinite(row_max)
        weights = np.where(seen, np.exp(logits - np.where(seen, row_max, 0.0)), 0.0)
        total = weights.sum(axis=-1, keepdims=True)
        probs = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0)
        out[q0:q1] = np.einsum("hqk,khd->qhd", probs, vb)
        with np.errstate(divide="ignore"):
            lse[q0:q1] = np.where(total[..., 0] > 0,
                                  np.log(np.where(total[..., 0] > 0, total[..., 0], 1.0)) +
                                  np.where(seen[..., 0], row_max[..., 0], 0.0),
                                  -np.inf).T
    return out, (lse / np.log(2.0) if lse_base == "log2" else lse)


def reference_merge(v, s, lse_base="log2"):
    """Merges states along axis 1: v [seq, n, H, D], s [seq, n, H] -> ([seq, H, D], [seq, H]),
    s in base 2 (FlashInfer's) or natural log (lse_base="ln")."""
    v = np.asarray(v, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    exp, log = (np.exp2, np.log2) if lse_base == "log2" else (np.exp, np.log)
    s_max = s.max(axis=1, keepdims=True)
    shift = np.where(np.isfinite(s_max), s_max, 0.0)
    w = exp(s - shift)
    total = w.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        merged_s = np.where(total > 0, shift + log(np.where(total > 0, total, 1.0)), -np.inf)
    scale = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0)
    return (v * scale[..., None]).sum(axis=1), merged_s[:, 0]


class PagedCache:
    """A random paged KV cache (numpy): pages of a permuted pool, unused pages and slots past
    each request's length poisoned with NaN, and the same tokens ragged for the oracle."""

    def __init__(self, kv_lens, num_kv_heads, head_dim, page_size, layout="NHD",
                 dtype=np.float32, seed=0, extra_pages=3):
        rng = np.random.default_rng(seed)
        self.kv_lens = np.asarray(kv_lens, dtype=np.int64)
        self.page_size, self.layout = page_size, layout
        pages = (self.kv_lens + page_size - 1) // page_size
        self.indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        pool = int(self.indptr[-1]) + extra_pages
        self.indices = rng.permutation(pool)[: self.indptr[-1]].astype(np.int32)
        self.last_page_len = np.where(self.kv_lens > 0, (self.kv_lens - 1) % page_size + 1,
                                      0).astype(np.int32)
        self.kv_indptr = np.concatenate([[0], np.cumsum(self.kv_lens)]).astype(np.int32)
        total = int(self.kv_indptr[-1])
        # Values rounded to the cache dtype, so the oracle sees what flare reads.
        self.k = rng.standard_normal((total, num_kv_heads, head_dim)).astype(dtype)
        self.v = rng.standard_normal((total, num_kv_heads, head_dim)).astype(dtype)
        shape = ((pool, 2, page_size, num_kv_heads, head_dim) if layout == "NHD" else
                 (pool, 2, num_kv_heads, page_size, head_dim))
        self.cache = np.full(shape, np.nan, dtype=dtype)
        for b, length in enumerate(self.kv_lens):
            for pos in range(int(length)):
                page = self.indices[self.indptr[b] + pos // page_size]
                slot = pos % page_size
                row = self.kv_indptr[b] + pos
                for which, source in ((0, self.k), (1, self.v)):
                    if layout == "NHD":
                        self.cache[page, which, slot] = source[row]
                    else:
                        self.cache[page, which, :, slot] = source[row]

    @property
    def batch(self):
        return len(self.kv_lens)


def max_abs_error(actual, expected):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    same_inf = np.isinf(expected) & (actual == expected)
    with np.errstate(invalid="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(actual - expected))
    if np.isnan(diff).any():
        return float("nan")
    return float(diff.max()) if diff.size else 0.0
