"""The prefill wrappers on PyTorch CUDA tensors (flare's GPU BatchPrefill): paged and ragged
prefill and append against a float64 reference (causal, no mask, custom masks packed on the
device and on the host, window, soft-cap, ALiBi, GQA 1/4/7/8, page sizes 1/3/16, NHD/HND,
head dims 64/128/256 and 192/128), single_prefill_with_kv_cache, CUDA-graph captures replayed
with new lengths, and the errors. Skipped visibly without PyTorch or without a CUDA device.

Outputs are NaN-poisoned before each run and unused cache slots hold NaN, so a row the kernel
never writes, or a key it reads outside a request, fails the comparison. Tolerances (unit
normal inputs, float64 reference on the same rounded inputs, as tests/gpu/prefill_test.cpp):
o max abs <= 2e-2 in bfloat16 (o rounded, P rounded before P.V) and <= 4e-3 in float16; lse
(float32, natural log) max abs <= 2e-3.
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from attention_reference import reference_attention  # noqa: E402
from flare._prefill_gpu import mask_on_device  # noqa: E402
from gpu_paged_cache import GpuPagedCache  # noqa: E402

DEVICE = torch.device("cuda:0")
O_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
LSE_TOLERANCE = 2e-3
# Fused RoPE: the kernels round rotated q and K to 16 bits (the MMA's operands), ~2^-9 relative
# error per element in every logit (tests/gpu/decode_test_support.h kLseToleranceRotary, in
# base 2 here).
ROTARY_LSE_TOLERANCE = 1.2e-2


def workspace(device=DEVICE):
    return torch.empty(128 << 20, dtype=torch.uint8, device=device)  # FlashInfer's size


def indptr(lengths):
    return torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32)


def max_error(actual, expected):
    """Largest |actual - expected|; equal infinities count as 0 and any NaN as infinite."""
    actual = actual.double().cpu().numpy()
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.size == 0:
        return 0.0
    same = actual == expected
    diff = np.where(same, 0.0, np.abs(actual - expected))
    return float(np.nan_to_num(diff, nan=np.inf).max())


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def random_q(total, heads, head_dim, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(total, heads, head_dim, generator=generator).to(dtype).to(DEVICE)


def ragged_kv(kv_lens, heads, head_dim_qk, head_dim_vo, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    total = int(sum(kv_lens))
    k = torch.randn(total, heads, head_dim_qk, generator=generator).to(dtype).to(DEVICE)
    v = torch.randn(total, heads, head_dim_vo, generator=generator).to(dtype).to(DEVICE)
    return k, v


def paged_reference(cache, q, qo_lens, **options):
    """float64 (o, lse) of a paged cache: each request's valid tokens gathered as ragged K/V."""
    ks, vs = zip(*(cache.tokens(b) for b in range(cache.batch)))
    k = torch.cat(ks).cpu().numpy()
    v = torch.cat(vs).cpu().numpy()
    return reference_attention(q.double().cpu().numpy(), k, v, indptr(qo_lens).numpy(),
                               indptr(cache.kv_lens).numpy(), **options)


def random_masks(qo_lens, kv_lens, seed):
    rng = np.random.default_rng(seed)
    return [rng.random((q, k)) < 0.6 for q, k in zip(qo_lens, kv_lens)]


def check(out, lse, expected, dtype, lse_tolerance=LSE_TOLERANCE):
    expected_o, expected_lse = expected
    assert not torch.isnan(out).any(), "rows the kernel never wrote"
    assert max_error(out, expected_o) <= O_TOLERANCE[dtype]
    assert max_error(lse, expected_lse) <= lse_tolerance


# Append (q_len < kv_len), prefill (q_len == kv_len), one token, a request without queries and
# one without keys (o = 0, lse = -inf).
QO_LENS = [1, 7, 0, 97, 33, 5]
KV_LENS = [1, 20, 5, 511, 33, 0]

PAGED_CASES = [
    # dtype, layout, page_size, (H_qo, H_kv), head_dim, causal
    (torch.bfloat16, "NHD", 16, (32, 8), 128, True),
    (torch.float16, "HND", 16, (8, 8), 128, True),
    (torch.bfloat16, "NHD", 1, (16, 4), 64, True),
    (torch.float16, "NHD", 3, (7, 1), 64, False),
    (torch.bfloat16, "HND", 1, (8, 1), 256, True),
]


