"""The bindings end to end on numpy arrays (the CPU backend): no PyTorch, no GPU needed.

Each output is compared with a float64 numpy oracle (attention_reference.py) and passed in
NaN-poisoned where the API takes an output, so an unwritten element fails.
"""

import functools
import math

import numpy as np
import pytest

import flare
from attention_reference import (PagedCache, max_abs_error, reference_attention,
                                 reference_merge)

# float32 values accumulate in float32 (split-KV merges included); float16 outputs round.
TOLERANCE = {np.float32: 5e-5, np.float16: 3e-3}


def workspace():
    return np.empty(1 << 20, dtype=np.uint8)


def decode_reference(cache, q, **options):
    qo_indptr = np.arange(cache.batch + 1)
    return reference_attention(q, cache.k, cache.v, qo_indptr, cache.kv_indptr, **options)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (7, 1), (32, 4)])
def test_decode_wrapper_matches_float64(layout, page_size, heads):
    num_qo_heads, num_kv_heads = heads
    head_dim = 64
    cache = PagedCache([0, 1, 7, 97, 33], num_kv_heads, head_dim, page_size, layout, seed=1)
    q = np.random.default_rng(2).standard_normal(
        (cache.batch, num_qo_heads, head_dim)).astype(np.float32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, num_qo_heads, num_kv_heads,
                 head_dim, page_size, q_data_type="float32")
    out = np.full((cache.batch, num_qo_heads, head_dim), np.nan, dtype=np.float32)
    lse = np.full((cache.batch, num_qo_heads), np.nan, dtype=np.float32)
    result = wrapper.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    assert result[0] is out and result[1] is lse
    expected_o, expected_lse = decode_reference(cache, q)
    assert max_abs_error(out, expected_o) <= TOLERANCE[np.float32]
    assert max_abs_error(lse, expected_lse) <= TOLERANCE[np.float32]
    # The empty request: o = 0, lse = -inf.
    assert np.all(out[0] == 0) and np.all(lse[0] == -np.inf)


def test_decode_wrapper_float16_tuple_cache_and_options():
    cache = PagedCache([5, 0, 511, 64], 2, 128, 16, dtype=np.float16, seed=3)
    num_qo_heads = 8
    q = np.random.default_rng(4).standard_normal((cache.batch, num_qo_heads, 128)).astype(
        np.float16)
    options = dict(sm_scale=0.05, window_left=40, logits_soft_cap=8.0)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, num_qo_heads, 2, 128, 16,
                 q_data_type=np.float16, **options)
    k_cache, v_cache = cache.cache[:, 0], cache.cache[:, 1]
    out = wrapper.run(q, (k_cache, v_cache))
    assert out.dtype == np.float16 and out.shape == (cache.batch, num_qo_heads, 128)
    expected, _ = decode_reference(cache, q, **options)
    assert max_abs_error(out, expected) <= TOLERANCE[np.float16]


def test_decode_wrapper_alibi_and_scales():
    cache = PagedCache([9, 30], 1, 64, 3, seed=5)
    q = np.random.default_rng(6).standard_normal((2, 8, 64)).astype(np.float32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 1, 64, 3,
                 pos_encoding_mode="ALIBI", q_data_type="float32")
    out, lse = wrapper.run(q, cache.cache, k_scale=0.5, v_scale=2.0, return_lse=True)
    expected_o, expected_lse = decode_reference(cache, q, alibi=True, k_scale=0.5, v_scale=2.0)
    assert max_abs_error(out, expected_o) <= 2 * TOLERANCE[np.float32]
    assert max_abs_error(lse, expected_lse) <= TOLERANCE[np.float32]


def test_decode_plan_is_reused_and_replanned():
    """One wrapper, several steps: each plan() sees new lengths (as a serving loop does)."""
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    for step, lens in enumerate([[3, 17], [4, 18, 1], [40]]):
        cache = PagedCache(lens, 2, 64, 16, seed=10 + step)
        q = np.random.default_rng(step).standard_normal((cache.batch, 4, 64)).astype(
            np.float32)
        wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 16,
                     q_data_type="float32", fixed_split_size=8 if step == 1 else None)
        expected, _ = decode_reference(cache, q)
        assert max_abs_error(wrapper.run(q, cache.cache), expected) <= TOLERANCE[np.float32]


def test_single_decode_nhd_and_hnd():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    k = rng.standard_normal((97, 2, 64)).astype(np.float32)
    v = rng.standard_normal((97, 2, 64)).astype(np.float32)
    expected_o, expected_lse = reference_attention(q[None], k, v, [0, 1], [0, 97])
    out, lse = flare.single_decode_with_kv_cache(q, k, v, return_lse=True)
    assert max_abs_error(out, expected_o[0]) <= TOLERANCE[np.float32]
    assert max_abs_error(lse, expected_lse[0]) <= TOLERANCE[np.float32]
    hnd = flare.single_decode_with_kv_cache(q, k.transpose(1, 0, 2).copy(),
                                            v.transpose(1, 0, 2).copy(), kv_layout="HND")
    assert max_abs_error(hnd, expected_o[0]) <= TOLERANCE[np.float32]


