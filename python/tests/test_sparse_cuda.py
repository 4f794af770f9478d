"""flare.sparse.spmm and sddmm on CUDA tensors (the GPU CSR kernels) against float64 torch:
torch sparse CSR and COO inputs and (indptr, indices, values) triples, feature sizes 32-512, a
power-law graph with a long row, non-contiguous operands, float16 and bfloat16 operands and
feature sizes below 32; the hyb(c, k) kernels (plans, graph replay); formats the GPU lacks and other feature sizes raise. Skipped visibly without PyTorch or a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402

DEVICE = torch.device("cuda:0")


def random_csr(rows, cols, nnz, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(rows * cols, generator=g)[:nnz].sort().values
    values = torch.randn(nnz, generator=g)
    coo = torch.sparse_coo_tensor(torch.stack([flat // cols, flat % cols]), values, (rows, cols))
    return coo.coalesce().to_sparse_csr()


def expected(a, x):
    return torch.sparse.mm(a.to(torch.float64).cpu(), x.to(torch.float64).cpu())


@pytest.mark.parametrize("d", [32, 64, 128, 256, 512])
def test_spmm_matches_float64_on_csr_coo_and_triples(d):
    a = random_csr(300, 257, 4000, seed=d)
    x = torch.randn(257, d, device=DEVICE)
    want = expected(a, x)
    for given in (a.to(DEVICE), a.to_sparse_coo().to(DEVICE)):
        y = flare.sparse.spmm(given, x)
        assert y.device == x.device and y.dtype == torch.float32 and y.shape == (300, d)
        torch.testing.assert_close(y.cpu().double(), want, atol=1e-4, rtol=1e-4)
    triple = (a.crow_indices().to(DEVICE), a.col_indices().to(DEVICE), a.values().to(DEVICE))
    y = flare.sparse.spmm(triple, x, shape=(300, 257))
    torch.testing.assert_close(y.cpu().double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [8, 32, 128, 512])
def test_sixteen_bit_operands_keep_their_dtype_with_float32_sums(dtype, d):
    a = random_csr(300, 257, 4000, seed=d + 1)
    x = torch.randn(257, d, device=DEVICE, dtype=dtype)
    y = flare.sparse.spmm(a.to(DEVICE), x)
    assert y.dtype == dtype and y.shape == (300, d)
    # A's values are rounded to X's dtype; the float32 sum is rounded once.
    want = expected(a.to(dtype), x)
    tolerance = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    torch.testing.assert_close(y.cpu().double(), want, atol=tolerance, rtol=tolerance)
    q = torch.randn(300, d, device=DEVICE, dtype=dtype)
    k = torch.randn(257, d, device=DEVICE, dtype=dtype)
    out = flare.sparse.sddmm(a.to(DEVICE), q, k)
    assert out.values().dtype == dtype
    rows = torch.repeat_interleave(torch.arange(300), a.crow_indices().diff())
    dense = q.double().cpu() @ k.double().cpu().T
    torch.testing.assert_close(out.values().cpu().double(), dense[rows, a.col_indices()],
                               atol=tolerance * d ** 0.5, rtol=tolerance)
    with pytest.raises(ValueError, match="K must have Q's dtype"):
        flare.sparse.sddmm(a.to(DEVICE), q, k.float())


def test_spmm_plan_tunes_once_then_replays_in_a_cuda_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("FLARE_CACHE_DIR", str(tmp_path))
    indptr, indices = flare.sparse.graph("uniform", 3000, 60000, seed=3)
    a = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                torch.randn(indices.shape[0]), (3000, 3000))
    x = torch.randn(3000, 256, device=DEVICE)
    want = expected(a, x)
    plan = flare.sparse.SpmmPlan(a, device=DEVICE)
    assert plan.schedule(256, torch.float32) is None
    y = plan.run(x)  # the search: every candidate timed, A X left in y
    torch.testing.assert_close(y.cpu().double(), want, atol=1e-4, rtol=1e-4)
    chosen = plan.schedule(256, torch.float32)
    candidates = flare._flare.sparse_spmm_schedules(256)
    assert not chosen["from_cache"] and len(chosen["timings_us"]) == len(candidates)
    assert (chosen["feature_tile"], chosen["chunk_items"]) in [tuple(c) for c in candidates]
    # A second plan of the same structure reads the disk cache.
    again = flare.sparse.SpmmPlan(a, device=DEVICE)
    torch.testing.assert_close(again.run(x).cpu().double(), want, atol=1e-4, rtol=1e-4)
    assert again.schedule(256, torch.float32)["from_cache"]
    # Tuned runs replay from a CUDA graph; a first run cannot be captured.
    out = torch.full((3000, 256), float("nan"), device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        plan.run(x, out=out)  # warm-up off the graph
        with torch.cuda.graph(graph, stream=stream):
            plan.run(x, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-4, rtol=1e-4)
    fresh = flare.sparse.SpmmPlan(a, device=DEVICE, cache=False)
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph"):
        with torch.cuda.stream(stream):
            with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                fresh.run(x)
    untuned = flare.sparse.SpmmPlan(a, device=DEVICE, tune=False)
    torch.testing.assert_close(untuned.run(x).cpu().double(), want, atol=1e-4, rtol=1e-4)
    assert untuned.schedule(256, torch.float32) == {"format": "csr", "feature_tile": 256,
                                                     "chunk_items": 256}
    with pytest.raises(ValueError, match="out must be a torch.float32 \\[3000, 256\\] tensor"):
        plan.run(x, out=torch.empty(3000, 128, device=DEVICE))


@pytest.mark.parametrize("c,k", [(1, 5), (1, 0), (3, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_spmm_over_hyb_matches_float64(c, k, dtype):
    indptr, indices = flare.sparse.graph("rmat", 3000, 40000, seed=c + k)
    a = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                torch.randn(indices.shape[0]), (3000, 3000))
    plan = flare.sparse.SpmmPlan(a.to(DEVICE), device=DEVICE, format="hyb", hyb=(c, k))
    for d in (8, 32, 128, 512):
        x = torch.randn(3000, d, device=DEVICE, dtype=dtype)
        y = plan.run(x)
        assert y.dtype == dtype and y.shape == (3000, d)
        want = expected(a.to(dtype), x)
        if dtype == torch.float32:
            torch.testing.assert_close(y.cpu().double(), want, atol=1e-4, rtol=1e-4)
        else:
            # One rounding to bfloat16 per partition, each of at most the row's L1 sum.
            magnitude = torch.sparse_csr_tensor(a.crow_indices(), a.col_indices(),
                                                a.values().to(dtype).abs(), a.shape)
            l1 = expected(magnitude, x.abs())
            assert ((y.cpu().double() - want).abs() <= c * 2 ** -8 * l1 + 1e-30).all()
    if (c, k) == (1, 5):  # spmm(format="hyb") is hyb(1, 5) for one call
        x = torch.randn(3000, 64, device=DEVICE, dtype=dtype)
        tolerance = 1e-4 if dtype == torch.float32 else 2 ** -7
        torch.testing.assert_close(flare.sparse.spmm(a.to(DEVICE), x, format="hyb").cpu().double(),
                                   expected(a.to(dtype), x), atol=tolerance, rtol=tolerance)


def test_spmm_over_hyb_replays_in_a_cuda_graph_and_checks_a():
    a = random_csr(500, 400, 6000, seed=9)
    x = torch.randn(400, 128, device=DEVICE)
    plan = flare.sparse.SpmmPlan(a, device=DEVICE, format="hyb", hyb=(2, 3))
    out = torch.full((500, 128), float("nan"), device=DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        plan.run(x, out=out)  # warm-up off the graph: compiles, gathers the float32 values
        with torch.cuda.graph(graph, stream=stream):
            plan.run(x, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu().double(), expected(a, x), atol=1e-4, rtol=1e-4)
    chosen = plan.schedule(128, torch.float32)  # tuned at the warm-up
    assert len(chosen["timings_us"]) == 6 or chosen["from_cache"]
    assert (chosen["feature_tile"], chosen["slots_per_warp"]) in [
        (128, 128), (128, 512), (64, 128), (64, 512), (32, 128), (32, 512)]
    untuned = flare.sparse.SpmmPlan(a, device=DEVICE, format="hyb", hyb=(2, 3), tune=False)
    torch.testing.assert_close(untuned.run(x).cpu().double(), expected(a, x), atol=1e-4,
                               rtol=1e-4)
    assert untuned.schedule(128, torch.float32) == {"format": "hyb(2, 3)", "feature_tile": 128,
                                                     "slots_per_warp": 128}
    with pytest.raises(ValueError, match="format must be 'csr', 'hyb', 'bsr' or 'auto', got 'ell'"):
        flare.sparse.SpmmPlan(a, device=DEVICE, format="ell")
    # The decomposition is built on the host, which validates A: an unsorted row raises.
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="indices"):
        flare.sparse.SpmmPlan((indptr, torch.tensor([3, 1], dtype=torch.int32),
                               torch.ones(2)), device=DEVICE, shape=(1, 4), format="hyb")


def test_format_auto_times_csr_and_each_hyb_then_keeps_the_fastest(tmp_path, monkeypatch):
    monkeypatch.setenv("FLARE_CACHE_DIR", str(tmp_path))
    indptr, indices = flare.sparse.graph("rmat", 4000, 50000, seed=5)
    a = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                torch.randn(indices.shape[0]), (4000, 4000))
    plan = flare.sparse.SpmmPlan(a, device=DEVICE, format="auto", auto_hyb=((1, 4), (2, 6)))
    for d in (32, 128):
        x = torch.randn(4000, d, device=DEVICE)
        out = torch.full((4000, d), float("nan"), device=DEVICE)
        plan.run(x, out=out)  # the search leaves A X from the chosen format in out
        torch.testing.assert_close(out.cpu().double(), expected(a, x), atol=1e-4, rtol=1e-4)
        chosen = plan.schedule(d, torch.float32)
        times = chosen["format_timings_us"]
        assert set(times) == {"csr", "hyb(1, 4)", "hyb(2, 6)"}
        assert chosen["format"] == min(times, key=times.get)
        out.fill_(float("nan"))
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                plan.run(x, out=out)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu().double(), expected(a, x), atol=1e-4, rtol=1e-4)
        # A second plan of the same structure reads the choice and builds only that format.
        again = flare.sparse.SpmmPlan(a, device=DEVICE, format="auto", auto_hyb=((1, 4), (2, 6)))
        torch.testing.assert_close(again.run(x).cpu().double(), expected(a, x), atol=1e-4,
                                   rtol=1e-4)
        cached = again.schedule(d, torch.float32)
        assert cached["format"] == chosen["format"] and cached["format_from_cache"]
        assert len(again._hybs) == (0 if chosen["format"] == "csr" else 1)


def block_structured(rows, cols, block_share, seed):
    """rows x cols with block_share of its 16 x 16 block positions 80% full, about 1% of the
    other entries set, as a torch sparse CSR tensor."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.rand((rows + 15) // 16, (cols + 15) // 16, generator=g) < block_share
    dense_blocks = blocks.repeat_interleave(16, 0).repeat_interleave(16, 1)[:rows, :cols]
    keep = torch.rand(rows, cols, generator=g) < torch.where(dense_blocks, 0.8, 0.01)
    return (torch.randn(rows, cols, generator=g) * keep).to_sparse_csr()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_spmm_over_bsr_blocks_on_tensor_cores(dtype):
    a = block_structured(300, 257, 0.3, seed=7)
    plan = flare.sparse.SpmmPlan(a, device=DEVICE, format="bsr", bsr_min_fill=0.5)
    for d in (32, 128, 512):
        x = torch.randn(257, d, device=DEVICE, dtype=dtype)
        y = plan.run(x)
        assert y.dtype == dtype and y.shape == (300, d)
        want = expected(a.to(dtype), x)
        magnitude = torch.sparse_csr_tensor(a.crow_indices(), a.col_indices(),
                                            a.values().to(dtype).abs(), a.shape)
        # The block kernel's 16-bit Y, then the remainder's rounding: two, each at most the
        # row's L1 sum in the dtype's unit roundoff.
        unit = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11
        l1 = expected(magnitude, x.abs())
        assert ((y.cpu().double() - want).abs() <= 2 * unit * l1 + 1e-6).all()
    chosen = plan.schedule(128, dtype)
    assert chosen["format"] == "bsr" and chosen["blocks"] > 0
    with pytest.raises(NotImplementedError, match="takes float16 or bfloat16 x, got float32"):
        plan.run(torch.randn(257, 32, device=DEVICE))
    with pytest.raises(NotImplementedError, match="positive multiples of 32, got 16"):
        plan.run(torch.randn(257, 16, device=DEVICE, dtype=dtype))


