"""Decode over NVFP4 KV through FlashInfer's interface on PyTorch CUDA tensors: a cache filled
by nvfp4_quantize_append_paged_kv_cache, plan(kv_data_type=torch.uint8), run(kv_cache_sf=...)
with global k_scale / v_scale, against float64 attention over the dequantized values
(fp4_quantization.e2m1_and_ufp8sf_scale_to_float); use_tensor_cores is a hint NVFP4 runs
without (the CUDA-core loop); missing scales refused. Skipped visibly without PyTorch or a
CUDA device."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import flare  # noqa: E402
from attention_reference import reference_attention  # noqa: E402
from flare.fp4_quantization import e2m1_and_ufp8sf_scale_to_float  # noqa: E402

DEVICE = torch.device("cuda:0")


def dequantize(codes, scales, global_scale):
    flat = e2m1_and_ufp8sf_scale_to_float(codes.reshape(-1, codes.shape[-1]),
                                          scales.reshape(-1, scales.shape[-1]),
                                          torch.tensor([global_scale], device=DEVICE),
                                          is_sf_swizzled_layout=False)
    return flat.reshape(*codes.shape[:-1], codes.shape[-1] * 2)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads", [(4, 4), (32, 4)])
@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_decode_over_an_appended_nvfp4_cache(head_dim, heads, use_tensor_cores):
    num_qo_heads, num_kv_heads = heads
    page_size, kv_lens = 16, [1, 97, 600, 33]
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
    total_pages = int(indptr[-1])
    indices = torch.randperm(total_pages + 3)[:total_pages].to(torch.int32)
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32)
    shape = (total_pages + 3, 2, page_size, num_kv_heads)
    codes = torch.zeros(*shape, head_dim // 2, dtype=torch.uint8, device=DEVICE)
    scales = torch.zeros(*shape, head_dim // 16, dtype=torch.uint8,
                         device=DEVICE).view(torch.float8_e4m3fn)
    k = torch.randn(sum(kv_lens), num_kv_heads, head_dim, dtype=torch.float16, device=DEVICE)
    v = torch.randn_like(k) * 3
    append_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32,
                                 device=DEVICE)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    batch, positions = flare.get_batch_indices_positions(append_indptr, seq_lens, sum(kv_lens))
    k_scale, v_scale = 0.5, 2.0
    flare.nvfp4_quantize_append_paged_kv_cache(
        k, v, batch, positions, codes, scales, indices.to(DEVICE), indptr.to(DEVICE),
        last.to(DEVICE), k_scale, v_scale)

    q = torch.randn(len(kv_lens), num_qo_heads, head_dim, dtype=torch.float16, device=DEVICE)
    wrapper = flare.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device=DEVICE), "NHD",
        use_tensor_cores=use_tensor_cores)
    wrapper.plan(indptr, indices.to(DEVICE), last, num_qo_heads, num_kv_heads, head_dim,
                 page_size, kv_data_type=torch.uint8, q_data_type=torch.float16)
    out = torch.full_like(q, float("nan"))
    _, lse = wrapper.run(q, codes, out=out, return_lse=True, k_scale=k_scale, v_scale=v_scale,
                         kv_cache_sf=scales)
    wrapper.check()

    k_dq = dequantize(codes[:, 0], scales[:, 0], k_scale).cpu().numpy()
    v_dq = dequantize(codes[:, 1], scales[:, 1], v_scale).cpu().numpy()
    ks, vs = [], []
    for b, n in enumerate(kv_lens):
        rows = indices[int(indptr[b]):int(indptr[b + 1])].numpy()
        ks.append(k_dq[rows].reshape(-1, num_kv_heads, head_dim)[:n])
        vs.append(v_dq[rows].reshape(-1, num_kv_heads, head_dim)[:n])
    want, want_lse = reference_attention(q.float().cpu().numpy(), np.concatenate(ks),
                                         np.concatenate(vs), np.arange(len(kv_lens) + 1),
                                         np.concatenate([[0], np.cumsum(kv_lens)]))
    assert (out.double().cpu() - torch.from_numpy(want)).abs().max() <= 1e-2 * 3
    assert (lse.double().cpu() - torch.from_numpy(want_lse)).abs().max() <= 2e-3
    with pytest.raises(ValueError, match="kv_cache_sf"):
        wrapper.run(q, codes, k_scale=k_scale, v_scale=v_scale)