@pytest.mark.parametrize("q_dtype, kv_dtype, expected", [
    ("bfloat16", "bfloat16", True), ("float16", "float16", True),
    ("bfloat16", "e4m3", True), ("float16", "e5m2", True),  # fp8 KV runs in float16
    ("float16", "bfloat16", False), ("bfloat16", "float16", False),  # mixed 16-bit pairs
    ("float32", "float32", False)])
def test_use_tensor_cores_selects_the_loops_dtype_pairs(q_dtype, kv_dtype, expected):
    from flare.decode import _tensor_core_loop
    assert _tensor_core_loop(True, q_dtype, kv_dtype, 128) is expected
    assert _tensor_core_loop(False, q_dtype, kv_dtype, 128) is False
    # Head dim 512 has no tensor-core loop: the hint runs the CUDA-core loop.
    assert _tensor_core_loop(True, q_dtype, kv_dtype, 512) is False


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_batch_prefill_paged(causal, layout):
    qo_lens = [1, 7, 0, 13, 5]
    kv_lens = [1, 20, 4, 13, 3]  # the last request has kv < q: causal rows see nothing
    cache = PagedCache(kv_lens, 2, 64, 3, layout, seed=8)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    q = np.random.default_rng(9).standard_normal((qo_indptr[-1], 8, 64)).astype(np.float32)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), layout)
    wrapper.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, 8, 2, 64, 3,
                 causal=causal, q_data_type="float32")
    out, lse = wrapper.run(q, cache.cache, return_lse=True)
    expected_o, expected_lse = reference_attention(q, cache.k, cache.v, qo_indptr,
                                                   cache.kv_indptr, causal=causal)
    assert max_abs_error(out, expected_o) <= TOLERANCE[np.float32]
    assert max_abs_error(lse, expected_lse) <= TOLERANCE[np.float32]


def random_masks(qo_lens, kv_lens, seed):
    rng = np.random.default_rng(seed)
    return [rng.random((q, k)) < 0.6 for q, k in zip(qo_lens, kv_lens)]


def test_batch_prefill_ragged_custom_mask_bool_and_packed():
    qo_lens, kv_lens = [3, 0, 9], [5, 2, 11]
    rng = np.random.default_rng(11)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = rng.standard_normal((qo_indptr[-1], 4, 64)).astype(np.float32)
    k = rng.standard_normal((kv_indptr[-1], 4, 64)).astype(np.float32)
    v = rng.standard_normal((kv_indptr[-1], 4, 64)).astype(np.float32)
    masks = random_masks(qo_lens, kv_lens, 12)
    flat = np.concatenate([m.reshape(-1) for m in masks])
    packed = np.concatenate([np.packbits(m.reshape(-1), bitorder="little") for m in masks])
    expected, _ = reference_attention(q, k, v, qo_indptr, kv_indptr, custom_mask=masks)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    for mask_kwargs in (dict(custom_mask=flat), dict(packed_custom_mask=packed)):
        wrapper.plan(qo_indptr, kv_indptr, 4, 4, 64, q_data_type="float32", **mask_kwargs)
        assert max_abs_error(wrapper.run(q, k, v), expected) <= TOLERANCE[np.float32]


def test_ragged_prefill_rope_staging_checked_and_the_same_on_the_cpu():
    """rope_staging places the GPU's rotation; the CPU backend computes the reference whatever
    it says, and a value outside auto / fused / staged is refused naming it."""
    rng = np.random.default_rng(14)
    qo_indptr, kv_indptr = np.array([0, 5, 12], np.int32), np.array([0, 9, 16], np.int32)
    q = rng.standard_normal((12, 4, 64)).astype(np.float32)
    k = rng.standard_normal((16, 2, 64)).astype(np.float32)
    v = rng.standard_normal((16, 2, 64)).astype(np.float32)
    expected, _ = reference_attention(q, k, v, qo_indptr, kv_indptr, causal=True, rope_theta=1e4)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    for staging in ("auto", "fused", "staged"):
        wrapper.plan(qo_indptr, kv_indptr, 4, 2, 64, causal=True, pos_encoding_mode="ROPE_LLAMA",
                     q_data_type="float32", rope_staging=staging)
        assert max_abs_error(wrapper.run(q, k, v), expected) <= 1e-4
    with pytest.raises(ValueError, match="rope_staging must be 'auto', 'fused' or 'staged', "
                                         "got 'sometimes'"):
        wrapper.plan(qo_indptr, kv_indptr, 4, 2, 64, causal=True, q_data_type="float32",
                     rope_staging="sometimes")


def test_single_prefill_rope_causal_hnd():
    rng = np.random.default_rng(13)
    q = rng.standard_normal((7, 4, 64)).astype(np.float32)
    k = rng.standard_normal((2, 19, 64)).astype(np.float32)  # HND [H_kv, kv_len, D]
    v = rng.standard_normal((2, 19, 64)).astype(np.float32)
    out = flare.single_prefill_with_kv_cache(q, k, v, causal=True, kv_layout="HND",
                                             pos_encoding_mode="ROPE_LLAMA", rope_theta=1e4)
    expected, _ = reference_attention(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), [0, 7],
                                      [0, 19], causal=True, rope_theta=1e4)
    assert max_abs_error(out, expected) <= 1e-4