@pytest.mark.parametrize("dtype,layout,page_size,heads,head_dim,causal", PAGED_CASES)
def test_paged_prefill_matches_float64(dtype, layout, page_size, heads, head_dim, causal):
    num_qo_heads, num_kv_heads = heads
    cache = GpuPagedCache(KV_LENS, num_kv_heads, head_dim, page_size, layout, dtype, seed=1)
    q = random_q(sum(QO_LENS), num_qo_heads, head_dim, dtype, seed=2)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), layout)
    # Host index arrays (plan never syncs); the page ids on the device.
    wrapper.plan(indptr(QO_LENS), cache.indptr, cache.indices.to(DEVICE), cache.last_page_len,
                 num_qo_heads, num_kv_heads, head_dim, page_size, causal=causal,
                 q_data_type=dtype)
    out = poisoned(q.shape, dtype)
    lse = poisoned((q.shape[0], num_qo_heads), torch.float32)
    result = wrapper.run(q, cache.cache, out=out, lse=lse, return_lse=True)
    assert result[0] is out and result[1] is lse
    check(out, lse, paged_reference(cache, q, QO_LENS, causal=causal), dtype)
    empty = slice(sum(QO_LENS[:5]), sum(QO_LENS))  # the request without keys
    assert torch.all(out[empty] == 0) and torch.all(lse[empty] == -math.inf)


RAGGED_CASES = [
    # dtype, kv_layout, (H_qo, H_kv), (D_qk, D_vo), causal
    (torch.bfloat16, "NHD", (16, 4), (128, 128), True),
    (torch.float16, "HND", (8, 1), (64, 64), True),
    (torch.bfloat16, "NHD", (7, 7), (256, 256), False),
    (torch.bfloat16, "NHD", (8, 2), (192, 128), True),
]


@pytest.mark.parametrize("dtype,kv_layout,heads,head_dims,causal", RAGGED_CASES)
def test_ragged_prefill_matches_float64(dtype, kv_layout, heads, head_dims, causal):
    num_qo_heads, num_kv_heads = heads
    head_dim_qk, head_dim_vo = head_dims
    k, v = ragged_kv(KV_LENS, num_kv_heads, head_dim_qk, head_dim_vo, dtype, seed=3)
    q = random_q(sum(QO_LENS), num_qo_heads, head_dim_qk, dtype, seed=4)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(), kv_layout)
    wrapper.plan(indptr(QO_LENS), indptr(KV_LENS), num_qo_heads, num_kv_heads, head_dim_qk,
                 head_dim_vo=head_dim_vo, causal=causal, q_data_type=dtype)
    if kv_layout == "HND":
        k_in, v_in = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    else:
        k_in, v_in = k, v
    out, lse = wrapper.run(q, k_in, v_in, return_lse=True)
    assert out.shape == (q.shape[0], num_qo_heads, head_dim_vo) and out.dtype == dtype
    expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                   v.double().cpu().numpy(), indptr(QO_LENS).numpy(),
                                   indptr(KV_LENS).numpy(), causal=causal)
    check(out, lse, expected, dtype)


def test_one_wrapper_alternating_configurations_and_lengths():
    """plan() remembers each configuration it checked: replanning alternates causal and
    window_left and changes the lengths, and every run matches the float64 reference of its own
    plan (a stale remembered configuration or capacity would not)."""
    dtype, num_qo_heads, num_kv_heads, head_dim = torch.bfloat16, 8, 2, 64
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD")
    steps = [([5, 40], [9, 40], dict(causal=True)),
             ([3, 1, 64], [30, 1, 64], dict(causal=False)),
             ([5, 40], [9, 40], dict(causal=True, window_left=7)),
             ([300, 2], [300, 77], dict(causal=True)),
             ([3, 1, 64], [30, 1, 64], dict(causal=False))]
    for seed, (qo_lens, kv_lens, options) in enumerate(steps):
        k, v = ragged_kv(kv_lens, num_kv_heads, head_dim, head_dim, dtype, seed=100 + seed)
        q = random_q(sum(qo_lens), num_qo_heads, head_dim, dtype, seed=200 + seed)
        wrapper.plan(indptr(qo_lens), indptr(kv_lens), num_qo_heads, num_kv_heads, head_dim,
                     q_data_type=dtype, **options)
        out, lse = wrapper.run(q, k, v, return_lse=True)
        expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                       v.double().cpu().numpy(), indptr(qo_lens).numpy(),
                                       indptr(kv_lens).numpy(), **options)
        check(out, lse, expected, dtype)


