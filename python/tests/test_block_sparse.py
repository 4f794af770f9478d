"""flare.sparse.BlockSparseAttentionWrapper on the CPU backend (numpy): random BSR masks with
square and non-square blocks (1x1, 16x16, 4x8), a last block row of fewer than R rows, empty
block rows, per-block masks and GQA, against dense float64 attention with the equivalent
element mask; malformed structures are errors naming the argument."""

import numpy as np
import pytest

import flare


def dense_mask(indptr, indices, M, N, R, C, block_masks=None):
    visible = np.zeros((M, N), dtype=bool)
    for i in range(len(indptr) - 1):
        for b in range(indptr[i], indptr[i + 1]):
            j = indices[b]
            rows = slice(i * R, min((i + 1) * R, M))
            block = np.ones((R, C), dtype=bool) if block_masks is None else block_masks[b]
            visible[rows, j * C:(j + 1) * C] = block[:rows.stop - rows.start]
    return visible


def reference(q, k, v, visible):
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("mhd,nhd->hmn", q.astype(np.float64), kk) / np.sqrt(q.shape[2])
    s = np.where(visible[None], s, -np.inf)
    peak = np.max(s, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    p = np.exp(s - peak)
    denominator = p.sum(-1, keepdims=True)
    o = np.einsum("hmn,nhd->mhd", p / np.where(denominator > 0, denominator, 1.0), vv)
    with np.errstate(divide="ignore"):  # rows that see nothing: lse -inf
        return o, np.log2(denominator[..., 0]).T + peak[..., 0].T / np.log(2)


def random_bsr(rng, row_blocks, column_blocks, density):
    indptr, indices = [0], []
    for _ in range(row_blocks):
        cols = np.flatnonzero(rng.random(column_blocks) < density)
        indices.extend(cols.tolist())
        indptr.append(len(indices))
    return np.array(indptr, dtype=np.int32), np.array(indices, dtype=np.int32)


@pytest.mark.parametrize("M,N,R,C,heads,with_mask", [
    (37, 40, 1, 1, (4, 4), False),
    (64, 96, 16, 16, (8, 2), False),
    (50, 64, 16, 16, (4, 1), True),   # last block row of 2 rows
    (30, 48, 4, 8, (6, 3), True),
])
def test_matches_dense_attention_with_the_block_mask(M, N, R, C, heads, with_mask):
    rng = np.random.default_rng(M * 1000 + N)
    H, H_kv = heads
    row_blocks = -(-M // R)
    indptr, indices = random_bsr(rng, row_blocks, N // C, 0.5)
    block_masks = rng.random((len(indices), R, C)) < 0.7 if with_mask else None
    q = rng.standard_normal((M, H, 64)).astype(np.float32)
    k = rng.standard_normal((N, H_kv, 64)).astype(np.float32)
    v = rng.standard_normal((N, H_kv, 64)).astype(np.float32)
    wrapper = flare.BlockSparseAttentionWrapper(np.zeros(1 << 22, dtype=np.uint8))
    wrapper.plan(indptr, indices, M, N, R, C, H, H_kv, 64, mask=block_masks,
                 q_data_type="float32")
    o, lse = wrapper.run(q, k, v, return_lse=True)
    visible = dense_mask(indptr, indices, M, N, R, C, block_masks)
    o_ref, lse_ref = reference(q, k, v, visible)
    assert np.abs(o - o_ref).max() < 1e-4
    seen = visible.any(axis=1)
    assert np.abs(lse[seen] - lse_ref[seen]).max() < 1e-4
    assert np.all(o[~seen] == 0)


def test_malformed_structures_are_named():
    wrapper = flare.BlockSparseAttentionWrapper(np.zeros(1 << 20, dtype=np.uint8))
    indptr = np.array([0, 1, 2], dtype=np.int32)
    indices = np.array([0, 1], dtype=np.int32)
    with pytest.raises(ValueError, match="N=30 must be a multiple of C=16"):
        wrapper.plan(indptr, indices, 32, 30, 16, 16, 4, 4, 64, q_data_type="float32")
    with pytest.raises(ValueError, match="indices holds column block 2"):
        wrapper.plan(indptr, np.array([0, 2], dtype=np.int32), 32, 32, 16, 16, 4, 4, 64,
                     q_data_type="float32")
    with pytest.raises(ValueError, match=r"indptr must have ceil\(M / R\) \+ 1 = 3"):
        wrapper.plan(indptr[:2], indices[:1], 32, 32, 16, 16, 4, 4, 64, q_data_type="float32")
    with pytest.raises(ValueError, match="indptr must start at 0"):
        wrapper.plan(np.array([0, 2, 1], dtype=np.int32), indices, 32, 32, 16, 16, 4, 4, 64,
                     q_data_type="float32")
    with pytest.raises(ValueError, match=r"mask must have shape \[nnz, R, C\] = \[2, 16, 16\]"):
        wrapper.plan(indptr, indices, 32, 32, 16, 16, 4, 4, 64, q_data_type="float32",
                     mask=np.ones((2, 16, 8), dtype=bool))
    with pytest.raises(NotImplementedError, match="block_mask"):
        wrapper.plan(indptr, indices, 32, 32, 16, 16, 4, 4, 64, q_data_type="float32",
                     block_mask=np.ones((4, 2, 2), dtype=bool))
    with pytest.raises(RuntimeError, match="needs a plan"):
        flare.BlockSparseAttentionWrapper(np.zeros(1 << 20, dtype=np.uint8)).run(
            np.zeros((32, 4, 64), np.float32), np.zeros((32, 4, 64), np.float32),
            np.zeros((32, 4, 64), np.float32))
    wrapper.plan(indptr, indices, 32, 32, 16, 16, 4, 4, 64, q_data_type="float32")
    with pytest.raises(ValueError, match=r"k, v \[N=32, H_kv, D\]"):
        wrapper.run(np.zeros((32, 4, 64), np.float32), np.zeros((16, 4, 64), np.float32),
                    np.zeros((16, 4, 64), np.float32))


def partition(rng, total, parts):
    cuts = np.sort(rng.choice(np.arange(1, total), parts - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]]))


@pytest.mark.parametrize("heads,qo_len,kv_len,blocks", [((4, 2), 40, 50, (3, 5)),
                                                        ((3, 3), 17, 33, (4, 6)),
                                                        ((8, 1), 64, 64, (2, 2))])
def test_variable_blocks_per_kv_head_match_dense_attention(heads, qo_len, kv_len, blocks):
    rng = np.random.default_rng(qo_len * 100 + kv_len)
    H, H_kv = heads
    MB, NB = blocks
    rows = np.stack([partition(rng, qo_len, MB) for _ in range(H_kv)]).astype(np.int32)
    cols = np.stack([partition(rng, kv_len, NB) for _ in range(H_kv)]).astype(np.int32)
    block_mask = rng.random((H_kv, MB, NB)) < 0.6
    q = rng.standard_normal((H, qo_len, 64)).astype(np.float32)
    k = rng.standard_normal((H_kv, kv_len, 64)).astype(np.float32)
    v = rng.standard_normal((H_kv, kv_len, 64)).astype(np.float32)
    wrapper = flare.VariableBlockSparseAttentionWrapper(np.zeros(1 << 22, dtype=np.uint8))
    wrapper.plan(block_mask, rows, cols, H, H_kv, 64, q_data_type="float32")
    o, lse = wrapper.run(q, k, v, return_lse=True)
    group = H // H_kv
    for h in range(H):
        g = h // group
        visible = np.repeat(np.repeat(block_mask[g], rows[g], axis=0), cols[g], axis=1)
        o_ref, lse_ref = reference(q[h][:, None], k[g][:, None], v[g][:, None], visible)
        assert np.abs(o[h] - o_ref[:, 0]).max() < 1e-4, h
        seen = visible.any(axis=1)
        assert np.abs(lse[h][seen] - lse_ref[seen, 0]).max() < 1e-4, h
    out = np.full_like(o, np.nan)
    assert wrapper.run(q, k, v, out=out) is out and np.array_equal(out, o)


def test_variable_blocks_reject_what_they_cannot_express():
    wrapper = flare.VariableBlockSparseAttentionWrapper(np.zeros(1 << 20, dtype=np.uint8))
    mask = np.ones((2, 2, 2), dtype=bool)
    rows = np.array([[3, 5], [4, 4]], dtype=np.int32)
    cols = np.array([[2, 6], [4, 4]], dtype=np.int32)
    with pytest.raises(NotImplementedError, match="causal=True"):
        wrapper.plan(mask, rows, cols, 4, 2, 64, causal=True, q_data_type="float32")
    with pytest.raises(ValueError, match="must sum to one qo_len"):
        wrapper.plan(mask, np.array([[3, 5], [4, 5]]), cols, 4, 2, 64, q_data_type="float32")
    with pytest.raises(ValueError, match=r"block_mask_map must be \[num_kv_heads=4"):
        wrapper.plan(mask, rows, cols, 4, 4, 64, q_data_type="float32")
    wrapper.plan(mask, rows, cols, 4, 2, 64, q_data_type="float32")
    with pytest.raises(ValueError, match=r"q must be \[4, 8, D\]"):
        wrapper.run(np.zeros((4, 9, 64), np.float32), np.zeros((2, 8, 64), np.float32),
                    np.zeros((2, 8, 64), np.float32))


def test_torch_cpu_tensors_with_block_masks_match_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    M, N, R, C, H = 50, 64, 16, 16, 4
    indptr, indices = random_bsr(rng, -(-M // R), N // C, 0.6)
    block_masks = rng.random((len(indices), R, C)) < 0.5
    q = rng.standard_normal((M, H, 64)).astype(np.float32)
    k = rng.standard_normal((N, H, 64)).astype(np.float32)
    v = rng.standard_normal((N, H, 64)).astype(np.float32)
    outputs = []
    for convert in (lambda x: x, torch.from_numpy):
        wrapper = flare.BlockSparseAttentionWrapper(np.zeros(1 << 22, dtype=np.uint8))
        wrapper.plan(convert(indptr), convert(indices), M, N, R, C, H, H, 64,
                     mask=convert(block_masks), q_data_type="float32")
        outputs.append(np.asarray(wrapper.run(convert(q), convert(k), convert(v))))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    visible = dense_mask(indptr, indices, M, N, R, C, block_masks)
    assert np.abs(outputs[0] - reference(q, k, v, visible)[0]).max() < 1e-4
