"""Issue 17 probe through Python (GPU machine, flare installed): cProfile of the paged prefill
wrapper's plan() on two Algorithm-1 shapes, top functions by own time, to find the wrapper's
share beyond the extension's BatchPrefill.plan (experiments/split_vs_queue_sweep.py times the
plans' kernels). 16-bit K/V, 32 / 8 heads, D 128, page 16, shuffled pages.
Usage: python3 experiments/plan_py_profile.py"""
import cProfile
import pstats

import torch

import flare
from paged_batch import DIM, HK, HQ, PS, paged_indices

D = torch.device("cuda:0")


def wrapper_and_args(batch, q_len, kv_len):
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
    return (flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD"),
            paged_indices(batch, q_len, kv_len))


for batch, q_len, kv_len, causal in ((1, 4096, 4096, True), (64, 1, 2048, False)):
    w, (qo, indptr, indices, last) = wrapper_and_args(batch, q_len, kv_len)
    plan = lambda: w.plan(qo, indptr, indices, last, HQ, HK, DIM, PS, causal=causal,
                          q_data_type=torch.float16, kv_data_type=torch.float16)
    plan()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        plan()
    profile.disable()
    print(f"== b{batch} q{q_len} kv{kv_len}: cProfile of 2000 plan() calls, by own time")
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)