def test_ragged_causal_prefill_matches_torch_sdpa_float64():
    """q_len == kv_len, where SDPA's top-left causal mask equals flare's bottom-right one."""
    dtype, num_qo_heads, num_kv_heads, head_dim = torch.bfloat16, 16, 4, 128
    lens = [1, 97, 256, 33]
    k, v = ragged_kv(lens, num_kv_heads, head_dim, head_dim, dtype, seed=30)
    q = random_q(sum(lens), num_qo_heads, head_dim, dtype, seed=31)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    wrapper.plan(indptr(lens), indptr(lens), num_qo_heads, num_kv_heads, head_dim, causal=True,
                 q_data_type=dtype)
    out = wrapper.run(q, k, v, out=poisoned(q.shape, dtype))
    group = num_qo_heads // num_kv_heads
    begin = 0
    for n in lens:
        rows = slice(begin, begin + n)
        qb = q[rows].double().transpose(0, 1)[None]  # [1, H_qo, n, D]
        kb = k[rows].double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
        vb = v[rows].double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
        expected = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
        assert max_error(out[rows], expected[0].transpose(0, 1).cpu().numpy()) <= \
            O_TOLERANCE[dtype], f"request of {n} tokens"
        begin += n


def test_device_mask_packing_matches_numpy_packbits():
    qo_len, kv_len = np.array([3, 0, 5, 1], np.int32), np.array([7, 4, 9, 1], np.int32)
    masks = random_masks(qo_len, kv_len, seed=5)
    flat = np.concatenate([m.reshape(-1) for m in masks])
    expected = np.concatenate([np.packbits(m.reshape(-1), bitorder="little") for m in masks])
    like = workspace()
    for source in (torch.from_numpy(flat).to(DEVICE), flat):  # packed on the device, the host
        bits, mask_indptr = mask_on_device(source, None, qo_len, kv_len, like)
        assert bits.device == DEVICE and bits.dtype == torch.uint8
        np.testing.assert_array_equal(bits.cpu().numpy(), expected)
        np.testing.assert_array_equal(mask_indptr.cpu().numpy(), [0, 3, 3, 9, 10])


@pytest.mark.parametrize("paged", [True, False])
def test_custom_mask_matches_float64(paged):
    """A bool mask on the device (packed there), on the host, and packed_custom_mask."""
    dtype, num_qo_heads, num_kv_heads, head_dim = torch.bfloat16, 16, 4, 128
    qo_lens, kv_lens = [5, 0, 40, 1, 17], [9, 3, 40, 64, 100]
    masks = random_masks(qo_lens, kv_lens, seed=6)
    flat = np.concatenate([m.reshape(-1) for m in masks])
    packed = np.concatenate([np.packbits(m.reshape(-1), bitorder="little") for m in masks])
    q = random_q(sum(qo_lens), num_qo_heads, head_dim, dtype, seed=7)
    if paged:
        cache = GpuPagedCache(kv_lens, num_kv_heads, head_dim, 16, "NHD", dtype, seed=8)
        wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
        expected = paged_reference(cache, q, qo_lens, custom_mask=masks)
    else:
        k, v = ragged_kv(kv_lens, num_kv_heads, head_dim, head_dim, dtype, seed=8)
        wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
        expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                       v.double().cpu().numpy(), indptr(qo_lens).numpy(),
                                       indptr(kv_lens).numpy(), custom_mask=masks)
    for mask_kwargs in (dict(custom_mask=torch.from_numpy(flat).to(DEVICE)),
                        dict(custom_mask=flat),
                        dict(packed_custom_mask=torch.from_numpy(packed).to(DEVICE))):
        if paged:
            wrapper.plan(indptr(qo_lens), cache.indptr, cache.indices, cache.last_page_len,
                         num_qo_heads, num_kv_heads, head_dim, 16, q_data_type=dtype,
                         **mask_kwargs)
            out, lse = wrapper.run(q, cache.cache, return_lse=True)
        else:
            wrapper.plan(indptr(qo_lens), indptr(kv_lens), num_qo_heads, num_kv_heads,
                         head_dim, q_data_type=dtype, **mask_kwargs)
            out, lse = wrapper.run(q, k, v, return_lse=True)
        check(out, lse, expected, dtype)