def random_states(seq, num_states, heads, dim, seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((seq, num_states, heads, dim)).astype(np.float32)
    s = (rng.standard_normal((seq, num_states, heads)) * 3).astype(np.float32)
    s[0, 0, 0] = -np.inf  # one empty state
    s[1, :, 1] = -np.inf  # a row where every state is empty
    return v, s


def test_merge_state_and_in_place_match_float64():
    v, s = random_states(7, 2, 4, 64, 14)
    expected_v, expected_s = reference_merge(v, s)
    merged_v, merged_s = flare.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1])
    assert max_abs_error(merged_v, expected_v) <= 1e-5
    assert max_abs_error(merged_s, expected_s) <= 1e-5
    assert np.all(merged_v[1, 1] == 0) and merged_s[1, 1] == -np.inf

    target_v, target_s = v[:, 0].copy(), s[:, 0].copy()
    mask = np.array([True, False, True, True, False, True, True])
    flare.merge_state_in_place(target_v, target_s, v[:, 1], s[:, 1], mask=mask)
    assert max_abs_error(target_v[mask], expected_v[mask]) <= 1e-5
    assert max_abs_error(target_s[mask], expected_s[mask]) <= 1e-5
    assert np.array_equal(target_v[~mask], v[~mask, 0])


def test_the_extensions_tensor_shape_pairs_view_contiguous_tensors():
    """The wrappers hand the extension (tensor, shape) pairs for free reshapes
    (python/src/object_view.cpp): a contiguous tensor is viewed with the shape, any other or a
    shape of another element count is refused naming the argument."""
    from flare import _flare

    v, s = random_states(6, 2, 4, 32, 16)
    expected_v, expected_s = reference_merge(v, s)
    flat_v, flat_s = v[:, 0].reshape(-1).copy(), s[:, 0].reshape(-1).copy()
    _flare.merge_state_in_place((flat_v, (6, 4, 32)), (flat_s, (6, 4)), v[:, 1], s[:, 1], None,
                                True)
    assert max_abs_error(flat_v.reshape(6, 4, 32), expected_v) <= 1e-5
    assert max_abs_error(flat_s.reshape(6, 4), expected_s) <= 1e-5
    with pytest.raises(ValueError, match=r"v of shape \[768\] cannot be viewed as \[6, 4, 33\]"):
        _flare.merge_state_in_place((flat_v, (6, 4, 33)), (flat_s, (6, 4)), v[:, 1], s[:, 1],
                                    None, True)
    with pytest.raises(ValueError, match="v viewed with 3 dimensions must be contiguous"):
        _flare.merge_state_in_place((v[:, 0], (6, 4, 32)), s[:, 0], v[:, 1], s[:, 1], None, True)


def test_merge_states_matches_float64():
    v, s = random_states(5, 3, 2, 32, 15)
    merged_v, merged_s = flare.merge_states(v, s)
    expected_v, expected_s = reference_merge(v, s)
    assert max_abs_error(merged_v, expected_v) <= 1e-5
    assert max_abs_error(merged_s, expected_s) <= 1e-5


def test_variable_length_merge_states_matches_merge_states_per_row():
    """flashinfer.triton.cascade's variable_length_merge_states (flare.triton.cascade): row r
    merges states indptr[r] .. indptr[r + 1] - 1; an empty range gives v = 0, s = -inf; a bad
    indptr names itself."""
    import flare.triton

    lengths = [3, 0, 1, 6]
    indptr = np.cumsum([0] + lengths).astype(np.int64)  # int64 on the host is taken as int32
    v, s = random_states(2, int(indptr[-1]), 2, 32, 17)
    v, s = v[0], s[0]  # [total, H, D], [total, H]
    merged_v, merged_s = flare.triton.cascade.variable_length_merge_states(v, s, indptr)
    assert merged_v.shape == (4, 2, 32) and merged_s.shape == (4, 2)
    for row in range(4):
        begin, end = indptr[row], indptr[row + 1]
        if begin == end:
            assert np.all(merged_v[row] == 0) and np.all(merged_s[row] == -np.inf)
            continue
        expected_v, expected_s = flare.merge_states(v[None, begin:end], s[None, begin:end])
        assert np.array_equal(merged_v[row], expected_v[0])
        assert np.array_equal(merged_s[row], expected_s[0])
    with pytest.raises(ValueError, match=r"indptr\[2\] = 1 after 3"):
        flare.triton.cascade.variable_length_merge_states(v, s, np.array([0, 3, 1, 4, 10]))
    with pytest.raises(ValueError, match=r"v must have rank 3 \[total_states, num_heads, "):
        flare.triton.cascade.variable_length_merge_states(v[None], s, indptr)


def test_merge_states_names_a_v_of_the_wrong_rank():
    v, s = random_states(5, 3, 2, 32, 15)
    with pytest.raises(ValueError, match=r"v must have rank 4 \[seq, num_states, .*got shape "
                                         r"\(3, 2, 32\)"):
        flare.merge_states(v[0], s)


