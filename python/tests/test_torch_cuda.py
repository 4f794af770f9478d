"""The wrappers on PyTorch CUDA tensors: batch decode against scaled_dot_product_attention in
float64, a CUDA-graph capture of a decode step replayed across changing lengths, merge and
append on the GPU (prefill: test_prefill_cuda.py). Skipped visibly without PyTorch or without a
CUDA device."""

import gc
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import flare  # noqa: E402
from attention_reference import reference_merge  # noqa: E402
from gpu_paged_cache import GpuPagedCache  # noqa: E402

DEVICE = torch.device("cuda:0")
# Output rounding of the dtype plus float32 accumulation; lse is float32 throughout.
O_TOLERANCE = {torch.bfloat16: 1.5e-2, torch.float16: 2e-3}
LOG2E = 1.0 / math.log(2.0)
LSE_TOLERANCE = 2e-3


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test draws the same q, k, v on every run: a failure reproduces."""
    torch.manual_seed(1234)


def workspace(device=DEVICE):
    return torch.empty(128 << 20, dtype=torch.uint8, device=device)  # FlashInfer's size


def sdpa_decode(cache, q, sm_scale=None, k_scale=1.0, v_scale=1.0):
    """(o, lse) float64 from torch's SDPA (math backend in float64), one request at a time."""
    batch, num_qo_heads, head_dim = q.shape
    scale = 1 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    out = torch.zeros(batch, num_qo_heads, head_dim, dtype=torch.float64, device=q.device)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(batch):
        if cache.kv_lens[b] == 0:
            continue
        k, v = cache.tokens(b)
        k, v = k * k_scale, v * v_scale
        group = num_qo_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)[None]  # [1, H, L, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)[None]
        qb = q[b].double()[None, :, None, :]  # [1, H, 1, D]
        out[b] = F.scaled_dot_product_attention(qb, k, v, scale=scale)[0, :, 0]
        lse[b] = torch.logsumexp((qb @ k.transpose(-1, -2))[0, :, 0] * scale, dim=-1)
    return out, lse * LOG2E  # FlashInfer's base-2 LSE


def max_error(actual, expected):
    actual, expected = actual.double(), expected.double()
    same_inf = torch.isinf(expected) & (actual == expected)
    diff = torch.where(same_inf, torch.zeros_like(actual), (actual - expected).abs())
    return float(diff.max()) if diff.numel() else 0.0


def plan_decode(wrapper, cache, num_qo_heads, head_dim, q_dtype, **kwargs):
    # Host index arrays for the lengths (plan never syncs); indices on the device.
    wrapper.plan(cache.indptr, cache.indices.to(cache.device), cache.last_page_len,
                 num_qo_heads, cache.cache.shape[3 if cache.layout == "NHD" else 2], head_dim,
                 cache.page_size, q_data_type=q_dtype, **kwargs)


CASES = [
    # dtype, layout, page_size, (H_qo, H_kv), head_dim
    (torch.bfloat16, "NHD", 16, (32, 8), 128),
    (torch.float16, "HND", 16, (8, 8), 128),
    (torch.bfloat16, "NHD", 1, (28, 4), 64),
    (torch.float16, "NHD", 3, (8, 1), 256),
    (torch.bfloat16, "HND", 3, (4, 4), 64),
]


