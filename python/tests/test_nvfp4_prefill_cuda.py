"""Prefill over NVFP4 KV through FlashInfer's interface on PyTorch CUDA tensors: a paged cache
filled by nvfp4_quantize_append_paged_kv_cache, plan(kv_data_type=torch.uint8) and
run(kv_cache_sf=...) with global k_scale / v_scale on the paged and ragged wrappers and
single_prefill_with_kv_cache, a paged wrapper under use_cuda_graph replayed after a plan of
more pages, against float64 attention over the dequantized values
(fp4_quantization.e2m1_and_ufp8sf_scale_to_float); missing scales and the CPU backend refused
by name. Skipped visibly without PyTorch or a CUDA device."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from attention_reference import reference_attention  # noqa: E402
from nvfp4_cache import K_SCALE, V_SCALE, dequantize, nvfp4_cache  # noqa: E402

DEVICE = torch.device("cuda:0")


@pytest.fixture(autouse=True)
def seeded_torch():
    torch.manual_seed(7)


def ragged_dequantized(codes, scales, indptr, indices, kv_lens, num_kv_heads, head_dim):
    k_dq = dequantize(codes[:, 0], scales[:, 0], K_SCALE).cpu().numpy()
    v_dq = dequantize(codes[:, 1], scales[:, 1], V_SCALE).cpu().numpy()
    ks, vs = [], []
    for b, n in enumerate(kv_lens):
        rows = indices[int(indptr[b]):int(indptr[b + 1])].numpy()
        ks.append(k_dq[rows].reshape(-1, num_kv_heads, head_dim)[:n])
        vs.append(v_dq[rows].reshape(-1, num_kv_heads, head_dim)[:n])
    return np.concatenate(ks), np.concatenate(vs)


def expect_close(out, lse, want, want_lse, dtype):
    tolerance = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert torch.isfinite(out).all()
    assert (out.double().cpu() - torch.from_numpy(want)).abs().max() <= tolerance * 3
    assert (lse.double().cpu() - torch.from_numpy(want_lse)).abs().max() <= 2e-3


@pytest.mark.parametrize("head_dim", [64, 128, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_and_ragged_prefill_over_an_appended_nvfp4_cache(head_dim, dtype, causal):
    num_qo_heads, num_kv_heads, page_size = 8, 2, 16
    kv_lens, q_lens = [17, 200, 64], [5, 33, 64]
    codes, scales, indptr, indices, last = nvfp4_cache(kv_lens, num_kv_heads, head_dim,
                                                       page_size)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    q = torch.randn(sum(q_lens), num_qo_heads, head_dim, dtype=dtype, device=DEVICE)
    k_rows, v_rows = ragged_dequantized(codes, scales, indptr, indices, kv_lens, num_kv_heads,
                                        head_dim)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)])
    want, want_lse = reference_attention(q.float().cpu().numpy(), k_rows, v_rows,
                                         qo_indptr.numpy(), kv_indptr, causal=causal)
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE)

    paged = flare.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    paged.plan(qo_indptr, indptr, indices.to(DEVICE), last, num_qo_heads, num_kv_heads,
               head_dim, page_size, causal=causal, kv_data_type=torch.uint8, q_data_type=dtype)
    out = torch.full((sum(q_lens), num_qo_heads, head_dim), float("nan"), dtype=dtype,
                     device=DEVICE)
    _, lse = paged.run(q, codes, out=out, return_lse=True, k_scale=K_SCALE, v_scale=V_SCALE,
                       kv_cache_sf=scales)
    paged.check()
    expect_close(out, lse, want, want_lse, dtype)
    with pytest.raises(ValueError, match="kv_cache_sf"):
        paged.run(q, codes, k_scale=K_SCALE, v_scale=V_SCALE)

    # The same rows as ragged NVFP4 K/V: codes and scales gathered from the pages.
    flat = [indices[int(indptr[b]):int(indptr[b + 1])] for b in range(len(kv_lens))]
    rows = [codes[f.long().to(DEVICE)].transpose(0, 1).reshape(2, -1, num_kv_heads,
                                                               head_dim // 2)[:, :n]
            for f, n in zip(flat, kv_lens)]
    srows = [scales[f.long().to(DEVICE)].transpose(0, 1).reshape(2, -1, num_kv_heads,
                                                                 head_dim // 16)[:, :n]
             for f, n in zip(flat, kv_lens)]
    k_codes, v_codes = torch.cat(rows, dim=1).contiguous()
    k_sf, v_sf = torch.cat(srows, dim=1).contiguous()
    ragged = flare.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    ragged.plan(qo_indptr, torch.from_numpy(kv_indptr.astype(np.int32)), num_qo_heads,
                num_kv_heads, head_dim, causal=causal, kv_data_type=torch.uint8,
                q_data_type=dtype)
    out2, lse2 = ragged.run(q, k_codes, v_codes, return_lse=True, k_scale=K_SCALE,
                            v_scale=V_SCALE, kv_cache_sf=(k_sf, v_sf))
    expect_close(out2, lse2, want, want_lse, dtype)

    # One request through single_prefill_with_kv_cache.
    b, lo = 1, int(kv_indptr[1])
    single = flare.single_prefill_with_kv_cache(
        q[qo_indptr[b]:qo_indptr[b + 1]], k_codes[lo:lo + kv_lens[b]],
        v_codes[lo:lo + kv_lens[b]], causal=causal, k_scale=K_SCALE, v_scale=V_SCALE,
        kv_cache_sf=(k_sf[lo:lo + kv_lens[b]], v_sf[lo:lo + kv_lens[b]]))
    assert (single.double().cpu() - torch.from_numpy(
        want[int(qo_indptr[b]):int(qo_indptr[b + 1])])).abs().max() <= (
            2e-2 if dtype == torch.bfloat16 else 4e-3) * 3


def test_captured_paged_prefill_replays_after_a_plan_of_more_pages():
    num_qo_heads, num_kv_heads, head_dim, page_size, batch = 4, 4, 128, 16, 2
    kv_lens, q_lens = [150, 90], [7, 20]
    codes, scales, indptr, indices, last = nvfp4_cache(kv_lens, num_kv_heads, head_dim,
                                                       page_size)
    total_pages = int(indptr[-1])
    buffers = dict(qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
                   paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
                   paged_kv_indices_buf=torch.zeros(total_pages, dtype=torch.int32,
                                                    device=DEVICE),
                   paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32,
                                                          device=DEVICE))
    wrapper = flare.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE), "NHD", use_cuda_graph=True,
        **buffers)
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    q = torch.randn(sum(q_lens), num_qo_heads, head_dim, dtype=torch.float16, device=DEVICE)
    out = torch.empty(sum(q_lens), num_qo_heads, head_dim, dtype=torch.float16, device=DEVICE)

    def plan(kv_pages_indptr, last_len):
        wrapper.plan(qo_indptr, kv_pages_indptr, indices.to(DEVICE), last_len, num_qo_heads,
                     num_kv_heads, head_dim, page_size, kv_data_type=torch.uint8,
                     q_data_type=torch.float16)

    plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([16, 16], dtype=torch.int32))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        wrapper.run(q, codes, out=out, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=scales)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, codes, out=out, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=scales)
    plan(indptr, last)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    wrapper.check()
    k_rows, v_rows = ragged_dequantized(codes, scales, indptr, indices, kv_lens, num_kv_heads,
                                        head_dim)
    want, _ = reference_attention(q.float().cpu().numpy(), k_rows, v_rows, qo_indptr.numpy(),
                                  np.concatenate([[0], np.cumsum(kv_lens)]))
    assert (out.double().cpu() - torch.from_numpy(want)).abs().max() <= 4e-3 * 3


def test_nvfp4_on_the_cpu_backend_is_refused_by_name():
    q = torch.randn(3, 2, 64, dtype=torch.float16)
    codes = torch.zeros(5, 2, 32, dtype=torch.uint8)
    sf = torch.zeros(5, 2, 4, dtype=torch.uint8)
    with pytest.raises(NotImplementedError, match="NVFP4"):
        flare.single_prefill_with_kv_cache(q, codes, codes, kv_cache_sf=(sf, sf))