def test_split_attention_merges_to_full_attention():
    """Attention over two halves of the KV, merged, equals attention over all of it."""
    rng = np.random.default_rng(16)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    k = rng.standard_normal((50, 4, 64)).astype(np.float32)
    v = rng.standard_normal((50, 4, 64)).astype(np.float32)
    o_a, s_a = flare.single_prefill_with_kv_cache(q, k[:20], v[:20], return_lse=True)
    o_b, s_b = flare.single_prefill_with_kv_cache(q, k[20:], v[20:], return_lse=True)
    merged, _ = flare.merge_state(o_a, s_a, o_b, s_b)
    expected, _ = reference_attention(q, k, v, [0, 1], [0, 50])
    assert max_abs_error(merged, expected) <= 1e-5


def test_get_batch_indices_positions():
    append_indptr = np.array([0, 2, 2, 5], dtype=np.int32)
    seq_lens = np.array([10, 4, 3], dtype=np.int32)
    batch_indices, positions = flare.get_batch_indices_positions(append_indptr, seq_lens, 7)
    assert batch_indices.tolist() == [0, 0, 2, 2, 2, -1, -1]
    assert positions.tolist() == [8, 9, 0, 1, 2, 0, 0]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_append_paged_kv_cache(layout, page_size):
    old_lens, append_lens = np.array([0, 5, 17, 2]), np.array([3, 0, 20, 1])
    full = PagedCache(old_lens + append_lens, 2, 64, page_size, layout, np.float16, seed=17)
    cache = full.cache.copy()
    # Blank the appended slots, then restore them by appending.
    rows = []
    for b in range(full.batch):
        for pos in range(old_lens[b], old_lens[b] + append_lens[b]):
            page = full.indices[full.indptr[b] + pos // page_size]
            if layout == "NHD":
                cache[page, :, pos % page_size] = np.nan
            else:
                cache[page, :, :, pos % page_size] = np.nan
            rows.append(full.kv_indptr[b] + pos)
    append_indptr = np.concatenate([[0], np.cumsum(append_lens)]).astype(np.int32)
    nnz = int(append_indptr[-1]) + 2  # two padding tokens
    batch_indices, positions = flare.get_batch_indices_positions(
        append_indptr, (old_lens + append_lens).astype(np.int32), nnz)
    key = np.full((nnz, 2, 64), 7.0, dtype=np.float16)
    value = np.full((nnz, 2, 64), 7.0, dtype=np.float16)
    key[: len(rows)], value[: len(rows)] = full.k[rows], full.v[rows]
    flare.append_paged_kv_cache(key, value, batch_indices, positions, cache, full.indices,
                                full.indptr, full.last_page_len, kv_layout=layout)
    np.testing.assert_array_equal(cache, full.cache)  # NaN == NaN for this comparison


def test_append_rejects_a_position_outside_the_pages_and_writes_nothing():
    full = PagedCache([4, 2], 1, 16, 3, seed=18)
    cache = full.cache.copy()
    key = np.ones((2, 1, 16), dtype=np.float32)
    batch_indices = np.array([0, 1], dtype=np.int32)
    positions = np.array([3, 3], dtype=np.int32)  # request 1 has one page of 3 slots
    with pytest.raises(ValueError, match=r"positions\[1\]=3"):
        flare.append_paged_kv_cache(key, key, batch_indices, positions, cache, full.indices,
                                    full.indptr, full.last_page_len)
    np.testing.assert_array_equal(cache, full.cache)


def test_invalid_arguments_raise_value_error_with_the_cpp_message():
    cache = PagedCache([4, 9], 2, 64, 4, seed=19)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    bad_indices = cache.indices.copy()
    bad_indices[1] = 1000
    wrapper.plan(cache.indptr, bad_indices, cache.last_page_len, 4, 2, 64, 4,
                 q_data_type="float32")
    q = np.zeros((2, 4, 64), dtype=np.float32)
    with pytest.raises(ValueError, match=r"kv_indices\[1\]=1000"):
        wrapper.run(q, cache.cache)
    with pytest.raises(ValueError, match="kv_layout"):
        flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NDH")
    with pytest.raises(ValueError, match="q has dtype"):
        wrapper.run(q.astype(np.float16), cache.cache)
    with pytest.raises(ValueError, match="divide|multiple"):
        wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 5, 2, 64, 4,
                     q_data_type="float32")


def test_run_before_plan_raises():
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    with pytest.raises(RuntimeError, match="plan"):
        wrapper.run(np.zeros((1, 4, 64), np.float32), np.zeros((1, 2, 4, 4, 64), np.float32))


def plan_paged_prefill(**kwargs):
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
    one = np.array([0, 1], dtype=np.int32)
    wrapper.plan(one, one, np.array([0], np.int32), np.array([1], np.int32), 4, 4, 64, 16,
                 **kwargs)
    return wrapper


