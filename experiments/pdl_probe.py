"""Issue 17 probe: what programmatic dependent launch (run(enable_pdl=...), on by default through
Python) does to decode and ragged prefill, next to SDPA cuDNN in the same process. bench_python.py's
shapes (bf16, decode 32 / 8 heads page 16 pages in allocation order, tensor-core loop; prefill
causal b16 h16). Per call: median of 200 calls with events around each (bench_python's eager);
back to back: 50 calls between two events, median of 5.
GPU machine, flare installed: python3 experiments/pdl_probe.py"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flare
from eager_timing import time_runs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from bench_python import eager_us  # noqa: E402

HQ, HK, DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16


ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
print("| case | PDL off per call / back to back | PDL on | SDPA cuDNN per call / b2b |")
print("|---|---|---|---|")
for batch, kv_len in ((1, 32768), (16, 4096), (64, 8192)):
    pages_per = kv_len // PAGE
    pages = batch * pages_per
    cache = torch.randn(pages, 2, PAGE, HK, DIM, device="cuda", dtype=DTYPE)
    indptr = torch.arange(0, pages + 1, pages_per, dtype=torch.int32)
    indices = torch.arange(pages, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), PAGE, dtype=torch.int32)
    q = torch.randn(batch, HQ, DIM, device="cuda", dtype=DTYPE)
    w = flare.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, HQ, HK, DIM, PAGE, q_data_type=DTYPE, kv_data_type=DTYPE)
    out = w.run(q, cache)
    cells = []
    for pdl in (False, True):
        call = lambda: w.run(q, cache, out=out, enable_pdl=pdl)  # noqa: E731
        cells.append(f"{eager_us(call, 200):.1f} / {time_runs(call, 50):.1f}")
    cache = None
    sq = torch.randn(batch, HQ, 1, DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(batch, HK, kv_len, DIM, device="cuda", dtype=DTYPE)
    v = torch.randn_like(k)

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(sq, k, v, enable_gqa=True)

    cells.append(f"{eager_us(sdpa, 200):.1f} / {time_runs(sdpa, 50):.1f}")
    print(f"| decode b{batch} kv{kv_len} | " + " | ".join(cells) + " |", flush=True)
    k = v = None
    torch.cuda.empty_cache()

for length in (1024, 4096):
    total = 16 * length
    indptr = torch.arange(0, total + 1, length, dtype=torch.int32)
    q = torch.randn(total, 16, DIM, device="cuda", dtype=DTYPE)
    k, v = torch.randn_like(q), torch.randn_like(q)
    w = flare.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indptr, 16, 16, DIM, causal=True, q_data_type=DTYPE, kv_data_type=DTYPE)
    out = w.run(q, k, v)
    cells = []
    for pdl in (False, True):
        call = lambda: w.run(q, k, v, out=out, enable_pdl=pdl)  # noqa: E731
        cells.append(f"{eager_us(call, 50):.1f} / {time_runs(call, 20):.1f}")
    sq, sk, sv = (t.view(16, length, 16, DIM).transpose(1, 2) for t in (q, k, v))

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(sq, sk, sv, is_causal=True)

    cells.append(f"{eager_us(sdpa, 50):.1f} / {time_runs(sdpa, 20):.1f}")
    print(f"| prefill ragged causal b16 L{length} | " + " | ".join(cells) + " |", flush=True)
