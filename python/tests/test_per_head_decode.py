"""flare.sparse.PerHeadSparseDecodeWrapper (Quest) on the CPU backend: each (request, KV head)
reads its own random subset of its request's pages (page sizes 1 and 4, partial last pages,
GQA 2, an empty subset), against float64 attention over exactly those tokens; malformed
arguments are errors naming them."""

import numpy as np
import pytest

import flare

H, H_KV, D = 4, 2, 32


@pytest.mark.parametrize("page_size", [1, 4])
def test_each_head_reads_its_own_pages(page_size):
    rng = np.random.default_rng(page_size)
    pages = 40
    k_cache = rng.standard_normal((pages, H_KV, page_size, D)).astype(np.float32)
    v_cache = rng.standard_normal((pages, H_KV, page_size, D)).astype(np.float32)
    owned = [list(range(0, 12)), list(range(12, 30)), list(range(30, 40))]
    batch = len(owned)
    indptr, indices, last, chosen = [0], [], [], []
    for r in range(batch):
        for h in range(H_KV):
            count = 0 if (r, h) == (2, 1) else rng.integers(1, len(owned[r]) + 1)
            pick = list(rng.choice(owned[r], size=count, replace=False))
            # The request's final page holds one token; any other selected last page is full.
            valid = 1 if pick and pick[-1] == owned[r][-1] else page_size
            indices += pick
            indptr.append(len(indices))
            last.append(valid if pick else 0)
            chosen.append((pick, valid))
    q = rng.standard_normal((batch, H, D)).astype(np.float32)
    wrapper = flare.sparse.PerHeadSparseDecodeWrapper(np.zeros(1 << 22, dtype=np.uint8))
    wrapper.plan(np.array(indptr, np.int32), np.array(indices, np.int32),
                 np.array(last, np.int32), H, H_KV, D, page_size, q_data_type="float32")
    o, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)
    group = H // H_KV
    for r in range(batch):
        for h in range(H_KV):
            pick, valid = chosen[r * H_KV + h]
            rows = [(p, t) for i, p in enumerate(pick)
                    for t in range(valid if i == len(pick) - 1 else page_size)]
            for g in range(group):
                head = h * group + g
                if not rows:
                    assert np.all(o[r, head] == 0) and lse[r, head] == -np.inf
                    continue
                k = np.array([k_cache[p, h, t] for p, t in rows], dtype=np.float64)
                v = np.array([v_cache[p, h, t] for p, t in rows], dtype=np.float64)
                s = k @ q[r, head].astype(np.float64) / np.sqrt(D)
                w = np.exp(s - s.max())
                expected = w @ v / w.sum()
                assert np.abs(o[r, head] - expected).max() < 1e-4, (r, head)
                assert abs(lse[r, head] - (np.log(w.sum()) + s.max()) / np.log(2)) < 1e-4


def test_malformed_arguments_are_named():
    wrapper = flare.sparse.PerHeadSparseDecodeWrapper(np.zeros(1 << 20, dtype=np.uint8))
    with pytest.raises(ValueError, match="batch \\* num_kv_heads \\+ 1 entries"):
        wrapper.plan(np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32),
                     np.array([1, 1], np.int32), H, H_KV * 2, D, 1, q_data_type="float32")
    with pytest.raises(ValueError, match="must be a positive multiple"):
        wrapper.plan(np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32),
                     np.array([1, 1], np.int32), 3, 2, D, 1, q_data_type="float32")
    with pytest.raises(ValueError, match="indices must have indptr\\[-1\\] = 2"):
        wrapper.plan(np.array([0, 1, 2], np.int32), np.array([0], np.int32),
                     np.array([1, 1], np.int32), H, H_KV, D, 1, q_data_type="float32")
    wrapper.plan(np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32),
                 np.array([1, 1], np.int32), H, H_KV, D, 1, q_data_type="float32")
    cache = np.zeros((2, 2, H_KV, 1, D), np.float32)
    with pytest.raises(ValueError, match="must be a \\(k_cache, v_cache\\) tuple"):
        wrapper.run(np.zeros((1, H, D), np.float32), cache)
    with pytest.raises(ValueError, match="k_cache must be a contiguous HND tensor"):
        wrapper.run(np.zeros((1, H, D), np.float32),
                    (np.zeros((2, 1, H_KV, D), np.float32), np.zeros((2, 1, H_KV, D), np.float32)))