UNSUPPORTED = [
    ("o_data_type", lambda: plan_paged_prefill(q_data_type="float32", o_data_type="float16")),
    ("use_fp16_qk_reduction", lambda: plan_paged_prefill(use_fp16_qk_reduction=True)),
]
# FlashInfer's backends: "fa2" and "fa3" (prefill) name flare's GPU kernels (CPU arrays run the
# CPU backend), the others are kernel families flare does not have.
UNSUPPORTED += [
    (f"backend='{b}'", lambda b=b: flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), backend=b))
    for b in ("fa2", "fa3", "cudnn", "trtllm-gen")
] + [
    ("backend='fa3'", lambda: flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(),
                                                                         backend="fa3")),
    ("backend='cutlass'", lambda: flare.single_prefill_with_kv_cache(
        *(np.zeros((1, 1, 64), np.float32),) * 3, backend="cutlass")),
]


@pytest.mark.parametrize("name,call", UNSUPPORTED, ids=[n for n, _ in UNSUPPORTED])
def test_unsupported_arguments_raise_not_implemented_naming_them(name, call):
    with pytest.raises(NotImplementedError, match=name):
        call()


def test_fa3_names_the_hopper_prefill_family_and_decode_has_only_fa2():
    from flare._args import check_backend
    check_backend("prefill", "fa3", cuda=True)  # flare's Hopper family: accepted on CUDA
    check_backend("prefill", "fa2", cuda=True)
    with pytest.raises(NotImplementedError, match="backend='fa3'.*here are 'fa2'"):
        check_backend("decode", "fa3", cuda=True, families=("fa2",))
    with pytest.raises(NotImplementedError, match="backend='fa3'.*CPU backend"):
        check_backend("prefill", "fa3", cuda=False)


def test_an_unknown_backend_is_a_value_error_listing_the_known_ones():
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'fa2', 'fa3'"):
        flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), backend="fa4")


def test_get_seq_lens_matches_the_page_arithmetic():
    indptr = np.array([0, 0, 1, 4, 9], np.int32)
    last = np.array([0, 5, 16, 1], np.int32)
    assert flare.get_seq_lens(indptr, last, 16).tolist() == [0, 5, 48, 65]
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        flare.get_seq_lens(indptr, last, 0)
    with pytest.raises(ValueError, match="len\\(kv_last_page_len\\) \\+ 1 = 5"):
        flare.get_seq_lens(indptr[:-1], last, 16)


def test_fast_decode_plan_is_plan_and_reads_the_host_indptr_override():
    cache = PagedCache([5, 97, 33], 2, 64, 16, seed=11)
    q = np.random.default_rng(12).standard_normal((cache.batch, 8, 64)).astype(np.float32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    # A stale device-side indptr (here: zeros) is ignored when the host copy is given.
    flare.fast_decode_plan(wrapper, np.zeros_like(cache.indptr), cache.indices,
                           cache.last_page_len, 8, 2, 64, 16, q_data_type="float32",
                           global_override_indptr_cpu=cache.indptr)
    out = wrapper.run(q, cache.cache)
    expected, _ = decode_reference(cache, q)
    assert max_abs_error(out, expected) <= TOLERANCE[np.float32]
    # Several tokens a request need the tensor-core path (FlashInfer's rule).
    with pytest.raises(ValueError, match="q_len_per_req=2 needs use_tensor_cores=True"):
        flare.fast_decode_plan(wrapper, cache.indptr, cache.indices, cache.last_page_len, 8, 2,
                               64, 16, q_data_type="float32", q_len_per_req=2)
    # FlashInfer's idiom: the instance's plan replaced by fast_decode_plan bound to it.
    patched = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    patched.plan = functools.partial(flare.fast_decode_plan, patched)
    patched.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 2, 64, 16,
                 q_data_type="float32")
    assert max_abs_error(patched.run(q, cache.cache), expected) <= TOLERANCE[np.float32]


@pytest.mark.parametrize("q_len", [2, 3])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_of_several_tokens_per_request_is_causal_within_the_request(q_len, layout):
    kv_lens = [3, 40, 17, 64]
    cache = PagedCache(kv_lens, 2, 64, 16, layout, seed=21)
    q = np.random.default_rng(22).standard_normal(
        (cache.batch * q_len, 8, 64)).astype(np.float32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout, use_tensor_cores=True)
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 2, 64, 16,
                 q_data_type="float32", q_len_per_req=q_len)
    out = np.full((cache.batch * q_len, 8, 64), np.nan, dtype=np.float32)
    lse = np.full((cache.batch * q_len, 8), np.nan, dtype=np.float32)
    wrapper.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    qo_indptr = np.arange(cache.batch + 1) * q_len
    expected_o, expected_lse = reference_attention(q, cache.k, cache.v, qo_indptr,
                                                   cache.kv_indptr, causal=True)
    assert max_abs_error(out, expected_o) <= TOLERANCE[np.float32]
    assert max_abs_error(lse, expected_lse) <= TOLERANCE[np.float32]
    # FlashInfer's deprecated run(q_len_per_req=) must agree with the plan.
    with pytest.raises(ValueError, match="q_len_per_req=1 but plan\\(\\) used"):
        wrapper.run(q, cache.cache, q_len_per_req=1)
    # A single-token plan of the same wrapper runs the decode loop again.
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 2, 64, 16,
                 q_data_type="float32")
    single = wrapper.run(q[q_len - 1::q_len].copy(), cache.cache)
    expected_single, _ = decode_reference(cache, q[q_len - 1::q_len])
    assert max_abs_error(single, expected_single) <= TOLERANCE[np.float32]