def test_spmm_on_a_power_law_graph_with_a_strided_x():
    indptr, indices = flare.sparse.graph("rmat", 5000, 60000, seed=1)
    a = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                torch.randn(indices.shape[0]), (5000, 5000))
    x = torch.randn(5000, 160, device=DEVICE)[:, 16:144]  # rows 160 floats apart
    y = flare.sparse.spmm(a.to(DEVICE), x)
    torch.testing.assert_close(y.cpu().double(), expected(a, x), atol=1e-4, rtol=1e-4)


def test_what_the_gpu_kernel_lacks_raises():
    a = random_csr(10, 10, 20, seed=0).to(DEVICE)
    with pytest.raises(NotImplementedError, match="format 'ell' runs on the CPU backend only"):
        flare.sparse.spmm(a, torch.randn(10, 32, device=DEVICE), format="ell")
    with pytest.raises(NotImplementedError, match="multiple of 32 or a power of two below 32, got 48"):
        flare.sparse.spmm(a, torch.randn(10, 48, device=DEVICE))
    with pytest.raises(ValueError, match="X must have shape \\[cols = 10, d\\], got \\[11, 32\\]"):
        flare.sparse.spmm(a, torch.randn(11, 32, device=DEVICE))
    # Column ids outside the matrix (a triple is not validated on the device): no read outside
    # X, those entries contribute nothing.
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    indices = torch.tensor([1, 99, -4], dtype=torch.int32, device=DEVICE)
    values = torch.tensor([2.0, 5.0, 7.0], device=DEVICE)
    x = torch.randn(3, 32, device=DEVICE)
    y = flare.sparse.spmm((indptr, indices, values), x, shape=(2, 3))
    torch.testing.assert_close(y, torch.stack([2.0 * x[1], torch.zeros(32, device=DEVICE)]))