def test_window_softcap_alibi_scale_on_a_side_stream():
    dtype, num_qo_heads, num_kv_heads, head_dim = torch.float16, 8, 1, 64
    qo_lens, kv_lens = [40, 1, 9], [130, 60, 9]
    cache = GpuPagedCache(kv_lens, num_kv_heads, head_dim, 3, "NHD", dtype, seed=9)
    q = random_q(sum(qo_lens), num_qo_heads, head_dim, dtype, seed=10)
    options = dict(causal=True, window_left=31, logits_soft_cap=20.0, sm_scale=0.1)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.plan(indptr(qo_lens), cache.indptr, cache.indices, cache.last_page_len,
                     num_qo_heads, num_kv_heads, head_dim, 3, pos_encoding_mode="ALIBI",
                     q_data_type=dtype, **options)
        out, lse = wrapper.run(q, (cache.cache[:, 0], cache.cache[:, 1]), return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    check(out, lse, paged_reference(cache, q, qo_lens, alibi=True, **options), dtype)


def test_k_and_v_scales():
    dtype, heads, head_dim = torch.float16, 4, 128
    qo_lens, kv_lens = [9, 30], [9, 50]
    k, v = ragged_kv(kv_lens, heads, head_dim, head_dim, dtype, seed=11)
    q = random_q(sum(qo_lens), heads, head_dim, dtype, seed=12)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    wrapper.plan(indptr(qo_lens), indptr(kv_lens), heads, heads, head_dim, causal=True,
                 q_data_type=dtype)
    # Powers of two: folding k_scale into q rounds nothing.
    out, lse = wrapper.run(q, k, v, k_scale=0.5, v_scale=2.0, return_lse=True)
    expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                   v.double().cpu().numpy(), indptr(qo_lens).numpy(),
                                   indptr(kv_lens).numpy(), causal=True, k_scale=0.5,
                                   v_scale=2.0)
    # v_scale doubles the output and its rounding.
    assert max_error(out, expected[0]) <= 2 * O_TOLERANCE[dtype]
    assert max_error(lse, expected[1]) <= LSE_TOLERANCE


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_single_prefill_matches_float64(kv_layout):
    dtype = torch.bfloat16
    q = random_q(77, 16, 128, dtype, seed=13)
    k, v = ragged_kv([300], 4, 128, 128, dtype, seed=14)
    k_in, v_in = ((k, v) if kv_layout == "NHD" else
                  (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()))
    out, lse = flare.single_prefill_with_kv_cache(q, k_in, v_in, causal=True,
                                                  kv_layout=kv_layout, return_lse=True)
    expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                   v.double().cpu().numpy(), [0, 77], [0, 300], causal=True)
    check(out, lse, expected, dtype)
    mask = np.random.default_rng(15).random((77, 300)) < 0.5
    masked = flare.single_prefill_with_kv_cache(q, k_in, v_in, kv_layout=kv_layout,
                                                custom_mask=torch.from_numpy(mask).to(DEVICE))
    expected_masked, _ = reference_attention(
        q.double().cpu().numpy(), k.double().cpu().numpy(), v.double().cpu().numpy(), [0, 77],
        [0, 300], custom_mask=[mask])
    assert max_error(masked, expected_masked) <= O_TOLERANCE[dtype]


def graph_buffers(batch, max_pages):
    def zeros(n, dtype=torch.int32):
        return torch.zeros(n, dtype=dtype, device=DEVICE)

    return dict(qo_indptr_buf=zeros(batch + 1), paged_kv_indptr_buf=zeros(batch + 1),
                paged_kv_indices_buf=zeros(max_pages), paged_kv_last_page_len_buf=zeros(batch))