def test_several_tokens_per_request_errors_name_q_len_per_req():
    cache = PagedCache([16, 16, 16, 16], 2, 64, 16, seed=23)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
    plan = functools.partial(wrapper.plan, cache.indptr, cache.indices, cache.last_page_len, 8,
                             2, 64, 16, q_data_type="float32")
    plan(q_len_per_req=2)
    q = np.zeros((cache.batch * 3, 8, 64), np.float32)
    with pytest.raises(ValueError, match="q must have batch \\* q_len_per_req = 4 \\* 2 = 8 rows"):
        wrapper.run(q, cache.cache)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="q_len_per_req must be an int >= 1"):
            plan(q_len_per_req=bad)
    with pytest.raises(TypeError, match="q_len_per_req must be an int"):
        plan(q_len_per_req="2")
    # A request whose KV is shorter than its tokens: FlashInfer's "empty KV range".
    short = PagedCache([16, 1, 16, 16], 2, 64, 16, seed=24)
    with pytest.raises(ValueError, match="request 1 has kv_len=1: .*empty KV range"):
        wrapper.plan(short.indptr, short.indices, short.last_page_len, 8, 2, 64, 16,
                     q_data_type="float32", q_len_per_req=2)
    cuda_cores = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    with pytest.raises(ValueError, match="needs use_tensor_cores=True"):
        cuda_cores.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 2, 64, 16,
                        q_data_type="float32", q_len_per_req=2)
    unplanned = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
    with pytest.raises(ValueError, match="needs a prior plan\\(\\)"):
        flare.fast_decode_plan(unplanned, cache.indptr, cache.indices, cache.last_page_len, 8, 2,
                               64, 16, q_data_type="float32", q_len_per_req=2)
    flare.fast_decode_plan(wrapper, cache.indptr, cache.indices, cache.last_page_len, 8, 2, 64,
                           16, q_data_type="float32", q_len_per_req=2)
    assert wrapper.run(np.zeros((8, 8, 64), np.float32), cache.cache).shape == (8, 8, 64)


def test_data_type_fills_only_the_dtypes_not_given_as_flashinfer_does():
    from flare.decode import _plan_dtypes
    assert _plan_dtypes(None, None, None) == ("float16", "float16")
    assert _plan_dtypes("bfloat16", None, None) == ("bfloat16", "bfloat16")
    assert _plan_dtypes(None, None, "bfloat16") == ("bfloat16", "bfloat16")
    # FlashInfer's tests: plan(data_type=kv_dtype, q_data_type=q_dtype) with fp8 KV, fp16 q.
    assert _plan_dtypes("float16", None, "float8_e4m3fn") == ("float16", "e4m3")
    assert _plan_dtypes("float32", "float16", "bfloat16") == ("float32", "float16")


def test_run_return_lse_is_run_with_return_lse():
    cache = PagedCache([9, 40], 2, 64, 16, seed=13)
    q = np.random.default_rng(14).standard_normal((cache.batch, 4, 64)).astype(np.float32)
    decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    decode.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 16,
                q_data_type="float32")
    o, lse = decode.run_return_lse(q, cache.cache)
    expected_o, expected_lse = decode.run(q, cache.cache, return_lse=True)
    assert np.array_equal(o, expected_o) and np.array_equal(lse, expected_lse)
    prefill = plan_paged_prefill(q_data_type="float32")
    q1 = np.ones((1, 4, 64), np.float32)
    kv = np.ones((1, 2, 16, 4, 64), np.float32)
    assert len(prefill.run_return_lse(q1, kv)) == 2


def test_cuda_graph_decode_wrapper_needs_cuda_buffers():
    with pytest.raises(ValueError, match="use_cuda_graph=True needs a CUDA"):
        flare.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            workspace(), np.zeros(3, np.int32), np.zeros(4, np.int32), np.zeros(2, np.int32))


# CUDA graphs need a CUDA workspace; the fixed buffers go with use_cuda_graph=True.
GRAPH_ARGUMENT_ERRORS = [
    ("use_cuda_graph=True needs a CUDA", lambda: flare.BatchPrefillWithPagedKVCacheWrapper(
        workspace(), use_cuda_graph=True)),
    ("use_cuda_graph=True needs a CUDA", lambda: flare.BatchPrefillWithRaggedKVCacheWrapper(
        workspace(), use_cuda_graph=True)),
    ("_buf arguments are for use_cuda_graph", lambda: flare.BatchPrefillWithRaggedKVCacheWrapper(
        workspace(), qo_indptr_buf=np.zeros(2, np.int32))),
    ("_buf arguments are for use_cuda_graph", lambda: flare.BatchPrefillWithPagedKVCacheWrapper(
        workspace(), custom_mask_buf=np.zeros(2, np.uint8))),
    ("pass them or a custom mask, not both", lambda: plan_paged_prefill(
        custom_mask=np.ones(1, bool), prefix_len_ptr=np.zeros(1, np.uint32),
        token_pos_in_items_ptr=np.zeros(1, np.uint16))),
    ("needs prefix_len_ptr and token_pos_in_items_ptr", lambda: plan_paged_prefill(
        max_item_len_ptr=np.zeros(1, np.uint16))),
]


