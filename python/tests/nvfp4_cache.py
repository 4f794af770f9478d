"""NVFP4 test caches on PyTorch CUDA tensors (the Python GPU tests of NVFP4 decode and prefill):
a paged cache filled by nvfp4_quantize_append_paged_kv_cache with global scales K_SCALE /
V_SCALE, and its dequantization (fp4_quantization.e2m1_and_ufp8sf_scale_to_float)."""

import numpy as np
import torch

import flare
from flare.fp4_quantization import e2m1_and_ufp8sf_scale_to_float

DEVICE = torch.device("cuda:0")
K_SCALE, V_SCALE = 0.5, 2.0


def dequantize(codes, scales, global_scale):
    flat = e2m1_and_ufp8sf_scale_to_float(codes.reshape(-1, codes.shape[-1]),
                                          scales.reshape(-1, scales.shape[-1]),
                                          torch.tensor([global_scale], device=DEVICE),
                                          is_sf_swizzled_layout=False)
    return flat.reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def nvfp4_cache(kv_lens, num_kv_heads, head_dim, page_size, spare_pages=3):
    """(codes [pages, 2, ps, H, D/2], scales, indptr, indices, last) of an appended cache."""
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32)
    total_pages = int(indptr[-1])
    indices = torch.randperm(total_pages + spare_pages)[:total_pages].to(torch.int32)
    last = torch.tensor([(n - 1) % page_size + 1 for n in kv_lens], dtype=torch.int32)
    shape = (total_pages + spare_pages, 2, page_size, num_kv_heads)
    codes = torch.zeros(*shape, head_dim // 2, dtype=torch.uint8, device=DEVICE)
    scales = torch.zeros(*shape, head_dim // 16, dtype=torch.uint8,
                         device=DEVICE).view(torch.float8_e4m3fn)
    k = torch.randn(sum(kv_lens), num_kv_heads, head_dim, dtype=torch.float16, device=DEVICE)
    v = torch.randn_like(k) * 3
    append_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32,
                                 device=DEVICE)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE)
    batch, positions = flare.get_batch_indices_positions(append_indptr, seq_lens, sum(kv_lens))
    flare.nvfp4_quantize_append_paged_kv_cache(
        k, v, batch, positions, codes, scales, indices.to(DEVICE), indptr.to(DEVICE),
        last.to(DEVICE), K_SCALE, V_SCALE)
    return codes, scales, indptr, indices, last