@pytest.mark.parametrize("use_tensor_cores", [False, True])
@pytest.mark.parametrize("dtype,layout,page_size,heads,head_dim", CASES)
def test_decode_matches_sdpa_float64(dtype, layout, page_size, heads, head_dim,
                                     use_tensor_cores):
    num_qo_heads, num_kv_heads = heads
    cache = GpuPagedCache([0, 1, 7, 97, 511, 1500], num_kv_heads, head_dim, page_size, layout,
                          dtype, seed=1)
    q = torch.randn(cache.batch, num_qo_heads, head_dim, device=DEVICE).to(dtype)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout,
                                                       use_tensor_cores=use_tensor_cores)
    plan_decode(wrapper, cache, num_qo_heads, head_dim, dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((cache.batch, num_qo_heads), float("nan"), device=DEVICE)
    wrapper.run(q, cache.cache, out=out, lse=lse)
    expected_o, expected_lse = sdpa_decode(cache, q)
    assert max_error(out, expected_o) <= O_TOLERANCE[dtype]
    assert max_error(lse, expected_lse) <= LSE_TOLERANCE
    assert torch.all(out[0] == 0) and torch.all(lse[0] == -math.inf)


def test_back_to_back_plans_alternating_configurations():
    """Plans and runs queued without a synchronization, one wrapper alternating sm_scale and
    batch sizes: each plan() writes the staging buffer the copy two plans ago read (two in
    turn) and reuses the configuration it checked before; every output matches its own plan."""
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), use_tensor_cores=True)
    steps = [([33, 200, 5], None), ([1, 700], 0.05), ([33, 200, 5], None), ([9] * 40, 0.05),
             ([1, 700], 0.05), ([33, 200, 5], 0.1)]
    results = []
    for seed, (kv_lens, sm_scale) in enumerate(steps):
        cache = GpuPagedCache(kv_lens, 2, 128, 16, "NHD", torch.bfloat16, seed=10 + seed)
        q = torch.randn(cache.batch, 16, 128, device=DEVICE).to(torch.bfloat16)
        plan_decode(wrapper, cache, 16, 128, torch.bfloat16, sm_scale=sm_scale)
        out, lse = wrapper.run(q, cache.cache, return_lse=True)
        results.append((cache, q, sm_scale, out, lse))
    torch.cuda.synchronize()
    for cache, q, sm_scale, out, lse in results:
        expected_o, expected_lse = sdpa_decode(cache, q, sm_scale=sm_scale)
        assert max_error(out, expected_o) <= O_TOLERANCE[torch.bfloat16]
        assert max_error(lse, expected_lse) <= LSE_TOLERANCE


def test_decode_on_a_side_stream_and_tuple_cache():
    cache = GpuPagedCache([33, 200, 5], 2, 128, 16, "NHD", torch.bfloat16, seed=2)
    q = torch.randn(3, 16, 128, device=DEVICE).to(torch.bfloat16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        plan_decode(wrapper, cache, 16, 128, torch.bfloat16, logits_soft_cap=30.0)
        out = wrapper.run(q, (cache.cache[:, 0], cache.cache[:, 1]))
    torch.cuda.current_stream().wait_stream(stream)
    capped = flare.BatchDecodeWithPagedKVCacheWrapper(np.empty(8, np.uint8))  # CPU oracle
    capped.plan(cache.indptr, cache.indices, cache.last_page_len, 16, 2, 128, 16,
                q_data_type=torch.bfloat16, logits_soft_cap=30.0)
    expected = capped.run(q.cpu(), cache.cache.cpu())
    # Both sides are rounded to bfloat16, so two results on either side of a rounding boundary
    # differ by one bfloat16 step of the output's magnitude (2^-7 relative at most) on top of
    # the accumulation error that O_TOLERANCE bounds against a float64 reference.
    one_step = 2.0**-7 * float(expected.double().abs().max())
    assert max_error(out.cpu(), expected) <= O_TOLERANCE[torch.bfloat16] + one_step


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_fused_rope_decode_matches_the_cpu_backend(use_tensor_cores):
    """pos_encoding_mode="ROPE_LLAMA": q at kv_len - 1 and key j at j rotate before q.k; the
    CPU backend (float64 RoPE) is the oracle."""
    cache = GpuPagedCache([1, 33, 700, 2500], 2, 128, 16, "NHD", torch.bfloat16, seed=5)
    q = torch.randn(cache.batch, 8, 128, device=DEVICE).to(torch.bfloat16)
    rope = dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5, rope_scale=2.0)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                       use_tensor_cores=use_tensor_cores)
    plan_decode(wrapper, cache, 8, 128, torch.bfloat16, **rope)
    out, lse = wrapper.run(q, cache.cache, return_lse=True)
    oracle = flare.BatchDecodeWithPagedKVCacheWrapper(np.empty(8, np.uint8))
    oracle.plan(cache.indptr, cache.indices, cache.last_page_len, 8, 2, 128, 16,
                q_data_type=torch.bfloat16, **rope)
    expected_o, expected_lse = oracle.run(q.cpu(), cache.cache.cpu(), return_lse=True)
    assert max_error(out.cpu(), expected_o) <= O_TOLERANCE[torch.bfloat16]
    # Rotated q and K are rounded to bf16 (test_prefill_cuda.py ROTARY_LSE_TOLERANCE).
    assert max_error(lse.cpu(), expected_lse) <= 1.2e-2


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_decode_fp8_cache_with_scales(use_tensor_cores):
    cache = GpuPagedCache([40, 300], 2, 128, 16, "NHD", torch.float32, seed=3)
    fp8 = cache.cache.nan_to_num().to(torch.float8_e4m3fn)
    q = torch.randn(2, 8, 128, device=DEVICE).to(torch.bfloat16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(),
                                                       use_tensor_cores=use_tensor_cores)
    wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 8, 2, 128, 16,
                 q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    out = wrapper.run(q, fp8, k_scale=0.5, v_scale=2.0)
    cache.cache = fp8.float()
    expected, _ = sdpa_decode(cache, q, k_scale=0.5, v_scale=2.0)
    # fp8 values and bf16 output rounding over 128-dim products.
    assert max_error(out, expected) <= 4e-2