def test_multi_item_scoring_on_the_device_with_flashinfers_unsigned_arrays():
    """prefix_len_ptr (uint32) and token_pos_in_items_ptr (uint16) on the GPU, as FlashInfer's
    test passes them: the mask is built on the device and equals the dense one."""
    qo_lens, prefix = [13, 6], [5, 3]
    kv_lens = [p + q for p, q in zip(prefix, qo_lens)]
    stride = 40
    token_pos = (list(range(4)) * 3 + [0]) + [0] * 27 + [0, 1, 2, 0, 1, 0] + [0] * 34
    cache = GpuPagedCache(kv_lens, 4, 128, 16, "NHD", torch.float16, seed=61)
    q = random_q(sum(qo_lens), 16, 128, torch.float16, seed=62)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(indptr(qo_lens).to(DEVICE), cache.indptr.to(DEVICE), cache.indices.to(DEVICE),
                 cache.last_page_len.to(DEVICE), 16, 4, 128, 16, causal=True,
                 pos_encoding_mode="ROPE_LLAMA", q_data_type=torch.float16,
                 prefix_len_ptr=torch.tensor(prefix).to(torch.uint32).to(DEVICE),
                 token_pos_in_items_ptr=torch.tensor(token_pos).to(torch.uint16).to(DEVICE),
                 token_pos_in_items_len=stride,
                 max_item_len_ptr=torch.tensor([4, 3]).to(torch.uint16).to(DEVICE))
    out = wrapper.run(q, cache.cache)
    masks = []
    for b, (qo, p) in enumerate(zip(qo_lens, prefix)):
        pos = np.array(token_pos[b * stride:b * stride + qo])
        s = np.arange(qo) + p
        j = np.arange(p + qo)
        masks.append((j[None, :] <= s[:, None]) & ((j[None, :] < p) | (s[:, None] < j[None, :] +
                                                                          pos[:, None])))
    expected_o, _ = paged_reference(cache, q, qo_lens, custom_mask=masks, rope_theta=1e4)
    assert max_error(out, expected_o) <= O_TOLERANCE[torch.float16]


