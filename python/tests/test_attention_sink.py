"""flare.BatchAttentionWithAttentionSinkWrapper on the CPU backend (numpy, float32): each head's
sink logit in the softmax denominator, causal append and decode rows, GQA 4/2, page size 3, an
empty request, against float64 attention with the sink appended to the logits (FlashInfer's
sink_softmax); the sink's and sm_scale's checks name them."""

import math

import numpy as np
import pytest

import flare

H, H_KV, D, PAGE = 4, 2, 32, 3


def sink_reference(q, k, v, sink, q_pos):
    """float64 o [q, H, D] and base-2 lse over keys 0..q_pos of each row, sink in the
    denominator."""
    group = H // H_KV
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("qhd,nhd->hqn", q.astype(np.float64), kk) / math.sqrt(D)
    s = np.where(np.arange(len(k))[None, None, :] <= q_pos[None, :, None], s, -np.inf)
    peak = np.maximum(s.max(-1, keepdims=True), sink[:, None, None])
    p = np.exp(s - peak)
    denominator = p.sum(-1) + np.exp(sink[:, None] - peak[..., 0])
    o = np.einsum("hqn,nhd->qhd", p / denominator[..., None], vv)
    return o, ((np.log(denominator) + peak[..., 0]) / np.log(2)).T


def test_sinks_join_the_denominator():
    rng = np.random.default_rng(3)
    kv_lens, q_lens = [7, 20, 1, 0], [2, 5, 1, 0]
    pages = [-(-n // PAGE) for n in kv_lens]
    k_cache = rng.standard_normal((sum(pages), PAGE, H_KV, D)).astype(np.float32)
    v_cache = rng.standard_normal((sum(pages), PAGE, H_KV, D)).astype(np.float32)
    indptr = np.cumsum([0] + pages).astype(np.int32)
    indices = np.arange(sum(pages), dtype=np.int32)
    last = np.array([n - (p - 1) * PAGE if p else 0 for n, p in zip(kv_lens, pages)], np.int32)
    qo = np.cumsum([0] + q_lens).astype(np.int32)
    q = rng.standard_normal((sum(q_lens), H, D)).astype(np.float32)
    sink = rng.standard_normal(H).astype(np.float32) * 2
    wrapper = flare.BatchAttentionWithAttentionSinkWrapper(
        np.zeros(1 << 22, np.uint8), q_data_type="float32", kv_data_type="float32",
        head_dim_qk=D, head_dim_vo=D)
    wrapper.plan(qo, indptr, indices, last, H, H_KV, D, PAGE, causal=True)
    o, lse = wrapper.run(q, (k_cache, v_cache), sink, 1 / math.sqrt(D), return_lse=True)
    for r, (kv, ql) in enumerate(zip(kv_lens, q_lens)):
        if ql == 0:
            continue
        k = k_cache[indptr[r]:indptr[r + 1]].reshape(-1, H_KV, D)[:kv]
        v = v_cache[indptr[r]:indptr[r + 1]].reshape(-1, H_KV, D)[:kv]
        rows = slice(qo[r], qo[r + 1])
        o_ref, lse_ref = sink_reference(q[rows], k, v, sink.astype(np.float64),
                                        np.arange(ql) + kv - ql)
        assert np.abs(o[rows] - o_ref).max() < 1e-5, r
        assert np.abs(lse[rows] - lse_ref).max() < 1e-5, r
    with pytest.raises(ValueError, match="sm_scale=0.5 differs from the plan's"):
        wrapper.run(q, (k_cache, v_cache), sink, 0.5)
    with pytest.raises(ValueError, match=r"sink must be \[num_qo_heads=4\]"):
        wrapper.run(q, (k_cache, v_cache), sink[:2])


def test_merge_sink_of_an_empty_row_is_the_sink():
    out = np.zeros((1, 2, 4), np.float32)
    lse = np.full((1, 2), -np.inf, np.float32)
    flare.attention.merge_sink(out, lse, np.array([0.5, -1.0], np.float32))
    assert np.all(out == 0)
    np.testing.assert_allclose(lse[0], np.array([0.5, -1.0]) / np.log(2), rtol=1e-6)


def test_merge_sink_on_torch_tensors_matches_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    out = rng.standard_normal((5, 4, 8)).astype(np.float32)
    lse = rng.standard_normal((5, 4)).astype(np.float32)
    lse[2, 1] = -np.inf
    sink = rng.standard_normal(4).astype(np.float32)
    o_t, s_t = torch.from_numpy(out.copy()), torch.from_numpy(lse.copy())
    flare.attention.merge_sink(o_t, s_t, torch.from_numpy(sink))
    flare.attention.merge_sink(out, lse, sink)
    np.testing.assert_allclose(o_t.numpy(), out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s_t.numpy(), lse, rtol=1e-6, atol=1e-6)