@pytest.mark.parametrize("message,call", GRAPH_ARGUMENT_ERRORS)
def test_prefill_argument_errors(message, call):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_custom_mask_replaces_causal_as_in_flashinfer():
    qo_lens, kv_lens = [5, 9], [12, 9]
    cache = PagedCache(kv_lens, 2, 64, 4, seed=31)
    qo_indptr = np.array([0, 5, 14], np.int32)
    q = np.random.default_rng(32).standard_normal((14, 4, 64)).astype(np.float32)
    masks = [np.random.default_rng(33 + b).random((qo, kv)) < 0.6
             for b, (qo, kv) in enumerate(zip(qo_lens, kv_lens))]
    flat = np.concatenate([m.reshape(-1) for m in masks])
    outs = []
    for causal in (False, True):
        wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
        wrapper.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 4,
                     custom_mask=flat, causal=causal, q_data_type="float32")
        outs.append(wrapper.run(q, cache.cache))
    expected, _ = reference_attention(q, cache.k, cache.v, qo_indptr, cache.kv_indptr,
                                      custom_mask=masks)
    assert np.array_equal(outs[0], outs[1])
    assert max_abs_error(outs[1], expected) <= TOLERANCE[np.float32]


def multi_item_reference_mask(token_pos, prefix_len):
    """FlashInfer's test's mask (create_2D_multi_item_mask_dense) for qo_len == kv_len -
    prefix_len: groups split at delimiters (position 0), causal within a group, none to or
    from delimiters, everything to the prefix."""
    is_delimiter = np.asarray(token_pos) == 0
    pos = np.arange(len(is_delimiter))
    groups = np.cumsum(is_delimiter)
    first = int(np.nonzero(is_delimiter)[0][0])
    within = (groups[:, None] == groups[None, :]) & (pos[None, :] <= pos[:, None])
    mask = ((within | ((pos >= first)[:, None] & (pos < first)[None, :]))
            & ~is_delimiter[None, :] & ~is_delimiter[:, None])
    return np.concatenate([np.ones((len(pos), prefix_len), bool), mask], axis=1)


@pytest.mark.parametrize("paged", [True, False])
def test_multi_item_scoring_is_flashinfers_mask(paged):
    # FlashInfer's two cases (batch 1), then a batch of 2 with a stride of 40 entries.
    cases = [(54, 37, [17], list(range(17)) + list(range(19)) + [0], 100),
             (97, 81, [16], list(range(80)) + [0], 97),
             (None, None, [5, 3], (list(range(4)) * 3 + [0]) + [0] * 27 + [0, 1, 2, 0, 1, 0]
              + [0] * 34, 40)]
    for kv_len, qo_len, prefix, token_pos, stride in cases:
        if kv_len is None:  # request lengths of the batched case
            kv_lens, qo_lens = [5 + 13, 3 + 6], [13, 6]
        else:
            kv_lens, qo_lens = [kv_len], [qo_len]
        cache = PagedCache(kv_lens, 4, 64, 5, seed=len(token_pos))
        qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        q = np.random.default_rng(41).standard_normal((qo_indptr[-1], 4, 64)).astype(np.float32)
        # One request's prefix as a scalar, as FlashInfer's test passes it.
        items = dict(prefix_len_ptr=np.array(prefix[0] if len(prefix) == 1 else prefix,
                                             np.uint32),
                     token_pos_in_items_ptr=np.array(token_pos, np.uint16),
                     token_pos_in_items_len=stride, max_item_len_ptr=np.array([19], np.uint16))
        if paged:
            wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
            wrapper.plan(qo_indptr, cache.indptr, cache.indices, cache.last_page_len, 4, 4, 64,
                         5, causal=True, q_data_type="float32", **items)
            out = wrapper.run(q, cache.cache)
        else:
            wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
            wrapper.plan(qo_indptr, cache.kv_indptr.astype(np.int32), 4, 4, 64, causal=True,
                         q_data_type="float32", **items)
            out = wrapper.run(q, cache.k, cache.v)
        masks = [multi_item_reference_mask(token_pos[b * stride:b * stride + qo_lens[b]],
                                           prefix[b]) for b in range(len(qo_lens))]
        expected, _ = reference_attention(q, cache.k, cache.v, qo_indptr, cache.kv_indptr,
                                          custom_mask=masks)
        assert max_abs_error(out, expected) <= TOLERANCE[np.float32], (kv_len, qo_len)


def test_multi_item_scoring_errors_name_the_argument():
    cache = PagedCache([10], 2, 64, 4, seed=51)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
    plan = functools.partial(wrapper.plan, np.array([0, 6], np.int32), cache.indptr,
                             cache.indices, cache.last_page_len, 4, 2, 64, 4,
                             q_data_type="float32")
    with pytest.raises(ValueError, match="prefix_len_ptr\\[0\\]=11 must lie in \\[0, kv_len=10\\]"):
        plan(prefix_len_ptr=np.array([11], np.uint32),
             token_pos_in_items_ptr=np.zeros(6, np.uint16))
    with pytest.raises(ValueError, match="read token_pos_in_items_ptr\\[0:6\\], past its 5"):
        plan(prefix_len_ptr=np.array([4], np.uint32),
             token_pos_in_items_ptr=np.zeros(5, np.uint16))
    with pytest.raises(ValueError, match="prefix_len_ptr must have one entry a request"):
        plan(prefix_len_ptr=np.array([4, 4], np.uint32),
             token_pos_in_items_ptr=np.zeros(6, np.uint16))


