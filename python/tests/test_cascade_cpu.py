"""FlashInfer's cascade wrappers on the CPU backend (numpy, float32): two- and three-level
cascades (a prefix for the whole batch, one per group of requests, each request's own pages;
odd lengths, page sizes 1 and 5, GQA 4/2), decode and causal append stages, and the
shared-prefix decode / prefill wrappers, against float64 attention over each request's
concatenated levels; malformed level structures are errors naming the argument."""

import numpy as np
import pytest

import flare

H, H_KV, D = 4, 2, 32


def attention(q, k, v, visible):
    """float64 o [q, H, D] and base-2 lse [q, H] of q [q, H, D] over k, v [n, H_kv, D]."""
    group = H // H_KV
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("qhd,nhd->hqn", q.astype(np.float64), kk) / np.sqrt(D)
    s = np.where(visible[None], s, -np.inf)
    peak = s.max(-1, keepdims=True)
    p = np.exp(s - peak)
    o = np.einsum("hqn,nhd->qhd", p / p.sum(-1, keepdims=True), vv)
    return o, (np.log(p.sum(-1)) + peak[..., 0]).T / np.log(2)


class Pages:
    """A paged cache (NHD, k and v) of random tokens, handed out page by page."""

    def __init__(self, rng, num_pages, page_size):
        self.page_size = page_size
        self.k = rng.standard_normal((num_pages, page_size, H_KV, D)).astype(np.float32)
        self.v = rng.standard_normal((num_pages, page_size, H_KV, D)).astype(np.float32)
        self.next = 0

    def take(self, tokens):
        """(page ids, last page length) of a new sequence of `tokens` tokens."""
        count = -(-tokens // self.page_size)
        ids = list(range(self.next, self.next + count))
        self.next += count
        return ids, tokens - (count - 1) * self.page_size

    def tokens(self, ids, last):
        k = self.k[ids].reshape(-1, H_KV, D)[:(len(ids) - 1) * self.page_size + last]
        v = self.v[ids].reshape(-1, H_KV, D)[:(len(ids) - 1) * self.page_size + last]
        return k, v


def level_arrays(sequences):
    """indptr, indices, last_page_len (int32) of [(page ids, last)] per group."""
    indptr = np.cumsum([0] + [len(ids) for ids, _ in sequences]).astype(np.int32)
    indices = np.array([i for ids, _ in sequences for i in ids], dtype=np.int32)
    last = np.array([last for _, last in sequences], dtype=np.int32)
    return indptr, indices, last


def check_request(o, lse, q, rows_of, parts):
    """o and lse of one request's query rows against attention over its levels' tokens (parts:
    (k, v) per level, the last its own pages, causal there; the earlier levels all visible)."""
    k = np.concatenate([p[0] for p in parts])
    v = np.concatenate([p[1] for p in parts])
    own_len = len(parts[-1][0])
    shared = len(k) - own_len
    q_len = rows_of.stop - rows_of.start
    rows = np.arange(q_len)[:, None] + own_len - q_len
    cols = np.arange(len(k))[None, :]
    visible = (cols < shared) | (cols - shared <= rows)
    o_ref, lse_ref = attention(q[rows_of], k, v, visible)
    assert np.abs(o[rows_of] - o_ref).max() < 1e-4
    assert np.abs(lse[rows_of] - lse_ref).max() < 1e-4


@pytest.mark.parametrize("page_size", [1, 5])
@pytest.mark.parametrize("q_lens", [[1, 1, 1], [3, 1, 5]])
def test_three_levels_match_attention_over_the_concatenated_levels(page_size, q_lens):
    rng = np.random.default_rng(page_size * 10 + sum(q_lens))
    pages = Pages(rng, 200, page_size)
    top = pages.take(23)                           # the whole batch's prefix
    groups = [pages.take(7), pages.take(12)]       # requests {0, 1} and {2}
    group_of = [0, 0, 1]
    own = [pages.take(n) for n in (q_lens[0] + 4, q_lens[1] + 9, q_lens[2])]
    total = sum(q_lens)
    q = rng.standard_normal((total, H, D)).astype(np.float32)
    qo_top = np.array([0, total], dtype=np.int32)
    qo_mid = np.array([0, q_lens[0] + q_lens[1], total], dtype=np.int32)
    qo_own = np.cumsum([0] + q_lens).astype(np.int32)
    levels = [level_arrays([top]), level_arrays(groups), level_arrays(own)]
    wrapper = flare.MultiLevelCascadeAttentionWrapper(3, np.zeros(3 << 22, dtype=np.uint8))
    wrapper.plan([qo_top, qo_mid, qo_own], [x[0] for x in levels], [x[1] for x in levels],
                 [x[2] for x in levels], H, H_KV, D, page_size, causal=True,
                 q_data_type="float32")
    o, lse = wrapper.run(q, (pages.k, pages.v), return_lse=True)
    # A level of one-token groups runs the batch decode (the decode stage's last level).
    assert wrapper._kernels == ["prefill", "prefill",
                                "decode" if q_lens == [1, 1, 1] else "prefill"]
    for r in range(3):
        parts = [pages.tokens(*top), pages.tokens(*groups[group_of[r]]), pages.tokens(*own[r])]
        check_request(o, lse, q, slice(qo_own[r], qo_own[r + 1]), parts)


def test_a_level_without_pages_is_skipped_and_changes_nothing():
    rng = np.random.default_rng(7)
    pages = Pages(rng, 40, 4)
    own = [pages.take(n) for n in (5, 9, 2)]
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    empty = (np.zeros(3, dtype=np.int32), np.zeros(0, dtype=np.int32), np.ones(2, dtype=np.int32))
    mine = level_arrays(own)
    qo_pairs = np.array([0, 2, 3], dtype=np.int32)
    qo_own = np.arange(4, dtype=np.int32)
    three = flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(3 << 22, dtype=np.uint8))
    three.plan([qo_pairs, qo_own], [empty[0], mine[0]], [empty[1], mine[1]],
               [empty[2], mine[2]], H, H_KV, D, 4, q_data_type="float32")
    assert three._kernels == ["skip", "decode"]
    o, lse = three.run(q, (pages.k, pages.v), return_lse=True)
    for r in range(3):
        k, v = pages.tokens(*own[r])
        o_ref, lse_ref = attention(q[r:r + 1], k, v, np.ones((1, len(k)), dtype=bool))
        assert np.abs(o[r:r + 1] - o_ref).max() < 1e-4, r
        assert np.abs(lse[r:r + 1] - lse_ref).max() < 1e-4, r


