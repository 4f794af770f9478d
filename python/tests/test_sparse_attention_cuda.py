"""Block-sparse and cascade attention on the GPU (FlashInfer's BlockSparseAttentionWrapper,
VariableBlockSparseAttentionWrapper, MultiLevelCascadeAttentionWrapper and the shared-prefix
wrappers over flare's paged prefill and decode): random masks and block sizes (1x1, 4x16,
16x16, 64x64), per-block masks, GQA, two-level cascades in the decode and causal append
stages, against float32 torch attention over the equivalent dense mask. Skipped visibly
without PyTorch or a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402

DEVICE = torch.device("cuda:0")


def dense_attention(q, k, v, visible):
    """o [m, H, D] (float32) of q [m, H, D], k, v [n, H_kv, D] and visible [m, n] (or
    [H, m, n]); fully masked rows give 0."""
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, 1)
    vv = v.float().repeat_interleave(group, 1)
    s = torch.einsum("mhd,nhd->hmn", q.float(), kk) / q.shape[2] ** 0.5
    s = s.masked_fill(~visible.expand_as(s), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hmn,nhd->mhd", p, vv)


def workspace():
    return torch.zeros(128 << 20, dtype=torch.uint8, device=DEVICE)


@pytest.mark.parametrize("R,C", [(1, 1), (4, 16), (16, 16), (64, 64)])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("mask_inside_block", [False, True])
def test_block_sparse_matches_dense_attention(R, C, heads, mask_inside_block):
    torch.manual_seed(R * 100 + C)
    H, H_kv = heads
    M, N = 256, 384
    MB, NB = M // R, N // C
    blocks = torch.rand(MB, NB) < 0.3
    indptr = torch.cat([torch.zeros(1, dtype=torch.int32),
                        blocks.sum(1).cumsum(0).to(torch.int32)]).to(DEVICE)
    indices = blocks.nonzero()[:, 1].to(torch.int32).to(DEVICE)
    nnz = int(indices.numel())
    block_masks = (torch.rand(nnz, R, C) > 0.5 if mask_inside_block
                   else torch.ones(nnz, R, C, dtype=torch.bool)).to(DEVICE)
    q = torch.randn(M, H, 128, dtype=torch.float16, device=DEVICE)
    k = torch.randn(N, H_kv, 128, dtype=torch.float16, device=DEVICE)
    v = torch.randn(N, H_kv, 128, dtype=torch.float16, device=DEVICE)
    visible = torch.zeros(M, N, dtype=torch.bool, device=DEVICE)
    rows, cols = blocks.nonzero(as_tuple=True)
    for b, (i, j) in enumerate(zip(rows.tolist(), cols.tolist())):
        visible[i * R:(i + 1) * R, j * C:(j + 1) * C] = block_masks[b]
    wrapper = flare.sparse.BlockSparseAttentionWrapper(workspace())
    wrapper.plan(indptr, indices, M, N, R, C, H, H_kv, 128,
                 mask=block_masks if mask_inside_block else None)
    o = wrapper.run(q, k, v)
    torch.testing.assert_close(o.float(), dense_attention(q, k, v, visible), atol=1e-2,
                               rtol=1e-3)
    out = torch.empty_like(o)
    wrapper.run(q, k, v, out=out)
    assert torch.equal(out, o)


@pytest.mark.parametrize("H,H_kv", [(8, 2), (4, 4)])
def test_variable_block_sparse_matches_dense_attention(H, H_kv):
    torch.manual_seed(11)
    seq = 1000

    def partition(blocks):
        cuts = torch.randperm(seq - 1)[:blocks - 1].sort().values + 1
        return torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([seq])]))

    rows = torch.stack([partition(7) for _ in range(H_kv)]).to(torch.int32)
    cols = torch.stack([partition(13) for _ in range(H_kv)]).to(torch.int32)
    block_mask = torch.rand(H_kv, 7, 13) > 0.5
    q = torch.randn(H, seq, 128, dtype=torch.bfloat16, device=DEVICE)
    k = torch.randn(H_kv, seq, 128, dtype=torch.bfloat16, device=DEVICE)
    v = torch.randn(H_kv, seq, 128, dtype=torch.bfloat16, device=DEVICE)
    wrapper = flare.sparse.VariableBlockSparseAttentionWrapper(workspace())
    wrapper.plan(block_mask.to(DEVICE), rows.to(DEVICE), cols.to(DEVICE), H, H_kv, 128,
                 q_data_type=torch.bfloat16)
    o = wrapper.run(q, k, v)
    group = H // H_kv
    for h in range(H):
        g = h // group
        visible = block_mask[g].repeat_interleave(rows[g].long(), 0).repeat_interleave(
            cols[g].long(), 1).to(DEVICE)
        expected = dense_attention(q[h][:, None], k[g][:, None], v[g][:, None], visible)[:, 0]
        torch.testing.assert_close(o[h].float(), expected, atol=2e-2, rtol=1e-2)
    # The caller's out / lse, contiguous (written in place when one query head a KV head) or
    # strided (written by a copy), hold what the wrapper returns.
    o_lse, lse = wrapper.run(q, k, v, return_lse=True)
    assert torch.equal(o_lse, o)
    for strided in (False, True):
        out = torch.full((H, seq, 256) if strided else (H, seq, 128), float("nan"),
                         dtype=torch.bfloat16, device=DEVICE)
        lse_out = torch.full((H, 2 * seq) if strided else (H, seq), float("nan"), device=DEVICE)
        out, lse_out = (out[..., ::2], lse_out[:, ::2]) if strided else (out, lse_out)
        got = wrapper.run(q, k, v, out=out, lse=lse_out, return_lse=True)
        assert got[0] is out and got[1] is lse_out
        assert torch.equal(out, o) and torch.equal(lse_out, lse)
    with pytest.raises(ValueError, match=r"out must have shape \[%d, %d, 128\]" % (H, seq)):
        wrapper.run(q, k, v, out=torch.empty(H, seq + 1, 128, dtype=torch.bfloat16,
                                             device=DEVICE))


@pytest.mark.parametrize("stage", ["decode", "append"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_two_level_cascade_and_shared_prefix_wrappers(stage, page_size):
    torch.manual_seed(page_size)
    H, H_kv, D, batch = 8, 2, 128, 5
    prefix_len = 301
    own_lens = [1, 17, 40, 3, 100]
    q_lens = [1] * batch if stage == "decode" else [1, 5, 9, 3, 7]
    pages_of = [-(-n // page_size) for n in [prefix_len] + own_lens]
    cache = torch.randn(sum(pages_of), 2, page_size, H_kv, D, dtype=torch.float16,
                        device=DEVICE)
    starts = torch.tensor([0] + pages_of).cumsum(0).tolist()
    total = sum(q_lens)
    q = torch.randn(total, H, D, dtype=torch.float16, device=DEVICE)

    def level(seqs):
        indptr = torch.tensor([0] + [pages_of[s] for s in seqs]).cumsum(0).to(torch.int32)
        indices = torch.cat([torch.arange(starts[s], starts[s + 1]) for s in seqs])
        lens = [([prefix_len] + own_lens)[s] for s in seqs]
        last = torch.tensor([n - (-(-n // page_size) - 1) * page_size for n in lens],
                            dtype=torch.int32)
        return indptr, indices.to(torch.int32).to(DEVICE), last

    top, own = level([0]), level(range(1, batch + 1))
    qo_top = torch.tensor([0, total], dtype=torch.int32)
    qo_own = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    wrapper = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD")
    wrapper.plan([qo_top, qo_own], [top[0], own[0]], [top[1], own[1]], [top[2], own[2]], H,
                 H_kv, D, page_size, causal=stage == "append")
    o = wrapper.run(q, cache)

    def tokens(s, n):
        rows = cache[starts[s]:starts[s + 1]]
        return rows[:, 0].reshape(-1, H_kv, D)[:n], rows[:, 1].reshape(-1, H_kv, D)[:n]

    k_shared, v_shared = (x.contiguous() for x in tokens(0, prefix_len))
    for r in range(batch):
        k_own, v_own = tokens(r + 1, own_lens[r])
        k = torch.cat([k_shared, k_own])
        v = torch.cat([v_shared, v_own])
        pos = torch.arange(q_lens[r], device=DEVICE)[:, None] + own_lens[r] - q_lens[r]
        col = torch.arange(len(k), device=DEVICE)[None, :]
        visible = (col < prefix_len) | (col - prefix_len <= pos)
        rows = slice(int(qo_own[r]), int(qo_own[r + 1]))
        torch.testing.assert_close(o[rows].float(), dense_attention(q[rows], k, v, visible),
                                   atol=1e-2, rtol=1e-3)
    if stage == "decode":
        two = flare.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(workspace(), "NHD")
        two.begin_forward(own[0], own[1], own[2], H, H_kv, D, page_size)
        o_two = two.forward(q, k_shared, v_shared, cache)
    else:
        two = flare.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(workspace(), "NHD")
        two.begin_forward(qo_own, own[0], own[1], own[2], H, H_kv, D, page_size)
        o_two = two.forward(q, k_shared, v_shared, cache, causal=True)
    torch.testing.assert_close(o_two.float(), o.float(), atol=1e-2, rtol=1e-3)
    # Later calls reuse the prefix plan and the scratch rows, a shorter prefix replans: against
    # the composition the wrappers stand for (the prefix's single prefill ⊕ the own pages).
    if stage == "decode":
        own_wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
        own_wrapper.plan(own[0], own[1], own[2], H, H_kv, D, page_size)
    else:
        own_wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
        own_wrapper.plan(qo_own, own[0], own[1], own[2], H, H_kv, D, page_size, causal=True)
    for n in (prefix_len, prefix_len - 100, prefix_len):
        ks, vs = k_shared[:n], v_shared[:n]
        extra = {} if stage == "decode" else {"causal": True}
        o_n, lse_n = two.forward(q, ks, vs, cache, return_lse=True, **extra)
        o_ref, lse_ref = flare.single_prefill_with_kv_cache(q, ks, vs, return_lse=True)
        own_o, own_lse = own_wrapper.run(q, cache, return_lse=True)
        flare.merge_state_in_place(o_ref, lse_ref, own_o, own_lse)
        torch.testing.assert_close(o_n, o_ref, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(lse_n, lse_ref, atol=1e-4, rtol=1e-5)
        assert torch.equal(two.forward(q, ks, vs, cache, **extra), o_n)


def test_an_empty_prefix_level_equals_plain_decode():
    """Level 0 with no pages (an empty kv_indices, which torch allocates without storage) adds
    nothing: the cascade equals the batch decode of the suffixes."""
    torch.manual_seed(3)
    H, H_kv, D, page, batch = 8, 2, 128, 16, 3
    cache = torch.randn(7, 2, page, H_kv, D, dtype=torch.float16, device=DEVICE)
    q = torch.randn(batch, H, D, dtype=torch.float16, device=DEVICE)
    indptr = torch.tensor([0, 2, 3, 7], dtype=torch.int32)
    indices = torch.tensor([4, 0, 6, 1, 2, 3, 5], dtype=torch.int32, device=DEVICE)
    last = torch.tensor([16, 9, 1], dtype=torch.int32)
    wrapper = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD")
    wrapper.plan([torch.tensor([0, batch], dtype=torch.int32), torch.arange(batch + 1, dtype=torch.int32)],
                 [torch.tensor([0, 0], dtype=torch.int32), indptr],
                 [torch.empty(0, dtype=torch.int32, device=DEVICE), indices],
                 [torch.tensor([0], dtype=torch.int32), last], H, H_kv, D, page)
    decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    decode.plan(indptr, indices, last, H, H_kv, D, page)
    torch.testing.assert_close(wrapper.run(q, cache).float(), decode.run(q, cache).float(),
                               atol=2e-3, rtol=1e-3)


def test_a_workspace_below_the_default_bound_plans_over_fewer_sms():
    """FlashInfer's tests pass 32 MB; flare's default bound at head_dim 128 is ~35 MB: the plan
    spreads over fewer SMs and stays correct with split KV; a buffer too small for one SM's
    partial states is an error naming the bytes."""
    torch.manual_seed(2)
    q = torch.randn(16, 8, 128, dtype=torch.float16, device=DEVICE)
    k = torch.randn(30000, 8, 128, dtype=torch.float16, device=DEVICE)
    v = torch.randn(30000, 8, 128, dtype=torch.float16, device=DEVICE)
    small = torch.empty(32 << 20, dtype=torch.int8, device=DEVICE)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(small, "NHD")
    wrapper.plan(torch.tensor([0, 16], dtype=torch.int32),
                 torch.tensor([0, 30000], dtype=torch.int32), 8, 8, 128, causal=True)
    o = wrapper.run(q, k, v)
    pos = torch.arange(16, device=DEVICE)[:, None] + 30000 - 16
    visible = torch.arange(30000, device=DEVICE)[None, :] <= pos
    torch.testing.assert_close(o.float(), dense_attention(q, k, v, visible), atol=1e-2,
                               rtol=1e-3)
    tiny = flare.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(4096, dtype=torch.uint8, device=DEVICE), "NHD")
    with pytest.raises(ValueError, match="the scratch buffer has 4096 bytes"):
        tiny.plan(torch.tensor([0, 16], dtype=torch.int32),
                  torch.tensor([0, 30000], dtype=torch.int32), 8, 8, 128, causal=True)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_per_head_sparse_decode_matches_attention_over_the_chosen_pages(page_size,
                                                                       use_tensor_cores):
    torch.manual_seed(page_size + use_tensor_cores)
    H, H_kv, D, batch, per_request = 32, 8, 128, 4, 64
    pages = batch * per_request
    k_cache = torch.randn(pages, H_kv, page_size, D, dtype=torch.bfloat16, device=DEVICE)
    v_cache = torch.randn(pages, H_kv, page_size, D, dtype=torch.bfloat16, device=DEVICE)
    budget = 24
    picks = [torch.randperm(per_request)[:budget] + r * per_request
             for r in range(batch) for _ in range(H_kv)]
    indices = torch.cat(picks).to(torch.int32).to(DEVICE)
    indptr = torch.arange(0, batch * H_kv * budget + 1, budget, dtype=torch.int32)
    last = torch.full((batch * H_kv,), page_size, dtype=torch.int32)
    q = torch.randn(batch, H, D, dtype=torch.bfloat16, device=DEVICE)
    wrapper = flare.sparse.PerHeadSparseDecodeWrapper(workspace(),
                                                      use_tensor_cores=use_tensor_cores)
    wrapper.plan(indptr, indices, last, H, H_kv, D, page_size, q_data_type=torch.bfloat16)
    o = wrapper.run(q, (k_cache, v_cache))
    group = H // H_kv
    for r in range(batch):
        for h in range(H_kv):
            chosen = picks[r * H_kv + h].to(DEVICE)
            k = k_cache[chosen, h].reshape(-1, 1, D)
            v = v_cache[chosen, h].reshape(-1, 1, D)
            heads = slice(h * group, (h + 1) * group)
            visible = torch.ones(1, k.shape[0], dtype=torch.bool, device=DEVICE)
            expected = torch.cat([dense_attention(q[r:r + 1, g:g + 1], k, v, visible)
                                  for g in range(heads.start, heads.stop)], dim=1)
            torch.testing.assert_close(o[r:r + 1, heads].float(), expected, atol=1e-2,
                                       rtol=1e-3)


def test_per_head_sparse_decode_replays_a_captured_step_over_new_selections():
    """use_cuda_graph: one capture, then plan() with another selection (another budget per
    head) before each replay; the replay equals an eager wrapper's run on the same plan."""
    torch.manual_seed(11)
    H, H_kv, D, batch, per_request, page_size = 16, 4, 128, 3, 40, 16
    k_cache = torch.randn(batch * per_request, H_kv, page_size, D, dtype=torch.bfloat16,
                          device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, H, D, dtype=torch.bfloat16, device=DEVICE)
    segments, most = batch * H_kv, batch * H_kv * per_request
    int_buffer = lambda n: torch.zeros(n, dtype=torch.int32, device=DEVICE)  # noqa: E731
    graphed = flare.sparse.PerHeadSparseDecodeWrapper(
        workspace(), use_tensor_cores=True, use_cuda_graph=True,
        paged_kv_indptr_buffer=int_buffer(segments + 1),
        paged_kv_indices_buffer=int_buffer(most),
        paged_kv_last_page_len_buffer=int_buffer(segments))
    eager = flare.sparse.PerHeadSparseDecodeWrapper(workspace(), use_tensor_cores=True)
    assert graphed.is_cuda_graph_enabled and not eager.is_cuda_graph_enabled

    def selection(step):
        generator = torch.Generator().manual_seed(step)
        budgets = torch.randint(1, per_request + 1, (segments,), generator=generator)
        picks = [torch.randperm(per_request, generator=generator)[:int(n)] + s // H_kv
                 * per_request for s, n in enumerate(budgets)]
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), budgets.cumsum(0)])
        last = torch.randint(1, page_size + 1, (segments,), generator=generator)
        return (indptr.to(torch.int32), torch.cat(picks).to(torch.int32).to(DEVICE),
                last.to(torch.int32))

    out = torch.full((batch, H, D), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    graphed.plan(*selection(0), H, H_kv, D, page_size, q_data_type=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graphed.run(q, (k_cache, v_cache), out=out)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.run(q, (k_cache, v_cache), out=out)
    for step in (1, 2, 3):
        chosen = selection(step)
        graphed.plan(*chosen, H, H_kv, D, page_size, q_data_type=torch.bfloat16)
        eager.plan(*chosen, H, H_kv, D, page_size, q_data_type=torch.bfloat16)
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, eager.run(q, (k_cache, v_cache)))
    with pytest.raises(ValueError, match="fix 12"):
        graphed.plan(torch.zeros(5, dtype=torch.int32), torch.zeros(0, dtype=torch.int32,
                     device=DEVICE), torch.ones(4, dtype=torch.int32), H, 1, D, page_size)


@pytest.mark.parametrize("backend,split", [("auto", None), ("fa2", None), ("fa2", 64),
                                           ("fa3", 64)])
def test_attention_sink_wrapper_matches_the_sink_softmax(backend, split):
    """The sinks join each row's denominator inside the kernels (the epilogue of final rows, the
    merge of split ones: split=64 forces splits), eagerly and in a replayed CUDA graph."""
    if backend == "fa3" and torch.cuda.get_device_capability(DEVICE) != (9, 0):
        pytest.skip("the fa3 family needs an sm_90 GPU")
    torch.manual_seed(5)
    H, H_kv, D, page = 8, 2, 128, 16
    kv_lens, q_lens = [300, 17, 1000], [1, 17, 4]
    pages = [-(-n // page) for n in kv_lens]
    cache = torch.randn(sum(pages), 2, page, H_kv, D, dtype=torch.bfloat16, device=DEVICE)
    indptr = torch.tensor([0] + pages).cumsum(0).to(torch.int32)
    indices = torch.arange(sum(pages), dtype=torch.int32, device=DEVICE)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, pages)], dtype=torch.int32)
    qo = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    q = torch.randn(sum(q_lens), H, D, dtype=torch.bfloat16, device=DEVICE)
    sink = torch.randn(H, device=DEVICE) * 2
    sink[0] = 30.0  # head 0's rows almost all sink
    wrapper = flare.BatchAttentionWithAttentionSinkWrapper(workspace(), "NHD", backend=backend)
    wrapper.plan(qo, indptr, indices, last, H, H_kv, D, page, causal=True,
                 fixed_split_size=split)
    o = wrapper.run(q, cache, sink, D ** -0.5)
    o_2, lse_2 = wrapper.run(q, cache, sink, return_lse=True)
    o_ln, lse_ln = wrapper.run(q, cache, sink.double(), return_lse=True, lse_base="ln")
    torch.testing.assert_close(o_2, o, atol=0, rtol=0)
    torch.testing.assert_close(o_ln, o, atol=0, rtol=0)
    poisoned = torch.full_like(o, float("nan"))
    with pytest.raises(ValueError, match=r"sink must be a contiguous float32 \[8\]"):
        wrapper.run(q, cache, sink[:7], out=poisoned)
    assert poisoned.isnan().all()  # nothing launched
    torch.testing.assert_close(lse_ln, lse_2 * math.log(2), atol=1e-5, rtol=1e-6)
    # run() of a use_cuda_graph wrapper in a CUDA graph (the sink's merge included), replayed
    # on new queries.
    graph_wrapper = flare.BatchAttentionWithAttentionSinkWrapper(
        workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo.to(DEVICE),
        paged_kv_indptr_buf=indptr.to(DEVICE), paged_kv_indices_buf=torch.empty_like(indices),
        paged_kv_last_page_len_buf=last.to(DEVICE), backend=backend)
    graph_wrapper.plan(qo, indptr, indices, last, H, H_kv, D, page, causal=True,
                       fixed_split_size=split)
    graphed = torch.empty_like(o)
    graph_wrapper.run(q, cache, sink)  # warm-up outside the capture
    torch.cuda.synchronize()
    capture = torch.cuda.CUDAGraph()
    with torch.cuda.graph(capture):
        graphed.copy_(graph_wrapper.run(q, cache, sink))
    q.copy_(torch.randn_like(q))
    capture.replay()
    torch.testing.assert_close(graphed, wrapper.run(q, cache, sink), atol=0, rtol=0)
    o, o_2, lse_2 = graphed, *wrapper.run(q, cache, sink, return_lse=True)
    for r in range(3):
        rows = cache[int(indptr[r]):int(indptr[r + 1])]
        k = rows[:, 0].reshape(-1, H_kv, D)[:kv_lens[r]].float().repeat_interleave(H // H_kv, 1)
        v = rows[:, 1].reshape(-1, H_kv, D)[:kv_lens[r]].float().repeat_interleave(H // H_kv, 1)
        qs = q[int(qo[r]):int(qo[r + 1])].float()
        s = torch.einsum("qhd,nhd->hqn", qs, k) * D ** -0.5
        pos = torch.arange(q_lens[r], device=DEVICE)[:, None] + kv_lens[r] - q_lens[r]
        s = s.masked_fill(torch.arange(kv_lens[r], device=DEVICE)[None, :] > pos, float("-inf"))
        logits = torch.cat([s, sink[:, None, None].expand(H, q_lens[r], 1)], -1)
        p = torch.softmax(logits, -1)[..., :-1]
        expected = torch.einsum("hqn,nhd->qhd", p, v)
        # bf16 o: an ulp is 0.0156 at magnitudes 2-4
        torch.testing.assert_close(o[int(qo[r]):int(qo[r + 1])].float(), expected, atol=2e-2,
                                   rtol=8e-3)
        lse = torch.logsumexp(logits, -1).T  # [q, H], natural log
        torch.testing.assert_close(lse_2[int(qo[r]):int(qo[r + 1])], lse / math.log(2),
                                   atol=2e-3, rtol=1e-4)