@pytest.mark.parametrize("d", [32, 128, 512])
def test_sddmm_matches_float64_on_csr_coo_and_triples(d):
    a = random_csr(300, 257, 4000, seed=d)
    q = torch.randn(300, d, device=DEVICE)
    k = torch.randn(257, d, device=DEVICE)
    dense = q.double().cpu() @ k.double().cpu().T
    rows = torch.repeat_interleave(torch.arange(300), a.crow_indices().diff())
    want = dense[rows, a.col_indices()]
    for given in (a.to(DEVICE), a.to_sparse_coo().to(DEVICE)):
        out = flare.sparse.sddmm(given, q, k)
        assert out.layout == torch.sparse_csr and out.device == q.device
        torch.testing.assert_close(out.values().cpu().double(), want, atol=1e-4, rtol=1e-4)
    pattern = (a.crow_indices().to(DEVICE), a.col_indices().to(DEVICE), None)
    out = flare.sparse.sddmm(pattern, q, k, shape=(300, 257))
    assert out.dtype == torch.float32 and out.shape == (4000,)
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-4, rtol=1e-4)


def test_sddmm_on_a_power_law_graph_with_strided_operands():
    indptr, indices = flare.sparse.graph("rmat", 5000, 60000, seed=2)
    a = torch.sparse_csr_tensor(torch.from_numpy(indptr), torch.from_numpy(indices),
                                torch.ones(indices.shape[0]), (5000, 5000))
    q = torch.randn(5000, 160, device=DEVICE)[:, 16:144]
    k = torch.randn(5000, 160, device=DEVICE)[:, 8:136]
    out = flare.sparse.sddmm(a.to(DEVICE), q, k)
    want = torch.sparse.sampled_addmm(a.to(DEVICE), q.contiguous(), k.T.contiguous(), beta=0.0)
    torch.testing.assert_close(out.values(), want.values(), atol=1e-4, rtol=1e-4)
    with pytest.raises(NotImplementedError, match="multiple of 32 or a power of two below 32, got 48"):
        flare.sparse.sddmm(a.to(DEVICE), torch.randn(5000, 48, device=DEVICE),
                           torch.randn(5000, 48, device=DEVICE))
    # Column ids outside the matrix: no read outside K, those entries are 0.
    pattern = (torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE),
               torch.tensor([1, 99, -4], dtype=torch.int32, device=DEVICE), None)
    q2, k2 = torch.randn(2, 32, device=DEVICE), torch.randn(3, 32, device=DEVICE)
    out = flare.sparse.sddmm(pattern, q2, k2, shape=(2, 3))
    torch.testing.assert_close(out, torch.stack([q2[0] @ k2[1], torch.tensor(0.0, device=DEVICE),
                                                 torch.tensor(0.0, device=DEVICE)]))
