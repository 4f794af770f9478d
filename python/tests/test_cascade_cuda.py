"""MultiLevelCascadeAttentionWrapper's one-launch path on the GPU (BatchPrefill.plan_cascade):
two and three levels, decode and causal append stages, GQA, page sizes 1 and 16, against the
levels run one after another (fused_levels=False) and against float32 torch attention over the
concatenated KV; a CUDA-graph capture replayed across re-plans with new suffixes; what the one
launch cannot take is refused under fused_levels=True and runs by levels otherwise; levels in
caches of their own (a page size per level: 16 with 1 or 64) by levels; a cascade that needs
more partial slots than a 32 MB float workspace holds. Skipped
visibly without PyTorch or a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402

DEVICE = torch.device("cuda:0")


def workspace():
    return torch.zeros(128 << 20, dtype=torch.uint8, device=DEVICE)


def dense(q, k, v, visible):
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, 1)
    vv = v.float().repeat_interleave(group, 1)
    s = torch.einsum("mhd,nhd->hmn", q.float(), kk) / q.shape[2] ** 0.5
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hmn,nhd->mhd", torch.softmax(s, -1).nan_to_num(0.0), vv)


class Cascade:
    """num_levels levels over `requests`: level 0 one shared prefix for all, a middle level
    (three levels) one per half of the requests, the last level each request's own pages; one
    page pool, each level's page ids in a table of its own."""

    def __init__(self, levels, q_lens, own_lens, prefix_lens, page, heads, kv_heads, dtype,
                 seed):
        g = torch.Generator().manual_seed(seed)
        self.q_lens, self.page, self.heads, self.kv_heads = q_lens, page, heads, kv_heads
        batch = len(q_lens)
        halves = [list(range(batch))] if levels == 2 else [list(range(batch)),
                                                           list(range(batch // 2)),
                                                           list(range(batch // 2, batch))]
        # groups per level: level 0 everyone, (middle: two halves), last: each request
        self.groups = [[halves[0]]] + ([halves[1:]] if levels == 3 else []) + \
            [[[r] for r in range(batch)]]
        self.lens = [prefix_lens[:1]] + ([prefix_lens[1:3]] if levels == 3 else []) + [own_lens]
        seqs = [n for level in self.lens for n in level]
        pages_of = [-(-n // page) for n in seqs]
        self.cache = torch.randn(sum(pages_of) + 2, 2, page, kv_heads, 128, generator=g,
                                 dtype=torch.float32).to(dtype).to(DEVICE)
        order = torch.randperm(sum(pages_of), generator=g).to(torch.int32)
        total = sum(q_lens)
        self.q = torch.randn(total, heads, 128, generator=g).to(dtype).to(DEVICE)
        qo_req = torch.tensor([0] + q_lens).cumsum(0)
        self.qo, self.indptr, self.indices, self.last, self.tokens = [], [], [], [], []
        first = 0
        for groups, lens in zip(self.groups, self.lens):
            n_pages = [-(-n // page) for n in lens]
            ids = order[first:first + sum(n_pages)]
            first += sum(n_pages)
            self.qo.append(torch.tensor([0] + [int(qo_req[grp[-1] + 1]) for grp in groups],
                                        dtype=torch.int32))
            self.indptr.append(torch.tensor([0] + n_pages).cumsum(0).to(torch.int32))
            self.indices.append(ids.to(DEVICE))
            self.last.append(torch.tensor([n - (-(-n // page) - 1) * page if n else 0
                                           for n in lens], dtype=torch.int32))
            self.tokens.append([ids[int(s):int(e)] for s, e in
                                zip(self.indptr[-1][:-1], self.indptr[-1][1:])])

    def plan(self, wrapper, causal):
        wrapper.plan(self.qo, self.indptr, self.indices, self.last, self.heads, self.kv_heads, 128,
                     self.page, causal=causal, q_data_type=self.q.dtype)

    def expected(self, causal):
        out = torch.empty(self.q.shape, dtype=torch.float32, device=DEVICE)
        start = 0
        for r, q_len in enumerate(self.q_lens):
            ks, vs, shared = [], [], 0
            for level, (groups, lens) in enumerate(zip(self.groups, self.lens)):
                g = next(i for i, grp in enumerate(groups) if r in grp)
                rows = self.cache[self.tokens[level][g].long().to(DEVICE)]
                ks.append(rows[:, 0].reshape(-1, self.kv_heads, 128)[:lens[g]])
                vs.append(rows[:, 1].reshape(-1, self.kv_heads, 128)[:lens[g]])
                if level < len(self.groups) - 1:
                    shared += lens[g]
            k, v = torch.cat(ks), torch.cat(vs)
            own = k.shape[0] - shared
            pos = torch.arange(q_len, device=DEVICE)[:, None] + own - q_len
            col = torch.arange(k.shape[0], device=DEVICE)[None, :]
            visible = (col < shared) | (col - shared <= pos) if causal else col >= 0
            rows = slice(start, start + q_len)
            out[rows] = dense(self.q[rows], k, v, visible.expand(self.heads, -1, -1))
            start += q_len
        return out


@pytest.mark.parametrize("levels", [2, 3])
@pytest.mark.parametrize("stage", ["decode", "append"])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)])
def test_one_launch_matches_levels_and_dense(levels, stage, page, heads):
    q_lens = [1] * 9 if stage == "decode" else [1, 5, 9, 3, 7, 2]
    own = [0, 17, 40, 3, 100, 64, 7, 1, 33][:len(q_lens)]
    own = [max(n, q) for n, q in zip(own, q_lens)] if stage == "append" else own
    c = Cascade(levels, q_lens, own, [301, 77, 0], page, *heads, torch.float16, seed=page)
    causal = stage == "append"
    fused = flare.MultiLevelCascadeAttentionWrapper(levels, workspace(), "NHD")
    c.plan(fused, causal)
    assert fused._fused
    o, lse = fused.run(c.q, c.cache, return_lse=True)
    by_levels = flare.MultiLevelCascadeAttentionWrapper(levels, workspace(), "NHD",
                                                        fused_levels=False)
    c.plan(by_levels, causal)
    o_levels, lse_levels = by_levels.run(c.q, c.cache, return_lse=True)
    torch.testing.assert_close(o.float(), c.expected(causal), atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(o.float(), o_levels.float(), atol=4e-3, rtol=1e-3)
    torch.testing.assert_close(lse, lse_levels, atol=2e-3, rtol=1e-4)


def test_one_launch_outgrows_a_small_workspace():
    """A cascade whose shared tiles need more partial slots than float_workspace_buffer holds
    (32 MB, the bound of the SM count; FlashInfer's own shared-prefix tests at head dim 256
    hit it): outside CUDA graphs the one launch keeps them in memory of its own."""
    q_lens = [17] * 16
    c = Cascade(2, q_lens, [512] * 16, [2048], 16, 32, 32, torch.bfloat16, seed=3)
    small = torch.zeros(32 << 20, dtype=torch.uint8, device=DEVICE)
    fused = flare.MultiLevelCascadeAttentionWrapper(2, small, "NHD")
    c.plan(fused, True)
    assert fused._fused
    o = fused.run(c.q, c.cache)
    torch.testing.assert_close(o.float(), c.expected(True), atol=2e-2, rtol=1e-2)


def test_cuda_graph_replays_across_plans():
    c = Cascade(2, [1] * 6, [5, 60, 17, 1, 33, 9], [200], 16, 8, 2, torch.bfloat16, seed=4)
    d = Cascade(2, [1] * 6, [2, 30, 80, 1, 3, 9], [120], 16, 8, 2, torch.bfloat16, seed=5)
    bufs = lambda n: [torch.zeros(n, dtype=torch.int32, device=DEVICE) for _ in range(2)]  # noqa
    wrapper = flare.MultiLevelCascadeAttentionWrapper(
        2, workspace(), "NHD", use_cuda_graph=True,
        qo_indptr_buf_arr=[torch.zeros(2, dtype=torch.int32, device=DEVICE),
                           torch.zeros(7, dtype=torch.int32, device=DEVICE)],
        paged_kv_indptr_buf_arr=[torch.zeros(2, dtype=torch.int32, device=DEVICE),
                                 torch.zeros(7, dtype=torch.int32, device=DEVICE)],
        paged_kv_indices_buf_arr=bufs(64),
        paged_kv_last_page_len_buf_arr=[torch.zeros(1, dtype=torch.int32, device=DEVICE),
                                        torch.zeros(6, dtype=torch.int32, device=DEVICE)])
    q = c.q.clone()
    cache = torch.zeros(64, 2, 16, 2, 128, dtype=torch.bfloat16, device=DEVICE)
    cache[:c.cache.shape[0]] = c.cache
    c.plan(wrapper, False)
    assert wrapper._fused
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.run(q, cache)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = wrapper.run(q, cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), c.expected(False), atol=2e-2, rtol=1e-2)
    q.copy_(d.q)
    cache.zero_()
    cache[:d.cache.shape[0]] = d.cache
    d.plan(wrapper, False)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), d.expected(False), atol=2e-2, rtol=1e-2)


def test_what_one_launch_cannot_take():
    c = Cascade(2, [1, 2, 3], [4, 5, 6], [40], 16, 8, 2, torch.float16, seed=1)
    insist = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD", fused_levels=True)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode and window_left"):
        insist.plan(c.qo, c.indptr, c.indices, c.last, 8, 2, 128, 16, causal=True,
                    pos_encoding_mode="ALIBI", q_data_type=torch.float16)
    auto = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD")
    auto.plan(c.qo, c.indptr, c.indices, c.last, 8, 2, 128, 16, causal=True,
              pos_encoding_mode="ALIBI", q_data_type=torch.float16)
    assert not auto._fused  # by levels, as FlashInfer runs it
    auto.plan(c.qo, c.indptr, c.indices, c.last, 8, 2, 128, 16, causal=False,
              pos_encoding_mode="ALIBI", q_data_type=torch.float16)
    assert auto._fused  # non-causal: every level bottom-right, as by levels
    o = auto.run(c.q, c.cache)
    levels = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD", fused_levels=False)
    levels.plan(c.qo, c.indptr, c.indices, c.last, 8, 2, 128, 16, causal=False,
                pos_encoding_mode="ALIBI", q_data_type=torch.float16)
    torch.testing.assert_close(o.float(), levels.run(c.q, c.cache).float(), atol=4e-3,
                               rtol=1e-3)
    empty = Cascade(2, [1, 1, 1], [4, 5, 6], [0], 16, 8, 2, torch.float16, seed=2)
    auto.plan(empty.qo, empty.indptr, empty.indices, empty.last, 8, 2, 128, 16,
              q_data_type=torch.float16)
    assert not auto._fused  # no shared KV: the last level alone, on the batch decode
    torch.testing.assert_close(auto.run(empty.q, empty.cache).float(), empty.expected(False),
                               atol=2e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="fused_levels must be None, True or False"):
        flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD", fused_levels="yes")


@pytest.mark.parametrize("stage", ["decode", "append"])
@pytest.mark.parametrize("pages", [(16, 1), (16, 64)])
def test_levels_in_caches_of_their_own_may_differ_in_page_size(stage, pages):
    """page_size per level: the prefix in one cache (pages of 16), each request's tokens moved
    into a cache of their own (pages of 1 or 64, shuffled), run by levels (their decode or
    prefill kernels), against dense attention over the same tokens; the one-launch path is
    refused by name under fused_levels=True."""
    q_lens = [1] * 6 if stage == "decode" else [1, 5, 9, 3, 7, 2]
    own = [0, 17, 40, 3, 100, 64] if stage == "decode" else [4, 17, 40, 3, 100, 64]
    c = Cascade(2, q_lens, own, [301], pages[0], 8, 2, torch.float16, seed=6)
    g = torch.Generator().manual_seed(7)
    small_page = pages[1]
    counts = [-(-n // small_page) for n in own]
    slots = torch.randperm(sum(counts) + 2, generator=g)[:sum(counts)].to(torch.int32)
    cache = torch.randn(sum(counts) + 2, 2, small_page, 2, 128, generator=g).to(
        torch.float16).to(DEVICE)
    first = 0
    for r, n in enumerate(own):
        rows = c.cache[c.tokens[1][r].long().to(DEVICE)]  # the request's pages in c's cache
        k = rows[:, 0].reshape(-1, 2, 128)[:n]
        v = rows[:, 1].reshape(-1, 2, 128)[:n]
        mine = slots[first:first + counts[r]].long().to(DEVICE)
        for t in range(n):  # token t: page mine[t // small_page], row t % small_page
            cache[mine[t // small_page], 0, t % small_page] = k[t]
            cache[mine[t // small_page], 1, t % small_page] = v[t]
        first += counts[r]
    indptr = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
    last = torch.tensor([n - (m - 1) * small_page if n else 0 for n, m in zip(own, counts)],
                        dtype=torch.int32)
    causal = stage == "append"
    wrapper = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD")
    arrays = ([c.qo[0], c.qo[1]], [c.indptr[0], indptr], [c.indices[0], slots.to(DEVICE)],
              [c.last[0], last])
    wrapper.plan(*arrays, 8, 2, 128, [pages[0], small_page], causal=causal,
                 q_data_type=torch.float16)
    assert not wrapper._fused
    o = wrapper.run(c.q, paged_kv_cache_arr=[c.cache, cache])
    torch.testing.assert_close(o.float(), c.expected(causal), atol=1e-2, rtol=1e-3)
    insist = flare.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD", fused_levels=True)
    with pytest.raises(NotImplementedError, match="the levels have caches of their own"):
        insist.plan(*arrays, 8, 2, 128, [pages[0], small_page], causal=causal,
                    q_data_type=torch.float16)