def test_shared_prefix_wrappers_match_the_two_level_cascade():
    rng = np.random.default_rng(5)
    page_size = 4
    pages = Pages(rng, 100, page_size)
    prefix = pages.take(17)
    k_shared, v_shared = (np.ascontiguousarray(x) for x in pages.tokens(*prefix))
    own = [pages.take(n) for n in (6, 9, 1)]
    indptr, indices, last = level_arrays(own)
    q = rng.standard_normal((3, H, D)).astype(np.float32)

    decode = flare.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(np.zeros(1 << 22, np.uint8))
    decode.begin_forward(indptr, indices, last, H, H_KV, D, page_size, data_type="float32")
    o_decode = decode.forward(q, k_shared, v_shared, (pages.k, pages.v))

    qo = np.arange(4, dtype=np.int32)
    prefill = flare.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(np.zeros(1 << 22, np.uint8))
    prefill.begin_forward(qo, indptr, indices, last, H, H_KV, D, page_size,
                          q_data_type="float32")
    o_prefill = prefill.forward(q, k_shared, v_shared, (pages.k, pages.v), causal=True)

    for r in range(3):
        k_own, v_own = pages.tokens(*own[r])
        k = np.concatenate([k_shared, k_own])
        v = np.concatenate([v_shared, v_own])
        o_ref, _ = attention(q[r:r + 1], k, v, np.ones((1, len(k)), dtype=bool))
        assert np.abs(o_decode[r] - o_ref[0]).max() < 1e-4, r
        assert np.abs(o_prefill[r] - o_ref[0]).max() < 1e-4, r


def test_malformed_levels_are_named():
    wrapper = flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(1 << 22, dtype=np.uint8))
    one = np.array([0, 1], dtype=np.int32)
    with pytest.raises(ValueError, match="qo_indptr_arr must hold num_levels = 2"):
        wrapper.plan([one], [one, one], [one, one], [one, one], H, H_KV, D, 1)
    with pytest.raises(ValueError, match=r"must end at the same number of query tokens"):
        wrapper.plan([np.array([0, 2], np.int32), np.array([0, 1, 3], np.int32)],
                     [one, np.array([0, 1, 2], np.int32)], [np.zeros(1, np.int32)] * 2,
                     [one, np.array([1, 1], np.int32)], H, H_KV, D, 1, q_data_type="float32")
    with pytest.raises(ValueError, match=r"qo_indptr_arr\[1\] must be a 1-D array starting at 0"):
        wrapper.plan([one, np.array([1, 1], np.int32)], [one, one], [one, one], [one, one],
                     H, H_KV, D, 1, q_data_type="float32")
    pages = [np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)]
    with pytest.raises(ValueError, match="page 1 is in level 0's group 0 and level 1's group 1"):
        wrapper.plan([np.array([0, 2], np.int32), np.array([0, 1, 2], np.int32)],
                     [np.array([0, 2], np.int32), np.array([0, 1, 2], np.int32)],
                     [pages[0], np.array([5, 1], np.int32)],
                     [one, np.array([1, 1], np.int32)], H, H_KV, D, 1, q_data_type="float32")
    with pytest.raises(ValueError, match="num_levels must be >= 1"):
        flare.MultiLevelCascadeAttentionWrapper(0, np.zeros(1 << 20, dtype=np.uint8))


