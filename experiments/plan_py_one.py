"""plan() host time of paged b64 q1 kv2048 (32 / 8 heads, D 128, page 16, CPU index tensors)
with NVFP4 and 16-bit K/V, median of 300 calls, and of the same batch with KV lengths spread
uniformly over 1024-3072 (FLARE_AB_SCRIPT of experiments/split_sweep_ab.sh).
Usage: python3 plan_py_one.py [LABEL]"""
import os
import sys

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from bench_python import host_us  # noqa: E402


def spread_indices(batch=64, low=1024, high=3072):
    """paged_indices' batch of q1 requests with KV lengths drawn from [low, high] (seed 7)."""
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(low, high + 1, (batch,), generator=g, dtype=torch.int32)
    pages = (lengths + PS - 1) // PS
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages, 0)
    indices = torch.randperm(int(indptr[-1])).to(torch.int32).to("cuda:0")
    return (torch.arange(batch + 1, dtype=torch.int32), indptr, indices,
            ((lengths - 1) % PS + 1).to(torch.int32))


def plan_us(kv_dtype, ws, calls=300, spread=False):
    qo, indptr, indices, last = spread_indices() if spread else paged_indices(64, 1, 2048)
    w = flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    call = lambda: w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS,  # noqa: E731
                          q_data_type=torch.float16, kv_data_type=kv_dtype)
    call()  # the first plan() of the configuration resolves and compiles
    return host_us(call, calls)[0]


ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")
print(f"{' '.join(sys.argv[1:])} {flare.__file__}: plan() b64 q1 kv2048 NVFP4 {plan_us(torch.uint8, ws):.1f} "
      f"us, 16-bit {plan_us(torch.float16, ws):.1f} us; kv 1024-3072 NVFP4 "
      f"{plan_us(torch.uint8, ws, spread=True):.1f} us, 16-bit "
      f"{plan_us(torch.float16, ws, spread=True):.1f} us")
