#!/usr/bin/env python3
"""A target for ncu: PyTorch SDPA's cuDNN backend on b64 kv8192 (the decode anchor's shape), three
calls. What it showed (H100, docs/perf.md): cuDNN runs 512 CTAs of 128 threads, two per SM, 86 KiB
of shared memory each: the geometry of flare's tensor-core decode loop.

Usage: ncu --launch-skip 2 --launch-count 3 --section LaunchStats --section SpeedOfLight \
           python3 scripts/ncu_cudnn_decode.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

q = torch.randn(64, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(64, 8, 8192, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