def test_paged_cuda_graph_replay_with_new_lengths():
    """Capture one prefill step, then plan() new lengths and page tables and replay; the first
    plan is the largest (FlashInfer's rule for the token count)."""
    dtype, num_qo_heads, num_kv_heads, head_dim, page_size = torch.bfloat16, 16, 4, 128, 16
    steps = [([100, 60, 33, 200], [700, 60, 90, 1000]),  # the largest step first
             ([1, 7, 0, 97], [5, 20, 3, 511]),
             ([50, 1, 1, 1], [50, 1, 2000, 3]),
             ([0, 0, 0, 0], [1, 2, 3, 4])]
    batch = 4
    max_rows = sum(steps[0][0])
    pool = max(sum((n + page_size - 1) // page_size for n in kv) for _, kv in steps) + 8
    buffers = graph_buffers(batch, pool)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True,
                                                        **buffers)
    assert wrapper.is_cuda_graph_enabled
    # Every tensor the graph reads keeps its address; each step refills them in place.
    kv = torch.empty(pool, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    q = torch.empty(max_rows, num_qo_heads, head_dim, dtype=dtype, device=DEVICE)
    out = torch.empty_like(q)
    lse = torch.empty(max_rows, num_qo_heads, device=DEVICE)

    def prepare(step):
        qo_lens, kv_lens = steps[step]
        used = sum((n + page_size - 1) // page_size for n in kv_lens)
        cache = GpuPagedCache(kv_lens, num_kv_heads, head_dim, page_size, "NHD", dtype,
                              seed=100 + step, extra_pages=pool - used)
        kv.copy_(cache.cache)
        cache.cache = kv
        q.copy_(random_q(max_rows, num_qo_heads, head_dim, dtype, seed=200 + step))
        wrapper.plan(indptr(qo_lens), cache.indptr, cache.indices, cache.last_page_len,
                     num_qo_heads, num_kv_heads, head_dim, page_size, causal=True,
                     q_data_type=dtype)
        return cache

    cache = prepare(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q, kv, out=out, lse=lse)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, kv, out=out, lse=lse)
    for step, (qo_lens, _) in enumerate(steps):
        if step > 0:
            cache = prepare(step)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rows = sum(qo_lens)
        expected = paged_reference(cache, q[:rows], qo_lens, causal=True)
        check(out[:rows], lse[:rows], expected, dtype)


def replay_graph_steps(wrapper, qkv, out, steps, prepare, dtype):
    """Captures wrapper.run(*qkv, out=out) once prepare(0) has planned the first step (a warm-up
    run on a side stream first), then for each step re-plans (prepare(step): the rows and the
    float64 reference), replays the graph over NaN-poisoned outputs and checks the rows."""
    rows, expected = prepare(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(*qkv, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(*qkv, out=out)
    for step in range(steps):
        if step > 0:
            rows, expected = prepare(step)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not torch.isnan(out[:rows]).any(), f"step {step}"
        assert max_error(out[:rows], expected) <= O_TOLERANCE[dtype], f"step {step}"


def test_ragged_cuda_graph_with_custom_mask_buffers():
    dtype, heads, head_dim, batch = torch.float16, 8, 64, 3
    steps = [([30, 20, 10], [40, 20, 64]), ([2, 9, 1], [2, 30, 7])]
    max_rows = sum(steps[0][0])
    max_kv = max(sum(kv) for _, kv in steps)
    max_mask_bytes = max(sum((q * k + 7) // 8 for q, k in zip(*s)) for s in steps)
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(
        workspace(), use_cuda_graph=True,
        qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
        kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
        custom_mask_buf=torch.zeros(max_mask_bytes, dtype=torch.uint8, device=DEVICE),
        mask_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE))
    q = torch.empty(max_rows, heads, head_dim, dtype=dtype, device=DEVICE)
    k = torch.empty(max_kv, heads, head_dim, dtype=dtype, device=DEVICE)
    v = torch.empty_like(k)
    out = torch.empty_like(q)

    def prepare(step):
        qo_lens, kv_lens = steps[step]
        masks = random_masks(qo_lens, kv_lens, seed=300 + step)
        step_k, step_v = ragged_kv(kv_lens, heads, head_dim, head_dim, dtype, seed=310 + step)
        k[:step_k.shape[0]].copy_(step_k)
        v[:step_v.shape[0]].copy_(step_v)
        q.copy_(random_q(max_rows, heads, head_dim, dtype, seed=320 + step))
        flat = np.concatenate([m.reshape(-1) for m in masks])
        wrapper.plan(indptr(qo_lens), indptr(kv_lens), heads, heads, head_dim,
                     custom_mask=torch.from_numpy(flat).to(DEVICE), q_data_type=dtype)
        rows = sum(qo_lens)
        return rows, reference_attention(
            q[:rows].double().cpu().numpy(), step_k.double().cpu().numpy(),
            step_v.double().cpu().numpy(), indptr(qo_lens).numpy(), indptr(kv_lens).numpy(),
            custom_mask=masks)[0]

    replay_graph_steps(wrapper, (q, k, v), out, len(steps), prepare, dtype)


def plan_small(wrapper, **kwargs):
    one = torch.tensor([0, 2], dtype=torch.int32)
    kwargs = dict(dict(q_data_type=torch.float16), **kwargs)
    head_dim = kwargs.pop("head_dim", 64)
    wrapper.plan(one, one, torch.zeros(2, dtype=torch.int32, device=DEVICE),
                 torch.tensor([2], dtype=torch.int32), 4, 4, head_dim, 16, **kwargs)


UNSUPPORTED_ON_GPU = [
    ("q_data_type", dict(q_data_type=torch.float32)),
    ("kv_data_type", dict(kv_data_type=torch.float8_e4m3fn)),
    ("use_fp16_qk_reduction", dict(use_fp16_qk_reduction=True)),
    ("head_dim", dict(head_dim=96)),
]


@pytest.mark.parametrize("name,kwargs", UNSUPPORTED_ON_GPU, ids=[n for n, _ in UNSUPPORTED_ON_GPU])
def test_what_the_gpu_prefill_does_not_run_is_not_implemented(name, kwargs):
    with pytest.raises(NotImplementedError, match=name):
        plan_small(flare.BatchPrefillWithPagedKVCacheWrapper(workspace()), **kwargs)


def test_fused_rope_prefill_matches_float64():
    """pos_encoding_mode="ROPE_LLAMA": q token i of a request at kv_len - q_len + i and key j
    at j rotate before q.k (paged append with GQA 4; single prefill with rope_scale/theta)."""
    dtype, num_qo_heads, num_kv_heads, head_dim = torch.bfloat16, 8, 2, 128
    qo_lens, kv_lens = [7, 1, 90], [130, 60, 90]
    cache = GpuPagedCache(kv_lens, num_kv_heads, head_dim, 16, "NHD", dtype, seed=21)
    q = random_q(sum(qo_lens), num_qo_heads, head_dim, dtype, seed=22)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
    wrapper.plan(indptr(qo_lens), cache.indptr, cache.indices, cache.last_page_len,
                 num_qo_heads, num_kv_heads, head_dim, 16, causal=True,
                 pos_encoding_mode="ROPE_LLAMA", q_data_type=dtype)
    out, lse = wrapper.run(q, cache.cache, return_lse=True)
    check(out, lse, paged_reference(cache, q, qo_lens, causal=True, rope_theta=1e4), dtype,
          lse_tolerance=ROTARY_LSE_TOLERANCE)

    q = random_q(77, 16, 64, torch.float16, seed=23)
    k, v = ragged_kv([300], 4, 64, 64, torch.float16, seed=24)
    out, lse = flare.single_prefill_with_kv_cache(q, k, v, causal=True,
                                                  pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0,
                                                  rope_theta=5e5, return_lse=True)
    expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                   v.double().cpu().numpy(), [0, 77], [0, 300], causal=True,
                                   rope_theta=5e5, rope_scale=2.0)
    check(out, lse, expected, torch.float16, lse_tolerance=ROTARY_LSE_TOLERANCE)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_ragged_rope_staging_matches_float64(kv_layout):
    """rope_staging (flare's): "staged" rotates q and k into copies before the kernels, "fused"
    in them, "auto" stages a batch whose query tiles read each key several times and not an
    append of one query tile a request; every placement against the float64 reference, k and v
    NHD or HND (strided rows for the rotation)."""
    dtype, num_qo_heads, num_kv_heads, head_dim = torch.bfloat16, 8, 2, 128
    for qo_lens, kv_lens, auto_stages in (([300, 1, 77, 0], [300, 40, 77, 9], True),
                                          ([5, 9], [900, 600], False)):
        q = random_q(sum(qo_lens), num_qo_heads, head_dim, dtype, seed=31)
        k, v = ragged_kv(kv_lens, num_kv_heads, head_dim, head_dim, dtype, seed=32)
        if kv_layout == "HND":
            k_in, v_in = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
        else:
            k_in, v_in = k, v
        expected = reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                       v.double().cpu().numpy(), indptr(qo_lens).numpy(),
                                       indptr(kv_lens).numpy(), causal=True, rope_theta=5e5)
        for staging, stages in (("auto", auto_stages), ("fused", False), ("staged", True)):
            wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(), kv_layout)
            wrapper.plan(indptr(qo_lens), indptr(kv_lens), num_qo_heads, num_kv_heads, head_dim,
                         causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5,
                         q_data_type=dtype, rope_staging=staging)
            assert wrapper._gpu.planned[0].last_plan_stages_rope == stages, staging
            out, lse = wrapper.run(q, k_in, v_in, return_lse=True)
            check(out, lse, expected, dtype, lse_tolerance=ROTARY_LSE_TOLERANCE)


def test_rope_staging_staged_is_refused_where_it_cannot_stage():
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    with pytest.raises(ValueError, match="rope_staging kStaged needs pos_encoding kRopeLlama"):
        wrapper.plan(indptr([4]), indptr([4]), 2, 2, 64, causal=True, q_data_type=torch.float16,
                     rope_staging="staged")


def test_ragged_rope_staged_under_cuda_graph_replays_later_plans():
    """rope_staging="staged" under use_cuda_graph: the first plan() fixes the k copy's room
    (the next power of two of its kv_indptr[-1]); a captured run() serves a later, smaller
    plan (the rotation reads its token counts on the device), and a plan past the room is
    refused before anything runs."""
    dtype, num_qo_heads, num_kv_heads, head_dim, batch = torch.bfloat16, 8, 2, 128, 3
    steps = [([70, 33, 129], [70, 200, 129]), ([5, 1, 40], [90, 17, 40])]
    max_rows, max_kv = sum(steps[0][0]), sum(steps[0][1])
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(
        workspace(), use_cuda_graph=True,
        qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
        kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE))
    q = torch.empty(max_rows, num_qo_heads, head_dim, dtype=dtype, device=DEVICE)
    k = torch.empty(max_kv, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    v = torch.empty_like(k)
    out = torch.empty_like(q)

    def plan(qo_lens, kv_lens):
        wrapper.plan(indptr(qo_lens), indptr(kv_lens), num_qo_heads, num_kv_heads, head_dim,
                     causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5,
                     q_data_type=dtype, rope_staging="staged")

    def prepare(step):
        qo_lens, kv_lens = steps[step]
        step_k, step_v = ragged_kv(kv_lens, num_kv_heads, head_dim, head_dim, dtype,
                                   seed=340 + step)
        k[:step_k.shape[0]].copy_(step_k)
        v[:step_v.shape[0]].copy_(step_v)
        q.copy_(random_q(max_rows, num_qo_heads, head_dim, dtype, seed=350 + step))
        plan(qo_lens, kv_lens)
        assert wrapper._gpu.planned[0].last_plan_stages_rope
        rows = sum(qo_lens)
        return rows, reference_attention(
            q[:rows].double().cpu().numpy(), step_k.double().cpu().numpy(),
            step_v.double().cpu().numpy(), indptr(qo_lens).numpy(), indptr(kv_lens).numpy(),
            causal=True, rope_theta=5e5)[0]

    replay_graph_steps(wrapper, (q, k, v), out, len(steps), prepare, dtype)
    room = 1 << (max_kv - 1).bit_length()
    with pytest.raises(ValueError, match=f"exceeds the {room} tokens of rotated k"):
        plan([1, 1, 1], [room, 1, 1])


def test_capturing_a_wrapper_without_cuda_graph_raises():
    cache = GpuPagedCache([9, 4], 1, 64, 16, "NHD", torch.float16, seed=16)
    q = random_q(5, 4, 64, torch.float16, seed=17)
    out = torch.empty_like(q)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace())
    wrapper.plan(indptr([2, 3]), cache.indptr, cache.indices, cache.last_page_len, 4, 1, 64, 16,
                 causal=True, q_data_type=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(ValueError, match="use_cuda_graph"):
            wrapper.run(q, cache.cache, out=out)


def test_cuda_graph_wrapper_errors():
    with pytest.raises(ValueError, match="paged_kv_indices_buf"):
        buffers = graph_buffers(2, 64)
        del buffers["paged_kv_indices_buf"]
        flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), use_cuda_graph=True, **buffers)
    with pytest.raises(ValueError, match="for use_cuda_graph=True"):
        flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), **graph_buffers(2, 64))
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(), use_cuda_graph=True,
                                                        **graph_buffers(2, 64))
    cache = GpuPagedCache([30, 40], 1, 64, 16, "NHD", torch.float16, seed=18)

    def plan(qo_lens, lens_cache=cache, **kwargs):
        wrapper.plan(indptr(qo_lens), lens_cache.indptr, lens_cache.indices,
                     lens_cache.last_page_len, 4, 1, 64, 16, q_data_type=torch.float16,
                     **kwargs)

    plan([10, 20])
    plan([3, 20])  # fewer tokens, same configuration: fine
    with pytest.raises(ValueError, match="exceed"):
        plan([11, 20])
    with pytest.raises(ValueError, match="first plan"):
        plan([10, 20], logits_soft_cap=5.0)
    with pytest.raises(ValueError, match="fixed at 2"):
        plan([1, 1, 1], GpuPagedCache([3, 4, 5], 1, 64, 16, "NHD", torch.float16, seed=19))


