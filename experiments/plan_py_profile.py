"""Issue 17 probe through Python (GPU machine, flare installed): cProfile of the paged prefill
wrapper's plan() on two Algorithm-1 shapes, top functions by own time, to find the wrapper's
share beyond the extension's BatchPrefill.plan (experiments/split_vs_queue_sweep.py times the
plans' kernels). 16-bit K/V, 32 / 8 heads, D 128, page 16, shuffled pages.
Usage: python3 experiments/plan_py_profile.py"""
import cProfile
import pstats

import torch

import flare

D = torch.device("cuda:0")
HQ, HK, DIM, PS = 32, 8, 128, 16


def wrapper_and_args(batch, q_len, kv_len):
    pages_per = (kv_len + PS - 1) // PS
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_per
    indices = torch.randperm(batch * pages_per).to(torch.int32).to(D)
    last = torch.full((batch,), (kv_len - 1) % PS + 1, dtype=torch.int32)
    qo = torch.arange(batch + 1, dtype=torch.int32) * q_len
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=D)
    return flare.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD"), (qo, indptr, indices, last)


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