def test_prefill_run_before_plan_and_dtype_mismatch():
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    q = np.zeros((1, 4, 64), np.float32)
    with pytest.raises(RuntimeError, match="plan"):
        wrapper.run(q, q, q)
    one = np.array([0, 1], dtype=np.int32)
    wrapper.plan(one, one, 4, 4, 64, q_data_type="float32")
    with pytest.raises(ValueError, match="q has dtype float16"):
        wrapper.run(q.astype(np.float16), q, q)


def test_unsupported_head_dim_is_not_implemented_or_invalid():
    """A head dim no kernel handles is rejected at plan(), never at launch."""
    with pytest.raises((NotImplementedError, ValueError), match="head"):
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
        cache = PagedCache([3], 1, 12, 4, seed=20)
        wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 1, 1, 12, 4,
                     q_data_type="float32")
        wrapper.run(np.zeros((1, 1, 12), np.float32), cache.cache)


def test_sm_scale_default_is_inverse_sqrt_head_dim():
    cache = PagedCache([11], 1, 64, 16, seed=21)
    q = np.random.default_rng(22).standard_normal((1, 1, 64)).astype(np.float32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    explicit = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 1, 1, 64, 16,
                 q_data_type="float32")
    explicit.plan(cache.indptr, cache.indices, cache.last_page_len, 1, 1, 64, 16,
                  q_data_type="float32", sm_scale=1 / math.sqrt(64))
    np.testing.assert_array_equal(wrapper.run(q, cache.cache), explicit.run(q, cache.cache))


def test_q_scale_multiplies_the_logits_and_lse_base_selects_the_log():
    """q_scale and k_scale scale q.k, v_scale the output (FlashInfer's fp8 calibration
    scales); lse is base 2 by default (FlashInfer's), natural with lse_base="ln"."""
    cache = PagedCache([5, 40], 2, 64, 16, seed=31)
    q = np.random.default_rng(32).standard_normal((cache.batch, 4, 64)).astype(np.float32)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    wrapper.plan(cache.indptr, cache.indices, cache.last_page_len, 4, 2, 64, 16,
                 q_data_type="float32")
    out, lse = wrapper.run(q, cache.cache, q_scale=0.25, k_scale=2.0, v_scale=3.0,
                           return_lse=True)
    expected_o, expected_lse = decode_reference(cache, q, k_scale=0.5, v_scale=3.0)
    assert max_abs_error(out, expected_o) <= TOLERANCE[np.float32] * 3
    assert max_abs_error(lse, expected_lse) <= TOLERANCE[np.float32]
    _, natural = wrapper.run(q, cache.cache, return_lse=True, lse_base="ln")
    _, expected_natural = decode_reference(cache, q, lse_base="ln")
    assert max_abs_error(natural, expected_natural) <= TOLERANCE[np.float32]
    with pytest.raises(ValueError, match="lse_base"):
        wrapper.run(q, cache.cache, lse_base="log10")


def test_merge_takes_lse_in_either_base():
    v, s = random_states_numpy(seed=33)
    for base in ("log2", "ln"):
        expected_v, expected_s = reference_merge(v, s, lse_base=base)
        merged_v, merged_s = flare.merge_states(v, s, lse_base=base)
        assert max_abs_error(merged_v, expected_v) <= 1e-5
        assert max_abs_error(merged_s, expected_s) <= 1e-5


def random_states_numpy(seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((5, 3, 2, 16)).astype(np.float32)
    s = (rng.random((5, 3, 2)) * 20 - 10).astype(np.float32)
    s[1, :, 1] = -np.inf
    return v, s


def test_errors_name_the_argument_the_caller_passed():
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    with pytest.raises(ValueError, match=r"kv_indptr must be non-decreasing: kv_indptr\[2\]=3"):
        wrapper.plan(np.array([0, 1, 2], np.int32), np.array([0, 5, 3], np.int32), 4, 4, 64,
                     q_data_type="float32")
    with pytest.raises(ValueError, match=r"qo_indptr\[0\] must be 0"):
        wrapper.plan(np.array([1, 2], np.int32), np.array([0, 5], np.int32), 4, 4, 64,
                     q_data_type="float32")
    wrapper.plan([0, 1], [0, 5], 4, 4, 64, q_data_type="float32")  # lists are fine
    with pytest.raises(TypeError, match="q must be a numpy array or a torch tensor, got list"):
        wrapper.run([[0.0]], np.zeros((5, 4, 64), np.float32), np.zeros((5, 4, 64), np.float32))
    decode = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    with pytest.raises(ValueError, match=r"indptr must be non-decreasing: indptr\[1\]=-1"):
        decode.plan([0, -1], [0], [1], 4, 4, 64, 16, q_data_type="float32")