def test_run_errors():
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    q = random_q(5, 4, 64, torch.float16, seed=20)
    with pytest.raises(RuntimeError, match="plan"):
        wrapper.run(q, q, q)
    wrapper.plan(indptr([5]), indptr([5]), 4, 4, 64, q_data_type=torch.float16)
    with pytest.raises(ValueError, match=r"q must have shape \[5, 4, 64\]"):
        wrapper.run(q[:4], q, q)
    with pytest.raises(ValueError, match="q must be float16, got bfloat16"):
        wrapper.run(q.bfloat16(), q, q)
    with pytest.raises(ValueError, match="custom_mask must have 25 entries"):
        wrapper.plan(indptr([5]), indptr([5]), 4, 4, 64, q_data_type=torch.float16,
                     custom_mask=torch.ones(24, dtype=torch.bool, device=DEVICE))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (cuda:1)")
def test_prefill_on_the_second_device():
    device = torch.device("cuda:1")
    dtype = torch.bfloat16
    cache = GpuPagedCache([12, 70], 2, 128, 16, "NHD", dtype, seed=21, device=device)
    q = torch.randn(20, 8, 128, device=device).to(dtype)
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace(device))
    wrapper.plan(indptr([8, 12]), cache.indptr, cache.indices.to(device), cache.last_page_len,
                 8, 2, 128, 16, causal=True, q_data_type=dtype)
    out, lse = wrapper.run(q, cache.cache, return_lse=True)
    assert out.device == device and torch.cuda.current_device() == 0
    check(out, lse, paged_reference(cache, q, [8, 12], causal=True), dtype)
