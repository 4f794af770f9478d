"""flare.sparse on the CPU (numpy triples; torch sparse tensors when torch is installed):
SpMM and SDDMM against dense float64 numpy, the hyb decomposition's exact cover, and errors
naming the array."""

import numpy as np
import pytest

import flare


def random_csr(rows, cols, density, seed, long_row=False):
    rng = np.random.default_rng(seed)
    dense = (rng.random((rows, cols)) < density) * rng.standard_normal((rows, cols))
    dense[3::4] = 0  # empty rows
    if long_row:
        dense[rows // 2] = rng.standard_normal(cols)
    indptr = np.zeros(rows + 1, np.int32)
    indices, values = [], []
    for r in range(rows):
        cols_r = np.nonzero(dense[r])[0]
        indices.extend(cols_r)
        values.extend(dense[r, cols_r])
        indptr[r + 1] = len(indices)
    return ((indptr, np.array(indices, np.int32), np.array(values, np.float32)),
            dense.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("rows,cols,d,long_row", [(120, 90, 16, True), (33, 1, 5, False),
                                                  (64, 300, 1, False)])
@pytest.mark.parametrize("fmt", ["auto", "coo", "ell", "hyb"])
def test_spmm_matches_dense_float64(rows, cols, d, long_row, fmt):
    a, dense = random_csr(rows, cols, 0.05, 1, long_row)
    x = np.random.default_rng(2).standard_normal((cols, d)).astype(np.float32)
    y = flare.sparse.spmm(a, x, format=fmt, shape=(rows, cols))
    assert y.dtype == np.float32 and y.shape == (rows, d)
    np.testing.assert_allclose(y, dense @ x.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_sddmm_matches_dense_float64():
    a, dense = random_csr(80, 50, 0.1, 3)
    q = np.random.default_rng(4).standard_normal((80, 8)).astype(np.float32)
    k = np.random.default_rng(5).standard_normal((50, 8)).astype(np.float32)
    out = flare.sparse.sddmm(a, q, k, shape=(80, 50))
    rows, cols = np.nonzero(dense)
    expected = (q.astype(np.float64) @ k.astype(np.float64).T)[rows, cols]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["auto", "coo", "ell", "hyb"])
def test_float16_operands_give_float16_results(fmt):
    a, dense = random_csr(70, 60, 0.1, 11, long_row=True)
    x = np.random.default_rng(12).standard_normal((60, 8)).astype(np.float16)
    y = flare.sparse.spmm(a, x, format=fmt, shape=(70, 60))
    assert y.dtype == np.float16 and y.shape == (70, 8)
    exact = dense @ x.astype(np.float64)
    # One rounding of the float64 sum (through float32) to float16: within half an ulp.
    np.testing.assert_array_equal(y, exact.astype(np.float32).astype(np.float16))
    q = np.random.default_rng(13).standard_normal((70, 4)).astype(np.float16)
    k = np.random.default_rng(14).standard_normal((60, 4)).astype(np.float16)
    out = flare.sparse.sddmm(a, q, k, shape=(70, 60))
    rows, cols = np.nonzero(dense)
    expected = (q.astype(np.float64) @ k.astype(np.float64).T)[rows, cols]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, expected.astype(np.float32).astype(np.float16))
    with pytest.raises(ValueError, match="K must have Q's dtype float16, got float32"):
        flare.sparse.sddmm(a, q, k.astype(np.float32), shape=(70, 60))


def test_torch_bfloat16_operands():
    torch = pytest.importorskip("torch")
    a, dense = random_csr(50, 40, 0.1, 15)
    csr = torch.sparse_csr_tensor(torch.from_numpy(a[0]), torch.from_numpy(a[1]),
                                  torch.from_numpy(a[2]), (50, 40))
    x = torch.randn(40, 6).to(torch.bfloat16)
    y = flare.sparse.spmm(csr, x)
    assert y.dtype == torch.bfloat16
    exact = torch.from_numpy(dense) @ x.double()
    torch.testing.assert_close(y, exact.float().bfloat16(), rtol=0, atol=0)
    q, k = torch.randn(50, 4).bfloat16(), torch.randn(40, 4).bfloat16()
    sampled = flare.sparse.sddmm(csr, q, k)
    assert sampled.values().dtype == torch.bfloat16


def test_hyb_covers_every_nonzero_once():
    a, _ = random_csr(100, 64, 0.1, 6, long_row=True)
    h = flare.sparse.hyb(a, 4, 2, shape=(100, 64))
    assert len(h["partitions"]) == 4 and h["nnz"] == len(a[1])
    sources = []
    for part in h["partitions"]:
        for bucket in part["buckets"]:
            sources += [s for s in bucket["source"] if s >= 0]
        sources += part["remainder"]["source"]
    assert sorted(sources) == list(range(len(a[1])))
    assert h["padding_ratio"] >= 1.0


def test_ell_pads_every_row_to_one_width():
    a, dense = random_csr(50, 40, 0.1, 8, long_row=True)
    longest = int(np.diff(a[0]).max())
    e = flare.sparse.ell(a, shape=(50, 40))
    assert e["width"] == longest and e["rows"] == list(range(50))
    assert sorted(s for s in e["source"] if s >= 0) == list(range(len(a[1])))
    assert e["padding_ratio"] == pytest.approx(50 * longest / len(a[1]))
    assert flare.sparse.ell(a, width=longest + 2, shape=(50, 40))["width"] == longest + 2
    with pytest.raises(ValueError, match="more than width"):
        flare.sparse.ell(a, width=longest - 1, shape=(50, 40))


def test_errors_name_the_array():
    a, _ = random_csr(4, 4, 0.5, 7)
    indptr, indices, values = a
    unsorted = indices.copy()
    row = int(np.argmax(np.diff(indptr) >= 2))
    begin = indptr[row]
    unsorted[begin], unsorted[begin + 1] = unsorted[begin + 1], unsorted[begin]
    x = np.ones((4, 2), np.float32)
    with pytest.raises(ValueError, match=r"A.indices\[.*columns must be sorted and unique"):
        flare.sparse.spmm((indptr, unsorted, values), x, shape=(4, 4))
    with pytest.raises(ValueError, match=r"X must have shape \[4, d\]"):
        flare.sparse.spmm(a, np.ones((3, 2), np.float32), shape=(4, 4))
    with pytest.raises(ValueError, match="needs shape=\\(rows, cols\\)"):
        flare.sparse.spmm(a, x)
    with pytest.raises(ValueError, match="format must be"):
        flare.sparse.spmm(a, x, format="bsr", shape=(4, 4))
    with pytest.raises(ValueError, match="column_parts must be in"):
        flare.sparse.hyb(a, 0, 2, shape=(4, 4))


def test_torch_sparse_tensors_match_torch():
    torch = pytest.importorskip("torch")
    a, dense = random_csr(60, 40, 0.1, 8)
    csr = torch.sparse_csr_tensor(torch.from_numpy(a[0]), torch.from_numpy(a[1]),
                                  torch.from_numpy(a[2]), (60, 40))
    x = torch.randn(40, 6)
    y = flare.sparse.spmm(csr, x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.sparse.mm(csr, x), rtol=1e-5, atol=1e-5)
    y_coo = flare.sparse.spmm(csr.to_sparse_coo(), x)
    torch.testing.assert_close(y_coo, y)
    q, k = torch.randn(60, 4), torch.randn(40, 4)
    sampled = flare.sparse.sddmm(csr, q, k)
    expected = torch.sparse.sampled_addmm(csr, q, k.T, beta=0.0)
    torch.testing.assert_close(sampled.values(), expected.values(), rtol=1e-5, atol=1e-5)


def test_graph_is_seeded_csr_with_sorted_unique_columns():
    indptr, indices = flare.sparse.graph("rmat", 1000, 5000, seed=3)
    again, again_indices = flare.sparse.graph("rmat", 1000, 5000, seed=3)
    assert np.array_equal(indptr, again) and np.array_equal(indices, again_indices)
    assert indptr.dtype == np.int32 and indptr.shape == (1001,) and indptr[-1] == 5000
    for r in range(1000):
        row = indices[indptr[r]:indptr[r + 1]]
        assert (np.diff(row) > 0).all() and (row >= 0).all() and (row < 1000).all()
    other, _ = flare.sparse.graph("uniform", 1000, 5000, seed=3)
    assert np.diff(other).max() < np.diff(indptr).max()  # R-MAT's hubs
    with pytest.raises(ValueError, match="kind must be 'rmat' or 'uniform'"):
        flare.sparse.graph("kronecker", 10, 10)
