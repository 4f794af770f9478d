"""Decode of several query tokens per request (q_len_per_req, speculative-decoding verification)
and decode on the Hopper family (backend="fa3") on PyTorch CUDA tensors, against float64
attention over the gathered pages: eager, and captured in a CUDA graph replayed after plans of
new lengths (down to kv_len == q_len_per_req). Skipped visibly without PyTorch or a CUDA
device."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from attention_reference import reference_attention  # noqa: E402
from gpu_paged_cache import GpuPagedCache  # noqa: E402

DEVICE = torch.device("cuda:0")
TOLERANCE = 1.5e-2  # bfloat16 output rounding over float32 sums


def workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE)


def expected(cache, q, q_len, kv_cache=None):
    """o float64 [batch * q_len, H_qo, D]: causal within each request (bottom-right)."""
    k, v, kv_indptr = cache.ragged(kv_cache)
    qo_indptr = np.arange(cache.batch + 1) * q_len
    o, _ = reference_attention(q.float().cpu().numpy(), k, v, qo_indptr, kv_indptr,
                               causal=q_len > 1)
    return torch.from_numpy(o)


def max_error(out, want):
    return (out.double().cpu() - want).abs().max().item()


@pytest.mark.parametrize("q_len", [2, 3, 4])
@pytest.mark.parametrize("heads", [(8, 2), (64, 8), (32, 4)])
def test_several_tokens_per_request_eagerly(q_len, heads):
    num_qo_heads, num_kv_heads = heads
    cache = GpuPagedCache([q_len, 17, 130, 64, 1000], num_kv_heads, 128, 16, "NHD",
                          torch.bfloat16, seed=q_len)
    q = torch.randn(cache.batch * q_len, num_qo_heads, 128, device=DEVICE).to(torch.bfloat16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True)
    wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, num_qo_heads,
                 num_kv_heads, 128, 16, q_data_type=torch.bfloat16, q_len_per_req=q_len)
    out = torch.full_like(q, float("nan"))
    wrapper.run(q, cache.cache, out=out)
    assert max_error(out, expected(cache, q, q_len)) <= TOLERANCE
    # A single-token plan's GPU run checks FlashInfer's deprecated run(q_len_per_req=) too.
    wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, num_qo_heads,
                 num_kv_heads, 128, 16, q_data_type=torch.bfloat16)
    with pytest.raises(ValueError, match=f"q_len_per_req={q_len} but plan\\(\\) used 1"):
        wrapper.run(q[::q_len].contiguous(), cache.cache, q_len_per_req=q_len)


def test_several_tokens_per_request_replay_in_a_cuda_graph_across_new_lengths():
    batch, q_len, num_qo_heads, num_kv_heads, page_size = 4, 3, 32, 8, 16
    steps = [[129] * batch, [33, 17, 65, 129], [q_len, 128, 64, 100]]
    pool = 64
    indptr_buf = torch.empty(batch + 1, dtype=torch.int32, device=DEVICE)
    indices_buf = torch.empty(pool, dtype=torch.int32, device=DEVICE)
    last_buf = torch.empty(batch, dtype=torch.int32, device=DEVICE)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=indptr_buf, paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf)
    kv = torch.empty(pool, 2, page_size, num_kv_heads, 128, dtype=torch.bfloat16, device=DEVICE)
    q = torch.randn(batch * q_len, num_qo_heads, 128, device=DEVICE).to(torch.bfloat16)
    out = torch.empty_like(q)

    def prepare(step):
        lens = steps[step]
        used = sum((n + page_size - 1) // page_size for n in lens)
        cache = GpuPagedCache(lens, num_kv_heads, 128, page_size, "NHD", torch.bfloat16,
                              seed=40 + step, extra_pages=pool - used)
        kv.copy_(cache.cache)
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, num_qo_heads,
                     num_kv_heads, 128, page_size, q_data_type=torch.bfloat16,
                     q_len_per_req=q_len)
        return cache

    cache = prepare(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q, kv, out=out)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, kv, out=out)
    for step in range(len(steps)):
        if step > 0:
            cache = prepare(step)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert max_error(out, expected(cache, q, q_len, kv)) <= TOLERANCE, f"step {step}"
    with pytest.raises(ValueError, match="frozen CUDA-graph shape: .* planned with 3, got 2"):
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, num_qo_heads,
                     num_kv_heads, 128, page_size, q_data_type=torch.bfloat16, q_len_per_req=2)


def test_fa3_decode_runs_on_the_hopper_family_with_one_token_per_request():
    if torch.cuda.get_device_capability(DEVICE) != (9, 0):
        pytest.skip("the Hopper family needs sm_90")
    cache = GpuPagedCache([1, 33, 700, 4096], 4, 128, 16, "NHD", torch.bfloat16, seed=7)
    q = torch.randn(cache.batch, 32, 128, device=DEVICE).to(torch.bfloat16)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True,
                                                       backend="fa3")
    plan = dict(q_data_type=torch.bfloat16)
    wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 32, 4, 128, 16,
                 **plan)
    out = torch.full_like(q, float("nan"))
    wrapper.run(q, cache.cache, out=out)
    assert max_error(out, expected(cache, q, 1)) <= TOLERANCE
    with pytest.raises(NotImplementedError, match="fa2 tensor-core path"):
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 32, 4, 128, 16,
                     q_len_per_req=2, **plan)
    with pytest.raises(NotImplementedError, match="backend='fa3'"):
        flare.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", backend="fa3")
