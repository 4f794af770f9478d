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
from nvfp4_cache import K_SCALE, V_SCALE, dequantize, nvfp4_cache  # noqa: E402

DEVICE = torch.device("cuda:0")


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads", [(4, 4), (32, 4)])
@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_decode_over_an_appended_nvfp4_cache(head_dim, heads, use_tensor_cores):
    num_qo_heads, num_kv_heads = heads
    page_size, kv_lens = 16, [1, 97, 600, 33]
    codes, scales, indptr, indices, last = nvfp4_cache(kv_lens, num_kv_heads, head_dim,
                                                       page_size)
    k_scale, v_scale = K_SCALE, V_SCALE

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