def test_fused_levels_on_the_cpu():
    """The one-launch path is the GPU's: on the CPU backend fused_levels=True names why not at
    plan() (nothing planned), None and False run the levels; a value other than None / True /
    False is refused at creation."""
    one = np.array([0, 1], dtype=np.int32)
    last = np.ones(1, dtype=np.int32)
    levels = ([one, one], [one, one], [np.zeros(1, np.int32), np.ones(1, np.int32)],
              [last, last])
    insist = flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(1 << 22, dtype=np.uint8),
                                                     fused_levels=True)
    with pytest.raises(NotImplementedError, match="fused_levels=True, but the float workspace"):
        insist.plan(*levels, H, H_KV, D, 1, q_data_type="float32")
    for fused in (None, False):
        wrapper = flare.MultiLevelCascadeAttentionWrapper(
            2, np.zeros(1 << 22, dtype=np.uint8), fused_levels=fused)
        wrapper.plan(*levels, H, H_KV, D, 1, q_data_type="float32")
        assert not wrapper._fused
    with pytest.raises(ValueError, match="fused_levels must be None, True or False"):
        flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(1 << 22, dtype=np.uint8),
                                                fused_levels=1)


@pytest.mark.parametrize("page_sizes", [(16, 1), (4, 3)])
@pytest.mark.parametrize("q_lens", [[1, 1, 1], [3, 1, 5]])
def test_levels_in_caches_of_their_own_may_differ_in_page_size(page_sizes, q_lens):
    """page_size per level: the prefix in one cache, each request's pages in another of a
    different page size (page ids of both starting at 0: different caches, no overlap check),
    decode and causal append, against attention over the concatenated tokens."""
    rng = np.random.default_rng(sum(page_sizes) * 10 + sum(q_lens))
    prefix_pages, own_pages = Pages(rng, 40, page_sizes[0]), Pages(rng, 60, page_sizes[1])
    top = prefix_pages.take(37)
    own = [own_pages.take(n) for n in (q_lens[0] + 4, q_lens[1] + 10, q_lens[2])]
    total = sum(q_lens)
    q = rng.standard_normal((total, H, D)).astype(np.float32)
    qo_top = np.array([0, total], dtype=np.int32)
    qo_own = np.cumsum([0] + q_lens).astype(np.int32)
    levels = [level_arrays([top]), level_arrays(own)]
    wrapper = flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(1 << 22, dtype=np.uint8))
    wrapper.plan([qo_top, qo_own], [x[0] for x in levels], [x[1] for x in levels],
                 [x[2] for x in levels], H, H_KV, D, list(page_sizes), causal=True,
                 q_data_type="float32")
    o, lse = wrapper.run(q, paged_kv_cache_arr=[(prefix_pages.k, prefix_pages.v),
                                                (own_pages.k, own_pages.v)], return_lse=True)
    for r in range(3):
        parts = [prefix_pages.tokens(*top), own_pages.tokens(*own[r])]
        check_request(o, lse, q, slice(qo_own[r], qo_own[r + 1]), parts)


def test_caches_per_level_are_checked_by_name():
    one = np.array([0, 1], dtype=np.int32)
    levels = ([one, one], [one, one], [np.zeros(1, np.int32), np.zeros(1, np.int32)],
              [np.ones(1, np.int32)] * 2)
    cache = (np.zeros((1, 4, H_KV, D), np.float32), np.zeros((1, 4, H_KV, D), np.float32))
    q = np.ones((1, H, D), np.float32)
    wrapper = flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(1 << 22, dtype=np.uint8))
    with pytest.raises(ValueError, match=r"page_size must be one positive int or num_levels = 2"):
        wrapper.plan(*levels, H, H_KV, D, [4], q_data_type="float32")
    with pytest.raises(ValueError, match=r"page_size must be one positive int or num_levels = 2"):
        wrapper.plan(*levels, H, H_KV, D, [4, 0], q_data_type="float32")
    # Page 0 in both levels is one page of one cache (refused), two pages of two caches.
    with pytest.raises(ValueError, match="page 0 is in level 0's group 0 and level 1's group 0"):
        wrapper.plan(*levels, H, H_KV, D, 4, q_data_type="float32")
    wrapper.plan(*levels, H, H_KV, D, [4, 4], q_data_type="float32")
    with pytest.raises(ValueError, match="pass paged_kv_cache_arr with num_levels = 2 caches"):
        wrapper.run(q, cache)
    with pytest.raises(ValueError, match="pass paged_kv_cache_arr with num_levels = 2 caches"):
        wrapper.run(q, paged_kv_cache_arr=[cache])
    assert wrapper.run(q, paged_kv_cache_arr=[cache, cache]).shape == (1, H, D)
    distinct = ([one, one], [one, one], [np.zeros(1, np.int32), np.ones(1, np.int32)],
                [np.ones(1, np.int32)] * 2)
    wrapper.plan(*distinct, H, H_KV, D, 4, q_data_type="float32")
    with pytest.raises(ValueError, match="the levels share one cache: pass paged_kv_cache"):
        wrapper.run(q, paged_kv_cache_arr=[cache, cache])
    insist = flare.MultiLevelCascadeAttentionWrapper(2, np.zeros(1 << 22, dtype=np.uint8),
                                                     fused_levels=True)
    with pytest.raises(NotImplementedError, match="the levels have caches of their own"):
        insist.plan(*levels, H, H_KV, D, [4, 4], q_data_type="float32")