@pytest.mark.parametrize("flashinfer_class", [False, True])
def test_cuda_graph_replay_across_changing_lengths(flashinfer_class):
    """Capture one decode step, then plan() new lengths and page tables and replay; through
    use_cuda_graph=True, and through FlashInfer's CUDAGraphBatchDecodeWithPagedKVCacheWrapper."""
    batch, num_qo_heads, num_kv_heads, head_dim, page_size = 4, 16, 4, 128, 16
    max_pages = 256
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE)
    indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=DEVICE)
    last_buf = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    if flashinfer_class:
        wrapper = flare.decode.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            workspace(), indptr_buf, indices_buf, last_buf, "NHD")
    else:
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
            workspace(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
            paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    assert wrapper.is_cuda_graph_enabled
    steps = [[5, 17, 1, 33], [300, 2, 0, 1000], [1, 1, 1, 1], [2000, 700, 64, 3]]
    # One cache tensor for every step (its address is captured); each step's tokens are fresh.
    pool = sum((n + page_size - 1) // page_size for n in steps[3]) + 8
    kv = torch.empty(pool, 2, page_size, num_kv_heads, head_dim, dtype=torch.bfloat16,
                     device=DEVICE)
    q = torch.empty(batch, num_qo_heads, head_dim, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty_like(q)
    lse = torch.empty(batch, num_qo_heads, device=DEVICE)

    def prepare(step, lens):
        cache = GpuPagedCache(lens, num_kv_heads, head_dim, page_size, "NHD", torch.bfloat16,
                              seed=100 + step, extra_pages=pool - sum(
                                  (n + page_size - 1) // page_size for n in lens))
        kv.copy_(cache.cache)
        cache.cache = kv
        q.copy_(torch.randn(batch, num_qo_heads, head_dim, device=DEVICE))
        plan_decode(wrapper, cache, num_qo_heads, head_dim, torch.bfloat16)
        return cache

    cache = prepare(0, steps[0])
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q, kv, out=out, lse=lse)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        wrapper.run(q, kv, out=out, lse=lse)
    for step, lens in enumerate(steps):
        if step > 0:
            cache = prepare(step, lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected_o, expected_lse = sdpa_decode(cache, q)
        assert max_error(out, expected_o) <= O_TOLERANCE[torch.bfloat16], f"step {step}"
        assert max_error(lse, expected_lse) <= LSE_TOLERANCE, f"step {step}"


def test_wrappers_collected_inside_a_capture_leave_it_valid():
    """Wrappers freed while torch.cuda.graph captures (its global mode): Python's collector may
    free a wrapper in a reference cycle at any allocation, inside a capture block too. flare
    frees its device memory in the relaxed capture mode, so the capture stays valid (in the
    global mode the driver counted that cuMemFree as unsafe and invalidated the capture:
    experiments/bench_t5_decode.py's graphs, forty-sixth session)."""
    cache = GpuPagedCache([9, 40, 300], 2, 64, 16, "NHD", torch.bfloat16, seed=6)
    q = torch.randn(3, 8, 64, device=DEVICE).to(torch.bfloat16)
    doomed = []
    for use_tensor_cores in (False, True):
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD",
                                                           use_tensor_cores=use_tensor_cores)
        plan_decode(wrapper, cache, 8, 64, torch.bfloat16)
        wrapper.run(q, cache.cache)
        wrapper.cycle = wrapper  # only the collector frees it
        doomed.append(wrapper)
    prefill = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD")
    indptr = torch.tensor([0, 5, 12], dtype=torch.int32)
    prefill.plan(indptr, indptr, 8, 2, 64, causal=True, q_data_type=torch.bfloat16)
    qkv = torch.randn(12, 8, 64, device=DEVICE).to(torch.bfloat16)
    prefill.run(qkv, qkv[:, :2].contiguous(), qkv[:, :2].contiguous())
    prefill.cycle = prefill
    doomed.append(prefill)
    bufs = [torch.zeros(n, dtype=torch.int32, device=DEVICE) for n in (4, 64, 3)]
    captured = flare.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
    plan_decode(captured, cache, 8, 64, torch.bfloat16)
    out = captured.run(q, cache.cache)
    expected = out.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        del doomed[:], wrapper, prefill
        assert gc.collect() > 0
        captured.run(q, cache.cache, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def test_capturing_a_wrapper_without_cuda_graph_raises():
    cache = GpuPagedCache([9, 4], 1, 64, 16, "NHD", torch.float16, seed=4)
    q = torch.randn(2, 4, 64, device=DEVICE).to(torch.float16)
    out = torch.empty_like(q)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace())
    plan_decode(wrapper, cache, 4, 64, torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with pytest.raises(ValueError, match="use_cuda_graph"):
            wrapper.run(q, cache.cache, out=out)


def test_cuda_graph_wrapper_rejects_a_different_batch():
    bufs = [torch.zeros(n, dtype=torch.int32, device=DEVICE) for n in (3, 64, 2)]
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
    cache = GpuPagedCache([3, 4, 5], 1, 64, 16, "NHD", torch.float16, seed=5)
    with pytest.raises(ValueError, match="fixed at 2"):
        plan_decode(wrapper, cache, 4, 64, torch.float16)


def test_cuda_graph_wrapper_keeps_its_first_configuration():
    bufs = [torch.zeros(n, dtype=torch.int32, device=DEVICE) for n in (3, 64, 2)]
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
        paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
    cache = GpuPagedCache([3, 40], 1, 64, 16, "NHD", torch.float16, seed=10)
    plan_decode(wrapper, cache, 4, 64, torch.float16)
    plan_decode(wrapper, cache, 4, 64, torch.float16)  # same configuration: fine
    with pytest.raises(ValueError, match="first plan"):
        plan_decode(wrapper, cache, 4, 64, torch.float16, logits_soft_cap=5.0)


def test_single_decode_matches_sdpa():
    q = torch.randn(32, 128, device=DEVICE).to(torch.float16)
    k = torch.randn(777, 8, 128, device=DEVICE).to(torch.float16)
    v = torch.randn(777, 8, 128, device=DEVICE).to(torch.float16)
    out, lse = flare.single_decode_with_kv_cache(q, k, v, return_lse=True)
    kk = k.double().repeat_interleave(4, dim=1).transpose(0, 1)[None]
    vv = v.double().repeat_interleave(4, dim=1).transpose(0, 1)[None]
    expected = F.scaled_dot_product_attention(q.double()[None, :, None], kk, vv)[0, :, 0]
    assert max_error(out, expected) <= O_TOLERANCE[torch.float16]
    hnd = flare.single_decode_with_kv_cache(q, k.transpose(0, 1).contiguous(),
                                            v.transpose(0, 1).contiguous(), kv_layout="HND")
    assert max_error(hnd, expected) <= O_TOLERANCE[torch.float16]
    assert lse.shape == (32,)
    tensor_cores = flare.single_decode_with_kv_cache(q, k, v, use_tensor_cores=True)
    assert max_error(tensor_cores, expected) <= O_TOLERANCE[torch.float16]


def test_merge_ops_on_cuda():
    rng = np.random.default_rng(6)
    v = rng.standard_normal((9, 3, 4, 64)).astype(np.float32)
    s = (rng.standard_normal((9, 3, 4)) * 2).astype(np.float32)
    s[2, :, 1] = -np.inf
    expected_v, expected_s = reference_merge(v, s)
    v_gpu, s_gpu = torch.from_numpy(v).to(DEVICE), torch.from_numpy(s).to(DEVICE)
    merged_v, merged_s = flare.merge_states(v_gpu, s_gpu)
    assert max_error(merged_v.cpu(), torch.from_numpy(expected_v)) <= 1e-5
    assert max_error(merged_s.cpu(), torch.from_numpy(expected_s)) <= 1e-5
    pair_v, pair_s = reference_merge(v[:, :2], s[:, :2])
    merged_v, merged_s = flare.merge_state(v_gpu[:, 0].half(), s_gpu[:, 0],
                                           v_gpu[:, 1].half(), s_gpu[:, 1])
    assert merged_v.dtype == torch.float16
    assert max_error(merged_v.cpu(), torch.from_numpy(pair_v)) <= 5e-3
    target_v, target_s = v_gpu[:, 0].clone(), s_gpu[:, 0].clone()
    mask = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1, 1], dtype=torch.bool, device=DEVICE)
    flare.merge_state_in_place(target_v, target_s, v_gpu[:, 1], s_gpu[:, 1], mask=mask)
    keep = mask.cpu().numpy()
    assert max_error(target_v.cpu()[keep], torch.from_numpy(pair_v[keep])) <= 1e-5
    assert max_error(target_s.cpu()[keep], torch.from_numpy(pair_s[keep])) <= 1e-5
    assert torch.equal(target_v[~mask], v_gpu[~mask, 0])


@pytest.mark.parametrize("layout,page_size,dtype,head_dim", [
    ("NHD", 16, torch.bfloat16, 128),  # 16-byte vectors
    ("HND", 3, torch.float16, 4),      # 8-byte rows: narrower vectors
    ("NHD", 1, torch.float8_e4m3fn, 64),
])
def test_append_on_cuda_matches_cpu(layout, page_size, dtype, head_dim):
    old_lens, append_lens = [0, 5, 17, 2], [3, 0, 20, 1]
    lens = [a + b for a, b in zip(old_lens, append_lens)]
    cache = GpuPagedCache(lens, 2, head_dim, page_size, layout, torch.float32, seed=7)
    pool = cache.cache.nan_to_num().to(dtype)
    append_indptr = torch.tensor([0] + list(np.cumsum(append_lens)), dtype=torch.int32)
    nnz = int(append_indptr[-1]) + 3
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    # K and V sliced from a fused [nnz, 3, H, D] projection: strided token rows.
    qkv = torch.randn(nnz, 3, 2, head_dim, device=DEVICE).to(dtype)
    key, value = qkv[:, 1], qkv[:, 2]
    batch_indices, positions = flare.get_batch_indices_positions(
        append_indptr.to(DEVICE), seq_lens.to(DEVICE), nnz)
    gpu = pool.clone()
    flare.append_paged_kv_cache(key, value, batch_indices, positions, gpu,
                                cache.indices.to(DEVICE), cache.indptr.to(DEVICE),
                                cache.last_page_len.to(DEVICE), kv_layout=layout)
    cpu = pool.cpu()
    flare.append_paged_kv_cache(key.cpu(), value.cpu(), batch_indices.cpu(), positions.cpu(),
                                cpu, cache.indices, cache.indptr, cache.last_page_len,
                                kv_layout=layout)
    assert not torch.equal(cpu.view(torch.uint8), pool.cpu().view(torch.uint8))
    assert torch.equal(gpu.cpu().view(torch.uint8), cpu.view(torch.uint8))


def test_append_on_cuda_skips_out_of_range_tokens():
    cache = GpuPagedCache([4, 2], 1, 64, 3, "NHD", torch.float16, seed=8)
    pool = cache.cache.nan_to_num()
    before = pool.clone()
    key = torch.ones(4, 1, 64, dtype=torch.float16, device=DEVICE)
    batch_indices = torch.tensor([0, 1, 5, 1], dtype=torch.int32, device=DEVICE)
    positions = torch.tensor([3, 3, 0, -1], dtype=torch.int32, device=DEVICE)
    flare.append_paged_kv_cache(key, key, batch_indices, positions, pool,
                                cache.indices.to(DEVICE), cache.indptr.to(DEVICE),
                                cache.last_page_len.to(DEVICE))
    changed = (pool != before).reshape(pool.shape[0], 2, 3, -1).any(dim=-1)
    page = int(cache.indices[1])  # request 0, position 3 -> its second page, slot 0
    assert changed.sum() == 2 and changed[page, 0, 0] and changed[page, 1, 0]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (cuda:1)")
def test_decode_on_the_second_device():
    device = torch.device("cuda:1")
    cache = GpuPagedCache([12, 70], 2, 128, 16, "NHD", torch.bfloat16, seed=9, device=device)
    q = torch.randn(2, 8, 128, device=device).to(torch.bfloat16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(device))
    wrapper.plan(cache.indptr, cache.indices.to(device), cache.last_page_len, 8, 2, 128, 16,
                 q_data_type=torch.bfloat16)
    out = wrapper.run(q, cache.cache)
    assert out.device == device and torch.cuda.current_device() == 0
    expected, _ = sdpa_decode(cache, q)
    assert max_error(out, expected) <= O_TOLERANCE[torch.bfloat16]
