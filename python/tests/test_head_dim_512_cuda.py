"""Head dim 512 on PyTorch CUDA tensors against float64 attention. Decode (the CUDA-core loop,
two 8-dim chunks a lane, items of at most 4 rows): batch decode with head groups of 1, 4 and 8,
pages of 1 and 16, RoPE, a sliding window and soft-cap; single decode; use_tensor_cores runs
the CUDA-core loop. Prefill (two passes over halves of the output, the FA2 family): ragged and
paged, causal and windowed; backend="fa3" refused by name. Skipped visibly without PyTorch or a
CUDA device."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from attention_reference import reference_attention  # noqa: E402
from gpu_paged_cache import GpuPagedCache  # noqa: E402

DEVICE = torch.device("cuda:0")
D = 512
TOLERANCE = 1e-2  # float16 output rounding over float32 sums
LSE_TOLERANCE = 2e-3


def expected(cache, q, **variant):
    k, v, kv_indptr = cache.ragged()
    o, lse = reference_attention(q.float().cpu().numpy(), k, v, np.arange(cache.batch + 1),
                                 kv_indptr, **variant)
    return torch.from_numpy(o), torch.from_numpy(lse)


@pytest.mark.parametrize("heads", [(4, 4), (16, 4), (32, 4)])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("variant", ["plain", "rope", "window_soft_cap"])
def test_batch_decode_head_dim_512(heads, page_size, variant):
    num_qo_heads, num_kv_heads = heads
    cache = GpuPagedCache([1, 54, 97, 1999], num_kv_heads, D, page_size, "NHD", torch.float16,
                          seed=page_size + num_qo_heads)
    q = torch.randn(cache.batch, num_qo_heads, D, device=DEVICE).to(torch.float16)
    kwargs, reference = {}, {}
    if variant == "rope":
        kwargs, reference = {"pos_encoding_mode": "ROPE_LLAMA"}, {"rope_theta": 1e4}
    elif variant == "window_soft_cap":
        kwargs = {"window_left": 33, "logits_soft_cap": 30.0}
        reference = {"window_left": 33, "logits_soft_cap": 30.0}
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device=DEVICE), "NHD")
    wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, num_qo_heads,
                 num_kv_heads, D, page_size, q_data_type=torch.float16, **kwargs)
    out = torch.full_like(q, float("nan"))
    _, lse = wrapper.run(q, cache.cache, out=out, return_lse=True)
    want_o, want_lse = expected(cache, q, **reference)
    assert (out.double().cpu() - want_o).abs().max().item() <= TOLERANCE
    assert (lse.double().cpu() - want_lse).abs().max().item() <= LSE_TOLERANCE


def test_single_decode_head_dim_512_window():
    k = torch.randn(1177, 4, D, device=DEVICE).to(torch.float16)
    v = torch.randn_like(k)
    q = torch.randn(8, D, device=DEVICE).to(torch.float16)
    out = flare.single_decode_with_kv_cache(q, k, v, window_left=37)
    want = flare.single_decode_with_kv_cache(q, k[-38:], v[-38:])
    assert torch.isfinite(out).all()
    assert (out - want).abs().max().item() <= 2e-3


def test_use_tensor_cores_at_head_dim_512_runs_the_cuda_core_loop():
    """FlashInfer's use_tensor_cores picks kernels, not results: at D 512 (no tensor-core loop)
    the plan runs on CUDA cores, bit for bit what use_tensor_cores=False gives."""
    cache = GpuPagedCache([1, 97, 530], 4, D, 16, "NHD", torch.float16, seed=5)
    q = torch.randn(cache.batch, 16, D, device=DEVICE).to(torch.float16)
    outputs = []
    for flag in (False, True):
        wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE), "NHD", use_tensor_cores=flag)
        wrapper.plan(cache.indptr, cache.indices.to(DEVICE), cache.last_page_len, 16, 4, D, 16,
                     q_data_type=torch.float16)
        outputs.append(wrapper.run(q, cache.cache))
    assert torch.equal(outputs[0], outputs[1])
    want, _ = expected(cache, q)
    assert (outputs[1].double().cpu() - want).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("kv_kind", ["ragged", "paged"])
@pytest.mark.parametrize("window_left", [-1, 37])
def test_prefill_head_dim_512(kv_kind, window_left):
    q_lens, kv_lens, heads = [1, 97, 300], [1, 1023, 300], (8, 2)
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(sum(q_lens), heads[0], D, generator=generator).to(torch.float16).to(DEVICE)
    k = torch.randn(sum(kv_lens), heads[1], D, generator=generator).to(torch.float16).to(DEVICE)
    v = torch.randn_like(k)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    if kv_kind == "ragged":
        wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(qo_indptr, kv_indptr, heads[0], heads[1], D, causal=True,
                     window_left=window_left, q_data_type=torch.float16)
        out = wrapper.run(q, k, v)
    else:  # pages of one token: the ragged rows in order
        cache = torch.stack([k, v], dim=1).unsqueeze(2)  # [tokens, 2, 1, H_kv, D]
        wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(qo_indptr, kv_indptr,
                     torch.arange(sum(kv_lens), dtype=torch.int32, device=DEVICE),
                     torch.ones(len(kv_lens), dtype=torch.int32), heads[0], heads[1], D, 1,
                     causal=True, window_left=window_left, q_data_type=torch.float16)
        out = wrapper.run(q, cache)
    want, _ = reference_attention(q.float().cpu().numpy(), k.float().cpu().numpy(),
                                  v.float().cpu().numpy(), qo_indptr.numpy(), kv_indptr.numpy(),
                                  causal=True, window_left=window_left)
    assert (out.double().cpu() - torch.from_numpy(want)).abs().max().item() <= TOLERANCE


def test_prefill_head_dim_512_on_fa3_is_refused_by_name():
    wrapper = flare.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(16 << 20, dtype=torch.uint8, device=DEVICE), "NHD", backend="fa3")
    indptr = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="head dim 512"):
        wrapper.plan(indptr, indptr, 4, 4, D, causal=True, q_data_type=torch.float16)
        wrapper.run(*(torch.zeros(4, 4, D, dtype=torch.float16, device=DEVICE),) * 3)
